"""Accuracy-versus-cost Pareto plots: the primary metric against train energy and train peak memory.

One figure per (task, backbone, primary metric) and cost.  Each method has one colour and marker;
the seeds of a configuration become one point at their mean with min–max error bars; the Pareto
front of those points (from :func:`petlprof.pareto.pareto_front` and the metric-direction table)
is drawn as a step line with its points ringed.  The cost axis says where its figures came from,
and says ``(estimated)`` when any plotted energy is an estimate.  Figures are drawn on matplotlib's
Agg canvas directly, so no display is needed and pyplot's global state is left alone.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from petlprof.metrics import direction
from petlprof.pareto import pareto_front
from petlprof.report.records import BYTES_PER_MIB, MISSING, config_key, distinct, field, is_ok, number, run_label, text

MARKERS = "osD^vP*Xh<>p"
LOG_SPREAD = 10.0  # a cost axis goes logarithmic when its largest value exceeds this times its smallest


@dataclass(frozen=True)
class CostAxis:
    """A cost plotted on x: where it sits in a record, its unit and where its provenance is noted."""

    slug: str  # in the file name: pareto_<metric>_vs_<slug>.png
    title: str
    objective: str  # the metric-direction name the Pareto front uses
    unit: str
    factor: float  # record value (SI unit of the field name) -> plotted unit
    source_field: str
    kind_field: str | None = None
    phase: str = "train"


ENERGY = CostAxis("energy", "Train energy", "energy_j", "J", 1.0, "energy_source", "energy_kind")
MEMORY = CostAxis("memory", "Train peak memory", "peak_memory_bytes", "MiB", 1 / BYTES_PER_MIB, "memory_source")
COST_AXES = (ENERGY, MEMORY)


@dataclass(frozen=True)
class Spread:
    """Mean, minimum and maximum of one figure over a configuration's seeds."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        return cls(statistics.fmean(values), min(values), max(values))


@dataclass(frozen=True)
class Point:
    """One configuration on a plot (its seeds averaged)."""

    method: str
    label: str
    x: Spread
    y: Spread
    seeds: int
    estimated: bool


@dataclass
class PlotResult:
    """What a plot showed, for report.md: its file, or why there is none, and the front's configurations."""

    task: str
    backbone: str
    metric: str
    axis: CostAxis
    path: Path | None = None
    skipped: str | None = None
    on_front: list[str] = dataclass_field(default_factory=list)
    runs: int = 0


def _slug(value: str) -> str:
    """A file-name-safe form of a task, backbone or metric name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-.") or "unnamed"


def plottable(record: Mapping[str, Any], metric: str, axis: CostAxis) -> bool:
    """True for a finished run that has both the metric and the cost figure."""
    has_metric = number(record, "metrics", metric) is not None
    return is_ok(record) and has_metric and number(record, axis.phase, axis.objective) is not None


def points(records: Sequence[Mapping[str, Any]], metric: str, axis: CostAxis) -> list[Point]:
    """The plottable configurations, seeds merged."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        if plottable(record, metric, axis):
            groups[config_key(record)].append(record)
    result = []
    for runs in groups.values():
        xs = [number(r, axis.phase, axis.objective) * axis.factor for r in runs]
        ys = [number(r, "metrics", metric) for r in runs]
        estimated = any(field(r, axis.phase, axis.kind_field or "") == "estimated" for r in runs)
        result.append(Point(text(runs[0].get("method")), run_label(runs[0]), Spread.of(xs), Spread.of(ys), len(runs), estimated))
    return result


def cost_label(axis: CostAxis, records: Sequence[Mapping[str, Any]]) -> str:
    """The x-axis label: the cost and unit, ``(estimated)`` when any figure is estimated, the source(s)."""
    label = f"{axis.title} ({axis.unit})"
    if axis.kind_field:
        kinds = {field(r, axis.phase, axis.kind_field) for r in records}
        if "estimated" in kinds:
            label += " (estimated)" if kinds == {"estimated"} else " (estimated: hollow markers)"
    sources = [str(s) for s in distinct(field(r, axis.phase, axis.source_field) for r in records)]
    if sources:
        label += f" — source{'s' if len(sources) > 1 else ''}: {', '.join(sources)}"
    return label


def wants_log_scale(values: Sequence[float]) -> bool:
    """True when positive values spread over more than LOG_SPREAD times, so a log axis reads better."""
    return min(values) > 0 and max(values) / min(values) > LOG_SPREAD


