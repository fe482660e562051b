"""Quality-versus-cost Pareto plots: the primary metric against train energy, train peak memory,
train time and trainable parameters, as PNG and SVG.

One figure per (task, backbone, primary metric) and cost.  Each method has one colour and marker
and its grid points (ordered by its Pareto knob) are joined by a line; each point is the mean over
the configuration's seeds with thin bars when it has several: the 95% confidence interval (Student's
t) or ± 1 standard error (``interval``, :mod:`petlprof.report.intervals`), said in the legend.  The
axes follow the means (:mod:`petlprof.report.plotkit`); a bar that runs past them is cut at the edge
and marked with a caret, and the legend counts those.  The
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

from petlprof.report.frame import frontier, knob_sort_value, majority_rate, of_task
from petlprof.report.intervals import DEFAULT_INTERVAL, caption, check_interval
from petlprof.report.plotkit import (
    COST,
    Bars,
    axis_limits,
    bar_legend,
    bounded_interval,
    clipped_caption,
    draw_bars,
    label_log_axis,
    place_labels,
    save_figure,
)
from petlprof.report.records import (
    MISSING,
    ZERO_SHOT_LABEL,
    distinct,
    text,
)
from petlprof.results import figures
from petlprof.tasks.metrics import METRIC_RANGES, direction
from petlprof.vocabulary import ESTIMATED, ZERO_SHOT

MARKERS = "osD^vP*Xh<>p"
LOG_SPREAD = 10.0  # a cost axis goes logarithmic when its largest value exceeds this times its smallest
FORMATS = ("png", "svg")
MAJORITY_LINE: dict[str, Any] = {"color": "dimgrey", "linestyle": ":", "linewidth": 1.3, "zorder": 0.5}
ZERO_SHOT_LINE: dict[str, Any] = {"color": "firebrick", "linestyle": "-.", "linewidth": 1.3, "zorder": 0.5}


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


ENERGY_AXIS = CostAxis(
    "energy",
    "Train energy",
    figures.ENERGY.name,
    figures.ENERGY.shown_unit,
    1.0,
    figures.ENERGY.source,
    figures.ENERGY.kind,
)
MEMORY_AXIS = CostAxis(
    "memory",
    "Train peak memory",
    figures.PEAK_MEMORY.name,
    figures.PEAK_MEMORY.shown_unit,
    figures.PEAK_MEMORY.scale,
    figures.PEAK_MEMORY.source,
)
TIME_AXIS = CostAxis("time", "Train time", figures.TIME.name, "s, warm-up excluded", figures.TIME.scale)
PARAMS_AXIS = CostAxis("params", "Trainable parameters", "trainable_params", "count", 1.0)
SEARCH_AXIS = CostAxis(  # drawn for a sweep with --tune lr: each configuration charged its learning-rate search
    "energy_with_search",
    "Train energy including the learning-rate search",
    figures.ENERGY_WITH_SEARCH,
    figures.ENERGY.shown_unit,
    1.0,
    None,
    figures.ENERGY.kind,
)
COST_AXES = (ENERGY_AXIS, MEMORY_AXIS, TIME_AXIS, PARAMS_AXIS)


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
            for a in (ENERGY_AXIS, MEMORY_AXIS, TIME_AXIS)
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
    caption: str = ""  # what the bars are, and how many were cut at the axes
    clipped: list[str] = dataclass_field(default_factory=list)  # "<method config>: x high", ...
    zero_shot: float | None = None  # the zero-shot row's score, drawn as a line

    @property
    def path(self) -> Path | None:
        """The PNG file, or None when nothing was plotted."""
        return next((p for p in self.paths if p.suffix == ".png"), None)


def file_slug(value: str) -> str:
    """A file-name-safe form of a task, backbone or metric name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-.") or "unnamed"


def cost_label(axis: CostAxis, runs: pd.DataFrame) -> str:
    """The x-axis label: the cost and unit, ``(estimated)`` when any figure is estimated, the source(s)."""
    label = f"{axis.title} ({axis.unit})"
    if axis.kind_column and axis.kind_column in runs:
        kinds = set(runs[axis.kind_column].dropna())
        if ESTIMATED in kinds:
            label += " (estimated)" if kinds == {ESTIMATED} else " (estimated: hollow markers)"
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


