"""Drawing pieces the report's plots share: axis limits that follow the points, thin error bars cut
at the axes and marked where they run off, the legend entries that say what the bars are, and point
labels placed where they overlap nothing.

An axis spans the plotted means with a margin (:func:`axis_limits`), never the bars: a two-seed
interval can be 25 standard errors wide and would otherwise squeeze every point into a corner.  A bar
that runs past an axis is drawn up to the edge and ends there in a caret pointing off the axes
instead of a cap (:func:`bar_ends`, :func:`draw_bars`), and the legend says how many were cut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from petlprof.tasks.metrics import METRIC_RANGES

MARGIN = 0.08  # of the span of the means, on each side of an axis
LOG_LABEL_DECADES = 5  # a log axis up to this many decades wide is labelled at 1, 2 and 5 × 10^k
COST = "cost"  # energy, memory, time and parameter counts are never negative
BAR = {"linewidth": 0.8, "alpha": 0.75, "zorder": 1.5}  # thin bars under the markers
CAP_SIZE = 4  # points: a small cap where a bar ends inside the axes
CARET_SIZE = 5  # points: the caret where a bar is cut at the axes' edge
CARETS = {("x", "low"): "<", ("x", "high"): ">", ("y", "low"): "v", ("y", "high"): "^"}
CLIPPED_NOTE = "bar cut at the axes' edge (runs further): caret"
LABEL_SIZE = 7  # points: the font of a point's label
LABEL_OFFSETS = (
    *((7, 6), (7, -7), (-7, 6), (-7, -7), (0, 11), (0, -11), (12, 0), (-12, 0), (12, 12), (-12, -12)),
    *((12, -12), (-12, 12), (0, 18), (0, -18), (-20, -20), (20, -20), (-20, 20), (20, 20), (0, -28), (0, 28)),
)


def bounded_interval(y: float, half_width: Any, metric: str) -> tuple[float, float]:
    """(below, above) of the interval y ± half_width cut to the metric's range (accuracy cannot pass
    1, nor energy fall below 0, however few the seeds); (0, 0) for no interval (one seed)."""
    half = 0.0 if half_width is None or math.isnan(half_width) else float(half_width)
    low, high = (0.0, math.inf) if metric == COST else METRIC_RANGES.get(metric, (-math.inf, math.inf))
    return max(min(half, y - low), 0.0), max(min(half, high - y), 0.0)


def axis_limits(values: Sequence[float], log: bool = False, margin: float = MARGIN) -> tuple[float, float]:
    """Limits spanning ``values`` (the means) with ``margin`` of their span on each side, in log space
    for a log axis; a single value gets ±``margin`` of itself (±``margin`` around 0)."""
    finite = [float(v) for v in values if v is not None and not math.isnan(v)]
    if log and any(v <= 0 for v in finite):
        raise ValueError(f"a log axis needs positive values, got {sorted(finite)}")
    points = [math.log10(v) for v in finite] if log else finite
    if not points:
        return (0.0, 1.0)
    low, high = min(points), max(points)
    pad = margin * (high - low) if high > low else (margin if log or low == 0 else margin * abs(low))
    low, high = low - pad, high + pad
    return (10**low, 10**high) if log else (low, high)


def compact_number(value: float) -> str:
    """A tick label: ``500``, ``2k``, ``1.5M``, ``20G``."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def label_log_axis(axis, low: float, high: float, first: float) -> float:
    """Label a log axis spanning ``low``..``high`` at 1, 2 and 5 × 10^k (at 10^k past LOG_LABEL_DECADES),
    compactly; return the largest label at or below ``first`` (the leftmost point), for the axis to
    reach, so that point has a label at its left."""
    subs = (1.0, 2.0, 5.0) if math.log10(high / low) <= LOG_LABEL_DECADES else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=100))
    axis.set_major_formatter(FuncFormatter(lambda value, _: compact_number(value)))
    axis.set_minor_formatter(NullFormatter())
    decade = 10 ** math.floor(math.log10(first))
    return max(decade * sub for sub in subs if decade * sub <= first * (1 + 1e-9))


