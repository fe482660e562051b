"""What a sweep or ``petlprof report`` says on the terminal: the summary table, what its figures rest on, the
runs' warnings, each text once (as report.md lists them), and after a sweep the report written beside the
store.  Light to import (no pandas, no matplotlib): ``petlprof run`` names :func:`report_sweep` before its
sweep starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from petlprof.errors import printable, say
from petlprof.report.records import grouped_run_warnings, load_records, overhead_line
from petlprof.report.table import summary_table
from petlprof.results.figures import ENERGY_KIND
from petlprof.results.result import RunResult
from petlprof.vocabulary import ESTIMATED


def report_sweep(store: Path, out_dir: Path) -> None:
    """After a sweep (``petlprof run`` and :func:`petlprof.api.run_sweep`): the summary of every run in ``store``
    on the terminal, and the report written into ``out_dir``."""
    from petlprof.report.markdown import write_report  # pandas and matplotlib: not before the sweep has run

    skipped: list[str] = []
    records = load_records([store], skipped)
    print_summary(records, skipped)
    for path in write_report(records, out_dir):
        say(f"wrote {path}")
    say(f"wrote {store}")


def print_summary(records: Sequence[RunResult], skipped: list[str]) -> None:
    """The summary table of ``records`` on stdout, the lines of the results that could not be used (``skipped``) on
    stderr, then what the table's figures rest on: energy models, the harness overhead, the runs' warnings."""
    if skipped:
        say(f"petlprof: skipped {len(skipped)} unusable line(s) of the results:")
        for line in skipped[:10]:
            say(f"  {line}")
    print(summary_table(records, fmt="text"))
    estimated = {r.train.text("energy_model") for r in records if r.train and r.train.text(ENERGY_KIND) == ESTIMATED}
    for model in sorted(m for m in estimated if m):
        print(f"energy marked 'estimated' is a model, not a measurement: {model}")
    if overhead := overhead_line(records):
        print(overhead)
    for warning in grouped_run_warnings(records):
        print(printable(f"warning: {warning}"))
