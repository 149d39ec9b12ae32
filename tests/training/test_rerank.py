"""The classic baseline of bidirectional decoding: a model trained right to left
(``reverse_target=true``) translates in the right order and reranks another model's n-best."""

import json

import pytest

from aiayn.cli.main import main
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.rerank import Reranked, rerank, reranked_search, within_reach
from aiayn.decoding.scoring import length_penalty
from aiayn.decoding.translator import Translator
from aiayn.errors import ConfigError
from tests.decoding.fixtures import tiny_transformer
from tests.training.conftest import tiny_args


@pytest.fixture(scope="module")
def pair(corpus_module, tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank")
    l2r, r2l = root / "l2r", root / "r2l"
    assert main(["train", *tiny_args(corpus_module, l2r, "max_steps=30", "eval_every=30")]) == 0
    assert (
        main(
            ["train", *tiny_args(corpus_module, r2l, "max_steps=30", "eval_every=30", "reverse_target=true")]
        )
        == 0
    )
    return Translator.from_dir(l2r), Translator.from_dir(r2l), l2r, r2l


def test_a_right_to_left_model_scores_its_own_search_and_writes_left_to_right(pair):
    l2r, r2l, _, r2l_dir = pair
    assert r2l.reverse and not l2r.reverse
    assert json.loads((r2l_dir / "best" / "config.json").read_text())["reverse_target"] is True
    sources, _ = r2l.encode(["hund läuft rot", "katze springt"])
    for translator in (l2r, r2l):
        hyps = translator.search(sources, SearchConfig(beam=3, nbest=3))
        flat = [(i, h) for i, hs in enumerate(hyps) for h in hs]
        complete = [h.tokens[-1] == 2 for _, h in flat]  # eos scored only where the search emitted it
        targets = [translator.forward_order(h.tokens) for _, h in flat]
        scores = translator.log_probs([sources[i] for i, _ in flat], targets, complete)
        assert scores == pytest.approx([h.log_prob for _, h in flat], abs=1e-3)


def test_a_bidirectional_scorer_is_refused_before_anything_is_decoded(pair):
    l2r = pair[0]
    scorer = Translator(tiny_transformer(l2r.tgt_tokenizer.vocab_size, bidirectional=True), l2r.src_tokenizer,
                        l2r.tgt_tokenizer)  # fmt: skip
    with pytest.raises(ConfigError, match="a bidirectional model does not score given targets"):
        Reranked(l2r, scorer)


def test_a_scorer_of_another_language_pair_is_refused(pair):
    """A joint vocabulary can be the same file in both directions: the recorded languages tell them apart."""
    l2r, r2l = pair[0], pair[1]
    other = Translator(r2l.model, r2l.src_tokenizer, r2l.tgt_tokenizer, reverse=True, tgt_lang="de")
    assert l2r.tgt_lang == "en"
    with pytest.raises(ConfigError, match="the reranking model writes 'de', the model 'en'; rerank with"):
        Reranked(l2r, other)


def test_a_scorer_with_fewer_learned_positions_bounds_the_search_instead_of_failing_after_it(pair):
    tok = pair[0].tgt_tokenizer
    wide = Translator(tiny_transformer(tok.vocab_size, positional="learned", max_len=64), tok, tok)
    narrow = Translator(tiny_transformer(tok.vocab_size, seed=1, positional="learned", max_len=6), tok, tok)
    sources, _ = wide.encode(["hund läuft rot und blau"])
    config = SearchConfig(beam=3, nbest=3, max_len_b=40)
    assert max(len(h.tokens) for h in wide.search(sources, config)[0]) > 6  # the bound matters here
    hyps = reranked_search(wide, narrow, sources, config)[0]
    assert hyps and max(len(h.tokens) for h in hyps) <= 6
    assert wide.max_tgt_len == 64  # the model's own translator is left as it was
    assert Reranked(wide, narrow).translate(["hund läuft rot und blau"], config)[0]
    assert within_reach(narrow, wide) is narrow  # a scorer that reads further bounds nothing


def test_rerank_sums_both_log_probs_under_one_length_penalty(pair):
    l2r, r2l, _, _ = pair
    sources, _ = l2r.encode(["hund läuft rot", "katze springt blau"])
    config = SearchConfig(beam=4, nbest=4)
    nbest = l2r.search(sources, config)
    out = rerank(l2r, r2l, sources, nbest, config)
    for hyps, new in zip(nbest, out, strict=True):
        assert sorted(h.tokens for h in hyps) == sorted(h.tokens for h in new)
        assert [h.score for h in new] == sorted((h.score for h in new), reverse=True)
        for h in new:
            src = [sources[0 if hyps is nbest[0] else 1]]
            other = r2l.log_probs(src, [l2r.forward_order(h.tokens)], [h.tokens[-1] == 2])[0]
            lp = float(length_penalty(len(h.tokens), config.lenpen))
            assert h.score == pytest.approx((h.log_prob + other) / lp, abs=1e-4)


def test_rerank_from_the_command_line(pair, tmp_path, capsys):
    _, _, l2r_dir, r2l_dir = pair
    (tmp_path / "in.txt").write_text("hund läuft\nkatze sitzt\n", encoding="utf-8")
    argv = [
        "translate",
        "--model",
        str(l2r_dir),
        "--input",
        str(tmp_path / "in.txt"),
        "--rerank-with",
        str(r2l_dir),
    ]
    assert main([*argv, "--beam", "4", "--nbest", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert main([*argv, "--beam", "1"]) == 1
    assert "--rerank-with re-sorts a beam's n-best" in capsys.readouterr().err


def reranked_by_hand(l2r, r2l, lines, beam: int, lenpen: float = 0.6) -> list[str]:
    """Each line's ``beam``-best hypothesis with the highest (log p_l2r + log p_r2l) / lp, both
    log-probabilities by teacher forcing; "" for a blank line."""
    sources, _ = l2r.encode(lines)
    out = []
    for src, hyps in zip(sources, l2r.search(sources, SearchConfig(beam=beam, nbest=beam, lenpen=lenpen)),
                         strict=True):  # fmt: skip
        if not hyps:
            out.append("")
            continue
        forward = [l2r.forward_order(h.tokens) for h in hyps]
        complete = [h.tokens[-1] == 2 for h in hyps]
        both = [
            sum(m.log_probs([src] * len(hyps), forward, complete)[i] for m in (l2r, r2l))
            / float(length_penalty(len(h.tokens), lenpen))
            for i, h in enumerate(hyps)
        ]
        out.append(l2r.detokenize(hyps[max(range(len(hyps)), key=both.__getitem__)]))
    return out


LINES = ["hund läuft rot", "", "katze springt blau"]


def test_a_reranked_translator_writes_each_beams_best_by_the_sum_of_both_models(pair):
    """``Reranked.translate`` (what ``scripts/reproduce.py --rerank-with`` weighs on validation)."""
    l2r, r2l, _, _ = pair
    got = Reranked(l2r, r2l).translate(LINES, SearchConfig(beam=4, nbest=1))
    assert got == reranked_by_hand(l2r, r2l, LINES, 4) and got[1] == ""
    with pytest.raises(ConfigError, match="give --beam 2 or more"):
        Reranked(l2r, r2l).translate(LINES, SearchConfig(beam=1))


def test_evaluate_scores_the_reranked_translations(pair, tmp_path, capsys):
    l2r, r2l, l2r_dir, r2l_dir = pair
    lines = [line for line in LINES if line]
    src, ref, out, report = (tmp_path / n for n in ("src.de", "ref.en", "hyp.en", "report.json"))
    src.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    ref.write_text("dog runs red\ncat jumps blue\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(l2r_dir), "--src", str(src), "--ref", str(ref)]
    argv += ["--rerank-with", str(r2l_dir)]
    assert main([*argv, "--beam", "4", "--lenpen", "1.0", "--output", str(out), "--json", str(report)]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == reranked_by_hand(l2r, r2l, lines, 4, 1.0)
    assert json.loads(report.read_text())["rerank_with"] == str(r2l_dir)
    capsys.readouterr()
    assert main([*argv, "--beam", "1"]) == 1
    assert "--rerank-with re-sorts a beam's n-best" in capsys.readouterr().err
