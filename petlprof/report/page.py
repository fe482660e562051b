"""The interactive part of report.html: the configurations' figures as data, and the script that plots them.

:func:`page_data` turns the per-configuration table (:func:`petlprof.report.frame.summarise`) into the JSON the
page embeds; ``page.js`` and ``page.css`` beside this module draw it with no library and no network: two axes
chosen from the declared figures (log or linear), a tooltip per point, methods toggled, budgets filtering the
points with the frontier recomputed for what remains, the zero-shot row kept as a line, tables sortable.  Plain
script (about 15 KB) rather than Vega-Lite or Plotly: their runtimes inlined would be 0.8-3.5 MB per page, and a
scatter plot with a frontier needs little of them.  Without JavaScript the page is the static report.

The data (``<script type="application/json" id="petlprof-data">``)::

    {"axes": [{"key", "label", "unit", "direction": "higher"|"lower", "kind": "metric"|"cost", "log": bool,
               "range": [low, high]|null}],
     "groups": [{"task", "backbone", "y": the task's primary metric (its default y axis)|null}],
     "points": [{"id", "group", "method", "config", "seeds", "zero_shot": bool,
                 "values": {axis key: number|null}, "intervals": {axis key: half-width|null},
                 "interval": "how the intervals were obtained",
                 "ranges": {axis key: [low, high]}, "range_how": "how the ranges were obtained",
                 "flags": {axis key: "why it is marked"}, "no_front": "why it is on no frontier"|null}],
     "budgets": [axis key, ...], "x": axis key, "y": axis key}

Values are in the axis' unit (the figure's shown unit: MiB for memory); intervals are 95% half-widths over seeds;
ranges, where a one-seed configuration has them, are the binomial intervals of its share-of-samples metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from petlprof.report.frame import CONTENDED, GENERATION_FIGURES, GENERATION_PHASES, PHASE_FIGURES, generation_column
from petlprof.report.intervals import PROPORTIONS, wilson_interval
from petlprof.report.records import text
from petlprof.report.table import CONTENDED_UNITS
from petlprof.results.figures import ENERGY, ENERGY_KIND, MIB, PEAK_MEMORY, TIME, TRAINABLE_PARAMS, Figure
from petlprof.results.result import finite
from petlprof.tasks.metrics import METRIC_DIRECTIONS
from petlprof.vocabulary import ESTIMATED, ZERO_SHOT

HIGHER, LOWER = "higher", "lower"
SEED_INTERVAL = "95% confidence interval over the seeds (Student's t)"
SHARE = (0.0, 1.0)
NO_FRONT = "a seed answered every prompt with one text, so its score is not the method's"
BINOMIAL_INTERVAL = "95% Wilson binomial interval from the {n} evaluation samples (one seed)"
PHASE_NAMES = {"train": "training", "eval": "evaluation"}
BUDGETS = (PEAK_MEMORY.name, ENERGY.name, TIME.name)  # the figures a reader may cap (train phase)
ESTIMATED_FLAG = "estimated: a model of power, not a measurement (energy grade D)"
KIND_COLUMNS = {  # phase -> the runs table's column saying how its energies were obtained
    "train": ENERGY_KIND,
    "eval": f"eval_{ENERGY_KIND}",
    "generation": f"generation_{ENERGY_KIND}",
    "generation_merged": f"generation_{ENERGY_KIND}",
}
CONTENDED_FLAG = "measured while other processes kept the machine's CPUs busy (in at least one seed): may be worse"


@dataclass(frozen=True)
class Axis:
    """A figure the page can plot: its column in the configurations table and how it is shown."""

    key: str
    label: str
    unit: str
    direction: str
    kind: str  # "metric" (quality) or "cost"
    log: bool = False  # drawn on a log scale by default (figures spanning orders of magnitude)
    scale: float = 1.0  # the column's value times this is the shown value
    range: tuple[float, float] | None = None  # the values it can take (a share of samples: [0, 1]), if bounded
    phase: str | None = None  # the window whose contention inflates it (times, energies, rates); None: none does
    energy_kind: str | None = None  # for an energy: the column saying whether it was measured or estimated


class AxisJSON(TypedDict):
    """An axis as the page's script reads it (:class:`Axis` less what only this module uses)."""

    key: str
    label: str
    unit: str
    direction: str
    kind: str
    log: bool
    range: tuple[float, float] | None


