"""A text as the sentences a translation model reads, and back: what LibreTranslate does before it
translates (Argos Translate: a paragraph per line, then its sentences, each translated on its own).

A model trained on sentences (Multi30k's captions, most parallel corpora) given a paragraph translates
its first sentence or two and drops the rest; a text past the model's positions is cut. ``Sentences``
splits a text at its newlines into paragraphs and each paragraph into sentences with ``sentencex``
(Wikimedia's segmenter: rules for about 300 languages, abbreviations such as "Dr." and "z.B."
included), and ``join`` puts the translations back: a paragraph's sentences joined by one space, its
lines by their newlines, a blank line kept blank.
"""

from __future__ import annotations

from collections.abc import Sequence

from sentencex import segment


class Sentences:
    """The sentences of ``text`` in ``language`` (``pieces``), and how to put their translations back."""

    def __init__(self, text: str, language: str):
        self.counts: list[int] = []  # sentences per line
        self.pieces: list[str] = []
        for line in text.split("\n"):
            found = [s.strip() for s in segment(language, line) if s.strip()]
            self.counts.append(len(found))
            self.pieces.extend(found)

    def join(self, translations: Sequence[str]) -> str:
        """The text's translation from its pieces' (``len(translations) == len(self.pieces)``)."""
        if len(translations) != len(self.pieces):
            raise ValueError(f"{len(translations)} translations for {len(self.pieces)} sentences")
        lines, start = [], 0
        for n in self.counts:
            lines.append(" ".join(t.strip() for t in translations[start : start + n]))
            start += n
        return "\n".join(lines)
