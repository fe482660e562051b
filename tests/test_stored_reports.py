"""Every stored report under ``reports/`` renders the same report.md text from its ``results.jsonl`` as the one
committed beside it: what was run, the tables per configuration, the differences, the table of all runs, how each
figure was obtained, the warnings and the environment.

The sections drawn from plots (the Pareto fronts, the cost to the target and the learning curves) are left out:
they name the plot files, and drawing them is slow; the plots' own inputs are the tables compared here.  A change
to the report code that changes a stored report's text fails here until the report is re-rendered
(``petlprof report reports/<folder>``) and the change is committed with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from petlprof.report.frame import runs_frame
from petlprof.report.markdown import REPORT_FILE, render_report
from petlprof.report.records import load_records

REPORTS = Path(__file__).resolve().parents[1] / "reports"
STORED = sorted(path.parent for path in REPORTS.rglob("results.jsonl") if (path.parent / REPORT_FILE).exists())
PLOTTED = ("Pareto fronts", "Cost to reach the target", "Learning curves")
PLOT_LINE = re.compile(r"^!\[[^\]]*\]\([^)]*\.png\)\n\n", flags=re.M)


def sections(text: str) -> dict[str, str]:
    """report.md's ``## `` sections by heading, those drawn from plots left out, and the lines naming a plot file in
    the others (the lifecycle's)."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    found = {heading: re.sub(PLOT_LINE, "", body) for heading, body in zip(parts[1::2], parts[2::2])}
    return {heading: body for heading, body in found.items() if heading not in PLOTTED}


def test_every_stored_report_is_checked():
    assert {p.relative_to(REPORTS).as_posix() for p in STORED} >= {
        "minilm-tweets-default",
        "minilm-tweets-all-methods",
        "smollm2-arith",
        "tweets3-study",
        "tweets3-study/budget",
        "tweets3-study/curve",
    }


@pytest.mark.parametrize("folder", STORED, ids=lambda p: p.relative_to(REPORTS).as_posix())
def test_a_stored_report_renders_the_committed_text(folder):
    records = load_records([folder])
    rendered = sections(render_report(records, runs_frame(records), []))
    committed = sections((folder / REPORT_FILE).read_text(encoding="utf-8"))
    assert list(rendered) == list(committed)
    for heading, body in committed.items():
        assert rendered[heading] == body, f"{folder.name}: section '{heading}' differs; re-render the report"
