"""Loading a model directory for inference, aiayn's or Hugging Face's: the model plus its
tokenizer(s), checked together.

A model directory holds what ``aiayn.models.io.save_model`` writes (``config.json`` +
``model.safetensors``) and the tokenizers the data module saves beside it:

- a translation model (kind ``"transformer"``): ``src/`` and ``tgt/`` tokenizer folders
  (``aiayn.data.save_translation_tokenizers``; a joint vocabulary is saved in both), or one joint
  tokenizer in the directory itself (``tokenizer.save(dir)``);
- a language model (kind ``"lm"``) or an encoder-only model (kind ``"encoder"``): one tokenizer in
  the directory itself (and, for a classifier, the class names under ``labels`` in ``config.json``).

Every problem (no such directory, a corrupt checkpoint, a model of the wrong kind for the command,
a tokenizer whose vocabulary does not fit the model) is a ``ModelDirError`` (or, for a tokenizer
file that cannot be read, a ``DataError``) whose message names the path and says what to do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from aiayn.data.tokenizer import META_FILE, Tokenizer, load_tokenizer, load_translation_tokenizers
from aiayn.errors import ModelDirError
from aiayn.interop.bert import WordPieceTokenizer, bert_tokenizer, kept_fields, load_bert_dir
from aiayn.interop.hf import read_hf_config
from aiayn.interop.pretrained import hf_model_type, load_gpt2_generation, load_marian_translation, unsupported
from aiayn.models.io import load_model, read_config, resolve_model_dir

KIND_NAMES = {
    "transformer": "translation model (kind 'transformer')",
    "lm": "language model (kind 'lm')",
    "encoder": "encoder-only model (kind 'encoder')",
}


def _article(name: str) -> str:
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


HF_KINDS = {"marian": "transformer", "gpt2": "lm", "bert": "encoder"}  # HF model_type -> aiayn kind


def model_meta(directory: str | os.PathLike) -> dict:
    """``config.json`` of an aiayn directory (``kind``, ``config``, extras such as ``src_lang``), or
    for a Hugging Face directory that aiayn can load its ``kind`` and, for a Marian model whose
    ``tokenizer_config.json`` names them (OPUS-MT's, aiayn's exports), ``src_lang`` and ``tgt_lang``."""
    hf_type = hf_model_type(directory)
    if hf_type is None:
        return read_config(directory)
    if hf_type not in HF_KINDS:
        raise unsupported(directory, hf_type)
    meta = {"kind": HF_KINDS[hf_type]}
    if hf_type == "marian":
        langs = _marian_languages(Path(directory) / "tokenizer_config.json")
        meta.update({k: v for k, v in zip(("src_lang", "tgt_lang"), langs, strict=True) if v})
    if hf_type == "bert":  # an aiayn export's own fields (its tables' columns, its long-text policy)
        meta.update(kept_fields(read_hf_config(directory)))
    if hf_type == "gpt2":  # an aiayn export's trained context and never-trained ids: a re-export keeps them
        config = read_hf_config(directory)
        meta.update(
            {k: config[f"aiayn_{k}"] for k in ("trained_max_len", "untrained_ids") if f"aiayn_{k}" in config}
        )
    return meta


def _marian_languages(path: Path) -> tuple[str | None, str | None]:
    """``source_lang`` and ``target_lang`` of a MarianTokenizer's config (None where not a string)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no such file, or not JSON: the languages are unknown
        return None, None
    if not isinstance(config, dict):
        return None, None
    pick = lambda k: v if isinstance(v := config.get(k), str) and v else None  # noqa: E731
    return pick("source_lang"), pick("target_lang")


def check_kind(directory: str | os.PathLike, kinds: tuple[str, ...]) -> str:
    """The model kind of ``directory``; a ``ModelDirError`` if it is not one of ``kinds``."""
    kind = model_meta(directory)["kind"]
    if kind not in kinds:
        name = KIND_NAMES.get(kind, f"model of kind {kind!r}")
        wanted = " or ".join(_article(KIND_NAMES[k]) for k in kinds)
        raise ModelDirError(f"{directory} holds {_article(name)}; this command needs {wanted}")
    return kind


def _check_vocab(directory: Path, tok: Tokenizer, vocab_size: int, eos_id: int, side: str) -> None:
    if tok.vocab_size != vocab_size or tok.eos_id != eos_id:
        raise ModelDirError(
            f"{directory}: the {side}tokenizer (vocab_size {tok.vocab_size}, eos_id {tok.eos_id}) does not "
            f"fit the model (vocab_size {vocab_size}, eos_id {eos_id}); save the tokenizer the model was "
            "trained with into the model directory"
        )