def _draw(points_: list[Point], front: list[int], metric: str, axis: CostAxis, xlabel: str, title: str, path: Path) -> None:
    """Draw one Pareto plot to ``path`` as PNG."""
    fig = Figure(figsize=(8.5, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    palette = [f"C{i}" for i in range(10)]
    methods = sorted({p.method for p in points_})
    mixed = len({p.estimated for p in points_}) > 1
    for i, method in enumerate(methods):
        colour, marker = palette[i % len(palette)], MARKERS[i % len(MARKERS)]
        for j, p in enumerate(q for q in points_ if q.method == method):
            several = p.seeds > 1  # a single seed has no spread to show
            ax.errorbar(
                p.x.mean, p.y.mean,
                xerr=[[p.x.mean - p.x.low], [p.x.high - p.x.mean]] if several else None,
                yerr=[[p.y.mean - p.y.low], [p.y.high - p.y.mean]] if several else None,
                fmt=marker, color=colour, markersize=7, capsize=3, elinewidth=1,
                markerfacecolor="none" if (mixed and p.estimated) else colour,
                label=method if j == 0 else None,
            )
            note = p.label[len(p.method):].strip()
            if p.seeds > 1:
                note = f"{note} ({p.seeds} seeds)".strip()
            if note:
                ax.annotate(note, (p.x.mean, p.y.mean), xytext=(6, 5), textcoords="offset points", fontsize=7, color=colour)
    best = sorted((points_[i] for i in front), key=lambda p: p.x.mean)
    front_x, front_y = [p.x.mean for p in best], [p.y.mean for p in best]
    ax.step(front_x, front_y, where="post", color="black", linestyle="--", linewidth=1, label="Pareto front")
    ax.scatter(front_x, front_y, s=220, facecolors="none", edgecolors="black", linewidths=1.2, label="on the front", zorder=3)
    if wants_log_scale([p.x.low for p in points_] + [p.x.high for p in points_]):
        ax.set_xscale("log")
    ax.set_xlabel(xlabel + (" [log scale]" if ax.get_xscale() == "log" else ""))
    ax.set_ylabel(f"{metric} on eval set ({direction(metric)} is better)")
    seeds_note = "\npoints: mean over seeds, bars: min–max" if any(p.seeds > 1 for p in points_) else ""
    ax.set_title(title + seeds_note, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=120)


def pareto_plot(records: Sequence[Mapping[str, Any]], result: PlotResult, path: Path) -> PlotResult:
    """Fill ``result`` by plotting ``records`` (one task/backbone/metric) against its cost to ``path``."""
    if result.metric == MISSING:
        result.skipped = "the runs record no primary metric"
        return result
    try:
        direction(result.metric)
    except KeyError:
        result.skipped = f"no better-direction is known for the metric '{result.metric}'"
        return result
    pts = points(records, result.metric, result.axis)
    if not pts:
        ok = sum(1 for r in records if is_ok(r))
        result.skipped = (
            f"none of the {ok} finished run(s) has both {result.metric} and {result.axis.phase} {result.axis.objective}"
            if ok else "no run finished"
        )
        return result
    objectives = [result.metric, result.axis.objective]
    front = pareto_front([{result.metric: p.y.mean, result.axis.objective: p.x.mean} for p in pts], objectives)
    plotted = [r for r in records if plottable(r, result.metric, result.axis)]
    title = f"{result.metric} vs {result.axis.title.lower()} — backbone {result.backbone}, task {result.task}"
    _draw(pts, front, result.metric, result.axis, cost_label(result.axis, plotted), title, path)
    result.path, result.runs = path, len(plotted)
    result.on_front = [pts[i].label for i in front]
    return result


def pareto_figures(records: Sequence[Mapping[str, Any]], out_dir: Path) -> list[PlotResult]:
    """Draw every Pareto plot ``records`` allow into ``out_dir``: per task, backbone and metric, one per cost.

    File names are ``pareto_<metric>_vs_<cost>.png``, with ``_<task>`` (and ``_<backbone>``) added
    when the records span several tasks (backbones).
    """
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        if is_ok(record) or record.get("primary_metric"):  # a failed run without a metric has nothing to plot
            key = (text(record.get("task")), text(record.get("backbone")), text(record.get("primary_metric")))
            groups[key].append(record)
    several_tasks = len({task for task, _, _ in groups}) > 1
    several_backbones = len({backbone for _, backbone, _ in groups}) > 1
    results = []
    for (task, backbone, metric), members in sorted(groups.items()):
        suffix = (f"_{_slug(task)}" if several_tasks else "") + (f"_{_slug(backbone)}" if several_backbones else "")
        for axis in COST_AXES:
            path = out_dir / f"pareto_{_slug(metric)}_vs_{axis.slug}{suffix}.png"
            results.append(pareto_plot(members, PlotResult(task, backbone, metric, axis), path))
    return results
