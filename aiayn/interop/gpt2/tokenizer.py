"""GPT-2's byte-level BPE behind aiayn's tokenizer interface (``aiayn.data.tokenizer.Tokenizer``).

A GPT-2 directory has ``vocab.json`` (piece -> id) and ``merges.txt`` (the merges in rank order).
HF's ``tokenizers`` library, which defines this tokenizer, reads them as transformers'
``GPT2Tokenizer`` builds it: a ``BPE`` model under the ``ByteLevel`` pre-tokenizer (GPT-2's split
into contractions, letters, digits and other symbols, each with its leading space, then every UTF-8
byte mapped to a printable character) and the ``ByteLevel`` decoder, with ``<|endoftext|>`` a
special token, so that the text ``<|endoftext|>`` is read as that one id, as transformers reads it.
The library is an optional dependency (``pip install 'aiayn[hf]'``).

``encode`` returns content ids only, as every aiayn tokenizer does. ``decode`` drops
``<|endoftext|>`` only: GPT-2's aiayn ``pad_id`` is a real token (``aiayn.interop.gpt2.convert``),
which a decoded continuation must keep.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import ModelDirError
from aiayn.interop.hf import hf_tokenizers, read_vocab
from aiayn.textfiles import read_text

EOS = "<|endoftext|>"
NEEDS = "GPT-2's tokenizer"  # what the error names when the tokenizers library is missing


class GPT2Tokenizer(Tokenizer):
    """GPT-2's byte-level BPE (``vocab.json`` + ``merges.txt``); ``eos`` names the end-of-text token,
    which is also bos and unk; ``pad_id`` is set to the model's (``aiayn.interop.gpt2.convert``)."""

    kind = "gpt2"

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], eos=EOS, pad_id=None):
        lib = hf_tokenizers(NEEDS)
        if eos not in vocab:
            raise ModelDirError(f"the vocabulary lacks the end-of-text piece {eos!r}")
        self.vocab, self.merges = vocab, [tuple(m) for m in merges]
        self.eos_id = self.bos_id = self.unk_id = vocab[eos]
        self.pad_id = self.eos_id if pad_id is None else pad_id
        self.vocab_size = len(vocab)
        self.bpe = lib.Tokenizer(lib.models.BPE(vocab, self.merges))  # as transformers' GPT2Tokenizer
        self.bpe.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.bpe.decoder = lib.decoders.ByteLevel()
        self.bpe.add_special_tokens([lib.AddedToken(eos, special=True, normalized=False)])

    def encode(self, text: str) -> list[int]:
        return self.bpe.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.bpe.decode(self._ids(ids), skip_special_tokens=True)  # eos is the one special token

    def model_bytes(self) -> bytes:
        ranks = {pair: i for i, pair in enumerate(self.merges)}  # a repeated merge: its last rank
        return json.dumps([self.vocab, sorted(ranks, key=ranks.get)], sort_keys=True).encode("utf-8")


def load_gpt2_tokenizer(directory: str | os.PathLike, pad_id: int | None = None) -> GPT2Tokenizer:
    """The tokenizer of a GPT-2 directory; ``ModelDirError`` naming a file that is missing, corrupt or
    does not fit the other (a merge whose pieces are not in the vocabulary)."""
    lib = hf_tokenizers(NEEDS)
    directory = Path(directory)
    incomplete = "not a complete GPT-2 directory"
    vocab = read_vocab(directory / "vocab.json", incomplete)
    path = directory / "merges.txt"
    lines = read_text(path, incomplete, fix="download or restore it again").splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise ModelDirError(f"{path}: the line {' '.join(bad)!r} is not two pieces separated by one space; "
                            "download or restore it again")  # fmt: skip
    # every byte's character and every merge's result must be pieces of the vocabulary
    unknown = [c for c in lib.pre_tokenizers.ByteLevel.alphabet() if c not in vocab]
    unknown += ["".join(m) for m in merges if "".join(m) not in vocab]
    unknown = unknown or [p for m in merges for p in m if p not in vocab]
    if unknown:
        raise ModelDirError(
            f"{path} and {directory / 'vocab.json'} do not belong together: {len(unknown)} piece(s) "
            f"such as {unknown[0]!r} are missing from the vocabulary; download or restore both again"
        )
    added = added_tokens(directory, vocab)
    if added:  # transformers reads each as one id; these files alone would split it into bytes
        raise ModelDirError(
            f"{directory} has tokens added to GPT-2's vocabulary ({', '.join(map(repr, added[:3]))}"
            f"{', …' if len(added) > 3 else ''}), which aiayn's GPT-2 tokenizer does not read; use the "
            "model's own vocabulary, or a tokenizer without them"
        )
    try:
        return GPT2Tokenizer(vocab, merges, pad_id=pad_id)
    except ModelDirError as e:
        raise ModelDirError(f"{directory / 'vocab.json'}: {e}") from None


def added_tokens(directory: Path, vocab: dict[str, int]) -> list[str]:
    """The tokens a transformers tokenizer adds beyond ``vocab.json`` (``add_special_tokens``, saved in
    ``tokenizer.json``'s ``added_tokens`` and ``tokenizer_config.json``'s token fields), in order."""
    found: list[str] = []

    def strings(value) -> None:  # a token, {"content": token}, or a list or dict of them
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict) and "content" in value:
            strings(value["content"])
        elif isinstance(value, dict):
            strings(list(value.values()))
        elif isinstance(value, list):
            for v in value:
                strings(v)

    for name in ("tokenizer.json", "tokenizer_config.json"):
        try:
            data = json.loads((directory / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # absent or unreadable: what it adds is unknown, as without it
            continue
        if not isinstance(data, dict):
            continue
        if name == "tokenizer.json":
            strings(data.get("added_tokens", []))
        else:
            strings([v for k, v in data.items() if k.endswith("_token") or k.endswith("_tokens")
                     or k == "added_tokens_decoder"])  # fmt: skip
    return list(dict.fromkeys(t for t in found if t not in vocab))
