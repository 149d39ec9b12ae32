"""BERT's WordPiece tokenization behind aiayn's tokenizer interface (``aiayn.data.tokenizer.Tokenizer``).

A BERT directory has ``vocab.txt`` (one WordPiece token per line, its id the line number) and
``tokenizer_config.json`` (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars`` and the
special tokens' names). HF's ``tokenizers`` library, which defines this tokenizer, does the work
as transformers' ``BertTokenizer`` builds it: special tokens such as ``[MASK]`` are cut out of the
raw text first; ``BertNormalizer`` cleans the rest (control characters dropped, whitespace made
spaces), spaces CJK ideographs apart, strips accents and lowercases for an uncased vocabulary;
``BertPreTokenizer`` splits at whitespace and around punctuation; ``WordPiece`` cuts each word
greedily into the longest tokens of the vocabulary (``##`` marks a continuation; a word that cannot
be cut, or is over 100 characters, is ``[UNK]``). The library is an optional dependency
(``pip install 'aiayn[hf]'``).

``encode`` returns no ``[CLS]``/``[SEP]``: they are the tokenizer's ``bos_id``/``eos_id``, which
aiayn's batching adds. aiayn's ``<mask>`` is read as ``[MASK]`` too, so ``aiayn fill-mask`` queries
work unchanged. ``decode`` equals ``BertTokenizer.decode(ids, skip_special_tokens=True)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from aiayn.atomic import write_json, write_text
from aiayn.data.tokenizer import MASK, Tokenizer
from aiayn.errors import ModelDirError
from aiayn.interop.hf import hf_tokenizers, read_json
from aiayn.textfiles import read_text

BERT_SPECIALS = dict(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]")
NEEDS = "BERT's WordPiece tokenizer"  # what the error names when the tokenizers library is missing


class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece tokenization of ``vocab.txt`` (see the module docstring): ``[CLS]``, ``[SEP]``,
    ``[PAD]`` and ``[UNK]`` are bos, eos, pad and unk; ``[MASK]`` is ``mask_id``.

    ``tokens`` lists the vocabulary in id order; ``strip_accents=None`` follows ``lowercase``, as in
    BERT; ``specials`` renames the special tokens (keys of ``BERT_SPECIALS``).
    """

    kind = "wordpiece"
    max_word = 100  # characters; a longer word is [UNK]

    def __init__(
        self,
        tokens: list[str],
        lowercase: bool = True,
        strip_accents: bool | None = None,
        chinese_chars: bool = True,
        **specials: str,
    ):
        lib = hf_tokenizers(NEEDS)
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}  # a repeated token: its last line, as in HF
        names = {**BERT_SPECIALS, **specials}
        missing = [names[k] for k in ("pad", "unk", "cls", "sep") if names[k] not in self.vocab]
        if missing:
            raise ModelDirError(f"the vocabulary lacks the special token(s) {missing}")
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            self.vocab[names[k]] for k in ("pad", "unk", "cls", "sep")
        )
        self.mask_id = self.vocab.get(names["mask"])
        self.vocab_size = len(self.tokens)
        self.lowercase, self.chinese_chars = lowercase, chinese_chars
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.names = names
        # as transformers' BertTokenizer builds it from the same files
        wordpiece = lib.models.WordPiece(
            self.vocab, unk_token=names["unk"], max_input_chars_per_word=self.max_word
        )
        self.wp = lib.Tokenizer(wordpiece)
        self.wp.normalizer = lib.normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=self.strip_accents,
            lowercase=lowercase,
        )  # fmt: skip
        self.wp.pre_tokenizer = lib.pre_tokenizers.BertPreTokenizer()
        self.wp.decoder = lib.decoders.WordPiece(prefix="##")
        specials_here = [names[k] for k in names if names[k] in self.vocab]
        self.wp.add_special_tokens([lib.AddedToken(t, special=True, normalized=False) for t in specials_here])

    def encode(self, text: str) -> list[int]:
        if self.mask_id is None:
            return self.wp.encode(text, add_special_tokens=False).ids
        ids = []
        for i, part in enumerate(text.split(MASK)):  # aiayn's "<mask>", as fill-mask writes it
            ids += ([self.mask_id] if i else []) + self.wp.encode(part, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.wp.decode(self._ids(ids), skip_special_tokens=True)

    def options(self) -> dict:
        """``tokenizer_config.json``'s fields for this tokenizer (what ``BertTokenizer`` reads)."""
        return {
            "tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.chinese_chars,
            **{f"{k}_token": v for k, v in self.names.items()},
        }  # fmt: skip

    def model_bytes(self) -> bytes:
        return json.dumps([self.tokens, self.options()], sort_keys=True).encode("utf-8")

    def save(self, directory: str | os.PathLike, max_len: int | None = None) -> Path:
        """``vocab.txt`` and ``tokenizer_config.json``, as ``BertTokenizer.save_pretrained`` writes them;
        with ``max_len``, its ``model_max_length`` (where ``truncation=True`` cuts: an export's)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text(directory / "vocab.txt", "".join(t + "\n" for t in self.tokens))
        limit = {} if max_len is None else {"model_max_length": max_len}
        write_json(directory / "tokenizer_config.json", {**self.options(), **limit})
        return directory


def _token_name(value) -> str | None:
    """A special token's name in tokenizer_config.json: a string, or an AddedToken's ``content``."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def load_bert_tokenizer(directory: str | os.PathLike) -> WordPieceTokenizer:
    """The WordPiece tokenizer of a BERT directory (``vocab.txt`` and, if there, ``tokenizer_config.json``,
    whose absence means BertTokenizer's defaults: lowercase); ``ModelDirError`` naming a file that is
    missing, corrupt or lacks a special token."""
    hf_tokenizers(NEEDS)
    directory = Path(directory)
    path = directory / "vocab.txt"
    text = read_text(
        path, "a BERT directory needs its WordPiece vocabulary", fix="download or restore it again"
    )
    lines = text.split("\n")
    if lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    tokens = [line.rstrip() for line in lines]  # as the tokenizers library reads vocab.txt
    config = directory / "tokenizer_config.json"
    options = read_json(config, "") if config.is_file() else {}
    flags = {}
    for key, name in (("lowercase", "do_lower_case"), ("strip_accents", "strip_accents"),
                      ("chinese_chars", "tokenize_chinese_chars")):  # fmt: skip
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            raise ModelDirError(f"{config}: {name} must be true or false, got {value!r}")
        if value is not None:
            flags[key] = value
    names = {k: _token_name(options.get(f"{k}_token")) for k in BERT_SPECIALS}
    try:
        return WordPieceTokenizer(tokens, **flags, **{k: v for k, v in names.items() if v})
    except ModelDirError as e:
        raise ModelDirError(f"{path}: {e}") from None
