"""Energy and time against the GPUs' power limit (``--power-limit``): one line per method configuration, its knee
marked.

Drawn per task and backbone whose runs were set to two or more limits.  Each configuration's seeds are averaged
at each limit (:func:`petlprof.report.frame.summarise`); the figures are the energy and time to the target where
every point has them (runs with ``--target-value``), else the training phase's.  The knee of a configuration is the
limit where lowering it stops paying: on its curve of energy against time across the limits (both scaled to
[0, 1]), the inner point farthest from the chord between the curve's ends (Satopää et al.'s Kneedle, on a
trade-off curve); none for fewer than three limits or a curve without a bend.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from petlprof.report.frame import GROUP, summarise
from petlprof.report.plotkit import save_figure
from petlprof.report.plots import FORMATS, file_slug
from petlprof.report.records import method_name, text
from petlprof.results.figures import ENERGY, TIME

LIMIT = "power_limit_w"
LINE = ("method", "config_at_any_limit")  # one line: a configuration at every limit
TO_TARGET = ("energy_to_target_j", "time_to_target_s")
MIN_BEND = 0.05  # a knee must stand this far (scaled) from the chord: a straight line has none


@dataclass(frozen=True)
class PowerLine:
    """One configuration across the limits: its name, the limits (W, ascending), energy (J) and time (s) at each,
    and its knee (W), if it has one."""

    name: str
    limits_w: tuple[float, ...]
    energy_j: tuple[float, ...]
    time_s: tuple[float, ...]
    knee_w: float | None


@dataclass(frozen=True)
class PowerPlot:
    task: str
    backbone: str
    measure: str  # "to the target" or "training"
    lines: tuple[PowerLine, ...]
    energy_kind: str = "unknown kind"  # measured, estimated, or both (measured/estimated)
    paths: list[Path] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.paths[0]

    @property
    def energy_label(self) -> str:
        what = "training energy" if self.measure == "training" else f"energy {self.measure}"
        return f"{what} (J, {self.energy_kind})"

    @property
    def time_label(self) -> str:
        what = "training time" if self.measure == "training" else f"time {self.measure}"
        return f"{what} (s, measured)"


def knee(energy_j: list[float], time_s: list[float]) -> int | None:
    """The index of the knee of a curve given point by point in limit order (see the module), or None."""
    if len(energy_j) < 3:
        return None

    def scaled(values: list[float]) -> list[float]:
        low, high = min(values), max(values)
        return [(v - low) / (high - low) if high > low else 0.0 for v in values]

    xs, ys = scaled(time_s), scaled(energy_j)
    (x0, y0), (x1, y1) = (xs[0], ys[0]), (xs[-1], ys[-1])
    chord = math.hypot(x1 - x0, y1 - y0)
    if chord == 0:
        return None
    distances = [abs((x1 - x0) * (y0 - y) - (x0 - x) * (y1 - y0)) / chord for x, y in zip(xs, ys)]
    best = max(range(1, len(xs) - 1), key=lambda i: distances[i])
    return best if distances[best] >= MIN_BEND else None


def _measure(group: pd.DataFrame) -> tuple[str, str, str]:
    """(what is plotted, energy column, time column): to the target where every point reached it, else training."""
    if all(c in group for c in TO_TARGET) and group[list(TO_TARGET)].notna().all().all():
        return "to the target", *TO_TARGET
    return "training", ENERGY.name, TIME.name


def power_lines(group: pd.DataFrame, energy: str, time: str) -> tuple[PowerLine, ...]:
    """The configurations of one task and backbone (rows of :func:`summarise`) as lines across the limits."""
    lines = []
    for (method, config), rows in group.groupby(list(LINE), sort=True, dropna=False):
        rows = rows.dropna(subset=[LIMIT, energy, time]).sort_values(LIMIT)
        if len(rows) < 2:
            continue
        energies, times = [float(v) for v in rows[energy]], [float(v) for v in rows[time]]
        at = knee(energies, times)
        limits = tuple(float(v) for v in rows[LIMIT])
        name = method_name(method) + ("" if text(config) == "-" else f" {text(config)}")
        lines.append(PowerLine(name, limits, tuple(energies), tuple(times), None if at is None else limits[at]))
    return tuple(lines)


def power_limit_figures(runs: pd.DataFrame, out_dir: Path) -> list[PowerPlot]:
    """One figure per task and backbone whose configurations ran at two or more power limits."""
    if runs.empty or LIMIT not in runs or runs[LIMIT].nunique(dropna=True) < 2:
        return []
    configs = summarise(runs)
    plots = []
    for (task, backbone), group in configs.groupby(GROUP, sort=True):
        measure, energy, time = _measure(group)
        lines = power_lines(group, energy, time)
        if not lines:
            continue
        kinds = sorted({str(k) for k in group.get("energy_kind", pd.Series(dtype=object)).dropna()})
        plot = PowerPlot(str(task), str(backbone), measure, lines, "/".join(kinds) or "unknown kind")
        paths = [out_dir / f"power_limit_{file_slug(str(task))}_{file_slug(str(backbone))}.{f}" for f in FORMATS]
        save_figure(draw_power_limit(plot), paths)
        plots.append(dataclasses.replace(plot, paths=paths))
    return plots


def draw_power_limit(plot: PowerPlot) -> Figure:
    """Two panels sharing the limit axis: energy above, time below; each knee ringed."""
    fig = Figure(figsize=(9, 7), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for line in plot.lines:
        for ax, values in ((top, line.energy_j), (bottom, line.time_s)):
            drawn = ax.plot(line.limits_w, values, marker="o", label=line.name)[0]
            if line.knee_w is not None:
                at = line.limits_w.index(line.knee_w)
                ring = {"marker": "o", "markersize": 14, "fillstyle": "none", "color": drawn.get_color()}
                ax.plot([line.knee_w], [values[at]], **ring)
    top.set_ylabel(plot.energy_label)
    bottom.set_ylabel(plot.time_label)
    bottom.set_xlabel("GPU power limit (W)")
    top.set_title(f"{plot.backbone} on {plot.task}: {plot.measure} energy and time by power limit (knee ringed)")
    top.legend(fontsize="small")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig
