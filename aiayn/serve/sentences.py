"""A text as the sentences a translation model reads, and back: what LibreTranslate does before it
translates (Argos Translate: a paragraph per line, then its sentences, each translated on its own).

A model trained on sentences (Multi30k's captions, most parallel corpora) given a paragraph translates
its first sentence or two and drops the rest; a text past the model's positions is cut. ``Sentences``
splits a text at its newlines into paragraphs and each paragraph into sentences with ``sentencex``
(Wikimedia's segmenter: rules for about 300 languages, abbreviations such as "Dr." and "z.B."
included), and ``join`` puts the translations back: a paragraph's sentences joined by one space, its
lines by their newlines, a blank line kept blank; ``joined`` does the same for whole results (their
n-best too), as both translation routes answer a text translated sentence by sentence.
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

    def joined(self, results: Sequence[dict], ranks: int | None = None) -> dict:
        """The text's result from its sentences' (``TranslationService`` answers, one per piece): the
        translations joined as ``join`` puts them back; ``ranks`` hypotheses (default: the most a
        sentence has), the n-th from each sentence's n-th (its last where it has fewer), scores summed
        and tokens one sentence after another (Argos Translate's alternatives); ``truncated`` if any
        sentence was cut, and a bidirectional model's ``r2l`` translations joined too."""
        none = {"text": "", "score": 0.0, "tokens": []}
        hypotheses = []
        for i in range(max((len(r["hypotheses"]) for r in results), default=0) if ranks is None else ranks):
            mine = [r["hypotheses"][min(i, len(r["hypotheses"]) - 1)] if r["hypotheses"] else none
                    for r in results]  # fmt: skip
            hypotheses.append({"text": self.join([h["text"] for h in mine]),
                               "score": round(sum(h["score"] for h in mine), 4),
                               "tokens": [t for h in mine for t in h["tokens"]]})  # fmt: skip
        joined = {"translation": self.join([r["translation"] for r in results]), "hypotheses": hypotheses,
                  "truncated": any(r.get("truncated") for r in results),
                  "sentences": list(results)}  # fmt: skip
        if any("r2l" in r for r in results):
            joined["r2l"] = self.join([r.get("r2l", "") for r in results])
        return joined


def pieces_of(split: Sequence[Sentences]) -> list[str]:
    """Every sentence of the texts ``split``, in order: what the model translates."""
    return [piece for s in split for piece in s.pieces]


def joined_texts(split: Sequence[Sentences], results: Sequence[dict], ranks: int | None = None) -> list[dict]:
    """Each text's result (``Sentences.joined``) from the results of ``pieces_of(split)``, in order."""
    out, start = [], 0
    for s in split:
        out.append(s.joined(results[start : start + len(s.pieces)], ranks))
        start += len(s.pieces)
    return out
