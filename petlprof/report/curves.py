"""Learning curves from the validation checks: the validation metric against optimiser steps, training energy
and training time.

A run trained with ``--eval-every`` (or ``--target-value``) scores its validation split every ``--eval-every``
steps and keeps each score in its record (``train.budget.checks``) with the training time and energy spent by
then (the checks left out).  Those points show how quality grew with what was spent -- a method that learns the
answer format fast and then drifts, another that keeps climbing -- and, with a target no run reaches, whether the
budget was long enough (the curve has stopped rising).

:func:`curve_frame` gathers the checks of every ok run, :func:`learning_curve_figures` draws one figure per task
and backbone: a panel per axis (steps; training energy where it was measured; training time), each with a line per
configuration through the mean over its seeds at each checked step (thin lines for the single seeds when there are
several), the target as a dashed line and the zero-shot row's evaluation score as a dotted one.  A seed that
stopped at its target has no later checks, so a mean is over the seeds still training at that step; the legend says
how many seeds a configuration has.  Records written before validation splits scored the first examples of the
evaluation split; their curves say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from petlprof.report.intervals import DEFAULT_INTERVAL, INTERVALS, half_width
from petlprof.report.plotkit import save_figure
from petlprof.report.records import is_ok, run_label
from petlprof.results.figures import ENERGY_KIND, HIGHER
from petlprof.results.result import RunResult, results_of
from petlprof.tasks.metrics import direction
from petlprof.vocabulary import ZERO_SHOT

CURVE_STEM = "learning_curves"


CURVE_COLUMNS = [
    "task",
    "backbone",
    "label",
    "seed",
    "step",
    "value",
    "train_energy_j",
    "train_time_s",
    "metric",
    "target",
    "slice",
    "every",
    "split",
    "energy_kind",
]


def curve_frame(records: Sequence[RunResult | Mapping[str, Any]]) -> pd.DataFrame:
    """One row per validation check of every ok run: task, backbone, configuration label, seed, step, value,
    training energy and time by then, the metric and its target, the size of the slice it was scored on, and that
    slice's split (``validation``; ``evaluation`` for a record written before validation splits)."""
    rows = []
    for record in results_of(records):
        budget = record.budget
        if budget is None or not budget.checks or not is_ok(record):
            continue
        split = "validation" if (record.spec or {}).get("val_size") else "evaluation"
        kind = None if record.train is None else record.train.text(ENERGY_KIND)  # measured, or estimated
        for check in budget.checks:
            rows.append(
                {
                    "task": record.task,
                    "backbone": record.backbone,
                    "label": run_label(record),
                    "seed": record.seed,
                    "step": check.step,
                    "value": check.value,
                    "train_energy_j": check.train_energy_j,
                    "train_time_s": check.train_time_s,
                    "metric": budget.target_metric,
                    "target": budget.target_value,
                    "slice": budget.check_eval_size,
                    "every": budget.eval_every_steps,
                    "split": split,
                    "energy_kind": kind,
                }
            )
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def zero_shot_levels(records: Sequence[RunResult | Mapping[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(task, backbone, metric) -> the zero-shot row's evaluation score: the level a tuned method must pass."""
    levels: dict[tuple[str, str, str], float] = {}
    for record in results_of(records):
        if record.method != ZERO_SHOT or not is_ok(record):
            continue
        for metric, value in record.metrics.items():
            if value is not None:
                levels[(str(record.task), str(record.backbone), metric)] = float(value)
    return levels


def mean_curve(group: pd.DataFrame, interval: str = DEFAULT_INTERVAL) -> pd.DataFrame:
    """Per checked step of one configuration: the mean value, training energy and time over the seeds checked
    there, their count, and the half-width of the mean value's ``interval`` (:data:`~petlprof.report.intervals.
    INTERVALS`; NaN at a step one seed reached)."""
    out = group.groupby("step").agg(
        value=("value", "mean"),
        train_energy_j=("train_energy_j", "mean"),
        train_time_s=("train_time_s", "mean"),
        seeds=("value", "count"),
        half_width=("value", lambda values: half_width(list(values), interval)),
    )
    return out.reset_index()


@dataclass(frozen=True)
class LevelCost:
    """What one configuration's mean curve spent to reach a level: the first checked step whose mean score is at or
    past it, with the mean training energy and time by then (None: the curve never reached it)."""

    label: str
    best: float  # the mean curve's best score
    step: int | None
    energy_j: float | None
    time_s: float | None


def common_level(frame: pd.DataFrame) -> float | None:
    """The best score every configuration's mean curve reaches: the worst of their best mean scores (None for one
    configuration, which has nothing to be compared with)."""
    if frame["label"].nunique() < 2:
        return None
    higher = direction(str(frame["metric"].iloc[0])) == HIGHER
    bests = [_best(mean_curve(group)["value"], higher) for _, group in frame.groupby("label", sort=True)]
    return min(bests) if higher else max(bests)


def _best(values: pd.Series, higher: bool) -> float:
    return float(values.max() if higher else values.min())


def costs_to_level(frame: pd.DataFrame, level: float) -> list[LevelCost]:
    """Each configuration's cost to reach ``level``, read from its mean curve at the checks (no interpolation: the
    first check at or past it)."""
    higher = direction(str(frame["metric"].iloc[0])) == HIGHER
    out = []
    for label, group in frame.groupby("label", sort=True):
        mean = mean_curve(group)
        reached = mean[mean["value"] >= level] if higher else mean[mean["value"] <= level]
        first = reached.iloc[0] if len(reached) else None
        out.append(
            LevelCost(
                str(label),
                _best(mean["value"], higher),
                None if first is None else int(first["step"]),
                None if first is None or pd.isna(first["train_energy_j"]) else float(first["train_energy_j"]),
                None if first is None or pd.isna(first["train_time_s"]) else float(first["train_time_s"]),
            )
        )
    return out


@dataclass
class CurvePlot:
    task: str
    backbone: str
    stem: Path
    configurations: int
    metric: str = ""
    split: str = "validation"
    energy_kind: str = "unknown kind"
    level: float | None = None  # common_level: the score every configuration's mean curve reaches
    costs: tuple[LevelCost, ...] = ()  # each configuration's cost to reach it

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
    splits = "/".join(sorted(set(frame["split"])))
    on = f"{'/'.join(map(str, slices))} {splits} examples" if slices else f"the {splits} slice"
    return f"{metric} on {on}, checked every {'/'.join(map(str, every))} steps"


# the panels of a curve figure: the frame's column on the x axis, and its label
AXES = (
    ("step", "optimiser steps"),
    ("train_energy_j", "training energy (J, checks left out)"),
    ("train_time_s", "training time (s, measured, checks left out)"),
)


def target_lines(frame: pd.DataFrame) -> list[float]:
    """The targets worth a line: those within the values' span (plus a tenth), not e.g. an
    unreachable 1.0 that only traced the curve and would squeeze it."""
    low, high = frame["value"].min(), frame["value"].max()
    pad = 0.1 * (high - low)
    return [t for t in sorted({float(t) for t in frame["target"].dropna()}) if low - pad <= t <= high + pad]


def _fit_lines(ax, frame: pd.DataFrame, zero_shot: float | None) -> None:
    """The value axis spans the curves, the targets drawn and the zero-shot line, not the bands: a 95% interval over
    two seeds is 12.7 standard errors wide each side, and would squeeze the curves into a sliver (it runs off the
    axes instead)."""
    values = [*frame["value"].dropna(), *target_lines(frame), *([zero_shot] if zero_shot is not None else [])]
    low, high = min(values), max(values)
    pad = 0.08 * (high - low) or 0.05 * (abs(high) or 1.0)
    ax.set_ylim(low - pad, high + pad)


def draw_curves(frame: pd.DataFrame, title: str, zero_shot: float | None = None, interval: str = DEFAULT_INTERVAL):
    """The figure of one task and backbone's curves: a panel per axis with values (energy only where measured); a
    configuration of several seeds has its mean's ``interval`` as a band, at the steps two or more seeds reached."""
    # matplotlib: slow to import, loaded only when used
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    axes = [(column, text) for column, text in AXES if frame[column].notna().any()]
    fig = Figure(figsize=(5.2 * len(axes), 4.6), dpi=110)
    colours = [f"C{i % 10}" for i in range(frame["label"].nunique())]
    for index, (column, text) in enumerate(axes):
        ax = fig.add_subplot(1, len(axes), index + 1)
        for colour, (label, group) in zip(colours, frame.groupby("label", sort=True)):
            seeds = group["seed"].nunique()
            if seeds > 1:
                for _, one in group.groupby("seed"):
                    ax.plot(one[column], one["value"], color=colour, linewidth=0.6, alpha=0.35)
            mean = mean_curve(group, interval)
            name = f"{label} (mean of {seeds} seeds)" if seeds > 1 else f"{label} (1 seed)"
            ax.plot(mean[column], mean["value"], color=colour, marker="o", markersize=3, linewidth=1.6, label=name)
            if mean["half_width"].notna().any():  # NaN half-widths (one seed at a step) leave gaps in the band
                low, high = mean["value"] - mean["half_width"], mean["value"] + mean["half_width"]
                ax.fill_between(mean[column], low, high, color=colour, alpha=0.15, linewidth=0)
        for target in target_lines(frame):
            ax.axhline(target, color="0.3", linestyle="--", linewidth=1, label=f"target {target:g}")
        if zero_shot is not None:
            ax.axhline(
                zero_shot, color="0.45", linestyle=":", linewidth=1.2, label=f"zero-shot {zero_shot:.3g} (eval split)"
            )
        _fit_lines(ax, frame, zero_shot)
        kinds = "/".join(sorted({str(k) for k in frame["energy_kind"].dropna()})) or "unknown kind"
        ax.set_xlabel(text.replace("(J,", f"(J, {kinds},"))
        ax.set_ylabel(f"{frame['metric'].iloc[0]} ({frame['split'].iloc[0]} slice)")
        ax.grid(True, alpha=0.3)
        if index == 0:
            handles, _ = ax.get_legend_handles_labels()
            if frame.groupby("label")["seed"].nunique().max() > 1:
                handles.append(Patch(color="0.5", alpha=0.3, label=f"band: {INTERVALS[interval]}"))
            ax.legend(handles=handles, fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def learning_curve_figures(
    records: Sequence[RunResult | Mapping[str, Any]], out_dir: Path, interval: str = DEFAULT_INTERVAL
) -> list[CurvePlot]:
    """``learning_curves[_task_backbone].{png,svg}`` for the records that carry validation checks, each mean curve of
    several seeds with its ``interval`` as a band."""
    frame = curve_frame(records)
    if frame.empty:
        return []
    levels = zero_shot_levels(records)
    groups = list(frame.groupby(["task", "backbone"], sort=True))
    plots = []
    for (task, backbone), group in groups:
        suffix = "" if len(groups) == 1 else f"_{task}_{backbone}".replace("/", "-")
        stem = Path(out_dir) / f"{CURVE_STEM}{suffix}"
        zero_shot = levels.get((str(task), str(backbone), str(group["metric"].iloc[0])))
        fig = draw_curves(group, f"{task} / {backbone}: {_title(group)}", zero_shot, interval)
        save_figure(fig, [stem.with_suffix(ext) for ext in (".png", ".svg")], dpi="figure")
        level = common_level(group)
        plots.append(
            CurvePlot(
                str(task),
                str(backbone),
                stem,
                group["label"].nunique(),
                str(group["metric"].iloc[0]),
                "/".join(sorted(set(group["split"]))),
                "/".join(sorted({str(k) for k in group["energy_kind"].dropna()})) or "unknown kind",
                level,
                tuple(costs_to_level(group, level)) if level is not None else (),
            )
        )
    return plots
