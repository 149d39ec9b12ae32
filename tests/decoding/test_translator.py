"""Model directories, Translator and Generator: layouts, order, blank lines, limits and errors."""

import pytest
import torch

from aiayn.data.tokenizer import CharTokenizer
from aiayn.decoding import Generator, SearchConfig, Translator
from aiayn.decoding.adapters import Seq2SeqAdapter
from aiayn.errors import ConfigError, DataError, ModelDirError
from aiayn.modules.kv_cache import DecoderCache
from tests.decoding.fixtures import char_tokenizer, tiny_transformer, translation_dir

LINES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde", "A", "   ", "spielen im Schnee!"]


def test_both_tokenizer_layouts_load_and_translate_alike(model_dirs):
    out = [
        Translator.from_dir(model_dirs[k]).translate(LINES, SearchConfig(beam=2))
        for k in ("joint", "src-tgt")
    ]
    assert out[0] == out[1]
    assert len(out[0]) == len(LINES)
    assert out[0][1] == "" and out[0][4] == ""  # blank lines stay blank


def test_batching_by_tokens_restores_the_input_order(model_dirs):
    translator = Translator.from_dir(model_dirs["joint"])
    lines = LINES * 3
    one_batch = translator.translate(lines, SearchConfig(beam=3), max_tokens=10_000)
    many_batches = translator.translate(lines, SearchConfig(beam=3), max_tokens=8)
    assert one_batch == many_batches
    alone = [translator.translate([line], SearchConfig(beam=3))[0] for line in LINES]
    assert one_batch[: len(LINES)] == alone


def test_default_output_limit_is_source_length_plus_50_or_min_len_plus_its_eos(tmp_path):
    translator = Translator.from_dir(translation_dir(tmp_path / "m", eos_bias=-50.0))  # never ends
    sources, _ = translator.encode(["Zwei Hunde"])
    assert len(translator.search(sources, SearchConfig(beam=1))[0][0].tokens) == len("Zwei Hunde") + 50
    hyp = translator.search(sources, SearchConfig(beam=1, min_len=100))[0][0]  # was cut at 60, then at 100
    assert len(hyp.tokens) == 101  # room for the eos a model that would end may put there


def test_long_lines_are_truncated_or_refused(model_dirs):
    translator = Translator.from_dir(model_dirs["joint"], max_src_len=6)
    sources, cut = translator.encode(LINES)
    assert cut == [0, 2, 5] and all(len(s) <= 5 for s in sources)
    with pytest.warns(UserWarning, match="line 1 truncated"):
        translator.translate(LINES[:1], SearchConfig(beam=1))
    with pytest.raises(DataError, match="line 2 has 11 source tokens, over the maximum of 6"):
        translator.encode(LINES[1:], strict=True)


def test_learned_positions_bound_source_and_output(tmp_path):
    translator = Translator.from_dir(translation_dir(tmp_path / "m", positional="learned", max_len=12))
    assert translator.max_src_len == 12
    sources, cut = translator.encode(["Ein Mann fährt Fahrrad."])
    assert cut == [0]
    hyp = translator.search(sources, SearchConfig(beam=2, min_len=10_000))[0][0]
    assert len(hyp.tokens) == 12  # bos + 11 fed tokens: every position the decoder has


def test_a_decoder_that_waits_for_a_callers_right_to_left_memory_is_refused_in_one_line():
    """``model.r2l_memory`` (the tutorial's module, its memory given by the caller) has no memory to
    decode with: refused when loaded for decoding, not with a traceback from inside the search."""
    tok = char_tokenizer()
    with pytest.raises(ConfigError, match="reads a right-to-left memory that only its caller gives"):
        Translator(tiny_transformer(tok.vocab_size, r2l_memory=True), tok, tok)


def test_a_bidirectional_model_with_learned_positions_reads_a_right_to_left_pass_cut_at_the_limit(tmp_path):
    """The right-to-left hypothesis is fed back as [bos] + its tokens: cut at the limit (no eos), it
    must still fit the learned positions (it stops one token earlier than the left-to-right pass)."""
    model_dir = translation_dir(tmp_path / "m", positional="learned", max_len=12, bidirectional=True)
    translator = Translator.from_dir(model_dir)
    sources, _ = translator.encode(["Ein Mann fährt Fahrrad."])
    hyp = translator.search(sources, SearchConfig(beam=2, min_len=10_000))[0][0]
    assert len(hyp.tokens) == 12 and len(hyp.r2l.tokens) == 11


def test_a_bidirectional_model_samples_with_its_right_to_left_pass_searched(tmp_path):
    """Sampling's options belong to the left-to-right pass; the right-to-left memory is a search."""
    model_dir = translation_dir(tmp_path / "m", bidirectional=True)
    translator = Translator.from_dir(model_dir)
    sources, _ = translator.encode(["Ein Mann fährt Fahrrad.", "Zwei Hunde"])
    config = SearchConfig(sample=True, beam=1, nbest=2, temperature=0.7, top_k=5, top_p=0.9, seed=3)
    first, again = (translator.search(sources, config) for _ in range(2))
    assert [[h.tokens for h in hs] for hs in first] == [[h.tokens for h in hs] for hs in again]
    assert all(len(hs) == 2 for hs in first)


