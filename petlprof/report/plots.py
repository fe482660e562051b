"""Quality-versus-cost Pareto plots: the primary metric against train energy, train peak memory,
train time and trainable parameters, as PNG and SVG.

One figure per (task, backbone, primary metric) and cost.  Each method has one colour and marker
and its grid points (ordered by its Pareto knob) are joined by a line; each point is the mean over
the configuration's seeds with 95% confidence-interval bars (Student's t) when it has several.  The
overall frontier (from :func:`petlprof.report.frame.frontier` and the metric-direction table) is a
dashed step line with its points ringed.  Axis labels carry units and say ``estimated`` where any
plotted figure is an estimate.  Point labels are placed so they do not overlap each other or the
markers; the legend sits outside the axes.  Figures are drawn on matplotlib's Agg canvas, so no
display is needed and pyplot's global state is left alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from petlprof.metrics import METRIC_RANGES, direction
from petlprof.report.frame import frontier, knob_sort_value, runs_frame
from petlprof.report.records import BYTES_PER_MIB, MISSING, distinct, text

MARKERS = "osD^vP*Xh<>p"
LOG_SPREAD = 10.0  # a cost axis goes logarithmic when its largest value exceeds this times its smallest
FORMATS = ("png", "svg")
LABEL_OFFSETS = (
    (7, 6),
    (7, -7),
    (-7, 6),
    (-7, -7),
    (0, 11),
    (0, -11),
    (12, 0),
    (-12, 0),
    (12, 12),
    (-12, -12),
    (12, -12),
    (-12, 12),
    (0, 18),
    (0, -18),
    (-20, -20),
    (20, -20),
    (-20, 20),
    (20, 20),
    (0, -28),
    (0, 28),
)


@dataclass(frozen=True)
class CostAxis:
    """A cost plotted on x: its column in :func:`runs_frame`, unit and where its provenance is noted."""

    slug: str  # in the file name: pareto_<metric>_vs_<slug>.png
    title: str
    column: str  # also its name in the metric-direction table
    unit: str
    factor: float  # record value (SI unit of the field name) -> plotted unit
    source_column: str | None = None
    kind_column: str | None = None


ENERGY = CostAxis("energy", "Train energy", "energy_j", "J", 1.0, "energy_source", "energy_kind")
MEMORY = CostAxis("memory", "Train peak memory", "peak_memory_bytes", "MiB", 1 / BYTES_PER_MIB, "memory_source")
TIME = CostAxis("time", "Train time", "time_s", "s, warm-up excluded", 1.0)
PARAMS = CostAxis("params", "Trainable parameters", "trainable_params", "count", 1.0)
COST_AXES = (ENERGY, MEMORY, TIME, PARAMS)


def axis_for(column: str) -> CostAxis:
    """The cost axis of a runs-frame column: a known one, or the column itself without unit scaling."""
    known = {axis.column: axis for axis in COST_AXES}
    known.update(
        {
            f"eval_{a.column}": CostAxis(
                a.slug,
                a.title.replace("Train", "Eval"),
                f"eval_{a.column}",
                a.unit,
                a.factor,
                a.source_column and f"eval_{a.source_column}",
                a.kind_column and f"eval_{a.kind_column}",
            )
            for a in (ENERGY, MEMORY, TIME)
        }
    )
    return known.get(column) or CostAxis(column, column, column, "as recorded", 1.0)


@dataclass
class PlotResult:
    """What a plot showed, for the reports: its files, or why there are none, and the front."""

    task: str
    backbone: str
    metric: str
    axis: CostAxis
    paths: list[Path] = dataclass_field(default_factory=list)
    skipped: str | None = None
    on_front: list[str] = dataclass_field(default_factory=list)
    runs: int = 0
    configs: int = 0

    @property
    def path(self) -> Path | None:
        """The PNG file, or None when nothing was plotted."""
        return next((p for p in self.paths if p.suffix == ".png"), None)


def _slug(value: str) -> str:
    """A file-name-safe form of a task, backbone or metric name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-.") or "unnamed"


def cost_label(axis: CostAxis, runs: pd.DataFrame) -> str:
    """The x-axis label: the cost and unit, ``(estimated)`` when any figure is estimated, the source(s)."""
    label = f"{axis.title} ({axis.unit})"
    if axis.kind_column and axis.kind_column in runs:
        kinds = set(runs[axis.kind_column].dropna())
        if "estimated" in kinds:
            label += " (estimated)" if kinds == {"estimated"} else " (estimated: hollow markers)"
    if axis.source_column and axis.source_column in runs:
        sources = [str(s) for s in distinct(runs[axis.source_column].dropna())]
        if sources:
            label += f" — source{'s' if len(sources) > 1 else ''}: {', '.join(sources)}"
    return label


