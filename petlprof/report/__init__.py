"""Reports from the run store: the summary table, Pareto plots and report.md.

``load_records`` reads one or more ``results.jsonl`` files, ``summary_table`` renders one row per
run for the terminal or Markdown, and ``write_report`` draws the accuracy-versus-energy and
accuracy-versus-memory Pareto plots and writes report.md beside them.  The names are imported on
first use, so the light modules (:mod:`petlprof.report.intervals`, whose choices the command line
offers) load without pandas and matplotlib.
"""

import importlib

_HOMES = {
    "load_records": "petlprof.report.records",
    "run_warnings": "petlprof.report.records",
    "summary_table": "petlprof.report.table",
    "write_report": "petlprof.report.markdown",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'petlprof.report' has no attribute '{name}'")
    return getattr(importlib.import_module(_HOMES[name]), name)


__all__ = ["load_records", "run_warnings", "summary_table", "write_report"]
