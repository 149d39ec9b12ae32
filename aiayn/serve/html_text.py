"""The text of an HTML fragment, taken out to be translated and put back between its tags.

LibreTranslate's ``format=html`` translates a page's text and keeps its markup. ``HtmlText`` splits
markup into the texts a reader sees and everything else, which it keeps as written: start tags with
their attributes, comments, doctype, character references outside the texts, and the content of
``script``, ``style`` and ``code`` elements and of any element marked ``translate="no"`` (HTML's own
attribute for it; ``translate="yes"`` inside one turns translation back on). End tags are written
``</tag>`` (the parser reports no more of them). Each text between two tags is one text to translate,
its runs of spaces and line breaks read as one space (as HTML shows them; one without a letter,
such as ``!`` or ``2024``, is kept as written), except inside ``pre`` and
``textarea``, where each line is a text of its own and the line breaks stay; the whitespace around a
text stays. A sentence split by inline markup (``a <b>big</b> dog``) is translated in pieces, as
LibreTranslate does; attribute values (``alt``, ``title``) are not translated.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
        "track", "wbr"}  # fmt: skip  # elements with no end tag
KEPT = {"script", "style", "code"}  # never translated, whatever their translate attribute says
LINES = {"pre", "textarea"}  # whitespace shown as written: a text per line
_EDGES = re.compile(r"^(\s*)(.*?)(\s*)$", re.S)


class HtmlText(HTMLParser):
    """``HtmlText(markup).texts`` to translate, then ``.join(translations)``: the markup with each
    text replaced by its translation (escaped), everything else as it was."""

    def __init__(self, markup: str):
        super().__init__(convert_charrefs=False)  # references arrive apart, so kept text stays as written
        self.parts: list[str] = []  # markup and kept text, with a "" where each translation goes
        self.slots: list[int] = []  # the index in parts of each text's translation
        self.texts: list[str] = []  # the texts to translate, unescaped
        self.open: list[tuple[str, bool, bool]] = []  # open elements: (tag, kept, lines)
        self.pending: list[str] = []  # raw text since the last tag
        self.feed(markup)
        self.close()
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
        """The text since the last tag: kept as written, or taken out to be translated."""
        raw, self.pending = "".join(self.pending), []
        if not raw:
            return
        kept, lines = self._state()
        text = html.unescape(raw)
        if kept or not any(c.isalpha() for c in text):  # nothing to translate: "", " ", "!", "2024"
            self.parts.append(raw)
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
        say = next((str(v).strip().lower() for k, v in attrs if k == "translate" and v is not None), None)
        kept = tag in KEPT or (kept if say not in ("yes", "no") else say == "no")
        self.open.append((tag, kept, lines or tag in LINES))

    def handle_startendtag(self, tag, attrs):
        self._markup(self.get_starttag_text())

    def handle_endtag(self, tag):
        self._markup(f"</{tag}>")
        for i in range(len(self.open) - 1, -1, -1):  # closes it and whatever it left open
            if self.open[i][0] == tag:
                del self.open[i:]
                break

    def handle_data(self, data):
        self.pending.append(data)

    def handle_entityref(self, name):
        self.pending.append(f"&{name};")

    def handle_charref(self, name):
        self.pending.append(f"&#{name};")

    def handle_comment(self, data):
        self._markup(f"<!--{data}-->")

    def handle_decl(self, decl):
        self._markup(f"<!{decl}>")

    def handle_pi(self, data):
        self._markup(f"<?{data}>")

    def unknown_decl(self, data):
        self._markup(f"<![{data}]>")