def wants_log_scale(values: Sequence[float]) -> bool:
    """True when positive values spread over more than LOG_SPREAD times, so a log axis reads better."""
    return min(values) > 0 and max(values) / min(values) > LOG_SPREAD


def point_label(row: Mapping[str, Any]) -> str | None:
    """The text beside a point: its knob value (the legend names the knob), else its config."""
    value = row.get("knob_value")
    if row.get("pareto_knob") and value is not None and not (isinstance(value, float) and math.isnan(value)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    return None if row.get("config") in (None, MISSING) else str(row["config"])


def _ci(value: Any, factor: float) -> float:
    return 0.0 if value is None or math.isnan(value) else float(value) * factor


COST = "cost"  # energy, memory, time and parameter counts are never negative


def _bounded_ci(y: float, half_width: Any, metric: str) -> Any:
    """The interval y ± half_width cut to the metric's range (accuracy cannot pass 1, nor energy fall
    below 0, however few the seeds), as matplotlib's [[below], [above]]."""
    half = _ci(half_width, 1.0)
    low, high = (0.0, math.inf) if metric == COST else METRIC_RANGES.get(metric, (-math.inf, math.inf))
    return [[max(min(half, y - low), 0.0)], [max(min(half, high - y), 0.0)]]


def _place_labels(
    fig: Figure, ax, items: list[tuple[float, float, str, str]], rings: list[tuple[float, float]]
) -> None:
    """Annotate points so labels overlap neither each other nor any marker or frontier ring, trying
    offsets in turn (the least-overlapping one when none is free)."""
    fig.canvas.draw()  # lays the figure out, so display coordinates are final
    renderer = fig.canvas.get_renderer()
    taken = []
    for points, half in ((((x, y) for x, y, _, _ in items), 7), (rings, 13)):
        for x, y in points:
            px, py = ax.transData.transform((x, y))
            taken.append((px - half, py - half, px + half, py + half))
    frame = ax.get_window_extent(renderer)

    def cost(box) -> float:
        inside = box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1
        area = sum(
            max(0.0, min(box.x1, b[2]) - max(box.x0, b[0])) * max(0.0, min(box.y1, b[3]) - max(box.y0, b[1]))
            for b in taken
        )
        return area + (0.0 if inside else 1e6)

    for x, y, label, colour in items:
        best = None
        for dx, dy in LABEL_OFFSETS:
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            note = ax.annotate(
                label,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=7,
                color=colour,
                ha=ha,
                va="bottom" if dy >= 0 else "top",
                zorder=4,
                bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
                arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.6, "shrinkA": 0, "shrinkB": 4},
            )  # a leader line ties a displaced label to its point
            box = note.get_window_extent(renderer)
            score = cost(box)
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, note, box)
            else:
                note.remove()
            if score == 0:
                break
        taken.append((best[2].x0, best[2].y0, best[2].x1, best[2].y1))


