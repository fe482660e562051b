"""The Python API for notebooks: result stores as pandas DataFrames, frontiers and plots.

```python
from petlprof.api import load_results, summarise, frontier, plot_frontier

runs = load_results("reports/tweets3-study/budget")     # one row per run (every status)
configs = frontier(runs, x="energy_j", y="accuracy")   # one row per configuration, seeds merged, on_front
fig = plot_frontier(runs, x="peak_memory_bytes")       # the report's plot, as a matplotlib Figure
```

Columns: ``task``, ``backbone``, ``method``, ``config``, ``seed``, ``status``, each quality metric by
name and ``quality`` (the primary metric), the train phase's ``energy_j``, ``peak_memory_bytes``,
``time_s``, ``steps``, ``latency_p50_s`` with ``energy_kind``/``energy_source``/``memory_source``, the
same for the eval phase prefixed ``eval_``, ``trainable_params``, ``total_params``, and the budget's
``stop_reason``/``target_reached``, ``diverged_at_step`` (the step whose loss was not finite, for status
``diverged``) and ``warnings`` (about the result, e.g. every prediction one class).  Missing figures are
NaN.  Only runs of status ``ok`` enter :func:`summarise`, :func:`frontier` and :func:`plot_frontier`.
Frontier directions come from :data:`petlprof.tasks.metrics.METRIC_DIRECTIONS`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from petlprof.report.frame import frontier, relative_to, runs_frame, summarise
from petlprof.report.records import load_records
from petlprof.results.figures import ENERGY


def load_results(paths: str | Path | Sequence[str | Path]) -> pd.DataFrame:
    """One row per run from one or more result stores (``results.jsonl`` files or folders holding
    one), the last attempt of each run; unusable lines are skipped with a warning naming them."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    skipped: list[str] = []
    records = load_records(list(paths), skipped)
    for line in skipped:
        warnings.warn(f"skipped {line}", stacklevel=2)
    return runs_frame(records)


def plot_frontier(
    frame: pd.DataFrame,
    x: str = ENERGY.name,
    y: str = "quality",
    *,
    task: str | None = None,
    backbone: str | None = None,
    ax=None,
):
    """Draw ``y`` against cost ``x`` for one task and backbone (the only ones in ``frame`` unless
    named) as in the report: methods joined along their grid, mean ± 95% CI over seeds, the
    frontier ringed.  Draws into ``ax`` when given; returns the matplotlib Figure."""
    # petlprof.report.plots (matplotlib): slow to import, loaded only when used
    from petlprof.report.plots import axis_for, cost_label, draw

    runs = frame
    for column, value in (("task", task), ("backbone", backbone)):
        if value is not None:
            runs = runs[runs[column] == value]
        elif runs[column].nunique() > 1:
            raise ValueError(
                f"the results hold several {column}s {sorted(runs[column].unique())}; pick one with {column}="
            )
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    configs = frontier(ok, x=x, y=y)
    configs = configs[configs[x].notna() & configs[y].notna()]
    if configs.empty:
        raise ValueError(f"no finished configuration has both '{x}' and '{y}'")
    metric = configs["primary_metric"].iloc[0] if y == "quality" else y
    axis = axis_for(x)
    title = f"{metric} vs {axis.title.lower()} — backbone {configs['backbone'].iloc[0]}, task {configs['task'].iloc[0]}"
    return draw(configs, y, metric, axis, cost_label(axis, ok), title, ax=ax)


__all__ = ["frontier", "load_results", "plot_frontier", "relative_to", "summarise"]
