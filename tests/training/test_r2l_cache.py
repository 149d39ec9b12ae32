"""Bidirectional training on cached right-to-left translations (``r2l_memory_from="cache"``, Su et
al. 2019): the cache is the right-to-left model's own translations, keyed by that model, the corpus
and the search; a jackknife's models never translate the half they trained on; training on the cache
resumes exactly; the model records the search decoding must repeat."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from aiayn.cli.main import main
from aiayn.data.views import halves, jackknife_half
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import Translator
from aiayn.errors import ConfigError
from aiayn.models import Transformer
from aiayn.models.config import TransformerConfig
from aiayn.models.io import WEIGHTS_FILE, resolve_model_dir, save_model
from aiayn.training.distributed import DistInfo
from aiayn.training.pseudo import fingerprint, pseudo_targets, translator_of
from aiayn.training.recipe import load_recipe
from aiayn.training.task import get_task
from tests.training.conftest import tiny_args

R2L = ["reverse_target=true", "eval_every=4", "max_steps=4"]
SEARCH = SearchConfig(beam=1, max_len_b=10)  # the cache's search
CACHED = ["model.bidirectional=true", "r2l_memory_from=cache", "eval_every=2", "keep_last=5"]


@pytest.fixture(scope="module")
def r2l(corpus_module, tmp_path_factory):
    """Three right-to-left models: one on all pairs, one on each half; the encoded training set."""
    root = tmp_path_factory.mktemp("r2l")
    cache = root / "cache"
    mp = pytest.MonkeyPatch()
    mp.setenv("AIAYN_CACHE_DIR", str(cache))
    dirs = {}
    for name, extra in (("all", []), ("half1", ["train_half=1"]), ("half2", ["train_half=2", "seed=2"])):
        dirs[name] = root / name
        assert main(["train", *tiny_args(corpus_module, dirs[name], *R2L, *extra)]) == 0
    yield dirs, cache
    mp.undo()


@pytest.fixture(autouse=True)
def _cache(r2l, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(r2l[1]))


def task(corpus, out, *extra):
    cfg = load_recipe(None, tiny_args(corpus, out, *extra))
    return get_task(cfg.task)(cfg, out, DistInfo())


def test_the_cache_holds_the_models_translations_and_is_keyed_by_model_corpus_and_search(
    corpus_module, r2l, tmp_path, monkeypatch
):
    dirs, _ = r2l
    t = task(corpus_module, tmp_path / "run", *CACHED, f"r2l_model={dirs['all']}")
    train = t.train
    first = pseudo_targets(train, [dirs["all"]])
    translator = Translator.from_dir(dirs["all"])
    for i in (0, 7, 123):
        hyp = translator.search([train.src[i].tolist()], SEARCH)[0][0].tokens
        assert first[i].tolist() == [tok for tok in hyp if tok != 2]  # right to left, eos dropped
    assert sum(len(first[i]) for i in range(len(first))) > len(first), "empty translations prove nothing"

    def no_search(*_, **__):
        raise AssertionError("a cache hit translated again")

    monkeypatch.setattr(Translator, "search", no_search)
    again = pseudo_targets(train, [dirs["all"]])  # the same model, corpus and search: a hit
    assert again.directory == first.directory and np.array_equal(again.ids, first.ids)
    monkeypatch.undo()
    changed = tmp_path / "changed"  # the same model with one weight changed: a miss
    shutil.copytree(dirs["all"] / "best", changed)
    weights = load_file(changed / "model.safetensors")
    name = next(k for k in weights if k.endswith("weight"))
    weights[name] = weights[name] + 1e-3
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(changed) != fingerprint(dirs["all"] / "best")
    others = [pseudo_targets(train, [changed]), pseudo_targets(t.valid.corpus, [dirs["all"]]),
              pseudo_targets(train, [dirs["all"]], beam=2)]  # fmt: skip
    assert len({first.directory, *(o.directory for o in others)}) == 4
    assert len(others[1]) == len(t.valid)


def test_the_jackknife_models_never_translate_their_own_half(corpus_module, r2l, tmp_path):
    dirs, _ = r2l
    half1 = task(corpus_module, tmp_path / "h1", *R2L, "train_half=1")  # what train_half=1 trains on
    seen = half1.sampler.corpora[0]
    assert {jackknife_half(seen[i][0]) for i in range(len(seen))} == {1} and 0 < len(seen) < len(half1.train)
    train = half1.train
    models = [dirs["half1"] / "best", dirs["half2"] / "best"]
    who = translator_of(train, models)  # 0: the half-1 model, 1: the half-2 model
    assert set(np.unique(halves(train))) == {1, 2}
    assert np.array_equal(who, np.where(halves(train) == 1, 1, 0)), "a model translated its own half"
    cached = pseudo_targets(train, models)
    translators = [Translator.from_dir(d) for d in models]
    for i in range(0, len(train), 37):
        hyp = translators[who[i]].search([train.src[i].tolist()], SEARCH)[0][0].tokens
        assert cached[i].tolist() == [tok for tok in hyp if tok != 2]
    with pytest.raises(ConfigError, match="one model trained with train_half=1 and one with train_half=2"):
        pseudo_targets(train, [dirs["half1"], dirs["half1"]])
    with pytest.raises(ConfigError, match="writes left to right"):
        left = tmp_path / "left"
        assert main(["train", *tiny_args(corpus_module, left, "max_steps=1", "eval_every=1")]) == 0
        pseudo_targets(train, [left])


def test_cached_training_resumes_exactly_and_decoding_repeats_the_cache_search(corpus_module, r2l, tmp_path):
    dirs, _ = r2l
    args = [*CACHED, f"r2l_model={dirs['half1']}", f"r2l_jackknife={dirs['half2']}", "r2l_cache_beam=2",
            "r2l_memory_dropout=0.3", "r2l_init=true"]  # fmt: skip
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", *tiny_args(corpus_module, straight, "max_steps=6", *args)]) == 0
    assert main(["train", *tiny_args(corpus_module, split, "max_steps=4", *args)]) == 0
    assert main(["train", *tiny_args(corpus_module, split, "max_steps=6", *args), "--resume"]) == 0

    def losses(run):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [(r["loss"], r["r2l_nll"]) for r in map(json.loads, lines) if r["split"] == "train"]

    assert losses(split) == losses(straight) and len(losses(straight)) == 6
    meta = json.loads((straight / "best" / "config.json").read_text())
    assert meta["r2l_beam"] == 2 and meta["config"]["bidirectional"] is True
    translator = Translator.from_dir(straight)
    assert translator.r2l_beam == 2  # the memory is built with the cache's search unless asked otherwise
    src, ref = tmp_path / "t.de", tmp_path / "t.en"
    src.write_text("hund läuft rot\n", encoding="utf-8")
    ref.write_text("dog runs red\n", encoding="utf-8")
    report = tmp_path / "scores.json"
    files = ["--src", str(src), "--ref", str(ref), "--json", str(report)]
    assert main(["evaluate", "--model", str(straight), *files, "--beam", "3"]) == 0
    assert json.loads(report.read_text())["search"]["r2l_beam"] == 2  # what built the memory, not null
    sources, _ = translator.encode(["hund läuft rot"])
    from aiayn.decoding import bidirectional

    seen = []
    real = bidirectional.BidirectionalAdapter.__init__

    def spy(self, model, config, max_len):
        seen.append(config.r2l_beam)
        real(self, model, config, max_len)

    bidirectional.BidirectionalAdapter.__init__ = spy
    try:
        translator.search(sources, SearchConfig(beam=3))
        translator.search(sources, SearchConfig(beam=3, r2l_beam=1))
    finally:
        bidirectional.BidirectionalAdapter.__init__ = real
    assert seen == [2, 1]


def test_decoding_reads_the_memory_the_cache_holds_whatever_the_left_to_right_search(
    corpus_module, r2l, tmp_path
):
    """With the right-to-left model's encoder and decoder copied and kept (``r2l_init``, ``r2l_freeze``,
    lr ≈ 0), the memory that decoding builds for a training source is that source's cached translation,
    token for token, under a left-to-right search with another beam, length penalty, min_len and limit."""
    dirs, _ = r2l
    run = tmp_path / "run"
    args = [*CACHED, f"r2l_model={dirs['all']}", "r2l_init=true", "r2l_freeze=true", "max_steps=2"]
    assert main(["train", *tiny_args(corpus_module, run, *args, "lr=1e-12")]) == 0
    train = task(corpus_module, tmp_path / "t", *args).train
    cached = pseudo_targets(train, [dirs["all"]])
    translator, rows = Translator.from_dir(run), range(0, 64)
    min_len = min(len(cached[i]) for i in rows) + 1  # over the shortest memory's length
    hyps = translator.search(
        [train.src[i].tolist() for i in rows], SearchConfig(beam=3, lenpen=1.0, min_len=min_len)
    )
    eos = translator.model.config.eos_id
    read = [[t for t in h[0].r2l.tokens if t != eos] for h in hyps]
    assert read == [cached[i].tolist() for i in rows]
    at_margin = [i for i in rows if len(cached[i]) == len(train.src[i]) + SEARCH.max_len_b]
    assert at_margin, "no translation at the margin: the test proves nothing"


def test_a_run_resumed_after_its_r2l_model_changed_is_refused(corpus_module, r2l, tmp_path, capsys):
    """The right-to-left model's weights are data the run read: retrained (its ``best`` moved, say),
    the resumed run would translate the training set again and train on other memories."""
    dirs, _ = r2l
    model = tmp_path / "r2l"
    shutil.copytree(dirs["all"], model, symlinks=True)
    run = tmp_path / "run"
    args = [*CACHED, f"r2l_model={model}"]
    assert main(["train", *tiny_args(corpus_module, run, "max_steps=2", *args)]) == 0
    weights = resolve_model_dir(model) / WEIGHTS_FILE
    shutil.copyfile(resolve_model_dir(dirs["half1"]) / WEIGHTS_FILE, weights)  # retrained in place
    capsys.readouterr()
    assert main(["train", *tiny_args(corpus_module, run, "max_steps=4", *args), "--resume"]) != 0
    err = capsys.readouterr().err
    assert f"the data changed: {weights} differs from what the run read (sha256)" in err, err


def test_r2l_init_copies_the_right_to_left_model_and_freeze_keeps_it(corpus_module, r2l, tmp_path):
    dirs, _ = r2l
    t = task(corpus_module, tmp_path / "run", *CACHED, f"r2l_model={dirs['all']}", "r2l_init=true",
             "r2l_freeze=true")  # fmt: skip
    model = t.build_model()
    source = load_file(dirs["all"] / "best" / "model.safetensors")
    ours = model.state_dict()
    decoder = [k for k in source if k.startswith("decoder.")]
    assert decoder and all(torch.equal(ours["r2l_" + k], source[k]) for k in decoder)
    assert all(torch.equal(ours[k], source[k]) for k in source if k.startswith("encoder."))
    assert not any(p.requires_grad for p in model.r2l_decoder.parameters())
    assert all(p.requires_grad for p in model.decoder.parameters())


def test_distillation_trains_on_references_and_reversed_translations(corpus_module, r2l, tmp_path):
    dirs, _ = r2l
    t = task(corpus_module, tmp_path / "run", "r2l_distill=true", f"r2l_model={dirs['all']}")
    pairs, pseudo = t.sampler.corpora[0], t.pseudo
    n = len(t.train)
    assert len(pairs) == n + int((pseudo.lengths > 0).sum())
    j = next(i for i in range(n) if len(pseudo[i]) > 1)
    extra = [pairs[k] for k in range(n, len(pairs))]
    assert any(np.array_equal(s, t.train.src[j]) and np.array_equal(tg, pseudo[j][::-1]) for s, tg in extra)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["model.bidirectional=true", "r2l_memory_from=cache"], "needs r2l_model"),
        (["r2l_memory_from=cache", "r2l_model=x"], "is for model.bidirectional=true"),
        (["r2l_model=x"], "is read by r2l_memory_from='cache' or r2l_distill=true"),
        (
            ["model.bidirectional=true", "r2l_memory_from=cache", "r2l_model=x", "r2l_freeze=true"],
            "needs r2l_init=true",
        ),
        (["model.bidirectional=true", "r2l_target=reference"], "is for r2l_memory_from='cache'"),
        (["model.bidirectional=true", "r2l_memory_dropout=1.0"], r"must be in \[0, 1\)"),
        (["r2l_memory_dropout=0.1"], "is for model.bidirectional=true"),
        (["train_half=3"], r"train_half=3 is not one of \(0, 1, 2\)"),
        (["r2l_jackknife=y"], "give r2l_model"),
        (["model.bidirectional=true", "r2l_memory_from=cache", "r2l_model=x", "r2l_cache_beam=0"], "≥ 1"),
        (["r2l_distill=true", "r2l_model=x", "subword_dropout=0.1"], "the cache was made for"),
        (["train_half=1", "subword_dropout=0.1"], "selects pairs of one segmentation"),
    ],
)
def test_bad_cache_configs(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_recipe(None, overrides)


def test_a_missing_r2l_model_is_one_clear_error(corpus_module, tmp_path, capsys):
    args = tiny_args(
        corpus_module, tmp_path / "run", *CACHED, f"r2l_model={tmp_path / 'nowhere'}", "max_steps=1"
    )
    assert main(["train", *args]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0], err


def test_with_learned_positions_the_cache_holds_what_the_positions_fit(corpus_module, r2l, tmp_path):
    """``[bos]`` + a cached translation cut at its limit (no eos) must fit a learned position table, as
    the memory decoding builds does (``r2l_translation``): at most ``max_len - 1`` tokens. The
    right-to-left model here: the fixture's, its weights replaced by a learned-position model's whose
    table holds the longest source and its eos, but not that source's memory margin."""
    dirs, _ = r2l
    train = task(corpus_module, tmp_path / "t", *CACHED, f"r2l_model={dirs['all']}").train
    rows = max(len(train.src[i]) for i in range(len(train))) + 2
    learned = tmp_path / "learned"
    shutil.copytree(dirs["all"] / "best", learned)
    meta = json.loads((learned / "config.json").read_text())
    config = TransformerConfig.from_dict({**meta.pop("config"), "positional": "learned", "max_len": rows})
    save_model(Transformer(config), learned, **{k: v for k, v in meta.items() if k != "kind"})
    cached = pseudo_targets(train, [learned])
    assert max(len(cached[i]) for i in range(len(cached))) == rows - 1, (
        "none reached the limit: proves nothing"
    )