def load_translation_dir(
    directory: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Tokenizer, Tokenizer]:
    """``(model, src_tokenizer, tgt_tokenizer)`` of a translation model directory (or of a training
    run: its best checkpoint), in eval mode."""
    directory = resolve_model_dir(directory)
    if hf_model_type(directory) == "marian":  # a downloaded OPUS-MT model (docs/interop.md)
        return load_marian_translation(directory, device)
    check_kind(directory, ("transformer",))
    if (directory / "src" / META_FILE).is_file():
        src_tok, tgt_tok = load_translation_tokenizers(directory)
    elif (directory / META_FILE).is_file():
        src_tok = tgt_tok = load_tokenizer(directory)
    else:
        raise ModelDirError(
            f"{directory} has no tokenizer: expected src/{META_FILE} and tgt/{META_FILE} "
            f"(aiayn.data.save_translation_tokenizers) or a joint {META_FILE}"
        )
    model = load_model(directory, device)
    c = model.config
    _check_vocab(directory, src_tok, c.src_vocab_size, c.eos_id, "source ")
    _check_vocab(directory, tgt_tok, c.tgt_vocab_size, c.eos_id, "target ")
    return model, src_tok, tgt_tok


def load_lm_dir(
    directory: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Tokenizer, dict]:
    """``(model, tokenizer, meta)`` of a language-model directory (or of a training run: its best
    checkpoint), in eval mode; ``meta`` is its ``config.json`` (``trained_max_len``: the context it
    was trained on; ``untrained_ids``: the ids it never had as targets); for a GPT-2 directory only
    those that aiayn's export keeps, if it is one (a downloaded GPT-2 trained every position and id)."""
    directory = resolve_model_dir(directory)
    if hf_model_type(directory) == "gpt2":  # a downloaded GPT-2 (docs/interop.md), or aiayn's export
        hf = read_hf_config(directory)  # an export of an aiayn run keeps what its run recorded
        meta = {k: hf[f"aiayn_{k}"] for k in ("trained_max_len", "untrained_ids") if hf.get(f"aiayn_{k}")}
        return (*load_gpt2_generation(directory, device), meta)
    check_kind(directory, ("lm",))
    tok = load_tokenizer(directory)
    model = load_model(directory, device)
    _check_vocab(directory, tok, model.config.vocab_size, model.config.eos_id, "")
    return model, tok, read_config(directory)


def load_encoder_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """The tokenizer of an encoder-only model directory: aiayn's own (``tokenizer.json``), or BERT's
    WordPiece vocabulary (``vocab.txt``: an imported BERT, or a run fine-tuned from one)."""
    tok = bert_tokenizer(directory)
    if tok is None:
        raise ModelDirError(
            f"{directory} has no tokenizer: expected aiayn's {META_FILE} or BERT's vocab.txt; save the "
            "tokenizer the model was trained with into the model directory"
        )
    return tok


def load_encoder_dir(
    directory: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Tokenizer, dict]:
    """``(model, tokenizer, meta)`` of an encoder-only model directory (or of a training run: its
    best checkpoint), in eval mode; ``meta`` is its ``config.json`` (``labels`` for a classifier)."""
    directory = resolve_model_dir(directory)
    if hf_model_type(directory) == "bert":  # a downloaded or exported BERT (docs/interop.md)
        return load_bert_dir(directory, device)
    check_kind(directory, ("encoder",))
    tok = load_encoder_tokenizer(directory)
    model = load_model(directory, device)
    rows = model.config.vocab_size
    if isinstance(tok, WordPieceTokenizer) and tok.vocab_size < rows:  # a BERT's vocab.txt: its
        rows = tok.vocab_size  # embedding may have more rows than words (as load_bert_dir accepts)
    _check_vocab(directory, tok, rows, model.config.eos_id, "")
    meta = read_config(directory)
    labels = meta.get("labels")
    if model.config.n_classes and (
        not isinstance(labels, list) or len(labels) != model.config.n_classes
        or not all(isinstance(x, str) for x in labels)
    ):  # fmt: skip
        raise ModelDirError(
            f"{directory / 'config.json'}: 'labels' must list the model's {model.config.n_classes} class "
            "names (strings); restore the file from the training run"
        )
    return model, tok, meta
