"""What an attention map shows: the tokens a decoder read, and a label for each.

``aiayn attention`` and the server's page draw the same maps, so both take their axes from here: a
map of tokens the decoder never read (or labelled otherwise on the page than in the CLI) would pass
for the model's.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.data.tokenizer import SentencePieceTokenizer, Tokenizer
from aiayn.interop.marian.tokenizer import MarianTokenizer

VISIBLE = str.maketrans({" ": "␣", "\n": "\\n", "\t": "\\t"})  # what would print as nothing


def decoder_read(tokens: Sequence[int], bos_id: int) -> list[int]:
    """The decoder's inputs while it wrote ``tokens`` (a hypothesis, eos last if it ended): ``[bos]``
    and every token but the last, which no position read: its eos, or, where the hypothesis stopped
    at its length limit, a token one position past what the decoder read (past a learned table's
    last row, there)."""
    return [bos_id, *list(tokens)[:-1]]


def token_labels(tok: Tokenizer, ids: Sequence[int], config) -> list[str]:
    """A printable label per id: special ids by name (bos before pad where the two are one id, as in
    Marian models; unk and mask too), the others as the text of their piece with its spaces shown
    ("␣"), so that a word's pieces read as one word ("␣unbelie", "v", "ably") and the space a
    sentencepiece, Marian or GPT-2 piece starts with is seen (a WordPiece continuation keeps its "##");
    a sentencepiece byte as its piece ("<0xE4>"), a GPT-2 piece of part of a character as its
    byte-level token, never as the "\ufffd" they decode to."""
    names = {tok.mask_id: "<mask>", getattr(config, "unk_id", None): "<unk>", config.pad_id: "<pad>",
             config.eos_id: "</s>", config.bos_id: "<s>"}  # later keys win  # fmt: skip
    if config.pad_id not in (config.bos_id, config.eos_id) and tok.decode([config.pad_id]):
        del names[config.pad_id]  # a real token that pads (a GPT-2 without a padding token): its text
    return [names.get(i) or _text(tok, i).translate(VISIBLE) or f"<{i}>" for i in ids]


def _text(tok: Tokenizer, i: int) -> str:
    """The text of one id's piece: a sentencepiece (or Marian) piece with its word boundary "▁" as
    the space it stands for (decoding drops a leading one) and its bytes as pieces; another
    tokenizer's decoded text, or its token where that text is no character."""
    if isinstance(tok, SentencePieceTokenizer):  # its ids are sentencepiece's own
        piece = tok.sp.id_to_piece(i)
        return piece if tok.sp.is_byte(i) else piece.replace("\u2581", " ")
    if isinstance(tok, MarianTokenizer):  # ids of vocab.json, not of the .spm files
        return tok.pieces.get(i, "").replace("\u2581", " ")
    text = tok.decode([i])
    if "\ufffd" in text and (token := getattr(getattr(tok, "bpe", None), "id_to_token", None)):
        return token(i) or text  # GPT-2's byte-level piece of part of a character
    return text
