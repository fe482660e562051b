"""The cost-to-target plot: per configuration, the energy (or time) it took to reach the target, as
measured (checks included) and without the checks' own cost, cheapest first.

One row per configuration, top to bottom by its mean cost as measured; a filled marker for the cost
as measured and a hollow one for the cost without the checks, each with thin bars of the report's
interval kind, cut at the axes and marked with a caret where they run off (:mod:`petlprof.report.plotkit`).
A configuration some of whose seeds missed the target says ``reached k of n`` (its means are over the
seeds that reached it); one that never reached it is listed at the bottom without a marker.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from petlprof.report.intervals import caption, check_interval
from petlprof.report.plotkit import (
    COST,
    Bars,
    axis_limits,
    bar_legend,
    bounded_interval,
    clipped_caption,
    draw_bars,
    save_figure,
)
from petlprof.report.plots import FORMATS, CostAxis, cost_label, file_slug, new_axes, wants_log_scale
from petlprof.report.records import text
from petlprof.report.target import TARGET_COSTS, TARGET_GROUP, TargetPlot, by_cost, target_configs, target_phrase
from petlprof.results.figures import ENERGY

OFFSET = 0.14  # rows: the two markers of a configuration sit just above and below its line
WITH_CHECKS = "as measured (target checks included)"
WITHOUT_CHECKS = "without the checks' measured cost"


def row_label(row) -> str:
    """A configuration's name, with ``reached k of n`` when some of its seeds missed the target."""
    n, k = int(row["n_seeds"]), int(row["reached"])
    if k == n:
        return row["name"]
    return f"{row['name']} — did not reach it (0 of {n})" if k == 0 else f"{row['name']} — reached {k} of {n}"


def _points(rows: pd.DataFrame, cost) -> list[float]:
    values = [*rows[cost.with_checks], *rows[cost.without_checks]]
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def _bars(row, column: str, suffix: str) -> Bars:
    below, above = bounded_interval(row[column], row.get(column + suffix, math.nan), COST)
    return Bars(x_below=below, x_above=above)


def draw_cost_to_target(configs: pd.DataFrame, runs: pd.DataFrame, plot: TargetPlot, interval: str) -> Figure:
    """Draw ``plot.cost`` to the target of ``configs`` (one task, backbone and target, rows of
    :func:`~petlprof.report.target.target_configs`); fill ``plot``'s order, caption and clipped."""
    cost, suffix = plot.cost, f"_{check_interval(interval)}"
    rows = by_cost(configs, cost.with_checks)
    fig, ax = new_axes(figsize=(10, 2.4 + 0.42 * len(rows)))
    points = _points(rows, cost)
    log = wants_log_scale(points)
    if log:
        ax.set_xscale("log")
    ax.set_xlim(*axis_limits(points, log=log))
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the cheapest on top
    methods = sorted(configs["method"].unique())
    has_without = rows[cost.without_checks].notna().any()
    for i, (_, row) in enumerate(rows.iterrows()):
        colour = f"C{methods.index(row['method']) % 10}"
        plot.order.append(row_label(row))
        for column, dy, fill, marker in (
            (cost.with_checks, -OFFSET, colour, "o"),
            (cost.without_checks, OFFSET, "white", "D"),
        ):
            x = row[column]
            if x is None or math.isnan(x):
                continue
            ax.plot(x, i + dy, marker=marker, color=colour, markerfacecolor=fill, markersize=7, linestyle="", zorder=2)
            ends = draw_bars(ax, x, i + dy, _bars(row, column, suffix), colour)
            plot.clipped += [f"{row['name']} ({'with' if dy < 0 else 'without'} checks): {end}" for end in ends]
    ax.set_yticks(range(len(rows)), plot.order, fontsize=8)
    unit_axis = CostAxis(cost.slug, f"{cost.title} to reach the target", cost.with_checks, cost.unit, 1.0)
    if cost.slug == "energy":
        unit_axis = CostAxis(cost.slug, unit_axis.title, cost.with_checks, cost.unit, 1.0, ENERGY.source, ENERGY.kind)
    ax.set_xlabel(cost_label(unit_axis, runs) + (" [log scale]" if log else ""))
    ax.set_title(plot.title, fontsize=11)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    bars_are = caption(interval, [int(n) for n in rows["reached"] if n > 0])
    plot.caption = clipped_caption(bars_are, len(plot.clipped))
    handles = [
        Line2D([], [], color="black", marker="o", linestyle="", label=WITH_CHECKS),
        Line2D([], [], color="black", marker="D", markerfacecolor="white", linestyle="", label=WITHOUT_CHECKS)
        if has_without
        else Line2D([], [], linestyle="", label=f"{WITHOUT_CHECKS}: not recorded (older records)"),
        *bar_legend(bars_are, len(plot.clipped)),
    ]
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncols=2)  # under the axes: they keep the width
    return fig


def save(fig: Figure, plot: TargetPlot, stem: Path) -> None:
    """Write ``fig`` as ``stem``.png and .svg and record the paths in ``plot``."""
    plot.paths = [stem.parent / f"{stem.name}.{fmt}" for fmt in FORMATS]
    save_figure(fig, plot.paths)


def cost_to_target_figures(runs: pd.DataFrame, out_dir: Path, interval: str) -> list[TargetPlot]:
    """Draw ``cost_to_target_{energy,time}.{png,svg}`` of the runs table (:func:`petlprof.report.frame.runs_frame`)
    per task, backbone and target into ``out_dir`` (a ``_<task>_<backbone>_<metric>-<value>`` suffix when
    there are several), bars of kind ``interval``."""
    configs = target_configs(runs)
    if configs.empty or not configs["reached"].any():
        return []
    groups = list(configs.groupby(TARGET_GROUP, sort=True, dropna=False))
    plots = []
    for key, group in groups:
        task, backbone, metric, value = key
        suffix = f"_{file_slug(f'{task}_{backbone}_{metric}-{value:g}')}" if len(groups) > 1 else ""
        title = f"to reach {target_phrase(metric, value)} — backbone {text(backbone)}, task {text(task)}"
        task_runs = runs[(runs["task"] == task) & (runs["backbone"] == backbone)]
        for cost in TARGET_COSTS:
            plot = TargetPlot(title=f"{cost.title} {title}", cost=cost, key=key)
            fig = draw_cost_to_target(group, task_runs, plot, interval)
            save(fig, plot, out_dir / f"cost_to_target_{cost.slug}{suffix}")
            plots.append(plot)
    return plots
