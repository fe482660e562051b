"""Reports from the run store: the summary table, Pareto plots, report.md and report.html.

The front of the package: ``load_records`` (:mod:`~petlprof.report.records`) reads one or more ``results.jsonl``
files as typed :class:`~petlprof.results.result.RunResult` records, ``summary_table``
(:mod:`~petlprof.report.table`) renders one row per run for the terminal or Markdown, and ``write_report``
(:mod:`~petlprof.report.markdown`) writes report.md, report.html (:mod:`~petlprof.report.html`) and the plots.
Behind it: :mod:`~petlprof.report.frame` (records as pandas tables), :mod:`~petlprof.report.pareto` (fronts over
any objectives), :mod:`~petlprof.report.intervals` and :mod:`~petlprof.report.differences` (seed intervals;
which differences exceed them), :mod:`~petlprof.report.target` and :mod:`~petlprof.report.target_plot` (cost to
reach a target), :mod:`~petlprof.report.curves` (learning curves), :mod:`~petlprof.report.plots` and
:mod:`~petlprof.report.plotkit` (the Pareto plots, drawn reproducibly), :mod:`~petlprof.report.terminal` (what a
sweep prints at its end). The names are imported on first use, so the light modules (``intervals``, whose
choices the command line offers) load without pandas and matplotlib.
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