def draw(configs: pd.DataFrame, y: str, metric: str, axis: CostAxis, xlabel: str, title: str, ax=None) -> Figure:
    """Draw one Pareto plot of per-configuration rows (from :func:`frontier`, with ``on_front``):
    column ``y`` (the quality ``metric``) against ``axis``; into ``ax`` if given, else a new figure."""
    if ax is None:
        fig = Figure(figsize=(10, 6), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
    fig = ax.get_figure()
    y_col = y
    x_col, x_ci = axis.column, f"{axis.column}_ci95"
    mixed = axis.kind_column is not None and configs[axis.kind_column].nunique() > 1
    labels, handles = [], []
    for i, method in enumerate(sorted(configs["method"].unique())):
        colour, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
        rows = configs[configs["method"] == method]
        rows = rows.iloc[
            sorted(range(len(rows)), key=lambda k: (knob_sort_value(rows.iloc[k]["knob_value"]), rows.iloc[k][x_col]))
        ]
        xs, ys = rows[x_col] * axis.factor, rows[y_col]
        if len(rows) > 1:
            ax.plot(xs, ys, "-", color=colour, alpha=0.55, linewidth=1.2, zorder=1)
        for (_, row), x, y in zip(rows.iterrows(), xs, ys):
            hollow = mixed and row.get(axis.kind_column) == "estimated"
            ax.errorbar(
                x,
                y,
                xerr=_bounded_ci(x, _ci(row.get(x_ci), axis.factor), COST),
                yerr=_bounded_ci(y, row.get(f"{y_col}_ci95"), metric),
                fmt=marker,
                color=colour,
                markersize=7,
                capsize=3,
                elinewidth=1,
                zorder=2,
                markerfacecolor="none" if hollow else colour,
            )
            note = point_label(row)
            if note:
                labels.append((x, y, note, colour))
        knob = rows["pareto_knob"].dropna()
        name = f"{method} ({knob.iloc[0]} = point label)" if len(knob) else method
        handles.append(Line2D([], [], color=colour, marker=marker, linestyle="-" if len(rows) > 1 else "", label=name))
    best = configs[configs["on_front"]].sort_values(x_col)
    front_x, front_y = best[x_col] * axis.factor, best[y_col]
    ax.step(front_x, front_y, where="post", color="black", linestyle="--", linewidth=1, zorder=0)
    ax.scatter(front_x, front_y, s=230, facecolors="none", edgecolors="black", linewidths=1.2, zorder=3)
    handles.append(
        Line2D(
            [],
            [],
            color="black",
            linestyle="--",
            marker="o",
            markerfacecolor="none",
            markersize=11,
            label="Pareto frontier (ringed points)",
        )
    )
    if (configs["n_seeds"] > 1).any():
        seeds = sorted({int(n) for n in configs["n_seeds"]})
        handles.append(
            Line2D(
                [],
                [],
                color="grey",
                marker="|",
                markersize=10,
                linestyle="-",
                label=f"mean ± 95% CI over {'/'.join(map(str, seeds))} seeds (t)",
            )
        )
    else:
        handles.append(Line2D([], [], linestyle="", label="one seed: no error bars"))
    lows = (configs[x_col] - configs[x_ci].fillna(0)) * axis.factor
    if wants_log_scale(list(lows.clip(lower=0)) + list(configs[x_col] * axis.factor)):
        ax.set_xscale("log")
    ax.set_xlabel(xlabel + (" [log scale]" if ax.get_xscale() == "log" else ""))
    unit = "fraction, " if metric == "accuracy" else ""
    ax.set_ylabel(f"{metric} on eval set ({unit}{direction(metric)} is better)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.08)
    ax.margins(x=0.08, y=0.12)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _place_labels(fig, ax, labels, list(zip(front_x, front_y)))
    return fig


def pareto_plot(runs: pd.DataFrame, result: PlotResult, stem: Path) -> PlotResult:
    """Fill ``result`` by plotting ``runs`` (one task/backbone/metric) against its cost to ``stem``.png/.svg."""
    if result.metric == MISSING:
        result.skipped = "the runs record no primary metric"
        return result
    try:
        direction(result.metric)
    except KeyError:
        result.skipped = f"no better-direction is known for the metric '{result.metric}'"
        return result
    column = result.axis.column
    ok = runs[runs["status"] == "ok"]
    plotted = ok[ok[result.metric].notna() & ok[column].notna()] if result.metric in ok else ok.iloc[0:0]
    if plotted.empty:
        result.skipped = (
            f"none of the {len(ok)} finished run(s) has both {result.metric} and train {column}"
            if len(ok)
            else "no run finished"
        )
        return result
    configs = frontier(plotted, x=column, y=result.metric)
    title = f"{result.metric} vs {result.axis.title.lower()} — backbone {result.backbone}, task {result.task}"
    result.paths = [stem.parent / f"{stem.name}.{fmt}" for fmt in FORMATS]
    fig = draw(configs, result.metric, result.metric, result.axis, cost_label(result.axis, plotted), title)
    for path in result.paths:
        fig.savefig(path, dpi=120)
    result.runs, result.configs = len(plotted), len(configs)
    front = configs[configs["on_front"]].sort_values(column)
    result.on_front = [f"{m} {c}".strip() if c != MISSING else m for m, c in zip(front["method"], front["config"])]
    return result


def pareto_figures(records: Sequence[Mapping[str, Any]], out_dir: Path) -> list[PlotResult]:
    """Draw every Pareto plot ``records`` allow into ``out_dir``: per task, backbone and metric, one per cost.

    File names are ``pareto_<metric>_vs_<cost>.{png,svg}``, with ``_<task>`` (and ``_<backbone>``)
    added when the records span several tasks (backbones).
    """
    runs = runs_frame(records)
    runs = runs[
        (runs["status"] == "ok") | runs["primary_metric"].notna()
    ]  # a failed run without a metric has nothing to plot
    if runs.empty:
        return []
    keys = runs[["task", "backbone", "primary_metric"]].map(text)
    several_tasks, several_backbones = keys["task"].nunique() > 1, keys["backbone"].nunique() > 1
    results = []
    for (task, backbone, metric), index in sorted(keys.groupby(list(keys.columns)).groups.items()):
        suffix = (f"_{_slug(task)}" if several_tasks else "") + (f"_{_slug(backbone)}" if several_backbones else "")
        for axis in COST_AXES:
            stem = out_dir / f"pareto_{_slug(metric)}_vs_{axis.slug}{suffix}"
            results.append(pareto_plot(runs.loc[index], PlotResult(task, backbone, metric, axis), stem))
    return results