class Group(TypedDict):
    """A (task, backbone) pair the page plots apart, with its default y axis (its primary metric)."""

    task: str
    backbone: str
    y: str | None


class Point(TypedDict):
    """One configuration on the page: its figures in their shown units and why any is flagged."""

    id: str
    group: int  # index into PageData.groups
    method: str
    config: str
    seeds: list[Any]
    zero_shot: bool
    values: dict[str, float | None]  # axis key -> shown value
    intervals: dict[str, float]  # axis key -> the seeds' 95% half-width
    interval: str  # how the intervals were obtained
    ranges: dict[str, list[float]]  # a one-seed share's Wilson interval [low, high]
    no_front: str | None  # why it is on no frontier
    range_how: str
    flags: dict[str, str]  # axis key -> why its figure is marked


class PageData(TypedDict):
    """The JSON report.html embeds: the axes it offers, the groups, the points, the cappable budgets and the
    default axes."""

    axes: list[AxisJSON]
    groups: list[Group]
    points: list[Point]
    budgets: list[str]
    x: str | None
    y: str | None


def _axis_json(axis: Axis) -> AxisJSON:
    return AxisJSON(
        key=axis.key,
        label=axis.label,
        unit=axis.unit,
        direction=axis.direction,
        kind=axis.kind,
        log=axis.log,
        range=axis.range,
    )


def _phase_axes() -> list[Axis]:
    """The train and eval phases' cost figures (those with a better direction), in declaration order."""
    axes = []
    for phase, columns in PHASE_FIGURES.items():
        for column, figure in columns.items():
            if figure.better is not None:
                axes.append(_figure_axis(column, f"{PHASE_NAMES[phase]} {figure.label}", figure, phase))
    return axes


def _figure_axis(key: str, label: str, figure: Figure, phase: str) -> Axis:
    log = figure.unit in ("J", "B", "count")
    inflated = phase if figure.unit in CONTENDED_UNITS else None
    unit, better = figure.shown_unit or figure.unit, figure.better or LOWER
    kind = KIND_COLUMNS[phase] if figure.kind == ENERGY_KIND else None
    return Axis(key, label, unit, better, "cost", log, figure.scale, phase=inflated, energy_kind=kind)


def _generation_axes(configs: pd.DataFrame) -> list[Axis]:
    """The generation figures at each batch size the configurations recorded (merged ones too)."""
    axes = []
    for phase in GENERATION_PHASES:
        batches = sorted(
            {c.split(".")[1] for c in configs.columns if c.startswith(phase + ".batch_")},
            key=lambda b: int(b.removeprefix("batch_")),
        )
        for batch in batches:
            size = batch.removeprefix("batch_")
            for figure in GENERATION_FIGURES:
                if figure.better is None:
                    continue
                merged = "merged " if phase.endswith("merged") else ""
                label = f"{merged}generation {figure.label}, batch {size}"
                axes.append(_figure_axis(generation_column(phase, batch, figure), label, figure, phase))
    return axes


def candidate_axes(metrics: Iterable[str], extra: Sequence[Axis] = ()) -> list[Axis]:
    """Every figure the page offers: the quality metrics, then the costs (train and eval phases, parameters,
    checkpoint size), then ``extra`` (the lifecycle's)."""
    axes = [
        Axis(m, m, "", METRIC_DIRECTIONS.get(m, HIGHER), "metric", range=SHARE if m in PROPORTIONS else None)
        for m in metrics
    ]
    axes += _phase_axes()
    axes.append(Axis("trainable_params", TRAINABLE_PARAMS.label, "count", LOWER, "cost", True))
    axes.append(Axis("checkpoint_bytes", "checkpoint size", "MiB", LOWER, "cost", True, 1 / MIB))
    return axes + list(extra)


def _number(value: Any, scale: float = 1.0) -> float | None:
    """A finite figure in its shown unit, else None (JSON has no NaN)."""
    number = finite(value)
    return None if number is None else finite(number * scale)


