"""Tiny random models, model directories and a fake decoder for the decoding and CLI tests."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from aiayn import LanguageModel, LMConfig, Transformer, TransformerConfig, build_transformer
from aiayn.data.tokenizer import CharTokenizer, save_translation_tokenizers
from aiayn.models.io import save_model

TINY = dict(d_model=32, n_heads=4, d_ff=64, dropout=0.0)
TEXT = "Ein Mann fährt Fahrrad. A man rides a bike. Zwei Hunde spielen im Schnee! Two dogs play in snow?"


def tiny_transformer(vocab: int = 50, seed: int = 0, eos_bias: float = 0.0, **kw) -> Transformer:
    """A random 2+2-layer model; ``eos_bias`` > 0 makes eos likelier, so outputs vary in length."""
    torch.manual_seed(seed)
    sizes = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, n_encoder_layers=2, n_decoder_layers=2)
    cfg = TransformerConfig(output_bias=eos_bias != 0.0, **{**sizes, **TINY, **kw})
    model = build_transformer(cfg).eval()
    if eos_bias:
        with torch.no_grad():
            model.head.bias[cfg.eos_id] = eos_bias
    return model


def tiny_lm(vocab: int = 40, seed: int = 0, **kw) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(LMConfig(vocab_size=vocab, n_layers=2, **{**TINY, **kw})).eval()


def padded_sources() -> torch.Tensor:
    """Four random source rows (ids 4…49), two of them padded."""
    src = torch.randint(4, 50, (4, 9), generator=torch.Generator().manual_seed(1))
    src[1, 5:] = 0
    src[3, 2:] = 0
    return src


def char_tokenizer() -> CharTokenizer:
    return CharTokenizer.train(TEXT)


def translation_dir(path: Path, layout: str = "joint", **kw) -> Path:
    """A model directory: random model + character tokenizer(s), ``layout`` "joint" or "src-tgt"."""
    tok = char_tokenizer()
    save_model(tiny_transformer(tok.vocab_size, **kw), path)
    if layout == "joint":
        tok.save(path)
    else:
        save_translation_tokenizers(path, tok, tok)
    return path


def lm_dir(path: Path, **kw) -> Path:
    tok = char_tokenizer()
    save_model(tiny_lm(tok.vocab_size, **kw), path)
    tok.save(path)
    return path


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Translation directories in both tokenizer layouts (eos made likely: outputs vary) and an LM."""
    root = tmp_path_factory.mktemp("models")
    return {
        "joint": translation_dir(root / "joint", eos_bias=4.0),
        "src-tgt": translation_dir(root / "src-tgt", layout="src-tgt", eos_bias=4.0),
        "lm": lm_dir(root / "lm"),
    }


class FakeDecoder:
    """An adapter whose next-token probabilities are a function of the generated tokens.

    ``probs(generated) -> {token: probability}``; tokens not listed get a tiny probability.
    Ids: pad 0, bos 1, eos 2, then "a" = 3, "b" = 4. Counts the steps taken.
    """

    pad_id, bos_id, eos_id, vocab = 0, 1, 2, 5

    def __init__(self, probs: Callable[[list[int]], dict[int, float]]):
        self.probs, self.steps = probs, 0

    def start(self, inputs: torch.Tensor, n: int = 1) -> torch.Tensor:
        return torch.full((inputs.size(0) * n, 1), self.bos_id)

    def step(self, prefix: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        out = torch.full((prefix.size(0), self.vocab), math.log(1e-9))
        for r, row in enumerate(prefix[:, 1:].tolist()):
            for token, p in self.probs(row).items():
                out[r, token] = math.log(p)
        return out

    def reorder(self, index: torch.Tensor) -> None:
        pass

    def select(self, index: torch.Tensor) -> None:
        pass