def new_axes(ax=None, figsize: tuple[float, float] = (10, 6)):
    """(figure, axes): ``ax`` and its figure, or a new figure on the Agg canvas."""
    if ax is None:
        fig = Figure(figsize=figsize, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
    return ax.get_figure(), ax


def _knob_order(rows: pd.DataFrame, x_col: str) -> pd.DataFrame:
    """A method's grid points in the order of its knob (then cost), as its line joins them."""
    keys = [(knob_sort_value(rows.iloc[k]["knob_value"]), rows.iloc[k][x_col]) for k in range(len(rows))]
    return rows.iloc[sorted(range(len(rows)), key=keys.__getitem__)]


def _set_limits(ax, configs: pd.DataFrame, x_col: str, y_col: str, factor: float, lines: list[float]) -> None:
    """Axes that follow the means and the reference ``lines`` (majority-class rate, zero-shot score; log x
    where the means spread past LOG_SPREAD, with a tick label at or left of the leftmost point), not the bars."""
    xs = list(configs[x_col] * factor)
    log = wants_log_scale(xs)
    if log:
        ax.set_xscale("log")
        low, high = axis_limits(xs, log=True)
        ax.set_xlim(min(low, label_log_axis(ax.xaxis, low, high, min(xs))), high)
    else:
        ax.set_xlim(*axis_limits(xs))
    ax.set_ylim(*axis_limits(list(configs[y_col]) + lines))


def _draw_majority(ax, majority: float | None) -> list[Line2D]:
    """The majority-class rate as a dotted line across the plot, and its legend entry."""
    if majority is None:
        return []
    ax.axhline(majority, **MAJORITY_LINE)
    label = f"majority-class rate ({majority:.3f}): always the most common class"
    return [Line2D([], [], **MAJORITY_LINE, label=label)]


def _draw_zero_shot(ax, score: float | None) -> list[Line2D]:
    """The zero-shot score (the model before tuning, no training cost) as a dash-dot line across the plot,
    and its legend entry: a configuration below it scores worse than not tuning at all."""
    if score is None:
        return []
    ax.axhline(score, **ZERO_SHOT_LINE)
    return [Line2D([], [], **ZERO_SHOT_LINE, label=f"{ZERO_SHOT_LABEL}: {score:.3f}, no training cost")]


def zero_shot_score(runs: pd.DataFrame, metric: str) -> float | None:
    """The mean ``metric`` of the finished zero-shot runs among ``runs``, or None when there are none."""
    if metric not in runs:
        return None
    scores = runs[(runs["method"] == ZERO_SHOT) & (runs["status"] == "ok")][metric].dropna()
    return float(scores.mean()) if len(scores) else None


def draw(
    configs: pd.DataFrame,
    y: str,
    metric: str,
    axis: CostAxis,
    xlabel: str,
    title: str,
    ax=None,
    interval: str = DEFAULT_INTERVAL,
    majority: float | None = None,
    zero_shot: float | None = None,
) -> Figure:
    """Draw one Pareto plot of per-configuration rows (from :func:`frontier`, with ``on_front``):
    column ``y`` (the quality ``metric``) against ``axis``, bars of kind ``interval``, a dotted line
    at the ``majority``-class rate and a dash-dot line at the ``zero_shot`` score (by default the mean of
    the zero-shot rows among ``configs``, which are never points); into ``ax`` if given, else a new figure."""
    return draw_pareto(configs, y, metric, axis, xlabel, title, ax, interval, majority, zero_shot)[0]


def draw_pareto(
    configs, y, metric, axis, xlabel, title, ax=None, interval=DEFAULT_INTERVAL, majority=None, zero_shot=None
):
    """:func:`draw`, returning (figure, caption, the bar ends cut at the axes as ``<config>: x high``)."""
    fig, ax = new_axes(ax)
    shots = configs.loc[configs["method"] == ZERO_SHOT, y].dropna()
    zero_shot = float(shots.mean()) if zero_shot is None and len(shots) else zero_shot
    configs = configs[configs["method"] != ZERO_SHOT]
    x_col, suffix = axis.column, f"_{check_interval(interval)}"
    lines = [v for v in (majority, zero_shot) if v is not None]
    _set_limits(ax, configs, x_col, y, axis.factor, lines)
    mixed = axis.kind_column is not None and configs[axis.kind_column].nunique() > 1
    labels, handles, clipped = [], [], []
    for i, method in enumerate(sorted(configs["method"].unique())):
        colour, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
        rows = _knob_order(configs[configs["method"] == method], x_col)
        xs, ys = rows[x_col] * axis.factor, rows[y]
        if len(rows) > 1:
            ax.plot(xs, ys, "-", color=colour, alpha=0.55, linewidth=1.2, zorder=1)
        for (_, row), x, y_mean in zip(rows.iterrows(), xs, ys):
            hollow = mixed and row.get(axis.kind_column) == ESTIMATED
            ax.plot(
                x,
                y_mean,
                marker=marker,
                color=colour,
                markersize=7,
                linestyle="",
                zorder=2,
                markerfacecolor="none" if hollow else colour,
            )
            x_half = row.get(x_col + suffix, float("nan")) * axis.factor
            bars = Bars(*bounded_interval(x, x_half, COST), *bounded_interval(y_mean, row.get(y + suffix), metric))
            name = f"{method} {row['config']}" if row["config"] != MISSING else method
            clipped += [f"{name}: {end}" for end in draw_bars(ax, x, y_mean, bars, colour)]
            note = point_label(row)
            if note:
                labels.append((x, y_mean, note, colour))
        knob = rows["pareto_knob"].dropna()
        name = f"{method} ({knob.iloc[0]} = point label)" if len(knob) else method
        handles.append(Line2D([], [], color=colour, marker=marker, linestyle="-" if len(rows) > 1 else "", label=name))
    best = configs[configs["on_front"]].sort_values(x_col)
    front_x, front_y = best[x_col] * axis.factor, best[y]
    ax.step(front_x, front_y, where="post", color="black", linestyle="--", linewidth=1, zorder=0)
    ax.scatter(front_x, front_y, s=230, facecolors="none", edgecolors="black", linewidths=1.2, zorder=3)
    ring = {"marker": "o", "markerfacecolor": "none", "markersize": 11}
    handles.append(Line2D([], [], color="black", linestyle="--", label="Pareto frontier (ringed points)", **ring))
    handles += _draw_majority(ax, majority)
    handles += _draw_zero_shot(ax, zero_shot)
    bars_are = caption(interval, list(configs["n_seeds"]))
    handles += bar_legend(bars_are, len(clipped))
    ax.set_xlabel(xlabel + (" [log scale]" if ax.get_xscale() == "log" else ""))
    unit = "fraction, " if METRIC_RANGES.get(metric) == (0.0, 1.0) else ""
    ax.set_ylabel(f"{metric} on eval set ({unit}{direction(metric)} is better)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.08)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    place_labels(fig, ax, labels, list(zip(front_x, front_y)))
    return fig, clipped_caption(bars_are, len(clipped)), clipped


def pareto_plot(
    runs: pd.DataFrame,
    result: PlotResult,
    stem: Path,
    interval: str = DEFAULT_INTERVAL,
    majority: float | None = None,
) -> PlotResult:
    """Fill ``result`` by plotting ``runs`` (one task/backbone/metric) against its cost to ``stem``.png/.svg,
    with bars of kind ``interval``, a line at the ``majority``-class rate when given and one at the
    zero-shot runs' score (they are no points: their training cost is zero, which no log axis shows)."""
    if result.metric == MISSING:
        result.skipped = "the runs record no primary metric"
        return result
    try:
        direction(result.metric)
    except KeyError:
        result.skipped = f"no better-direction is known for the metric '{result.metric}'"
        return result
    column = result.axis.column
    result.zero_shot = zero_shot_score(runs, result.metric)
    ok = runs[(runs["status"] == "ok") & (runs["method"] != ZERO_SHOT)]
    plotted = ok[ok[result.metric].notna() & ok[column].notna()] if result.metric in ok else ok.iloc[0:0]
    if plotted.empty:
        result.skipped = (
            f"none of the {len(ok)} finished run(s) has both {result.metric} and train {column}"
            if len(ok)
            else "only the zero-shot row finished, and it alone is no frontier"
            if result.zero_shot is not None
            else "no run finished"
        )
        return result
    configs = frontier(plotted, x=column, y=result.metric)
    title = f"{result.metric} vs {result.axis.title.lower()} — backbone {result.backbone}, task {result.task}"
    result.paths = [stem.parent / f"{stem.name}.{fmt}" for fmt in FORMATS]
    xlabel = cost_label(result.axis, plotted)
    fig, result.caption, result.clipped = draw_pareto(
        configs,
        result.metric,
        result.metric,
        result.axis,
        xlabel,
        title,
        interval=interval,
        majority=majority,
        zero_shot=result.zero_shot,
    )
    save_figure(fig, result.paths)
    result.runs, result.configs = len(plotted), len(configs)
    front = configs[configs["on_front"]].sort_values(column)
    result.on_front = [f"{m} {c}".strip() if c != MISSING else m for m, c in zip(front["method"], front["config"])]
    return result


def pareto_figures(runs: pd.DataFrame, out_dir: Path, interval: str = DEFAULT_INTERVAL) -> list[PlotResult]:
    """Draw every Pareto plot the runs table (:func:`petlprof.report.frame.runs_frame`) allows into
    ``out_dir``: per task, backbone and metric, one per cost, with bars of kind ``interval``.

    File names are ``pareto_<metric>_vs_<cost>.{png,svg}``, with ``_<task>`` (and ``_<backbone>``)
    added when the runs span several tasks (backbones).
    """
    plotted = runs[(runs["status"] == "ok") | runs["primary_metric"].notna()]  # a failed run without a metric
    if plotted.empty:  # has nothing to plot
        return []
    keys = plotted[["task", "backbone", "primary_metric"]].map(text)
    several_tasks, several_backbones = keys["task"].nunique() > 1, keys["backbone"].nunique() > 1
    results = []
    for (task, backbone, metric), index in sorted(keys.groupby(list(keys.columns)).groups.items()):
        suffix = (f"_{file_slug(task)}" if several_tasks else "") + (
            f"_{file_slug(backbone)}" if several_backbones else ""
        )
        majority = majority_rate(of_task(runs, task, backbone)) if metric == "accuracy" else None
        column = figures.ENERGY_WITH_SEARCH
        searched = column in plotted and plotted.loc[index, column].notna().any()
        for axis in (*COST_AXES, *([SEARCH_AXIS] if searched else [])):
            stem = out_dir / f"pareto_{file_slug(metric)}_vs_{axis.slug}{suffix}"
            result = PlotResult(task, backbone, metric, axis)
            results.append(pareto_plot(plotted.loc[index], result, stem, interval, majority))
    return results
