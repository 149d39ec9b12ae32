"""One entry point for local model directories, aiayn's own or Hugging Face's, and one for export.

``from_pretrained(path)`` reads ``path/config.json``: with aiayn's ``kind`` field it is
``aiayn.models.io.load_model``; with HF's ``model_type`` it is ``"marian"`` (OPUS-MT, as a
``Transformer``), ``"gpt2"`` (as a ``LanguageModel``) or ``"bert"`` (as an ``EncoderModel``).
Nothing is downloaded: fetch a model first
(``huggingface-cli download Helsinki-NLP/opus-mt-de-en --local-dir opus-mt-de-en``).
``export_hf(model, out)`` writes the HF directory of a ``Transformer`` (MarianMT), a
``LanguageModel`` (GPT-2) or an ``EncoderModel`` (BERT), refusing, with the reason, what those
architectures cannot express.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from aiayn.data.tokenizer import META_FILE, Tokenizer, load_tokenizer
from aiayn.errors import ConfigError, ModelDirError
from aiayn.interop.bert import export_bert, load_bert
from aiayn.interop.gpt2 import GPT2Tokenizer, export_gpt2, load_gpt2, load_gpt2_tokenizer
from aiayn.interop.hf import AIAYN_TOKENIZER, HF_CONFIG, read_hf_config
from aiayn.interop.marian import MarianTokenizer, export_marian, load_marian, load_marian_tokenizers
from aiayn.models.encoder import EncoderModel
from aiayn.models.io import load_model
from aiayn.models.lm import LanguageModel
from aiayn.models.transformer import Transformer

M = TypeVar("M", Transformer, LanguageModel)


def hf_model_type(path: str | os.PathLike) -> str | None:
    """HF's ``model_type`` of a directory, or None for anything else (an aiayn directory, say)."""
    if not (Path(path) / HF_CONFIG).is_file():
        return None
    model_type = read_hf_config(path).get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ModelDirError(f"{Path(path) / HF_CONFIG}: 'model_type' must be a string, got {model_type!r}")
    return model_type


def from_pretrained(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    pad_id: int | None = None,
) -> nn.Module:
    """The model in a local directory, in eval mode.

    ``pad_id`` only matters for GPT-2, which has no padding token (see ``aiayn.interop.gpt2``); given
    for any other model, whose padding id is its own, it is refused rather than ignored.
    """
    model_type = hf_model_type(path)
    if pad_id is not None and model_type != "gpt2":
        raise ConfigError(f"pad_id={pad_id} is for GPT-2 directories (which have no padding token); "
                          f"{path} has its own ({model_type or 'aiayn'}): leave pad_id out")  # fmt: skip
    if model_type is None:
        model = load_model(path)
    elif model_type == "marian":
        model = load_marian(path)
    elif model_type == "gpt2":
        model = load_gpt2(path, pad_id)
    elif model_type == "bert":
        model = load_bert(path)
    else:
        raise unsupported(path, model_type)
    return model.to(device=device, dtype=dtype).eval()


def unsupported(path: str | os.PathLike, model_type: str) -> ModelDirError:
    """The error for a Hugging Face directory of a model type aiayn does not read."""
    return ModelDirError(
        f"{Path(path) / HF_CONFIG}: model_type {model_type!r} is not supported; "
        "aiayn reads marian (OPUS-MT), gpt2, bert and its own model directories"
    )


def _check_fit(directory, side: str, tok, size: int, eos_id: int, pad_id: int) -> None:
    if (tok.eos_id, tok.pad_id) != (eos_id, pad_id) or tok.vocab_size > size:
        raise ModelDirError(
            f"{directory}: the {side}vocabulary (size {tok.vocab_size}, eos {tok.eos_id}, pad {tok.pad_id}) "
            f"does not fit config.json (size {size}, eos {eos_id}, pad {pad_id})"
        )


def load_gpt2_generation(
    directory: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[LanguageModel, GPT2Tokenizer | Tokenizer]:
    """``(model, tokenizer)`` of a GPT-2 directory (what ``aiayn generate --model DIR`` runs): GPT-2's
    byte-level BPE, or the aiayn tokenizer that ``aiayn export`` writes into ``aiayn_tokenizer/``
    for a model trained with one."""
    if (Path(directory) / AIAYN_TOKENIZER / META_FILE).is_file():
        tok = load_tokenizer(Path(directory) / AIAYN_TOKENIZER)
        model = from_pretrained(directory, device, pad_id=tok.pad_id)
    else:
        model = from_pretrained(directory, device)
        tok = load_gpt2_tokenizer(directory, pad_id=model.config.pad_id)
    _check_fit(directory, "", tok, model.config.vocab_size, model.config.eos_id, model.config.pad_id)
    return limit_to(model, tok.vocab_size), tok


def load_marian_translation(
    directory: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[Transformer, MarianTokenizer, MarianTokenizer]:
    """``(model, source tokenizer, target tokenizer)`` of an OPUS-MT directory, checked together
    (what ``aiayn translate --model DIR`` runs for a Marian directory)."""
    model, (src, tgt) = from_pretrained(directory, device), load_marian_tokenizers(directory)
    c = model.config
    _check_fit(directory, "source ", src, c.src_vocab_size, c.eos_id, c.pad_id)
    _check_fit(directory, "target ", tgt, c.tgt_vocab_size, c.eos_id, c.pad_id)
    return limit_to(model, tgt.vocab_size), src, tgt


def limit_to(model: M, words: int) -> M:
    """``model``, told that its output rows from ``words`` on have no token in its tokenizer (a
    checkpoint's vocabulary padded to a round size, as nanoGPT's 50,304 for GPT-2's 50,257), so that
    no search ever emits them (``decoding.steps.restrict``); transformers would, and drop them from
    the text."""
    rows = model.config.vocab_size if isinstance(model, LanguageModel) else model.config.tgt_vocab_size
    if words < rows:
        model.vocab_limit = words
    return model


def export_hf(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``model`` as an HF directory: MarianMT for a ``Transformer``, GPT-2 for a ``LanguageModel``,
    BERT for an ``EncoderModel``."""
    if isinstance(model, Transformer):
        return export_marian(model, directory)
    if isinstance(model, LanguageModel):
        return export_gpt2(model, directory)
    if isinstance(model, EncoderModel):
        return export_bert(model, directory)
    raise ModelDirError(
        f"cannot export a {type(model).__name__} to HF: only a Transformer (as MarianMT), a LanguageModel "
        "(as GPT-2) or an EncoderModel (as BERT) maps to a Hugging Face architecture"
    )
