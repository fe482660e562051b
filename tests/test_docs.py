"""The README is a front door and the manual is in docs/: the README is short, its first screen holds the two
set-up commands, every relative link in the README and in docs/*.md reaches a file (and, for ``#anchor``, a
heading of that file), and every docs page is linked from the README.

Anchors are GitHub's: a heading's text in lower case, inline code marks and links reduced to their text, every
character other than a letter, digit, space, ``-`` or ``_`` dropped, spaces turned into ``-``; a heading whose
anchor is taken already gets ``-1``, ``-2``, ...  Links and headings inside fenced code blocks do not count.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SETUP_COMMANDS = (
    "pip install -e . && petlprof run --methods read,lora",
    'pip install -e ".[dev,ray]" && ruff check . && mypy && pytest -n auto',
)
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks (those inside are blanked, keeping line numbers)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def anchor(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = anchor(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link that is not a URL with a scheme, outside code blocks and code spans."""
    links = []
    for number, line in enumerate(prose_lines(path), 1):
        line = re.sub(r"`[^`]*`", "", line)
        for match in LINK.finditer(line):
            target = match.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                links.append((number, target))
    return links


def test_the_docs_pages_exist():
    assert DOCS, "docs/ has no Markdown page"


def test_the_readme_has_at_most_200_lines():
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move detail into a docs/ page"


@pytest.mark.parametrize("command", SETUP_COMMANDS)
def test_the_setup_commands_are_in_the_readmes_first_40_lines(command):
    first = README.read_text().splitlines()[:40]
    assert any(command in line for line in first), f"{command!r} is not in README.md's first 40 lines"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(page):
    broken = []
    for number, target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif fragment and resolved.suffix == ".md" and fragment.lower() not in anchors(resolved):
            broken.append(f"{where} (no heading with anchor #{fragment} in {resolved.relative_to(ROOT)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in relative_links(README)}
    missing = [str(page.relative_to(ROOT)) for page in DOCS if page.resolve() not in linked]
    assert not missing, f"docs pages the README does not link to: {missing}"


def test_every_docs_page_starts_with_a_title_and_a_sentence():
    for page in DOCS:
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# "), f"{page.relative_to(ROOT)} does not start with a '# Title'"
        assert lines[1] == "" and lines[2].strip(), f"{page.relative_to(ROOT)}: no sentence after its title"


def test_the_anchor_rule():
    assert anchor("Methods × architectures") == "methods--architectures"
    assert anchor("Cost regression checks in CI (pytest-benchmark)") == "cost-regression-checks-in-ci-pytest-benchmark"
    assert anchor("Reports: reading a frontier") == "reports-reading-a-frontier"
    assert anchor("The hidden-state cache (side-tuning fast path)") == "the-hidden-state-cache-side-tuning-fast-path"
    assert anchor("`petlprof estimate` and snake_case") == "petlprof-estimate-and-snake_case"
