"""Ensembles: the mean of the members' probabilities, computed by a reference written here in
probability space from each member's full teacher-forced forward (no cache, no log-sum-exp)."""

import json

import pytest
import torch

from aiayn.cli.main import main
from aiayn.data.tokenizer import CharTokenizer
from aiayn.decoding import SearchConfig, Translator
from aiayn.decoding.bidirectional import adapter_for_translation, r2l_inputs
from aiayn.decoding.search import search
from aiayn.errors import ConfigError, ModelDirError
from aiayn.models.ensemble import Ensemble
from aiayn.models.io import save_model
from aiayn.models.quantize import is_quantized, quantize
from tests.decoding.fixtures import TEXT, char_tokenizer, tiny_lm, tiny_transformer, translation_dir
from tests.helpers import assert_close

V = 30


def members() -> list:
    """Three members that share the vocabulary but not their sizes; one scores only some pieces."""
    a = tiny_transformer(V, seed=1, eos_bias=2.0)
    b = tiny_transformer(V, seed=2, d_model=16, d_ff=48, n_heads=2, eos_bias=1.0)
    c = tiny_transformer(V, seed=3, output_pieces=20)
    c.head.set_pieces(torch.tensor(list(range(20))))
    return [a, b, c]


@torch.no_grad()
def reference_log_probs(models, src, tgt):
    """log((1/M) Σ_m softmax(logits_m)) from every member's full forward."""
    probs = torch.stack([m(src, tgt).double().softmax(-1) for m in models])
    return probs.mean(0).log()


def argmax_loop(log_probs, c, steps: int) -> list[int]:
    """Greedy decoding by hand: ``log_probs(prefix (1, t)) -> (V,)``, pad never chosen, up to eos."""
    prefix = [c.bos_id]
    for _ in range(steps):
        lp = log_probs(torch.tensor([prefix])).clone()
        lp[c.pad_id] = float("-inf")
        prefix.append(int(lp.argmax()))
        if prefix[-1] == c.eos_id:
            break
    return prefix[1:]


def test_forward_is_the_log_of_the_mean_probability():
    models = members()
    src, tgt = torch.randint(3, V, (3, 7)), torch.randint(3, V, (3, 5))
    got = Ensemble(models)(src, tgt)
    want = reference_log_probs(models, src, tgt)
    assert torch.isneginf(got[..., 20:]).sum() == 0  # a piece one member never scores keeps the others' mass
    assert_close("ensemble: log of the members' mean softmax", got, want, atol=1e-5)
    one = tiny_transformer(V, seed=1)
    assert_close("ensemble: log of the members' mean softmax", Ensemble([one])(src, tgt),
                 one(src, tgt).log_softmax(-1), atol=1e-5)  # fmt: skip


def test_greedy_search_follows_the_reference_argmax_step_by_step():
    models = members()
    ensemble = Ensemble(models)
    src = torch.randint(3, V, (4, 6))
    config = SearchConfig(beam=1, max_len=9)
    hyps = search(adapter_for_translation(ensemble, config, 9), src, config, 9)
    c = ensemble.config
    for row, (hyp,) in zip(src, hyps, strict=True):
        assert hyp.tokens == argmax_loop(
            lambda prefix, row=row: reference_log_probs(models, row[None], prefix)[0, -1], c, 9
        )


def test_an_ensemble_never_emits_an_id_a_members_tokenizer_lacks():
    """A member loaded with a tokenizer smaller than its output (``interop.pretrained.limit_to``):
    the ensemble's searches keep below the smallest such limit."""
    models = members()
    models[0].vocab_limit, models[1].vocab_limit = 12, 25
    ensemble = Ensemble(models)
    src = torch.randint(3, V, (4, 6))
    for config in (SearchConfig(beam=1, min_len=8, max_len=8), SearchConfig(beam=4, min_len=8, max_len=8)):
        hyps = search(adapter_for_translation(ensemble, config, 8), src, config, 8)
        tokens = [t for hs in hyps for h in hs for t in h.tokens]
        assert len(tokens) == 4 * 8 and max(tokens) < 12


