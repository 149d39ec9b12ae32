"""OPUS-MT's tokenization behind aiayn's tokenizer interface (``aiayn.data.tokenizer.Tokenizer``).

A Marian directory has two sentencepiece models, ``source.spm`` and ``target.spm``, and a
``vocab.json`` mapping their pieces to the model's ids (which are *not* sentencepiece's ids; a
piece missing from vocab.json is ``<unk>``). ``tokenizer_config.json`` may say
``separate_vocabs: true``, and then the target side maps through ``target_vocab.json``.

``encode`` does what HF's ``MarianTokenizer`` does short of the final ``</s>``: a leading language
code such as ``>>fra<<`` becomes its own token, the rest goes through sentencepiece. The ``</s>``
Marian appends is added by aiayn's batching, which ends every source with eos, as for any aiayn
tokenizer (``encode`` returns content ids only). ``decode`` matches
``MarianTokenizer.decode(ids, skip_special_tokens=True)``: pad, eos and unk are dropped.

A GPT-2 directory has ``vocab.json`` and ``merges.txt``: byte-level BPE. ``GPT2Tokenizer`` splits
text with GPT-2's pattern (which needs the ``regex`` package, a dependency of transformers), maps
each piece's UTF-8 bytes to printable characters and applies the merges by rank, as HF's
``GPT2Tokenizer`` does. ``decode`` drops ``<|endoftext|>`` only: GPT-2's aiayn ``pad_id`` is a real
token (``aiayn/interop/gpt2.py``), which a decoded continuation must keep.

A BERT directory has ``vocab.txt`` (one WordPiece token per line, its id the line number) and
``tokenizer_config.json`` (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars`` and the
special tokens' names). ``WordPieceTokenizer`` does what HF's ``BertTokenizer`` (the tokenizers
library's ``BertNormalizer``, ``BertPreTokenizer`` and ``WordPiece``) does: special tokens such as
``[MASK]`` are cut out of the raw text first; the rest is cleaned (control characters dropped,
whitespace made spaces), CJK ideographs spaced apart, accents stripped and letters lowercased (per
character) for an uncased vocabulary, split at whitespace and around punctuation, and each word
cut greedily into the longest tokens of the vocabulary (``##`` marks a continuation; a word that
cannot be cut, or is over 100 characters, is ``[UNK]``). ``encode`` returns no ``[CLS]``/``[SEP]``:
they are the tokenizer's ``bos_id``/``eos_id``, which aiayn's batching adds. aiayn's ``<mask>`` is
read as ``[MASK]`` too, so ``aiayn fill-mask`` queries work unchanged. ``decode`` equals
``BertTokenizer.decode(ids, skip_special_tokens=True)``.
"""

from __future__ import annotations

import json
import os
import re
import string
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import sentencepiece as spm

from aiayn.atomic import write_bytes, write_json, write_text
from aiayn.data.tokenizer import MASK, SentencePieceTokenizer, Tokenizer
from aiayn.errors import ModelDirError
from aiayn.interop.hf import read_json
from aiayn.textfiles import read_text

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
        self.vocab_size = len(vocab)
        self.skip = {self.eos_id, self.pad_id, self.unk_id}

    def encode(self, text: str) -> list[int]:
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:  # a target-language token
            code, text = [text[: end + 2]], text[end + 2 :]
        unk, vocab = self.unk_id, self.vocab
        return [vocab.get(p, unk) for p in code + self.sp.encode(text, out_type=str)]

    def decode(self, ids: Iterable[int]) -> str:
        pieces = [self.pieces.get(i) or self.sp.id_to_piece(i) for i in self._ids(ids) if i not in self.skip]
        return self.sp.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()

    def model_bytes(self) -> bytes:
        return self.model + json.dumps(self.vocab, sort_keys=True).encode("utf-8")


def _read_vocab(path: Path, missing: str) -> dict[str, int]:
    """A piece -> id map from a ``vocab.json``, checked: every id is an integer ≥ 0."""
    vocab = read_json(path, missing)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in vocab.values()):
        raise ModelDirError(f"{path} does not map pieces to integer ids ≥ 0; download or restore it again")
    return vocab


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
    vocab = _read_vocab(directory / "vocab.json", incomplete)
    tgt_vocab = _read_vocab(directory / vocab_file, incomplete) if vocab_file != "vocab.json" else vocab
    sides = []
    for name, v, v_file in (("source.spm", vocab, "vocab.json"), ("target.spm", tgt_vocab, vocab_file)):
        path = directory / name
        if not path.is_file():
            raise ModelDirError(f"{path} is missing: {incomplete}")
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


# GPT-2's pre-tokenizer: contractions, letters, digits, other symbols, each with one leading space
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> character map: printable bytes map to themselves, the others to
    characters from U+0100 up, so that every BPE piece is a printable string."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = (b for b in range(256) if b not in keep)
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


