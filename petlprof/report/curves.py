"""Learning curves from the target checks: the held-out metric against optimiser steps.

A run trained with ``--target-value`` scores a held-out slice every ``--eval-every`` steps and keeps
each score in its record (``train.budget.checks``).  Those scores trace how the metric rose during
training; with a target no run reaches (e.g. accuracy 1.0) they cover the whole budget, which is
how a study shows that its budget is long enough (the curve has stopped rising).

:func:`curve_frame` gathers the checks of every ok run, :func:`learning_curve_figures` draws one
plot per task and backbone: a line per configuration through the mean over its seeds at each
checked step (thin lines for the single seeds when there are several) and the target as a dashed
line.  A seed that stopped at its target has no later checks, so a mean is over the seeds still
training at that step; the legend says how many seeds a configuration has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from petlprof.report.plotkit import save_figure
from petlprof.report.records import is_ok, run_label
from petlprof.results.result import RunResult, results_of

CURVE_STEM = "learning_curves"


def curve_frame(records: Sequence[RunResult | Mapping[str, Any]]) -> pd.DataFrame:
    """One row per target check of every ok run: task, backbone, configuration label, seed, step,
    value, the metric and its target, and the size of the slice it was scored on."""
    rows = []
    for record in results_of(records):
        budget = record.budget
        if budget is None or not budget.checks or not is_ok(record):
            continue
        for check in budget.checks:
            rows.append(
                {
                    "task": record.task,
                    "backbone": record.backbone,
                    "label": run_label(record),
                    "seed": record.seed,
                    "step": check.step,
                    "value": check.value,
                    "metric": budget.target_metric,
                    "target": budget.target_value,
                    "slice": budget.check_eval_size,
                    "every": budget.eval_every_steps,
                }
            )
    columns = ["task", "backbone", "label", "seed", "step", "value", "metric", "target", "slice", "every"]
    return pd.DataFrame(rows, columns=columns)


def mean_curve(group: pd.DataFrame) -> pd.DataFrame:
    """Per checked step of one configuration: the mean value over the seeds checked there and their count."""
    out = group.groupby("step")["value"].agg(["mean", "count"]).reset_index()
    return out.rename(columns={"mean": "value", "count": "seeds"})


@dataclass
class CurvePlot:
    task: str
    backbone: str
    stem: Path
    configurations: int

    @property
    def path(self) -> Path:
        return self.stem.with_suffix(".png")

    @property
    def paths(self) -> list[Path]:
        return [self.stem.with_suffix(".png"), self.stem.with_suffix(".svg")]


def _title(frame: pd.DataFrame) -> str:
    metric = frame["metric"].iloc[0]
    slices = sorted({int(s) for s in frame["slice"].dropna()})
    every = sorted({int(e) for e in frame["every"].dropna()})
    on = f"the first {'/'.join(map(str, slices))} evaluation examples" if slices else "the held-out slice"
    return f"{metric} on {on}, checked every {'/'.join(map(str, every))} steps (target checks)"


def target_lines(frame: pd.DataFrame) -> list[float]:
    """The targets worth a line: those within the values' span (plus a tenth), not e.g. an
    unreachable 1.0 that only traced the curve and would squeeze it."""
    low, high = frame["value"].min(), frame["value"].max()
    pad = 0.1 * (high - low)
    return [t for t in sorted({float(t) for t in frame["target"].dropna()}) if low - pad <= t <= high + pad]


def draw_curves(frame: pd.DataFrame, title: str):
    """The figure of one task and backbone's curves."""
    # matplotlib: slow to import, loaded only when used
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=110)
    ax = fig.add_subplot()
    colours = [f"C{i % 10}" for i in range(frame["label"].nunique())]
    for colour, (label, group) in zip(colours, frame.groupby("label", sort=True)):
        seeds = group["seed"].nunique()
        if seeds > 1:
            for _, one in group.groupby("seed"):
                ax.plot(one["step"], one["value"], color=colour, linewidth=0.6, alpha=0.35)
        mean = mean_curve(group)
        name = f"{label} (mean of {seeds} seeds)" if seeds > 1 else f"{label} (1 seed)"
        ax.plot(mean["step"], mean["value"], color=colour, marker="o", markersize=3, linewidth=1.6, label=name)
    for target in target_lines(frame):
        ax.axhline(target, color="0.3", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("optimiser steps")
    ax.set_ylabel(f"{frame['metric'].iloc[0]} (held-out slice)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def learning_curve_figures(records: Sequence[RunResult | Mapping[str, Any]], out_dir: Path) -> list[CurvePlot]:
    """``learning_curves[_task_backbone].{png,svg}`` for the records that carry target checks."""
    frame = curve_frame(records)
    if frame.empty:
        return []
    groups = list(frame.groupby(["task", "backbone"], sort=True))
    plots = []
    for (task, backbone), group in groups:
        suffix = "" if len(groups) == 1 else f"_{task}_{backbone}".replace("/", "-")
        stem = Path(out_dir) / f"{CURVE_STEM}{suffix}"
        fig = draw_curves(group, f"{task} / {backbone}: {_title(group)}")
        save_figure(fig, [stem.with_suffix(ext) for ext in (".png", ".svg")], dpi="figure")
        plots.append(CurvePlot(str(task), str(backbone), stem, group["label"].nunique()))
    return plots
