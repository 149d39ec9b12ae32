"""Every relative link in README.md and docs/*.md reaches a file, and every ``#anchor`` a heading of
it, spelled as GitHub spells heading anchors (lowercased; letters, digits, spaces, hyphens and
underscores kept; spaces become hyphens; a repeated heading gets ``-1``, ``-2``…)."""

import functools
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), not an image
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def github_anchor(heading: str) -> str:
    kept = (c for c in heading.strip().lower() if c in " -_" or unicodedata.category(c)[0] in "LN")
    return "".join(kept).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors of ``page``'s headings (outside code blocks), as GitHub renders them."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"#{1,6} (.*)", line):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "").replace("*", "")
            anchor = github_anchor(text)
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            out.add(anchor if n == 0 else f"{anchor}-{n}")
    return frozenset(out)


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, mailto: …
        path, _, fragment = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            out.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.resolve()):
            out.append(f"{target} (no such heading in {dest.name})")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_reaches_its_file_and_heading(page):
    assert broken_links(page) == []


def test_the_checker_finds_a_split_heading_and_spells_anchors_as_github_does(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "## Current results\n### SST-2 from scratch: 82.11 (issue 59)\n## Notes\n## Notes\n"
        "```\n# not a heading\n```\n### S| row |uperseded recipes\n"
        "[a](#current-results) [b](#sst-2-from-scratch-8211-issue-59) [c](#notes-1) "
        "[d](#superseded-recipes) [e](#not-a-heading) [f](missing.md) [g](https://x.org/#y)\n"
    )
    assert broken_links(page) == [
        "#superseded-recipes (no such heading in page.md)",
        "#not-a-heading (no such heading in page.md)",
        "missing.md (no such file)",
    ]
    assert github_anchor("`aiayn serve` under load") == "aiayn-serve-under-load"
    assert github_anchor("学习者指南：注意力") == "学习者指南注意力"
