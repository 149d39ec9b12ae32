"""What an attention map shows: the tokens a decoder read, and a label for each.

``aiayn attention`` and the server's page draw the same maps, so both take their axes from here: a
map of tokens the decoder never read (or labelled otherwise on the page than in the CLI) would pass
for the model's.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.data.tokenizer import SentencePieceTokenizer, Tokenizer
from aiayn.interop.marian.tokenizer import MarianTokenizer

VISIBLE = {" ": "␣", "\n": "\\n", "\t": "\\t"}  # pieces that would print as nothing


def decoder_read(tokens: Sequence[int], bos_id: int) -> list[int]:
    """The decoder's inputs while it wrote ``tokens`` (a hypothesis, eos last if it ended): ``[bos]``
    and every token but the last, which no position read: its eos, or, where the hypothesis stopped
    at its length limit, a token one position past what the decoder read (past a learned table's
    last row, there)."""
    return [bos_id, *list(tokens)[:-1]]


def token_labels(tok: Tokenizer, ids: Sequence[int], config) -> list[str]:
    """A printable label per id: special ids by name (bos before pad where the two are one id, as in
    Marian models), the others as the text they decode to (a space, tab or line break shown)."""
    names = {config.pad_id: "<pad>", config.eos_id: "</s>", config.bos_id: "<s>"}  # later keys win
    return [names.get(i) or VISIBLE.get(s := _text(tok, i), s) or f"<{i}>" for i in ids]


def _text(tok: Tokenizer, i: int) -> str:
    """The text of one id; sentencepiece's lone word boundary "▁", which decodes to nothing (a
    leading space is dropped), is the space it stands for; a Marian vocabulary's piece that decodes
    to nothing (that boundary, ``<unk>``) is its piece."""
    text = tok.decode([i])
    if not text and isinstance(tok, SentencePieceTokenizer):  # its ids are sentencepiece's own
        text = tok.sp.id_to_piece(i).replace("\u2581", " ")
    elif not text and isinstance(tok, MarianTokenizer):  # ids of vocab.json, not of the .spm files
        text = tok.pieces.get(i, "").replace("\u2581", " ")
    return text
