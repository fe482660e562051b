"""report.html: the text of report.md as one self-contained web page.

The Markdown is converted with Python-Markdown (tables, fenced code); every image the report links
is replaced by its SVG (or PNG) file inlined as a base64 ``data:`` URI, links to SVG files become
in-page anchors, and the style sheet is inline, so the page needs no other file and no network.
Headers wrap; a table still wider than the page scrolls in its own box with its first column (the
method) kept in view.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from petlprof.report.page import asset, embedded_json

HTML_FILE = "report.html"
MIME = {".svg": "image/svg+xml", ".png": "image/png"}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #bbb; margin-top: 2em; }
table { border-collapse: separate; border-spacing: 0; font-size: 13px; margin: 1em 0; display: block;
        max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 3px 7px; white-space: nowrap; background: #fff; }
th { background: #f0f0f0; white-space: normal; vertical-align: bottom; min-width: 4em; }
tr:nth-child(even) td { background: #fafafa; }
th:first-child, td:first-child { position: sticky; left: 0; z-index: 1; box-shadow: 2px 0 0 #ccc; }
img { max-width: 100%; height: auto; border: 1px solid #ddd; }
pre, code { background: #f5f5f5; font-size: 12px; }
pre { padding: .6em; overflow-x: auto; }
"""


def _data_uri(folder: Path, name: str) -> str | None:
    """The file ``name`` in ``folder`` as a data URI, preferring its SVG twin; None when absent."""
    path = folder / name
    svg = path.with_name(path.stem + ".svg") if path.suffix == ".png" else path
    for candidate in (svg, path):
        if candidate.is_file() and candidate.suffix in MIME:
            encoded = base64.b64encode(candidate.read_bytes()).decode("ascii")
            return f"data:{MIME[candidate.suffix]};base64,{encoded}"
    return None


EXPLORER = """<section id="explorer" hidden>
<h2>Explore the configurations</h2>
<div id="explorer-controls"></div>
<div id="explorer-chart"></div>
<p id="explorer-frontier"></p>
</section>
<noscript><p><em>With JavaScript on, an explorer here plots any metric against any cost, filters by budget and
recomputes the frontier; the tables and plots below are the whole report without it.</em></p></noscript>
"""


def _with_explorer(body: str, data: Mapping[str, Any]) -> str:
    """``body`` with the explorer after the bottom line (or the title), its data and its script at the end."""
    parts = EXPLORER, f'<script type="application/json" id="petlprof-data">{embedded_json(data)}</script>\n'
    after = re.search(r"<h2[^>]*>Bottom line</h2>.*?(?=<h2)", body, flags=re.S) or re.search(r"</h1>\n?", body)
    at = after.end() if after else 0
    return body[:at] + parts[0] + body[at:] + parts[1] + f"<script>{asset('page.js')}</script>\n"


def render_html(markdown_text: str, folder: Path, title: str, data: Mapping[str, Any] | None = None) -> str:
    """The page for ``markdown_text`` whose images and plot links point at files in ``folder``, with the
    explorer of :mod:`petlprof.report.page` drawing ``data`` where given."""
    # markdown: slow to import, loaded only when used
    import markdown

    converter = markdown.Markdown(extensions=["tables", "fenced_code"], output_format="html")
    # the text is the report's own and the records' (labels, task paths, prompts, errors): HTML in it is shown as
    # text, never run (an <img onerror> in a method config was a live element)
    converter.preprocessors.deregister("html_block")
    converter.inlinePatterns.deregister("html")
    body = converter.convert(markdown_text)

    def inline(match: re.Match) -> str:
        uri = _data_uri(folder, html.unescape(match.group(2)))
        return f"{match.group(1)}{uri}{match.group(3)}" if uri else match.group(0)

    body = re.sub(r'(<img[^>]*\ssrc=")([^":]+)(")', inline, body)
    # the SVG links point at files beside report.md; in the page, the inlined figure above them is the SVG
    body = re.sub(r'<a href="[^":]+\.svg">(SVG)</a>', r"\1 inline above", body)
    style = STYLE + (asset("page.css") if data is not None else "")
    if data is not None:
        body = _with_explorer(body, data)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def write_html(markdown_text: str, out_dir: Path, data: Mapping[str, Any] | None = None) -> Path:
    """Write report.html for the report text into ``out_dir`` (where its plots are), with the explorer of
    ``data`` where given, and return its path."""
    first = next((line[2:].strip() for line in markdown_text.splitlines() if line.startswith("# ")), "petlprof report")
    path = Path(out_dir) / HTML_FILE
    path.write_text(render_html(markdown_text, Path(out_dir), first, data), encoding="utf-8")
    return path