def bar_ends(centre: float, below: float, above: float, limits: tuple[float, float]) -> tuple[float, float, bool, bool]:
    """(low end, high end, cut at low, cut at high) of the bar centre - below .. centre + above drawn
    within ``limits``; an end that would leave the axes is cut at the edge (a cost bar reaching 0 is
    cut at the edge of a log axis too)."""
    low, high = centre - below, centre + above
    cut_low, cut_high = low < limits[0], high > limits[1]
    return max(low, limits[0]), min(high, limits[1]), cut_low, cut_high


@dataclass
class Bars:
    """The bars of one point: half-widths below and above, on x and y (0 where there is none)."""

    x_below: float = 0.0
    x_above: float = 0.0
    y_below: float = 0.0
    y_above: float = 0.0


def draw_bars(ax, x: float, y: float, bars: Bars, colour: str) -> list[str]:
    """Draw a point's thin bars within the axes' current limits: a small cap where a bar ends inside,
    a caret at the edge where it runs off; return the cut ends as ``x low``, ``y high``, ..."""
    cut = []
    for name, centre, below, above in (("x", x, bars.x_below, bars.x_above), ("y", y, bars.y_below, bars.y_above)):
        if below <= 0 and above <= 0:
            continue
        limits = ax.get_xlim() if name == "x" else ax.get_ylim()
        low, high, cut_low, cut_high = bar_ends(centre, below, above, limits)
        xs, ys = ((low, high), (y, y)) if name == "x" else ((x, x), (low, high))
        ax.plot(xs, ys, color=colour, solid_capstyle="butt", **BAR)
        for end, is_cut, side in ((low, cut_low, "low"), (high, cut_high, "high")):
            if end == centre:
                continue
            point = (end, y) if name == "x" else (x, end)
            if is_cut:
                cut.append(f"{name} {side}")
                ax.plot(*point, marker=CARETS[name, side], color=colour, markersize=CARET_SIZE, clip_on=False, zorder=3)
            else:
                cap = "|" if name == "x" else "_"
                ax.plot(*point, marker=cap, color=colour, markersize=CAP_SIZE, markeredgewidth=BAR["linewidth"])
    return cut


def bar_legend(caption: str, cut: int) -> list[Line2D]:
    """Legend entries saying what the bars are and, when ``cut`` bars ran off the axes, how they are marked."""
    handles = [Line2D([], [], color="grey", marker="|", markersize=8, linewidth=0.8, label=caption)]
    if cut:
        handles.append(
            Line2D(
                [], [], color="grey", marker=">", markersize=CARET_SIZE, linestyle="", label=f"{CLIPPED_NOTE} ({cut})"
            )
        )
    return handles


def clipped_caption(caption: str, cut: int) -> str:
    """The caption of a plot: what its bars are, and how many run off the axes."""
    if not cut:
        return caption
    return f"{caption}; {cut} bar end(s) run past the axes: cut at the edge and marked with a caret"


def lay_out(fig: Figure, engine) -> None:
    """Place ``fig``'s axes by its layout ``engine`` alone, without drawing every artist as a draw does (the same
    positions: every stored report's PNG, SVG and report.md re-render byte for byte; ``write_report`` took 2.68
    against 2.87 CPU-s on minilm-tweets-all-methods and 3.63 against 4.05 on smollm2-arith-tuned, 2 alternating pairs
    of 4 repeats), the autoscaled limits settled first."""
    for ax in fig.axes:
        ax.get_xlim(), ax.get_ylim()  # autoscaling is lazy, and transData reads the limits as they stand
    engine.execute(fig)


