"""Cost to reach the target: the energy-to-accuracy view of runs trained with ``--target-value``.

A run with a target stops training once its held-out checks reach it (:mod:`petlprof.run.budget`); its
train-phase time and energy are then the cost of getting there, *checks included*.  The checks are
not free (scoring the check slice every ``--eval-every`` steps), and they cost a cheap method a larger
share, so each figure is shown twice: as measured, and without the checks' own measured cost
(``*_without_checks``; records written before the checks' energy was metered lack those, shown ``—``).

:func:`target_configs` gives one row per configuration (the means over the seeds that reached the
target, ``reached``/``n_seeds``, the checks' share, and ratios to ``full``); :func:`target_tables`
renders them for report.md; :mod:`petlprof.report.target_plot` draws them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import pandas as pd

from petlprof.report.frame import summarise
from petlprof.report.records import MISSING, text
from petlprof.report.table import contended_in, marked, render_markdown, with_contended_note
from petlprof.results.figures import HIGHER
from petlprof.tasks.metrics import direction

REFERENCE = "full"
NOT_RECORDED = "—"  # no figure: not reached, or a record older than the split-out check costs
TARGET_GROUP = ["task", "backbone", "target_metric", "target_value"]


@dataclass(frozen=True)
class TargetCost:
    """One cost to the target: its column as measured, the same without the checks, and its unit."""

    slug: str  # in the file name: cost_to_target_<slug>
    title: str
    with_checks: str
    without_checks: str
    check_cost: str
    unit: str
    decimals: int


ENERGY_TO_TARGET = TargetCost(
    "energy",
    "Train energy",
    "energy_to_target_j",
    "energy_to_target_without_checks_j",
    "check_energy_j",
    "J",
    1,
)
TIME_TO_TARGET = TargetCost(
    "time",
    "Train time",
    "time_to_target_s",
    "time_to_target_without_checks_s",
    "check_time_s",
    "s",
    1,
)
TARGET_COSTS = (ENERGY_TO_TARGET, TIME_TO_TARGET)


def _with_shares(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's checks' share of its cost to the target (NaN where it did not reach it)."""
    runs = runs.copy()
    for cost in TARGET_COSTS:
        runs[f"check_share_{cost.slug}"] = runs[cost.check_cost] / runs[cost.with_checks]
    return runs


