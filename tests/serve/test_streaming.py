"""``LMService.stream``: the pieces a client receives join to the final text, even where one
character's bytes come from several tokens (byte-fallback pieces of a CJK character)."""

import torch

from aiayn import LanguageModel, LMConfig
from aiayn.data import SentencePieceTokenizer
from aiayn.decoding.adapters import LMAdapter
from aiayn.decoding.generator import Generator
from aiayn.decoding.options import SearchConfig
from aiayn.models.io import save_model
from aiayn.serve.services import LMService


def test_streamed_pieces_join_to_the_text_when_a_character_spans_tokens(tmp_path, monkeypatch):
    tok = SentencePieceTokenizer.train(["a good film", "the plot is dull"] * 50, 300)
    script = tok.encode("中文 a")  # byte-fallback pieces: three per character
    assert len(script) > 6
    torch.manual_seed(0)
    model = LanguageModel(LMConfig(vocab_size=tok.vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32))
    save_model(model, tmp_path / "lm")
    tok.save(tmp_path / "lm")
    service = LMService("lm", tmp_path / "lm")
    ids = iter([*script, service.model.config.eos_id])

    def scripted(self, prefix):  # the model "chooses" the script's next token
        log_probs = torch.full((prefix.size(0), tok.vocab_size), float("-inf"))
        log_probs[:, next(ids)] = 0.0
        return log_probs

    monkeypatch.setattr(LMAdapter, "step", scripted)
    pieces: list[str] = []
    emit = lambda p: pieces.append(p) or True  # noqa: E731
    text, made = service.stream(service.generator.encode("a"), len(script) + 1, SearchConfig(beam=1), emit)
    assert text == " 中文 a" and made == len(script)  # "▁中": a word's start, after the prompt "a"
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    # cut off after the first byte of "文" (max_new_tokens): the unfinished character still reaches
    # the client, so that the pieces join to the final text
    ids, pieces = iter(script), []
    text, made = service.stream(service.generator.encode("a"), 5, SearchConfig(beam=1), emit)
    assert made == 5 and text == " 中\ufffd" and "".join(pieces) == text


def test_a_stream_past_the_trained_context_is_the_generators_continuation(tmp_path):
    """The server streams as ``Generator`` decodes: past the 8 trained positions, each step reads
    the last 8 tokens; every token asked for comes, none read at an untrained position."""
    tok = SentencePieceTokenizer.train(["a good film", "the plot is dull"] * 50, 300)
    torch.manual_seed(0)
    config = LMConfig(vocab_size=tok.vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32,
                      positional="learned", max_len=8)  # fmt: skip
    save_model(LanguageModel(config), tmp_path / "lm")
    tok.save(tmp_path / "lm")
    service = LMService("lm", tmp_path / "lm")
    greedy = SearchConfig(beam=1, min_len=20)
    text, _ = service.stream(service.generator.encode("the plot"), 20, greedy, lambda _: True)
    (expected,) = service.generator.complete("the plot", 20, greedy)
    prompt = service.generator.encode("the plot")
    assert len(expected.tokens) == 20 and text == service.generator.continuation(prompt, expected.tokens)


def test_a_stream_never_emits_padding_nor_ends_before_min_len(tmp_path, monkeypatch):
    """The stream restricts each step as every search does (``steps.restrict``): the model prefers
    padding, then eos, then one piece; the stream writes that piece ``min_len`` times, then ends."""
    tok = SentencePieceTokenizer.train(["a good film", "the plot is dull"] * 50, 300)
    torch.manual_seed(0)
    model = LanguageModel(LMConfig(vocab_size=tok.vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32))
    save_model(model, tmp_path / "lm")
    tok.save(tmp_path / "lm")
    service = LMService("lm", tmp_path / "lm")
    c, piece = service.model.config, tok.encode("film")[-1]

    def preferring_padding(self, prefix):
        log_probs = torch.full((prefix.size(0), tok.vocab_size), -10.0)
        log_probs[:, [c.pad_id, c.eos_id, piece]] = torch.tensor([0.0, -1.0, -2.0])
        return log_probs

    monkeypatch.setattr(LMAdapter, "step", preferring_padding)
    for greedy in (True, False):
        config = (
            SearchConfig(beam=1, min_len=3)
            if greedy
            else SearchConfig(sample=True, beam=1, min_len=3, top_k=1, seed=0)
        )
        text, _ = service.stream(service.generator.encode("a"), 10, config, lambda _: True)
        assert text == " film film film"  # each "▁film" a word: the first one too, after "a"


def test_a_stream_lm_never_emits_the_ids_it_never_trained_on(tmp_path, monkeypatch):
    """An LM run records bos, unk and eos as ``untrained_ids`` (its text stream holds none of them;
    label smoothing gave them crumbs of probability): the generator and the server's stream never
    emit them, so an answer is as long as asked, not ended by an eos that means nothing."""
    tok = SentencePieceTokenizer.train(["a good film", "the plot is dull"] * 50, 300)
    torch.manual_seed(0)
    model = LanguageModel(LMConfig(vocab_size=tok.vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32))
    save_model(model, tmp_path / "lm", untrained_ids=[tok.bos_id, tok.unk_id, tok.eos_id])
    tok.save(tmp_path / "lm")
    piece = tok.encode("film")[-1]

    def preferring_specials(self, prefix):
        log_probs = torch.full((prefix.size(0), tok.vocab_size), -10.0)
        log_probs[:, [tok.eos_id, tok.unk_id, tok.bos_id, piece]] = torch.tensor([0.0, -0.5, -1.0, -3.0])
        return log_probs

    monkeypatch.setattr(LMAdapter, "step", preferring_specials)
    (hyp,) = Generator.from_dir(tmp_path / "lm").complete("a", 6, SearchConfig(beam=1))
    assert hyp.tokens == [piece] * 6
    service = LMService("lm", tmp_path / "lm")
    text, made = service.stream(service.generator.encode("a"), 6, SearchConfig(beam=1), lambda _: True)
    assert made == 6 and text == " film" * 6
