"""Minimum Bayes-risk selection: utilities against sacreBLEU's own sentence scores, the order it
gives, and the Translator, CLI and config paths that use it."""

import pytest
import sacrebleu

from aiayn.decoding import SearchConfig, Translator
from aiayn.decoding.mbr import expected_utilities, mbr_order
from aiayn.errors import ConfigError
from tests.decoding.fixtures import translation_dir

CANDIDATES = ["a man rides a red bike .", "two dogs play", "a man rides a bike .", "a man is riding a bike ."]


@pytest.mark.parametrize(
    "utility, reference", [("bleu", sacrebleu.sentence_bleu), ("chrf", sacrebleu.sentence_chrf)]
)
def test_expected_utility_is_the_mean_sentence_score_against_the_others(utility, reference):
    expected = [
        sum(reference(c, [r]).score for j, r in enumerate(CANDIDATES) if j != i) / (len(CANDIDATES) - 1)
        for i, c in enumerate(CANDIDATES)
    ]
    assert expected_utilities(CANDIDATES, utility) == pytest.approx(expected)
    assert len(set(expected)) == len(expected)  # the candidates are told apart


def test_bleu_is_tokenized_for_the_target_language():
    """13a splits on spaces: Chinese candidates, written without them, all scored 0 and MBR kept the
    beam's order; sacreBLEU's zh tokenizer (what `aiayn evaluate` scores zh with) tells them apart."""
    zh = ["一个男人在骑红色的自行车。", "两只狗在玩耍", "一个男人在骑自行车。", "一个男人正在骑自行车。"]
    expected = [
        sum(sacrebleu.sentence_bleu(c, [r], tokenize="zh").score for j, r in enumerate(zh) if j != i) / 3
        for i, c in enumerate(zh)
    ]
    assert expected_utilities(zh, "bleu", "zh") == pytest.approx(expected) and max(expected) > 20
    assert mbr_order(zh, "bleu", "zh")[-1] == 1  # the outlier last


def test_the_consensus_wins_and_the_outlier_comes_last():
    # "two dogs play" shares nothing with the rest: utility 0, last; the beam's first is not the consensus
    assert mbr_order(CANDIDATES) == [2, 0, 3, 1]
    assert mbr_order(["x y z", "a b c d", "a b c d"]) == [1, 2, 0]  # a tie keeps the given order
    assert mbr_order(["alone"]) == [0] and mbr_order([]) == []
    with pytest.raises(ValueError, match="utility='ter'"):
        expected_utilities(CANDIDATES, "ter")


def test_a_target_language_whose_bleu_needs_an_extra_is_refused_before_the_search(tmp_path, monkeypatch):
    """Japanese BLEU needs sacreBLEU's MeCab extra: without it the error came after the beam search
    had run (in the server, on every request); now before any decoding."""
    sacrebleu_ja = pytest.importorskip("sacrebleu.tokenizers.tokenizer_ja_mecab")
    try:
        sacrebleu_ja.TokenizerJaMecab()
        pytest.skip("sacreBLEU's Japanese tokenizer is installed here")
    except (RuntimeError, ImportError):
        pass
    translator = Translator.from_dir(translation_dir(tmp_path / "m"))
    translator.tgt_lang = "ja"
    monkeypatch.setattr("aiayn.decoding.translator.search", lambda *a, **k: pytest.fail("searched first"))
    sources, _ = translator.encode(["Ein Mann"])
    with pytest.raises(ConfigError, match=r"sacrebleu\[ja\]"):
        translator.search(sources, SearchConfig(beam=4, mbr="bleu"))


def test_translator_returns_the_beam_reordered_by_expected_utility(tmp_path):
    # a character model whose beam holds outputs of different lengths, which chrF tells apart
    translator = Translator.from_dir(translation_dir(tmp_path / "m", eos_bias=1.0))
    sources, _ = translator.encode(["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee!"])
    beam = translator.search(sources, SearchConfig(beam=4, nbest=4))
    mbr = translator.search(sources, SearchConfig(beam=4, nbest=4, mbr="chrf"))
    top = translator.search(sources, SearchConfig(beam=4, nbest=2, mbr="chrf"))
    assert mbr[1] == [] and top[1] == []  # blank lines stay blank
    for i in (0, 2):
        order = mbr_order([translator.detokenize(h) for h in beam[i]], "chrf")
        assert order[0] != 0  # the beam's best is not the consensus here: the order really changes
        assert [h.tokens for h in mbr[i]] == [beam[i][j].tokens for j in order]
        assert [h.score for h in mbr[i]] == [beam[i][j].score for j in order]  # the model's scores kept
        assert top[i] == mbr[i][:2]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(mbr="rouge"), "mbr='rouge' is not one of"),
        (dict(beam=1, mbr="bleu"), "give beam 2 or more"),
        (dict(beam=4, sample=True, mbr="chrf"), "give beam 2 or more (and no sampling)"),
    ],
)
def test_bad_mbr_options_are_refused_by_name(options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SearchConfig(**options)
