"""``LMService.stream``: the pieces a client receives join to the final text, even where one
character's bytes come from several tokens (byte-fallback pieces of a CJK character)."""

import torch

from aiayn import LanguageModel, LMConfig
from aiayn.data import SentencePieceTokenizer
from aiayn.decoding.adapters import LMAdapter
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
    text = service.stream("a", len(script) + 1, SearchConfig(beam=1), lambda p: pieces.append(p) or True)
    assert text == tok.decode(script) == "中文 a"
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)


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
    text = service.stream("the plot", 20, greedy, lambda _: True)
    (expected,) = service.generator.complete("the plot", 20, greedy)
    assert len(expected.tokens) == 20 and text == tok.decode(expected.tokens)