@pytest.mark.parametrize("beam", [3, 5])
def test_beam_search_scores_are_the_ensembles_log_probabilities_and_the_cache_changes_nothing(beam):
    models = members()
    ensemble = Ensemble(models)
    src = torch.randint(3, V, (5, 6))
    src[1, 4:] = src[3, 2:] = ensemble.config.pad_id  # padded sources
    results = []
    for use_cache in (True, False):
        config = SearchConfig(beam=beam, nbest=beam, use_cache=use_cache)
        results.append(search(adapter_for_translation(ensemble, config, 12), src, config, 12))
    for cached, plain in zip(*results, strict=True):
        assert [h.tokens for h in cached] == [h.tokens for h in plain]
        assert [h.log_prob for h in cached] == pytest.approx([h.log_prob for h in plain], abs=1e-4)
    for i, hyps in enumerate(results[0]):
        row = src[i : i + 1, : int((src[i] != ensemble.config.pad_id).sum())]
        for h in hyps:
            tgt = torch.tensor([[ensemble.config.bos_id, *h.tokens[:-1]]])
            lp = reference_log_probs(models, row, tgt)[0]
            assert h.log_prob == pytest.approx(
                float(lp.gather(1, torch.tensor(h.tokens)[:, None]).sum()), abs=1e-4
            )


def test_an_ensemble_of_copies_decodes_as_the_model_alone(model_dirs):
    single = Translator.from_dir(model_dirs["joint"])
    double = Translator.from_dirs([model_dirs["joint"], model_dirs["src-tgt"]])  # the same weights (seed 0)
    assert isinstance(double.model, Ensemble) and len(double.model.members) == 2
    lines = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen"]
    for config in (SearchConfig(beam=1), SearchConfig(beam=4, nbest=4), SearchConfig(beam=4, mbr="bleu")):
        sources, _ = single.encode(lines)
        want, got = single.search(sources, config), double.search(sources, config)
        assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
        assert [h.score for hs in got for h in hs] == pytest.approx(
            [h.score for hs in want for h in hs], abs=1e-4
        )


@pytest.mark.parametrize("r2l_beam", [1, 3])
def test_a_bidirectional_ensemble_reads_each_members_own_right_to_left_translation(r2l_beam):
    """Each member decodes its own right-to-left translation (as it would alone) and reads those states;
    the left-to-right step is the mean of the members' probabilities given their own memories,
    computed here from each member's full forward over [bos] + the prefix."""
    models = [tiny_transformer(V, seed=s, eos_bias=1.5, bidirectional=True) for s in (1, 2)]
    ensemble = Ensemble(models)
    src = torch.randint(3, V, (3, 6))
    src[2, 3:] = ensemble.config.pad_id
    config = SearchConfig(beam=1, max_len=9, r2l_beam=r2l_beam)
    adapter = adapter_for_translation(ensemble, config, 9)
    hyps = search(adapter, src, config, 9)
    memories, shown = [], []  # each member's [bos] + right-to-left translation, as it decodes one alone
    for m in models:
        alone = adapter_for_translation(m, config, 9)
        search(alone, src, config, 9)
        shown.append([h[0].tokens for h in alone.r2l_hypotheses])
        memories.append(
            r2l_inputs(alone.r2l_hypotheses, m.config.bos_id, m.config.eos_id, m.config.pad_id, "cpu")
        )
    assert [h[0].tokens for h in adapter.r2l_hypotheses] == shown[0]  # the first member's, shown
    assert not torch.equal(memories[0], memories[1])  # the members' memories differ: each reads its own
    c = ensemble.config
    with torch.no_grad():
        for i, (hyp,) in enumerate(hyps):
            row = src[i : i + 1, : int((src[i] != c.pad_id).sum())]

            def mean_of_members(prefix, row=row, i=i):  # each member given its own memory
                probs = [m(row, prefix, mem[i : i + 1])[0][0, -1].double().softmax(-1)
                         for m, mem in zip(models, memories)]  # fmt: skip
                return torch.stack(probs).mean(0).log()

            assert hyp.tokens == argmax_loop(mean_of_members, c, 9)


def test_members_must_share_vocabularies_and_kind_and_be_translation_models():
    with pytest.raises(ConfigError, match="at least one"):
        Ensemble([])
    with pytest.raises(ConfigError, match="member 2 has src_vocab_size=31 but member 1 has 30"):
        Ensemble([tiny_transformer(V), tiny_transformer(V + 1)])
    with pytest.raises(ConfigError, match="member 2 has max_len=64 but member 1 has 128"):
        Ensemble([tiny_transformer(V, positional="learned", max_len=128),
                  tiny_transformer(V, positional="learned", max_len=64)])  # fmt: skip
    with pytest.raises(ConfigError, match="member 2 has positional='learned'"):
        Ensemble([tiny_transformer(V), tiny_transformer(V, positional="learned")])
    Ensemble([tiny_transformer(V, max_len=128), tiny_transformer(V, max_len=64)])  # sinusoidal tables grow
    with pytest.raises(ConfigError, match="member 2 has bidirectional=True but member 1 has False"):
        Ensemble([tiny_transformer(V), tiny_transformer(V, bidirectional=True)])
    with pytest.raises(ConfigError, match="decodes .* does not score given targets"):
        Ensemble([tiny_transformer(V, bidirectional=True)])(torch.ones(1, 3).long(), torch.ones(1, 2).long())
    with pytest.raises(ConfigError, match="member 2 is a LanguageModel"):
        Ensemble([tiny_transformer(V), tiny_lm(V)])