def place_labels(fig: Figure, ax, items: list[tuple[float, float, str, str]], rings: list[tuple[float, float]]) -> None:
    """Annotate points so labels overlap neither each other nor any marker or frontier ring, trying
    offsets in turn (the least-overlapping one when none is free).

    A label's box at each offset is computed from its size, measured once, rather than by drawing an annotation
    at every offset (that took most of a report's plotting time).  The figure is laid out once, here, and then
    keeps that layout (the saved files draw exactly what the labels were placed on)."""
    engine = fig.get_layout_engine()
    if engine is None or isinstance(engine, PlaceHolderLayoutEngine):
        fig.draw_without_rendering()  # a figure laid out by hand: a draw makes its display coordinates final
    else:
        lay_out(fig, engine)
    fig.set_layout_engine("none")
    # every canvas that draws has a renderer (Agg, which new_axes attaches, and the interactive canvases built
    # on it); matplotlib's stubs declare get_renderer on none but FigureCanvasAgg's, and ``fig`` may be a user's
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    taken = []
    for points, half in ((((x, y) for x, y, _, _ in items), 7), (rings, 13)):
        for x, y in points:
            px, py = ax.transData.transform((x, y))
            taken.append((px - half, py - half, px + half, py + half))
    frame = ax.get_window_extent(renderer)
    pixels_per_point = fig.dpi / 72

    def cost(box: tuple[float, float, float, float]) -> float:
        x0, y0, x1, y1 = box
        inside = x0 >= frame.x0 and x1 <= frame.x1 and y0 >= frame.y0 and y1 <= frame.y1
        area = sum(max(0.0, min(x1, b[2]) - max(x0, b[0])) * max(0.0, min(y1, b[3]) - max(y0, b[1])) for b in taken)
        return area + (0.0 if inside else 1e6)

    for x, y, label, colour in items:
        probe = fig.text(0, 0, label, fontsize=LABEL_SIZE)  # its size, wherever it stands
        extent = probe.get_window_extent(renderer)
        probe.remove()
        px, py = ax.transData.transform((x, y))
        best: tuple[float, tuple[int, int], tuple[float, float, float, float]] | None = None
        for dx, dy in LABEL_OFFSETS:
            box = _label_box(px + dx * pixels_per_point, py + dy * pixels_per_point, dx, dy, extent)
            score = cost(box)
            if best is None or score < best[0]:
                best = (score, (dx, dy), box)
            if score == 0:
                break
        assert best is not None  # LABEL_OFFSETS is not empty
        (dx, dy), box = best[1], best[2]
        ax.annotate(
            label,
            (x, y),
            xytext=(dx, dy),
            textcoords="offset points",
            fontsize=LABEL_SIZE,
            color=colour,
            ha=_label_align(dx),
            va="bottom" if dy >= 0 else "top",
            zorder=4,
            bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.6, "shrinkA": 0, "shrinkB": 4},
        )  # a leader line ties a displaced label to its point
        taken.append(box)


def _label_align(dx: float) -> str:
    return "left" if dx > 0 else "right" if dx < 0 else "center"


def _label_box(ax_: float, ay: float, dx: float, dy: float, extent) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) in pixels of a label of ``extent``'s size anchored at (``ax_``, ``ay``), aligned as
    :func:`place_labels` aligns a label at offset (``dx``, ``dy``)."""
    width, height = extent.width, extent.height
    x0 = {"left": ax_, "right": ax_ - width, "center": ax_ - width / 2}[_label_align(dx)]
    y0 = ay if dy >= 0 else ay - height
    return (x0, y0, x0 + width, y0 + height)


DPI = 120


def fix_layout(fig: Figure) -> None:
    """Lay ``fig`` out once (unless :func:`place_labels` has) and drop its layout engine, so the positions stay.

    ``savefig`` draws a figure that has a layout engine twice, a layout pass and then the file, even when the
    engine is the placeholder that ``set_layout_engine("none")`` leaves: 2 of the 5 draws of each report plot
    (its PNG and its SVG) drew nothing that was kept, about a quarter of a report's CPU time."""
    engine = fig.get_layout_engine()
    if engine is None:
        return
    if not isinstance(engine, PlaceHolderLayoutEngine):
        lay_out(fig, engine)
    # set_layout_engine(None) leaves no engine only while these rc settings are off (else it sets theirs)
    with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)


def save_figure(fig: Figure, paths: Sequence[Path], dpi: float | str = DPI) -> None:
    """Write ``fig`` to each of ``paths`` (PNG, SVG by suffix) so that the same figure gives the same bytes: the
    SVG without its creation date and with its element ids drawn from a fixed salt, so a re-rendered report
    differs from the last one only where its figures do.  ``dpi``: the PNG's (``"figure"``: the figure's own)."""
    fix_layout(fig)
    with matplotlib.rc_context({"svg.hashsalt": "petlprof"}):
        for path in paths:
            metadata = {"Date": None} if Path(path).suffix == ".svg" else None
            fig.savefig(path, dpi=dpi, metadata=metadata)