def target_configs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of the finished runs that had a target, from the runs table
    (:func:`petlprof.report.frame.runs_frame`): :func:`summarise`'s means
    (costs to the target are means over the seeds that reached it), ``reached`` (how many seeds did),
    ``name`` (method and config), and ``<cost>_vs_full`` ratios of means to ``full``'s in the same
    task, backbone and target (NaN without a ``full`` that reached it)."""
    runs = runs[(runs["status"] == "ok") & runs["target_reached"].notna()]
    if runs.empty:
        return pd.DataFrame()
    configs = summarise(_with_shares(runs)).reset_index(drop=True)
    configs["reached"] = [int(str(r).split("/")[0]) for r in configs["target_reached"]]
    configs["name"] = [m if c == MISSING else f"{m} {c}" for m, c in zip(configs["method"], configs["config"])]
    columns = [c for cost in TARGET_COSTS for c in (cost.with_checks, cost.without_checks)]
    for column in columns:
        configs[f"{column}_vs_{REFERENCE}"] = math.nan
    for _, group in configs.groupby(TARGET_GROUP, sort=False, dropna=False):
        refs = group[(group["method"] == REFERENCE) & (group["reached"] > 0)]
        if refs.empty:
            continue
        for column in columns:
            ref = refs.iloc[0][column]
            if ref and not math.isnan(ref):
                configs.loc[group.index, f"{column}_vs_{REFERENCE}"] = group[column] / ref
    return configs


def by_cost(group: pd.DataFrame, column: str) -> pd.DataFrame:
    """Configurations ordered by their mean cost to the target, those that never reached it last."""
    return (
        group.assign(_unreached=group[column].isna())
        .sort_values(["_unreached", column, "name"])
        .drop(columns="_unreached")
    )


def target_phrase(metric: Any, value: Any) -> str:
    """``accuracy ≥ 0.4`` (``≤`` for a lower-is-better metric)."""
    try:
        sign = "≥" if direction(str(metric)) == HIGHER else "≤"
    except KeyError:
        sign = "at"
    return f"{text(metric)} {sign} {value:g}" if isinstance(value, float) else f"{text(metric)} {sign} {text(value)}"


def _cell(row: Mapping[str, Any], column: str, decimals: int, factor: float = 1.0) -> str:
    mean, ci = row.get(column), row.get(f"{column}_ci95")
    if mean is None or mean != mean:
        return NOT_RECORDED
    shown = f"{mean * factor:,.{decimals}f}"
    return shown if ci is None or ci != ci else f"{shown} ± {ci * factor:,.{decimals}f}"


def _ratio(row: Mapping[str, Any], column: str) -> str:
    if row.get("method") == REFERENCE:
        return marked("ref", contended_in(row, "train"))  # every ratio leans on it
    value = row.get(f"{column}_vs_{REFERENCE}")
    return NOT_RECORDED if value is None or value != value else marked(f"{value:.2f}×", contended_in(row, "train"))


def _share(row: Mapping[str, Any], cost: TargetCost) -> str:
    value = row.get(f"check_share_{cost.slug}")
    return NOT_RECORDED if value is None or value != value else f"{100 * value:.0f}%"


def target_table(group: pd.DataFrame) -> str:
    """The Markdown table of one task, backbone and target: a row per configuration, cheapest first."""
    with_full = (group["method"] == REFERENCE).any()
    headers = ["method", "config", "reached (seeds)"]
    for cost in TARGET_COSTS:
        unit = f"({cost.unit}, mean ± 95% CI)"
        headers += [f"{cost.slug} to target {unit}", f"checks' share of {cost.slug}"]
        headers += [f"{cost.slug} without checks ({cost.unit})"]
        if with_full:
            headers += [f"{cost.slug} vs {REFERENCE}", f"{cost.slug} without checks vs {REFERENCE}"]
    rows = []
    for _, row in by_cost(group, ENERGY_TO_TARGET.with_checks).iterrows():
        cells = [text(row["method"]), text(row["config"]), f"{row['reached']} of {int(row['n_seeds'])}"]
        for cost in TARGET_COSTS:
            contended = contended_in(row, "train")
            cells += [marked(_cell(row, cost.with_checks, cost.decimals), contended, NOT_RECORDED), _share(row, cost)]
            cells += [marked(_cell(row, cost.without_checks, cost.decimals), contended, NOT_RECORDED)]
            if with_full:
                cells += [_ratio(row, cost.with_checks), _ratio(row, cost.without_checks)]
        rows.append(cells)
    numeric = [False, False] + [True] * (len(headers) - 2)
    return with_contended_note(render_markdown(headers, rows, numeric), rows)


def target_tables(runs: pd.DataFrame) -> list[tuple[tuple, str, str]]:
    """(key: task, backbone, metric and target value; heading; Markdown table) per task, backbone and
    target of the runs (the runs table) that had one."""
    configs = target_configs(runs)
    if configs.empty:
        return []
    return [
        (key, f"{target_phrase(key[2], key[3])} — {text(key[1])} on {text(key[0])}", target_table(group))
        for key, group in configs.groupby(TARGET_GROUP, sort=True, dropna=False)
    ]


@dataclass
class TargetPlot:
    """What a cost-to-target plot showed: its files, its caption and the bar ends cut at the axes."""

    title: str
    cost: TargetCost
    key: tuple  # task, backbone, target metric and value
    paths: list[Path] = dataclass_field(default_factory=list)
    caption: str = ""
    order: list[str] = dataclass_field(default_factory=list)  # configuration labels, top (cheapest) first
    clipped: list[str] = dataclass_field(default_factory=list)

    @property
    def path(self) -> Path | None:
        """The PNG file."""
        return next((p for p in self.paths if p.suffix == ".png"), None)
