"""The Python API for notebooks: sweeps run as ``petlprof run`` runs them, result stores as pandas DataFrames,
frontiers and plots.

```python
from petlprof.api import load_results, run_sweep, summarise, frontier, plot_frontier
from petlprof.results.figures import ENERGY, PEAK_MEMORY  # each figure's key, declared once

sweep = run_sweep(methods=["read", "lora"], output="my-sweep", seeds=[0, 1])  # any run option by its config name
runs = load_results("reports/tweets3-study/budget")     # one row per run (every status)
configs = frontier(runs, x=ENERGY.name, y="accuracy")  # one row per configuration, seeds merged, on_front
fig = plot_frontier(runs, x=PEAK_MEMORY.name)          # the report's plot, as a matplotlib Figure
records = load_records("my-sweep")                     # the runs as typed RunResult objects
records[0].train[ENERGY], records[0].task_info.majority_rate, records[0].budget  # a phase keyed by its Figure
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

import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from petlprof.execution.sweep import SweepOutcome, drive
from petlprof.report.frame import frontier, relative_to, runs_frame, summarise
from petlprof.report.records import load_records
from petlprof.report.terminal import report_sweep
from petlprof.results.figures import ENERGY
from petlprof.sweep.config import build_options, load_config_file


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


class Sweep(SweepOutcome):
    """What :func:`run_sweep` did: ``output`` (the folder), ``results_file`` (its results.jsonl), ``runs`` (of the
    sweep), ``recorded`` (of them, found in the results file and skipped), ``ran`` (run to a record by this call),
    ``failed`` (of those, not ok) and ``exit_code`` (what ``petlprof run`` exits with: 0; 1 when a run failed or
    a record could not be written; 130 or 143 when Ctrl-C or SIGTERM stopped the sweep)."""

    def results(self) -> pd.DataFrame:
        """The results file as :func:`load_results` reads it: one row per run, this call's and those before."""
        return load_results(self.results_file)


def run_sweep(
    methods: str | Sequence[str] | None = None,
    output: str | os.PathLike[str] | None = None,
    *,
    config: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Sweep:
    """Run a sweep from Python: what ``petlprof run`` runs, with the same options, checked the same way.

    ``methods``, ``output`` and every other keyword are run options under their config-file names (the fields of
    :class:`~petlprof.sweep.options.RunOptions`: ``seeds=[0, 1]``, ``backbone="minilm"``, ``train_size=32``,
    ``method_config={"lora": {"r": 8}}``, ``in_process=True``, ...), laid over those of the TOML or YAML file
    ``config`` as the command line's are; ``None`` leaves an option to the file or its default.  A bad value
    raises the :class:`~petlprof.errors.UsageError` whose line ``petlprof run`` prints, before any run starts or
    any file is written.  Runs already in the results file of ``output`` (a new ``petlprof-out/run-<time>``
    folder unless given) are skipped and every other run's record is appended to it; status lines go to stderr,
    the summary table to stdout, and the report into ``output``.  Ctrl-C (or SIGTERM, in the main thread) stops
    the sweep with the runs in flight recorded ``cancelled``, as on the command line."""
    values = {"methods": methods, "output": output, **options}
    file_values = load_config_file(os.fspath(config)) if config else {}
    run_options = build_options(file_values, {k: _as_given(v) for k, v in values.items()})
    outcome = drive(run_options, finish=report_sweep, peak=estimated_peak, predict=predictions_of(run_options))
    return Sweep(**vars(outcome))


def estimated_peak(*args: Any) -> int | None:
    """:func:`petlprof.estimate.core.lm_training_peak`, for the sweep's preflight, which cannot import the estimate
    (the layers above it may)."""
    # petlprof.estimate (torch, seconds): only a preflight that must price a batch its data decides imports it
    from petlprof.estimate.core import lm_training_peak

    return lm_training_peak(*args)


def predictions_of(options: Any) -> Any:
    """Each run's predicted costs (:func:`petlprof.estimate.runs.predict_runs`) for the sweep ``options`` describe,
    for the sweep driver, which cannot import the estimate; the classifier's labels read from each task."""

    def predict(specs: list) -> Mapping[str, Mapping[str, object]]:
        # petlprof.estimate: imported when a sweep has runs to predict (torch only where there is a device model)
        from petlprof.estimate.runs import predict_runs, training_row_lengths
        from petlprof.sweep.config import sweep_task
        from petlprof.sweep.lengths import longest_rows

        @functools.cache  # a task's rows on a backbone: tokenised once, whatever the configurations
        def rows_of(task: str, backbone: str) -> tuple[int, int]:
            return longest_rows(options, task, sweep_task(options, task), backbone)

        def lm_lengths(spec) -> tuple[int, int]:
            return rows_of(spec.task, spec.backbone)

        def objective_of(spec) -> str:  # --objective auto resolved as the run resolves it: by its task
            return sweep_task(options, spec.task).objective

        @functools.cache  # a classification task's rows on a backbone, tokenised once per --max-length
        def row_lengths(task: str, backbone: str, max_length: int) -> tuple[int, ...]:
            return training_row_lengths(sweep_task(options, task).train, backbone, max_length, options.random_init)

        return predict_runs(
            specs, lambda task: int(sweep_task(options, task).num_labels or 2), lm_lengths, objective_of, row_lengths
        )

    return predict


def _as_given(value: Any) -> Any:
    """A Python value as a config file gives it: a path as its text, a tuple or range as a list."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple, range)):
        return [_as_given(v) for v in value]
    return value


__all__ = [
    "Sweep",
    "frontier",
    "load_records",
    "load_results",
    "plot_frontier",
    "relative_to",
    "run_sweep",
    "summarise",
]