def page_data(
    configs: pd.DataFrame,
    metrics: Iterable[str],
    extra: Sequence[Axis] = (),
) -> PageData:
    """The page's data for ``configs`` (one row per configuration, as :func:`~petlprof.report.frame.summarise`
    gives), offering the ``metrics``, every cost some configuration has and the ``extra`` axes; a figure measured
    on a contended machine is flagged."""
    axes = [a for a in candidate_axes(metrics, extra) if _has_values(configs, a.key)]
    axes += [a for a in _generation_axes(configs) if _has_values(configs, a.key)]
    groups: list[tuple[str, str]] = []
    primary: dict[tuple[str, str], str] = {}  # each task's primary metric: its default y axis
    offered = {a.key for a in axes}
    points: list[Point] = []
    for i, (_, row) in enumerate(configs.iterrows()):
        group = (text(row.get("task")), text(row.get("backbone")))
        if group not in groups:
            groups.append(group)
        if isinstance(metric := row.get("primary_metric"), str) and metric in offered:
            primary.setdefault(group, metric)
        values = {a.key: _number(row.get(a.key), a.scale) for a in axes}
        intervals = {a.key: _number(row.get(f"{a.key}_ci95"), a.scale) for a in axes}
        points.append(
            {
                "id": f"c{i}",
                "group": groups.index(group),
                "method": text(row.get("method")),
                "config": text(row.get("config")),
                "seeds": list(row.get("seeds") or []),
                "zero_shot": row.get("method") == ZERO_SHOT,
                "values": values,
                "intervals": {k: v for k, v in intervals.items() if v is not None},
                "interval": SEED_INTERVAL,
                "ranges": _binomial_ranges(row, axes),
                "no_front": _no_front(row),
                "range_how": BINOMIAL_INTERVAL.format(n=_count(row.get("eval_samples"))),
                "flags": {a.key: flag for a in axes if (flag := _flag(row, a))},
            }
        )
    keys = [a.key for a in axes]
    metric_keys = [a.key for a in axes if a.kind == "metric"]
    return {
        "axes": [_axis_json(a) for a in axes],
        "groups": [{"task": t, "backbone": b, "y": primary.get((t, b))} for t, b in groups],
        "points": points,
        "budgets": [k for k in BUDGETS if k in keys],
        "x": ENERGY.name if ENERGY.name in keys else next((k for k in keys if k not in metric_keys), None),
        "y": (primary.get(groups[0]) if groups else None) or (metric_keys[0] if metric_keys else None),
    }


def _binomial_ranges(row: pd.Series, axes: Sequence[Axis]) -> dict[str, list[float]]:
    """A one-seed configuration's share-of-samples metrics: their 95% Wilson interval [low, high]."""
    samples = _number(row.get("eval_samples"))
    if row.get("n_seeds") != 1 or not samples:
        return {}
    ranges = {}
    for axis in axes:
        value = _number(row.get(axis.key))
        if axis.key in PROPORTIONS and value is not None:
            low, high = wilson_interval(value, samples)
            if math.isfinite(low) and math.isfinite(high):
                ranges[axis.key] = [low, high]
    return ranges


def _flag(row: pd.Series, axis: Axis) -> str:
    """Why a configuration's figure on ``axis`` is marked (estimated, contended), or ""."""
    estimated = axis.energy_kind is not None and row.get(axis.energy_kind) == ESTIMATED
    contended = axis.phase is not None and _contended(row, axis.phase)
    return "; ".join(why for why, applies in ((ESTIMATED_FLAG, estimated), (CONTENDED_FLAG, contended)) if applies)


def _no_front(row: pd.Series) -> str | None:
    """Why a configuration is on no frontier (its score is no result), as :func:`~petlprof.report.frame.frontier`
    and the differences table judge; None when it may be."""
    if row.get("constant_output"):
        return NO_FRONT
    if row.get("random_init"):
        return "trained from random weights (--random-init): its score says nothing of the method"
    return None


def _count(value: Any) -> str:
    number = _number(value)
    return "?" if number is None else f"{number:,.0f}"


def _contended(row: pd.Series, phase: str) -> bool:
    value = row.get(CONTENDED[phase])
    return isinstance(value, (bool, np.bool_)) and bool(value)


def _has_values(configs: pd.DataFrame, key: str) -> bool:
    return key in configs.columns and any(finite(value) is not None for value in configs[key])


def embedded_json(data: Mapping[str, Any]) -> str:
    """``data`` as JSON safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` (written as JSON escapes), so
    neither ``</script>`` nor ``<!--<script>`` in a label can end it early or keep it open."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def asset(name: str) -> str:
    """The text of ``page.js`` or ``page.css``, shipped beside this module."""
    return resources.files("petlprof.report").joinpath(name).read_text(encoding="utf-8")


__all__ = ["Axis", "asset", "candidate_axes", "embedded_json", "page_data"]
