"""Which differences in the primary metric are larger than their intervals.

For each task and backbone, every configuration's mean primary metric is compared with the best
configuration's (best in the metric's direction) and with ``full`` fine-tuning's: the difference of
the means with the 95% confidence interval of that difference by Welch's t
(:func:`petlprof.report.intervals.welch_difference`, unequal variances), and a plain *yes* where the
difference is larger than the interval's half-width (the interval excludes 0), *no* where it is not,
and ``—`` where a side has a single seed (no interval can be given).  Runs on random weights are
left out (cost-only).  Where a zero-shot row ran (the model before tuning), every configuration is
also compared with it; its score is one deterministic figure (greedy decoding of a fixed model on a
fixed evaluation set, so one seed), and the interval of that difference is the configuration's own
(Student's t over its seeds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from petlprof.report.frame import CONFIG, GROUP
from petlprof.report.intervals import ci_half_width, welch_difference
from petlprof.report.records import MISSING, ZERO_SHOT_LABEL, method_name, text
from petlprof.report.table import render_markdown
from petlprof.results.figures import HIGHER
from petlprof.tasks.metrics import direction
from petlprof.vocabulary import ZERO_SHOT

REFERENCE = "full"
NO_INTERVAL = "—"


@dataclass(frozen=True)
class ConfigValues:
    """One configuration's finished seeds: its method, config label and their primary-metric values."""

    method: str
    config: str
    values: list[float]

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)


def configuration_values(runs: pd.DataFrame) -> list[ConfigValues]:
    """One entry per configuration of one task and backbone: method, config, and its seeds' ``quality``
    values (finished runs only), best mean first in the metric's direction."""
    ok = runs[(runs["status"] == "ok") & runs["quality"].notna()]
    entries = [
        ConfigValues(keys[2], keys[3], [float(v) for v in group["quality"]])
        for keys, group in ok.groupby(CONFIG, sort=False, dropna=False)
    ]
    metric = text(ok["primary_metric"].iloc[0]) if len(ok) else MISSING
    try:
        higher = direction(metric) == HIGHER
    except KeyError:
        higher = True
    return sorted(entries, key=lambda e: (-e.mean if higher else e.mean, e.method, str(e.config)))


def compare(entry: ConfigValues, other: ConfigValues) -> tuple[float, float, str]:
    """(difference of means, half-width of its 95% Welch interval, ``yes``/``no``/``—``: is the
    difference larger than its interval); with the single zero-shot score on one side, the interval is
    the other side's own."""
    fixed = [e for e in (entry, other) if e.method == ZERO_SHOT and len(e.values) == 1]
    if len(fixed) == 1:
        varying = other if fixed[0] is entry else entry
        diff, half = entry.mean - other.mean, ci_half_width(varying.values)
    else:
        diff, half = welch_difference(entry.values, other.values)
    if math.isnan(half):
        return diff, half, NO_INTERVAL
    return diff, half, "yes" if abs(diff) > half else "no"


def _shown(diff: float, half: float) -> str:
    sign = f"{diff:+.4f}".replace("-", "−")
    return sign if math.isnan(half) else f"{sign} ± {half:.4f}"


def difference_table(runs: pd.DataFrame) -> str:
    """The Markdown table of one task and backbone's configurations against the best and ``full``."""
    entries = configuration_values(runs)
    metric = text(runs["primary_metric"].dropna().iloc[0]) if runs["primary_metric"].notna().any() else "metric"
    best = entries[0]
    full = next((e for e in entries if e.method == REFERENCE), None)
    zero_shot = next((e for e in entries if e.method == ZERO_SHOT), None)
    headers = ["method", "config", "seeds", f"{metric} (mean)", "Δ vs best (95% CI, Welch)", "larger than its interval"]
    if full is not None:
        headers += [f"Δ vs {REFERENCE} (95% CI, Welch)", "larger than its interval"]
    if zero_shot is not None:
        headers += [f"Δ vs {ZERO_SHOT_LABEL} (95% CI)", "larger than its interval"]
    pairs = [best] + [other for other in (full, zero_shot) if other is not None]
    rows = []
    for entry in entries:
        cells = [method_name(entry.method), text(entry.config), str(len(entry.values)), f"{entry.mean:.4f}"]
        for other, mark in zip(pairs, ["best"] + ["ref"] * (len(pairs) - 1)):
            if entry is other:
                cells += [mark, NO_INTERVAL]
                continue
            diff, half, larger = compare(entry, other)
            cells += [_shown(diff, half), larger]
        rows.append(cells)
    numeric = [False, False, True, True] + [True, False] * len(pairs)
    return render_markdown(headers, rows, numeric)


def comparable(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs of the runs table (:func:`petlprof.report.frame.runs_frame`) whose scores can be compared:
    with a score, not on random weights (``--random-init``, cost-only), and not of a configuration with a run that
    answered every prompt with one text (``constant_output``): their scores mean nothing."""
    constant = set(runs.loc[runs["constant_output"].astype(bool), "config_key"])  # every seed of such a config
    return runs[
        ~runs["random_init"].astype(bool)
        & ~runs["config_key"].isin(constant)
        & (runs["status"] == "ok")
        & runs["quality"].notna()
    ]


def difference_tables(runs: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(task, backbone, Markdown table) for every task and backbone with a finished run, from the runs
    table (:func:`petlprof.report.frame.runs_frame`); only the :func:`comparable` runs count."""
    runs = comparable(runs)
    return [
        (text(task), text(backbone), difference_table(group))
        for (task, backbone), group in runs.groupby(GROUP, sort=True, dropna=False)
    ]
