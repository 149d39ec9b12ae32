"""The text of an HTML fragment, taken out to be translated and put back between its tags.

LibreTranslate's ``format=html`` translates a page's text and keeps its markup. ``HtmlText`` splits
markup into the texts a reader sees and everything else, which it keeps: start tags as written, with
their attributes, comments, declarations, the content of ``script`` and ``style`` as written, and
the text of ``code`` elements and of any element marked ``translate="no"`` (HTML's own attribute for
it; ``translate="yes"``, ``""`` or a bare ``translate`` inside one turns translation back on), its
character references written as the escapes ``&amp;``, ``&lt;``, ``&gt;`` or as the characters they
stand for (the same text to a browser). End tags are written ``</tag>`` (the parser reports no more
of them). Each text between two tags is one text to translate, its runs of spaces and line breaks
read as one space (as HTML shows them; one without a letter, such as ``!`` or ``2024``, is kept),
except inside ``pre`` and ``textarea``, where each line is a text of its own and the line breaks
stay; the whitespace around a text stays. A sentence split by inline markup (``a <b>big</b> dog``) is
translated in pieces, as LibreTranslate does; attribute values (``alt``, ``title``) are not
translated. Markup the parser cannot read is a ``DataError``.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from aiayn.errors import DataError

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
        "track", "wbr"}  # fmt: skip  # elements with no end tag
KEPT = {"script", "style", "code"}  # never translated, whatever their translate attribute says
RAW = {"script", "style"}  # their content is not HTML: written back as it came
LINES = {"pre", "textarea"}  # whitespace shown as written: a text per line
_EDGES = re.compile(r"^(\s*)(.*?)(\s*)$", re.S)


class HtmlText(HTMLParser):
    """``HtmlText(markup).texts`` to translate, then ``.join(translations)``: the markup with each
    text replaced by its translation (escaped), everything else as it was."""

    def __init__(self, markup: str):
        super().__init__(convert_charrefs=True)  # text arrives unescaped ("Q&A" stays "Q&A")
        self.parts: list[str] = []  # markup and kept text, with a "" where each translation goes
        self.slots: list[int] = []  # the index in parts of each text's translation
        self.texts: list[str] = []  # the texts to translate, unescaped
        self.open: list[tuple[str, bool, bool]] = []  # open elements: (tag, kept, lines)
        self.pending: list[str] = []  # text since the last tag, unescaped (raw in script and style)
        try:
            self.feed(markup)
            self.close()
        except AssertionError as e:  # the parser's own complaint, e.g. "<![" not followed by a name
            raise DataError(f"format=html: the markup cannot be read ({e}); send it as text") from None
        self._flush()

    def join(self, translations: list[str]) -> str:
        parts = list(self.parts)
        for slot, text in zip(self.slots, translations, strict=True):
            parts[slot] = html.escape(text, quote=False)
        return "".join(parts)

    # -- where the parser is --------------------------------------------------------------------------
    def _state(self) -> tuple[bool, bool]:
        return (self.open[-1][1], self.open[-1][2]) if self.open else (False, False)

    def _flush(self) -> None:
        """The text since the last tag: kept, or taken out to be translated."""
        text, self.pending = "".join(self.pending), []
        if not text:
            return
        if self.open and self.open[-1][0] in RAW:  # script or style: as written, never escaped
            self.parts.append(text)
            return
        kept, lines = self._state()
        if kept or not any(c.isalpha() for c in text):  # nothing to translate: "", " ", "!", "2024"
            self.parts.append(html.escape(text, quote=False))
            return
        for i, line in enumerate(text.split("\n") if lines else [text]):
            if i:
                self.parts.append("\n")
            lead, middle, trail = _EDGES.match(line).groups()
            self.parts.append(html.escape(lead, quote=False))
            if any(c.isalpha() for c in middle):
                self.slots.append(len(self.parts))
                self.parts.append("")
                self.texts.append(middle if lines else " ".join(middle.split()))
            else:
                self.parts.append(html.escape(middle, quote=False))
            self.parts.append(html.escape(trail, quote=False))

    def _markup(self, text: str) -> None:
        self._flush()
        self.parts.append(text)

    # -- HTMLParser's callbacks ------------------------------------------------------------------------
    def handle_starttag(self, tag, attrs):
        self._markup(self.get_starttag_text())
        if tag in VOID:
            return
        kept, lines = self._state()
        # HTML's translate attribute: "yes", "" or bare turn it on, "no" off, anything else inherits
        say = next(("" if v is None else str(v).strip().lower() for k, v in attrs if k == "translate"), None)
        kept = tag in KEPT or (say == "no" if say in ("yes", "", "no") else kept)
        self.open.append((tag, kept, lines or tag in LINES))

    def handle_startendtag(self, tag, attrs):
        if tag in RAW:  # HTML has no self-closed script or style: what follows is their content
            self.handle_starttag(tag, attrs)
            self.set_cdata_mode(tag)
            return
        self._markup(self.get_starttag_text())

    def handle_endtag(self, tag):
        self._markup(f"</{tag}>")
        for i in range(len(self.open) - 1, -1, -1):  # closes it and whatever it left open
            if self.open[i][0] == tag:
                del self.open[i:]
                break

    def handle_data(self, data):
        self.pending.append(data)

    def handle_comment(self, data):
        self._markup(f"<!--{data}-->")

    def handle_decl(self, decl):
        self._markup(f"<!{decl}>")

    def handle_pi(self, data):
        self._markup(f"<?{data}>")

    def unknown_decl(self, data):  # a marked section: CDATA's ends in "]]>", the others in "]>"
        self._markup(f"<![{data}]]>" if data.startswith("CDATA[") else f"<![{data}]>")
