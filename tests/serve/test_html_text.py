"""LibreTranslate's format=html: the texts between tags out, the translations back in, the markup kept."""

import pytest

from aiayn.errors import DataError
from aiayn.serve.html_text import HtmlText


def upper(markup: str) -> tuple[list[str], str]:
    page = HtmlText(markup)
    return page.texts, page.join([t.upper() for t in page.texts])


@pytest.mark.parametrize(
    ("markup", "texts", "joined"),
    [
        ("kein html", ["kein html"], "KEIN HTML"),
        ("", [], ""),
        # whitespace inside a text reads as one space; around it, it stays; references are unescaped
        # for the model and the translation escaped back
        ('<p class="x"> Ein  Mann\n fährt &amp; liest. </p>', ["Ein Mann fährt & liest."],
         '<p class="x"> EIN MANN FÄHRT &amp; LIEST. </p>'),
        ("<p>&lt;b&gt; heißt &#x3c;fett&#62;</p><!-- Notiz -->", ["<b> heißt <fett>"],
         "<p>&lt;B&gt; HEISST &lt;FETT&gt;</p><!-- Notiz -->"),
        # inline markup splits a sentence; a text without a letter is kept
        ("<p>Hallo <b>Welt</b>!</p>", ["Hallo", "Welt"], "<p>HALLO <b>WELT</b>!</p>"),
        # raw elements and translate="no" (and "yes" inside it) as HTML defines them
        ('<script>var a = "<p>x</p>";</script><style>p{color:red}</style><code>Mann</code>', [],
         '<script>var a = "<p>x</p>";</script><style>p{color:red}</style><code>Mann</code>'),
        ('<div translate="no">Marke <span translate="yes">Hund</span> X</div> Ende',
         ["Hund", "Ende"], '<div translate="no">Marke <span translate="yes">HUND</span> X</div> ENDE'),
        ("<div TRANSLATE=NO><div>innen</div> noch behalten</div> aus", ["aus"],
         "<div TRANSLATE=NO><div>innen</div> noch behalten</div> AUS"),
        # pre: a text per line, the line breaks and indentation kept
        ("<pre>Zeile eins\n  Zeile zwei\n</pre>", ["Zeile eins", "Zeile zwei"],
         "<pre>ZEILE EINS\n  ZEILE ZWEI\n</pre>"),
        # void elements, attributes (not translated), doctype; an end tag closes what it left open
        ('<!DOCTYPE html><img alt="Bild">Bild<br/><ul><li>eins<li>zwei</ul> drei &nbsp;',
         ["Bild", "eins", "zwei", "drei"],
         '<!DOCTYPE html><img alt="Bild">BILD<br/><ul><li>EINS<li>ZWEI</ul> DREI \xa0'),
    ],
)  # fmt: skip
def test_texts_out_and_translations_in(markup, texts, joined):
    assert upper(markup) == (texts, joined)


def test_the_markup_comes_back_as_written_when_nothing_changes():
    markup = ('<!DOCTYPE html><html lang="de"><head><title>Titel</title></head>\n'
              '<body><p>Zwei <a href="/x?a=1&amp;b=2">Hunde</a> spielen.</p>'
              "<?php echo 1; ?></body></html>")  # fmt: skip
    page = HtmlText(markup)
    assert page.texts == ["Titel", "Zwei", "Hunde", "spielen."]
    assert page.join(page.texts) == markup


def test_a_translation_per_text_is_required():
    with pytest.raises(ValueError):
        HtmlText("<p>a</p><p>b</p>").join(["A"])


@pytest.mark.parametrize(
    ("markup", "texts", "joined"),
    [
        # a bare & is text, not a reference to be completed
        ("<p>Unser Q&A heute</p>", ["Unser Q&A heute"], "<p>UNSER Q&amp;A HEUTE</p>"),
        ('<span translate="no">AT&T</span> x', ["x"], '<span translate="no">AT&amp;T</span> X'),
        # a self-closed script is still a script (HTML has none): its content stays as written
        ('<script src="a.js"/>var a = b && c < d;</script> Ende', ["Ende"],
         '<script src="a.js"/>var a = b && c < d;</script> ENDE'),
        # a CDATA section comes back whole; translate="" and a bare translate turn translation on
        ("<svg><![CDATA[x < y]]></svg>", [], "<svg><![CDATA[x < y]]></svg>"),
        ('<div translate="no">a <b translate="">bb</b> <i translate>ii</i></div>', ["bb", "ii"],
         '<div translate="no">a <b translate="">BB</b> <i translate>II</i></div>'),
    ],
)  # fmt: skip
def test_references_raw_elements_and_marked_sections(markup, texts, joined):
    assert upper(markup) == (texts, joined)


def unreadable(self, markup):
    """What html.parser raises where it gives up: older Pythons on ``<![]>``, for one. The parser fixes
    of 2025 (also in distributions' patched Pythons) read that as a comment, and nothing raises."""
    raise AssertionError("expected name token")


def test_markup_the_parser_cannot_read_is_a_data_error(monkeypatch):
    monkeypatch.setattr(HtmlText, "feed", unreadable)
    with pytest.raises(DataError, match=r"format=html: the markup cannot be read \(expected name token\)"):
        HtmlText("a <p> b")


def test_an_empty_marked_section_is_an_error_or_markup_whatever_the_python():
    """Older parsers raise; the fixed ones read a bogus comment, kept between the two texts."""
    try:
        page = HtmlText("a <![]> b")
    except DataError as e:
        assert "the markup cannot be read" in str(e)
    else:
        joined = page.join(["A", "B"])
        assert page.texts == ["a", "b"] and joined.startswith("A <!") and joined.endswith("> B"), joined