class GPT2Tokenizer(Tokenizer):
    """GPT-2's byte-level BPE (``vocab.json`` + ``merges.txt``); ``eos`` names the end-of-text token."""

    kind = "gpt2"

    def __init__(
        self, vocab: dict[str, int], merges: list[tuple[str, str]], eos="<|endoftext|>", pad_id=None
    ):
        try:
            import regex
        except ImportError:
            raise ImportError("GPT-2's tokenizer needs the regex package: pip install regex") from None
        self.pattern = regex.compile(GPT2_PATTERN)
        self.vocab, self.ranks = vocab, {pair: i for i, pair in enumerate(merges)}
        self.pieces = {i: p for p, i in vocab.items()}
        if eos not in vocab:
            raise ModelDirError(f"the vocabulary lacks the end-of-text piece {eos!r}")
        self.eos_id = self.bos_id = self.unk_id = vocab[eos]
        self.pad_id = self.eos_id if pad_id is None else pad_id  # set to the model's (gpt2.py)
        self.vocab_size = len(vocab)
        self.byte_to_char = bytes_to_unicode()
        self.char_to_byte = {c: b for b, c in self.byte_to_char.items()}
        self.cache: dict[str, list[str]] = {}

    def _bpe(self, word: str) -> list[str]:
        """Merge the characters of ``word`` pairwise, lowest merge rank first, until none applies."""
        if word in self.cache:
            return self.cache[word]
        parts, never = list(word), len(self.ranks)
        while len(parts) > 1:
            rank, i = min((self.ranks.get(pair, never), i) for i, pair in enumerate(zip(parts, parts[1:])))
            if rank == never:
                break
            pair, merged, i = (parts[i], parts[i + 1]), [], 0
            while i < len(parts):  # every occurrence of the pair, left to right
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
                    merged.append(pair[0] + pair[1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self.cache[word] = parts
        return parts

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in self.pattern.findall(text):
            chars = "".join(self.byte_to_char[b] for b in word.encode("utf-8"))
            ids += [self.vocab[p] for p in self._bpe(chars)]
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        text = "".join(self.pieces[i] for i in self._ids(ids) if i != self.eos_id)
        return bytes(self.char_to_byte[c] for c in text).decode("utf-8", errors="replace")

    def model_bytes(self) -> bytes:
        return json.dumps([self.vocab, sorted(self.ranks, key=self.ranks.get)], sort_keys=True).encode(
            "utf-8"
        )


def load_gpt2_tokenizer(directory: str | os.PathLike, pad_id: int | None = None) -> GPT2Tokenizer:
    """The tokenizer of a GPT-2 directory; ``ModelDirError`` naming a file that is missing or corrupt."""
    directory = Path(directory)
    vocab = _read_vocab(directory / "vocab.json", "not a complete GPT-2 directory")
    path = directory / "merges.txt"
    lines = read_text(path, "not a complete GPT-2 directory", fix="download or restore it again").splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    # encode looks up every byte character and every merge result in vocab.json: check them once here
    unknown = [c for c in bytes_to_unicode().values() if c not in vocab]
    unknown += ["".join(m) for m in merges if "".join(m) not in vocab]
    if unknown:
        raise ModelDirError(
            f"{path} and {directory / 'vocab.json'} do not belong together: {len(unknown)} piece(s) "
            f"such as {unknown[0]!r} are missing from the vocabulary; download or restore both again"
        )
    try:
        return GPT2Tokenizer(vocab, merges, pad_id=pad_id)
    except ModelDirError as e:
        raise ModelDirError(f"{directory / 'vocab.json'}: {e}") from None


# the tokenizers library's WordPiece decoder cleans each token's text with these replacements, in order
WORDPIECE_CLEANUP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
    (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip
CJK_RANGES = (  # BERT's "Chinese characters": the CJK Unified Ideographs blocks
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip
BERT_SPECIALS = dict(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]")


def _is_punctuation(ch: str) -> bool:
    """ASCII punctuation and symbols (``$``, ``+``, ``^``, …) or any Unicode punctuation (P*)."""
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece tokenization of ``vocab.txt`` (see the module docstring): ``[CLS]``, ``[SEP]``,
    ``[PAD]`` and ``[UNK]`` are bos, eos, pad and unk; ``[MASK]`` is ``mask_id``.

    ``tokens`` lists the vocabulary in id order; ``strip_accents=None`` follows ``lowercase``, as in
    BERT; ``specials`` renames the special tokens (keys of ``BERT_SPECIALS``).
    """

    kind = "wordpiece"
    prefix = "##"  # marks a token that continues a word
    max_word = 100  # characters; a longer word is [UNK]

    def __init__(
        self,
        tokens: list[str],
        lowercase: bool = True,
        strip_accents: bool | None = None,
        chinese_chars: bool = True,
        **specials: str,
    ):
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
        self.specials = {names[k]: self.vocab[names[k]] for k in names if names[k] in self.vocab}
        self.skip = set(self.specials.values())
        if self.mask_id is not None:
            self.specials[MASK] = self.mask_id  # aiayn's "<mask>", as fill-mask writes it
        alternatives = sorted(self.specials, key=len, reverse=True)  # leftmost, then longest
        self.special_pattern = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")

    def _normalize(self, text: str) -> str:
        """BertNormalizer: clean, space CJK ideographs apart, strip accents, lowercase."""
        out = []
        for ch in text:
            if ch in "\t\n\r":  # control characters that count as whitespace
                out.append(" ")
            elif ch == "\ufffd" or unicodedata.category(ch).startswith("C"):  # control, format, unassigned
                continue
            elif ch.isspace():
                out.append(" ")
            elif self.chinese_chars and any(lo <= ord(ch) <= hi for lo, hi in CJK_RANGES):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = "".join(out)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        return "".join(c.lower() for c in text) if self.lowercase else text  # per character, as Rust does

    def _words(self, text: str) -> list[str]:
        """BertPreTokenizer: split at whitespace, and every punctuation character is a word."""
        words = []
        for chunk in text.split():
            start = 0
            for i, ch in enumerate(chunk):
                if _is_punctuation(ch):
                    words += [chunk[start:i], ch] if i > start else [ch]
                    start = i + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    def _wordpiece(self, word: str) -> list[int]:
        """Greedy longest-match-first cut of one word; [UNK] for the whole word if it fails."""
        if len(word) > self.max_word:
            return [self.unk_id]
        ids, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    start = end
                    break
            else:
                return [self.unk_id]
        return ids

    def encode(self, text: str) -> list[int]:
        ids = []
        for i, part in enumerate(self.special_pattern.split(text)):
            if i % 2:  # a special token, as written
                ids.append(self.specials[part])
            else:
                for word in self._words(self._normalize(part)):
                    ids += self._wordpiece(word)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        tokens = [self.tokens[i] for i in self._ids(ids) if i not in self.skip]
        out = []
        for i, token in enumerate(tokens):
            if i:
                token = token[len(self.prefix) :] if token.startswith(self.prefix) else " " + token
            for dirty, clean in WORDPIECE_CLEANUP:
                token = token.replace(dirty, clean)
            out.append(token)
        return "".join(out)

    def options(self) -> dict:
        """``tokenizer_config.json``'s fields for this tokenizer (what ``BertTokenizer`` reads)."""
        return {
            "tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.chinese_chars,
            **{f"{k}_token": v for k, v in self.names.items()},
        }  # fmt: skip

    def model_bytes(self) -> bytes:
        return json.dumps([self.tokens, self.options()], sort_keys=True).encode("utf-8")

    def save(self, directory: str | os.PathLike) -> Path:
        """``vocab.txt`` and ``tokenizer_config.json``, as ``BertTokenizer.save_pretrained`` writes them."""
        directory = Path(directory)
        write_text(directory / "vocab.txt", "".join(t + "\n" for t in self.tokens))
        write_json(directory / "tokenizer_config.json", self.options())
        return directory


def _token_name(value) -> str | None:
    """A special token's name in tokenizer_config.json: a string, or an AddedToken's ``content``."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def load_bert_tokenizer(directory: str | os.PathLike) -> WordPieceTokenizer:
    """The WordPiece tokenizer of a BERT directory (``vocab.txt`` and, if there, ``tokenizer_config.json``,
    whose absence means BertTokenizer's defaults: lowercase); ``ModelDirError`` naming a file that is
    missing, corrupt or lacks a special token."""
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


def save_marian_tokenizer(
    directory: str | os.PathLike, src: Tokenizer, tgt: Tokenizer, src_lang: str | None, tgt_lang: str | None
) -> Path:
    """Write the files of HF's ``MarianTokenizer`` for aiayn's sentencepiece tokenizers:
    ``source.spm``/``target.spm`` (the models as they are), ``vocab.json`` (every piece -> its id:
    aiayn's ids *are* sentencepiece's), ``target_vocab.json`` when the vocabularies differ, and a
    ``tokenizer_config.json`` that makes ``<s>`` (the decoder's start) special, so that
    ``decode(..., skip_special_tokens=True)`` drops it. A tokenizer that is not sentencepiece
    (characters, an imported Marian or GPT-2 one) is a ``ModelDirError``: MarianTokenizer segments
    with sentencepiece only."""
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
    write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "source_lang": src_lang, "target_lang": tgt_lang,
        "separate_vocabs": separate, "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
        "bos_token": "<s>", "model_max_length": 512,
    })  # fmt: skip
    return directory
