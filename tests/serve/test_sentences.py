"""``Sentences``: LibreTranslate's reading of a text (its lines, then their sentences) and back."""

import pytest

pytest.importorskip("sentencex")

from aiayn.serve.sentences import Sentences  # noqa: E402


def test_a_text_is_its_lines_sentences_and_its_translation_keeps_the_lines():
    text = "Ein Mann fährt Fahrrad. Zwei Hunde spielen im Schnee!\n\nDr. Müller liest z.B. ein Buch.\n  "
    s = Sentences(text, "de")
    assert s.pieces == ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee!",
                        "Dr. Müller liest z.B. ein Buch."]  # fmt: skip  # abbreviations are not ends
    assert s.join(["A man rides.", " Two dogs play! ", "Dr. Müller reads."]) == (
        "A man rides. Two dogs play!\n\nDr. Müller reads.\n"
    )
    with pytest.raises(ValueError, match="2 translations for 3 sentences"):
        s.join(["a", "b"])


@pytest.mark.parametrize("text", ["", "\n", "   ", "Hund"])
def test_a_text_without_an_end_is_one_sentence_or_none(text):
    s = Sentences(text, "de")
    assert s.pieces == ([text] if text.strip() else [])
    assert s.join([t.upper() for t in s.pieces]) == (
        text.upper() if text.strip() else "\n" * text.count("\n")
    )