def test_a_seeded_sample_of_a_sentence_depends_on_nothing_else_in_its_batch(tmp_path):
    """One shared stream of draws made a sentence's samples depend on the rows before it in its batch:
    a request's seed did not fix its output once the server batched it with another's. Each sentence now
    draws from streams of its own (its ids, the seed, its repeats); a repeated line still gets new ones."""
    translator = Translator.from_dir(translation_dir(tmp_path / "m"))
    (a, b, c), _ = translator.encode(["Ein Mann", "Zwei Hunde spielen im Park", "Eine Frau"])
    config = SearchConfig(sample=True, beam=1, nbest=2, seed=3, min_len=8, max_len=8)
    tokens = lambda hyps: [h.tokens for h in hyps]  # noqa: E731
    alone = tokens(translator.search([a], config)[0])
    assert tokens(translator.search([b, a, c], config)[1]) == alone
    assert tokens(translator.search([b, a, c], config, max_tokens=1)[1]) == alone  # one sentence a batch
    assert alone[0] != alone[1]  # the two samples of a sentence differ
    twice = [tokens(h) for h in translator.search([a, a], config)]
    assert twice[0] == alone and twice[1] != alone  # the line's second copy: new samples
    other_seed = tokens(translator.search([a], SearchConfig(sample=True, beam=1, nbest=2, seed=4, min_len=8,
                                                            max_len=8))[0])  # fmt: skip
    assert other_seed != alone


def test_generator_samples_reproducibly(model_dirs):
    gen = Generator.from_dir(model_dirs["lm"])
    cfg = SearchConfig(beam=1, sample=True, nbest=2, seed=5, top_k=10, min_len=15)
    a, b = gen.generate("Ein ", 15, cfg), gen.generate("Ein ", 15, cfg)
    assert a == b and len(a) == 2 and all(t.startswith("Ein ") and len(t) == 4 + 15 for t in a)
    with pytest.raises(ConfigError, match="prompt is empty"):
        gen.generate("", 5)


def test_directory_errors_say_what_is_wrong(model_dirs, tmp_path):
    with pytest.raises(ModelDirError, match="does not exist"):
        Translator.from_dir(tmp_path / "nope")
    with pytest.raises(
        ModelDirError, match="holds a language model .kind 'lm'.; this command needs a translation model"
    ):
        Translator.from_dir(model_dirs["lm"])
    with pytest.raises(
        ModelDirError, match="holds a translation model .*; this command needs a language model"
    ):
        Generator.from_dir(model_dirs["joint"])
    no_tok = translation_dir(tmp_path / "no-tok")
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(ModelDirError, match="has no tokenizer"):
        Translator.from_dir(no_tok)
    other = translation_dir(tmp_path / "other")
    CharTokenizer.train("xyz").save(other)
    with pytest.raises(ModelDirError, match="source tokenizer .vocab_size 7.* does not fit the model"):
        Translator.from_dir(other)


def test_beam_reorder_leaves_cross_attention_caches_alone():
    model = tiny_transformer(vocab=char_tokenizer().vocab_size)
    adapter = Seq2SeqAdapter(model)
    adapter.step(adapter.start(torch.randint(4, 20, (2, 5)), n=2))
    cache: DecoderCache = adapter.cache
    cross, own = cache.layers[0]["cross"].k, cache.layers[0]["self"].k
    cache.reorder(torch.tensor([1, 0, 3, 2]), static=False)
    assert cache.layers[0]["cross"].k is cross
    torch.testing.assert_close(cache.layers[0]["self"].k, own[[1, 0, 3, 2]])
    assert cross.size(0) == 2  # one memory row per sentence: its two beams share it
    adapter.select(torch.tensor([3, 2]))  # sentence 0 leaves
    torch.testing.assert_close(cache.layers[0]["cross"].k, cross[[1]])
    assert adapter.context.memory.size(0) == 1
    adapter.select(torch.tensor([1]))  # one beam of a sentence alone (a sample): rows get their own copy
    torch.testing.assert_close(cache.layers[0]["cross"].k, cross[[1]])
    assert adapter.group == 1 and adapter.context.memory.size(0) == 1


def test_a_beam_wider_than_the_vocabulary_is_refused_before_any_step(tmp_path, monkeypatch):
    """The check came after the first step had allocated beam × vocabulary log-probs: --beam 1000000
    was a traceback out of memory, not one line."""
    translator = Translator.from_dir(translation_dir(tmp_path / "m"))
    monkeypatch.setattr("aiayn.decoding.translator.search", lambda *a, **k: pytest.fail("searched first"))
    sources, _ = translator.encode(["Ein Mann"])
    with pytest.raises(ConfigError, match=r"beam=1000000 exceeds the vocabulary \(\d+ tokens\)"):
        translator.search(sources, SearchConfig(beam=1_000_000))