def test_directories_must_share_tokenizers_and_direction(model_dirs, tmp_path):
    other, backward = tmp_path / "other", tmp_path / "backward"
    tok = CharTokenizer.train(TEXT.replace("?", "§"))  # as many characters, one of them different
    assert tok.vocab_size == char_tokenizer().vocab_size
    save_model(tiny_transformer(tok.vocab_size), other)
    tok.save(other)
    with pytest.raises(ModelDirError, match="other: its tokenizers differ from those of"):
        Translator.from_dirs([model_dirs["joint"], other])
    save_model(tiny_transformer(tok.vocab_size), backward, reverse_target=True)
    char_tokenizer().save(backward)
    with pytest.raises(ModelDirError, match="backward: it writes the target in the other direction"):
        Translator.from_dirs([model_dirs["joint"], backward])
    # the same joint vocabulary, trained the other way: the recorded language pair tells them apart
    forward, reverse = tmp_path / "de-en", tmp_path / "en-de"
    for d, (src, tgt) in ((forward, ("de", "en")), (reverse, ("en", "de"))):
        save_model(tiny_transformer(tok.vocab_size), d, src_lang=src, tgt_lang=tgt)
        char_tokenizer().save(d)
    with pytest.raises(ModelDirError, match="en-de: it translates en→de, .*de-en de→en; ensemble models"):
        Translator.from_dirs([forward, reverse])
    Translator.from_dirs([forward, model_dirs["joint"]])  # a directory naming no languages is not refused


def test_ensemble_from_the_command_line(model_dirs, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde\n")
    args = ["translate", "--model", str(model_dirs["joint"]), "--input", str(src), "--beam", "3"]
    assert main(args) == 0
    alone = capsys.readouterr().out
    assert main([*args, "--ensemble-with", str(model_dirs["src-tgt"])]) == 0
    assert capsys.readouterr().out == alone
    assert main([*args, "--quantize", "int8"]) == 0
    alone = capsys.readouterr().out
    assert main([*args, "--quantize", "int8", "--ensemble-with", str(model_dirs["src-tgt"])]) == 0
    assert capsys.readouterr().out == alone
    ensemble = quantize(Translator.from_dirs([model_dirs["joint"], model_dirs["src-tgt"]]).model)
    assert all(is_quantized(m) for m in ensemble.members)
    assert main([*args, "--ensemble-with", str(model_dirs["src-tgt"]), str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert "nope" in err and err.count("\n") == 1


def test_evaluate_scores_an_ensemble_and_records_its_members(model_dirs, tmp_path, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde\n")
    ref.write_text("A man rides a bike.\nTwo dogs\n")
    args = [
        "evaluate",
        "--model",
        str(model_dirs["joint"]),
        "--src",
        str(src),
        "--ref",
        str(ref),
        "--beam",
        "2",
    ]
    reports = []
    for extra in ([], ["--ensemble-with", str(model_dirs["src-tgt"])]):
        out = tmp_path / f"report{len(extra)}.json"
        assert main([*args, *extra, "--json", str(out)]) == 0
        reports.append(json.loads(out.read_text()))
    capsys.readouterr()
    assert reports[1]["ensemble_with"] == [str(model_dirs["src-tgt"])] and reports[0]["ensemble_with"] == []
    assert {k: reports[1][k] for k in ("bleu", "chrf")} == {k: reports[0][k] for k in ("bleu", "chrf")}


def test_a_bidirectional_ensemble_of_copies_translates_as_the_model_alone(tmp_path, capsys):
    """Two directories with the same bidirectional weights: the ensemble's translations and its shown
    right-to-left pass (``--show-r2l``) are the model's own, and a plain member is refused."""
    one = translation_dir(tmp_path / "one", bidirectional=True)
    two = translation_dir(tmp_path / "two", layout="src-tgt", bidirectional=True)  # the same seed
    plain = translation_dir(tmp_path / "plain")
    src = tmp_path / "in.txt"
    src.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde\n")
    args = ["translate", "--model", str(one), "--input", str(src), "--beam", "3", "--show-r2l"]
    assert main(args) == 0
    alone = capsys.readouterr().out
    assert alone.count("\t") == 2  # translation TAB its right-to-left pass, on each line
    assert main([*args, "--ensemble-with", str(two)]) == 0
    assert capsys.readouterr().out == alone
    assert main([*args, "--ensemble-with", str(plain)]) == 1
    assert "member 2 has bidirectional=False but member 1 has True" in capsys.readouterr().err
