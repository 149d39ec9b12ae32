"""``Generator``: a language model reads at most the context it was trained on, the text cut to its
last tokens before each step as nanoGPT's sampling loop does, so a continuation is as long as asked."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn.decoding.generator import Generator, context
from aiayn.decoding.options import SearchConfig
from tests.decoding.fixtures import char_tokenizer, lm_dir, tiny_lm

WINDOW = 8


def nanogpt_greedy(model, ids: list[int], new: int, window: int) -> tuple[list[int], float]:
    """nanoGPT's ``generate`` (model.py), greedy: ``idx[:, -block_size:]`` through the whole model
    every step, the last position's argmax appended (pad and eos never chosen, as the search forbids
    them before ``min_len``); the tokens and the sum of their log-probabilities."""
    c, out, log_prob = model.config, [], 0.0
    for _ in range(new):
        logp = model(torch.tensor([(ids + out)[-window:]]))[0, -1].float().log_softmax(-1)
        allowed = logp.clone()
        allowed[[c.pad_id, c.eos_id]] = float("-inf")
        out.append(int(allowed.argmax()))
        log_prob += float(logp[out[-1]])
    return out, log_prob


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_greedy_continuation_past_the_context_is_nanogpts_cropped_loop(positional, use_cache):
    tok = char_tokenizer()
    model = tiny_lm(
        tok.vocab_size, positional=positional, max_len=WINDOW if positional == "learned" else 1024
    )
    gen = Generator(model, tok, trained_max_len=WINDOW)
    new = 3 * WINDOW  # the prompt (5 tokens) and its continuation pass the window twice over
    (hyp,) = gen.complete("Ein M", new, SearchConfig(beam=1, min_len=new, use_cache=use_cache))
    assert len(hyp.tokens) == new
    with torch.inference_mode():
        tokens, log_prob = nanogpt_greedy(model, tok.encode("Ein M"), new, WINDOW)
    assert hyp.tokens == tokens and hyp.log_prob == pytest.approx(log_prob, abs=1e-4)


def test_a_prompt_longer_than_the_context_is_read_from_its_end():
    tok = char_tokenizer()
    model = tiny_lm(tok.vocab_size, positional="learned", max_len=WINDOW)
    prompt = "Zwei Hunde spielen im Schnee"  # 28 characters, 3.5 windows
    (hyp,) = Generator(model, tok).complete(prompt, 6, SearchConfig(beam=1, min_len=6))
    with torch.inference_mode():
        tokens, log_prob = nanogpt_greedy(model, tok.encode(prompt), 6, WINDOW)
    assert hyp.tokens == tokens and hyp.log_prob == pytest.approx(log_prob, abs=1e-4)


def test_seeded_samples_are_the_same_with_and_without_the_cache():
    tok = char_tokenizer()
    gen = Generator(tiny_lm(tok.vocab_size, positional="learned", max_len=WINDOW), tok)
    samples = [
        [h.tokens for h in gen.complete("Ein ", 20, SearchConfig(sample=True, beam=1, nbest=3, seed=3,
                                                                 min_len=20, use_cache=cached))]
        for cached in (True, False)
    ]  # fmt: skip
    assert samples[0] == samples[1] and all(len(t) == 20 for t in samples[0])


def test_context_is_the_trained_one_within_the_positions():
    tok = char_tokenizer()
    learned = tiny_lm(tok.vocab_size, positional="learned", max_len=64).config
    computed = tiny_lm(tok.vocab_size).config
    assert computed.positional != "learned"
    assert context(learned, None) == 64 and context(learned, 16) == 16 and context(learned, 100) == 64
    assert context(computed, None) is None and context(computed, 16) == 16


def test_a_model_directory_gives_its_trained_context(tmp_path):
    """``trained_max_len`` in config.json (what LM training writes: its block_size) is the context."""
    path = lm_dir(tmp_path / "lm", positional="learned", max_len=64)
    assert Generator.from_dir(path).context == 64  # a directory that does not say: its positions
    meta = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**meta, "trained_max_len": 12}))
    assert Generator.from_dir(path).context == 12


def test_a_sentencepiece_continuation_keeps_the_space_before_its_first_word(monkeypatch):
    """Decoded on its own, a continuation's first piece ("▁rides") lost its word-start space: "A man"
    went on as "A manrides a bike", in generate and in the server's stream. It is decoded with the
    prompt now, and the prompt's own text cut off."""
    from aiayn.data.tokenizer import SentencePieceTokenizer
    from aiayn.decoding.beam import Hypothesis

    text = ["a man rides a bike", "a woman reads a book", "two dogs play in the park"] * 40
    tok = SentencePieceTokenizer.train([t.capitalize() for t in text] + text, 300)
    g = Generator(tiny_lm(vocab=tok.vocab_size), tok)
    prompt, whole = tok.encode("A man"), tok.encode("A man rides a bike")
    assert whole[: len(prompt)] == prompt and tok.decode(whole[len(prompt) :]) == "rides a bike"  # the loss
    assert g.continuation(prompt, whole[len(prompt) :]) == " rides a bike"
    monkeypatch.setattr(g, "complete", lambda *a: [Hypothesis(whole[len(prompt) :], 0.0, 0.0)])
    assert g.generate("A man", 4) == ["A man rides a bike"]
