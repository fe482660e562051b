"""Reports from the run store: the summary table, Pareto plots and report.md.

``load_records`` reads one or more ``results.jsonl`` files, ``summary_table`` renders one row per
run for the terminal or Markdown, and ``write_report`` draws the accuracy-versus-energy and
accuracy-versus-memory Pareto plots and writes report.md beside them.
"""

from petlprof.report.markdown import write_report
from petlprof.report.records import load_records, run_warnings
from petlprof.report.table import summary_table

__all__ = ["load_records", "run_warnings", "summary_table", "write_report"]
