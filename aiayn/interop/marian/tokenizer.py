"""OPUS-MT's tokenization behind aiayn's tokenizer interface (``aiayn.data.tokenizer.Tokenizer``).

A Marian directory has two sentencepiece models, ``source.spm`` and ``target.spm``, and a
``vocab.json`` mapping their pieces to the model's ids (which are *not* sentencepiece's ids; a
piece missing from vocab.json is ``<unk>``). ``tokenizer_config.json`` may say
``separate_vocabs: true``, and then the target side maps through ``target_vocab.json``.
Sentencepiece, the library that defines these models, does the segmentation; this module only maps
its pieces through the vocabulary.

``encode`` does what HF's ``MarianTokenizer`` does short of the final ``</s>``: a leading language
code such as ``>>fra<<`` becomes its own token, the rest goes through sentencepiece. The ``</s>``
Marian appends is added by aiayn's batching, which ends every source with eos, as for any aiayn
tokenizer (``encode`` returns content ids only). ``decode`` matches
``MarianTokenizer.decode(ids, skip_special_tokens=True)``: pad, eos and unk are dropped.
``save_marian_tokenizer`` goes the other way: aiayn's sentencepiece tokenizers as the files
``MarianTokenizer`` reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from aiayn.atomic import write_bytes, write_json
from aiayn.data.tokenizer import SentencePieceTokenizer, Tokenizer
from aiayn.errors import ModelDirError
from aiayn.interop.hf import read_json, read_vocab
from aiayn.textfiles import absent

SPIECE_UNDERLINE = "\u2581"


class MarianTokenizer(Tokenizer):
    """One side (source or target) of a Marian model's tokenization.

    ``vocab`` maps pieces to ids; ``eos``, ``pad`` and ``unk`` name the special pieces in it. The
    decoder of a Marian model starts from pad, so ``bos_id == pad_id``.
    """

    kind = "marian"

    def __init__(self, model: bytes, vocab: dict[str, int], eos="</s>", pad="<pad>", unk="<unk>"):
        missing = [p for p in (eos, pad, unk) if p not in vocab]
        if missing:
            raise ModelDirError(f"the vocabulary lacks the special piece(s) {missing}")
        self.model, self.vocab = model, vocab
        self.sp = spm.SentencePieceProcessor(model_proto=model)  # RuntimeError if model is corrupt
        self.pieces = {i: p for p, i in vocab.items()}
        self.eos_id, self.pad_id, self.unk_id = vocab[eos], vocab[pad], vocab[unk]
        self.bos_id = self.pad_id
        self.vocab_size = max(vocab.values()) + 1  # every id a piece holds may be emitted (a gap: nothing)
        self.skip = {self.eos_id, self.pad_id, self.unk_id}

    def encode(self, text: str) -> list[int]:
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:  # a target-language token
            code, text = [text[: end + 2]], text[end + 2 :]
        unk, vocab = self.unk_id, self.vocab
        return [vocab.get(p, unk) for p in code + self.sp.encode(text, out_type=str)]

    def decode(self, ids: Iterable[int]) -> str:
        held = (self.pieces.get(i) for i in self._ids(ids) if i not in self.skip)
        pieces = [p for p in held if p is not None]  # an id no piece has (a gap in vocab.json): dropped
        return self.sp.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()

    def model_bytes(self) -> bytes:
        return self.model + json.dumps(self.vocab, sort_keys=True).encode("utf-8")


def load_marian_tokenizers(directory: str | os.PathLike) -> tuple[MarianTokenizer, MarianTokenizer]:
    """The (source, target) tokenizers of a Marian directory; ``ModelDirError`` naming a file that
    is missing, corrupt or does not fit."""
    directory = Path(directory)
    incomplete = "not a complete Marian (OPUS-MT) directory"
    config = directory / "tokenizer_config.json"
    options = read_json(config, "") if config.is_file() else {}
    specials = {
        k: options[f"{k}_token"] for k in ("eos", "pad", "unk") if isinstance(options.get(f"{k}_token"), str)
    }
    vocab_file = "target_vocab.json" if options.get("separate_vocabs") else "vocab.json"
    vocab = read_vocab(directory / "vocab.json", incomplete)
    tgt_vocab = read_vocab(directory / vocab_file, incomplete) if vocab_file != "vocab.json" else vocab
    sides = []
    for name, v, v_file in (("source.spm", vocab, "vocab.json"), ("target.spm", tgt_vocab, vocab_file)):
        path = directory / name
        if not path.is_file():
            raise ModelDirError(f"{path} {absent(path)}: {incomplete}")
        try:
            sides.append(MarianTokenizer(path.read_bytes(), v, **specials))
        except RuntimeError:  # sentencepiece's "INTERNAL: … [model_proto->ParseFromArray(…)]"
            raise ModelDirError(
                f"{path} is not a valid sentencepiece model (its bytes do not parse: truncated or "
                "corrupt); download or restore it again"
            ) from None
        except ModelDirError as e:
            raise ModelDirError(f"{directory / v_file}: {e}") from None
    return sides[0], sides[1]


def save_marian_tokenizer(
    directory: str | os.PathLike,
    src: Tokenizer,
    tgt: Tokenizer,
    src_lang: str | None,
    tgt_lang: str | None,
    max_len: int = 512,
) -> Path:
    """Write the files of HF's ``MarianTokenizer`` for aiayn's sentencepiece tokenizers:
    ``source.spm``/``target.spm`` (the models as they are), ``vocab.json`` (every piece -> its id:
    aiayn's ids *are* sentencepiece's), ``target_vocab.json`` when the vocabularies differ, and a
    ``tokenizer_config.json`` that makes ``<s>`` (the decoder's start) special, so that
    ``decode(..., skip_special_tokens=True)`` drops it, and whose ``model_max_length`` is the model's
    ``max_len`` (its position table: ``truncation=True`` then cuts there). A tokenizer that is not
    sentencepiece (characters, an imported Marian or GPT-2 one) is a ``ModelDirError``:
    MarianTokenizer segments with sentencepiece only."""
    for side, tok in (("source", src), ("target", tgt)):
        if not isinstance(tok, SentencePieceTokenizer):
            raise ModelDirError(
                f"the {side} tokenizer is {type(tok).__name__}; MarianTokenizer needs sentencepiece"
            )
    directory = Path(directory)
    vocab = {tok.sp.id_to_piece(i): i for tok in (src,) for i in range(tok.vocab_size)}
    separate = src.model_bytes() != tgt.model_bytes()
    write_bytes(directory / "source.spm", src.model_bytes())
    write_bytes(directory / "target.spm", tgt.model_bytes())
    write_json(directory / "vocab.json", vocab)
    if separate:
        write_json(directory / "target_vocab.json", {tgt.sp.id_to_piece(i): i for i in range(tgt.vocab_size)})
    piece = src.sp.id_to_piece  # the specials by the model's own pieces (a sentencepiece trained with
    # --pad_piece=[PAD] names its own; MarianTokenizer refuses a pad token its vocabulary lacks)
    write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "source_lang": src_lang, "target_lang": tgt_lang,
        "separate_vocabs": separate, "unk_token": piece(src.unk_id), "eos_token": piece(src.eos_id),
        "pad_token": piece(src.pad_id), "bos_token": piece(src.bos_id), "model_max_length": max_len,
    })  # fmt: skip
    return directory
