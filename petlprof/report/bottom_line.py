"""The report's bottom line, read first: per task and backbone, a few sentences in plain words.

Which configurations are on the frontier of the primary metric against training energy, and against training
peak memory (:func:`petlprof.report.frame.frontier`, seed means); which configurations' mean scores differ from
the best's by more than the 95% interval of the difference and which do not (the comparisons of
:mod:`petlprof.report.differences`, Welch's t); with one seed per configuration, that no difference is set against
seed-to-seed variation and that the tables' intervals come from the evaluation samples (binomial), not from seeds;
and which configurations were measured on a contended machine, with the tables' mark.  Scores on random weights
and of configurations that answered every prompt with one text are left out, as in the differences table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from petlprof.report.differences import NO_INTERVAL, ConfigValues, comparable, compare, configuration_values
from petlprof.report.frame import CONTENDED, GROUP, frontier, summarise
from petlprof.report.intervals import PROPORTIONS, wilson_interval
from petlprof.report.records import MISSING, method_name, text
from petlprof.report.table import CONTENDED_MARK, contended_in
from petlprof.results.figures import ENERGY, PEAK_MEMORY
from petlprof.vocabulary import ZERO_SHOT

HEADING = "## Bottom line"
LISTED = 5  # configurations named in one clause before "and N more"
PHASE_WORDS = {  # how a phase of CONTENDED is named in a sentence
    "train": "training",
    "eval": "evaluation",
    "eval_merged": "merged evaluation",
    "inference": "inference",
    "generation": "generation",
    "generation_merged": "merged generation",
}


def bottom_line(runs: pd.DataFrame) -> list[str]:
    """The lines of the "Bottom line" section for the runs table (:func:`petlprof.report.frame.runs_frame`): one
    paragraph, or one item per task and backbone where there are several."""
    ok = runs[runs["status"] == "ok"]
    lines = [HEADING, ""]
    if ok.empty:
        return lines + ["No run finished, so there is nothing to compare; *Failed runs* below says why.", ""]
    groups = list(ok.groupby(GROUP, sort=True, dropna=False))
    for (task, backbone), group in groups:
        paragraph = " ".join(_sentences(group))
        lines.append(f"- **{text(task)} on {text(backbone)}:** {paragraph}" if len(groups) > 1 else paragraph)
    return lines + [""]


def _sentences(group: pd.DataFrame) -> list[str]:
    """One task and backbone's finished runs in a few sentences."""
    scored = comparable(group)
    sentences = []
    if scored.empty:
        sentences.append(
            "No finished run has a score that means something (each ran on random weights, `--random-init`, or "
            "answered every prompt with one text), so only the costs in the tables count."
        )
    else:
        metric = text(scored["primary_metric"].dropna().iloc[0]) if scored["primary_metric"].notna().any() else "score"
        sentences += _frontiers(scored, metric)
        sentences.append(_differences(scored, metric))
    contended = _contended(group)
    return sentences + ([contended] if contended else [])


def _label(method: Any, config: Any) -> str:
    """A configuration as the plots' captions name it: method and config, the config left out where it is none."""
    shown = text(config)
    return method_name(method) if shown in (MISSING, "") else f"{method_name(method)} {shown}"


def _listed(items: Sequence[str]) -> str:
    """``items`` comma-separated, past :data:`LISTED` of them cut to ``and N more``."""
    if len(items) <= LISTED:
        return ", ".join(items)
    return ", ".join(items[:LISTED]) + f" and {len(items) - LISTED} more"


def _energy(row: Any) -> str:
    """A configuration's mean training energy in J, measured or estimated, marked where it was contended."""
    kind = text(row.get("energy_kind"))
    shown = f"{row[ENERGY.name] * ENERGY.scale:,.{ENERGY.decimals}f} {ENERGY.shown_unit}"
    mark = CONTENDED_MARK if contended_in(row, "train") else ""
    return shown + mark + ("" if kind == MISSING else f" {kind}")


def _frontiers(scored: pd.DataFrame, metric: str) -> list[str]:
    """Who is on the frontier of the metric against training energy (with the figures), and against memory."""
    configs = frontier(scored, x=ENERGY.name, y="quality")
    tuned = configs[configs["method"] != ZERO_SHOT]
    front = tuned[tuned["on_front"]].sort_values(ENERGY.name)
    off = tuned[~tuned["on_front"] & tuned["quality"].notna() & tuned[ENERGY.name].notna()]
    if tuned.empty:
        return ["Nothing was tuned (the zero-shot model alone), so there is no frontier of tuning methods."]
    if front.empty:
        return [f"No configuration has both a {metric} and a training energy figure, so there is no frontier."]
    points = [
        f"{_label(row['method'], row['config'])} ({metric} {row['quality']:.4f}, {_energy(row)})"
        for _, row in front.iterrows()
    ]
    others = [_label(row["method"], row["config"]) for _, row in off.iterrows()]
    if len(points) == 1 and not others:
        sentence = f"{points[0]} is the only configuration with both a {metric} and a training energy figure."
    elif len(points) == 1:
        sentence = (
            f"{points[0]} dominates on {metric} against training energy: every other configuration "
            f"({_listed(others)}) scores no better and uses no less energy."
        )
    else:
        sentence = f"On the frontier of {metric} against training energy, cheapest first: {'; '.join(points)}."
        if others:
            which = "the other configuration (" if len(others) == 1 else f"the other {len(others)} ("
            sentence = sentence[:-1] + (
                f"; {which}{_listed(others)}) {'is' if len(others) == 1 else 'are'} dominated: another configuration "
                "scores at least as well for no more energy."
            )
    memory = frontier(scored, x=PEAK_MEMORY.name, y="quality")
    memory = memory[memory["on_front"] & (memory["method"] != ZERO_SHOT)].sort_values(PEAK_MEMORY.name)
    if memory.empty:
        return [sentence]
    named = [
        f"{_label(row['method'], row['config'])} "
        f"({row[PEAK_MEMORY.name] * PEAK_MEMORY.scale:,.{PEAK_MEMORY.decimals}f} {PEAK_MEMORY.shown_unit})"
        for _, row in memory.iterrows()
    ]
    return [sentence, f"Against training peak memory the frontier is {_listed(named)}."]


def _signed(value: float) -> str:
    return f"{value:+.4f}".replace("-", "−")


def _differences(scored: pd.DataFrame, metric: str) -> str:
    """Which means the best's is told apart from (:func:`petlprof.report.differences.compare`), or, with one seed
    per configuration, where the tables' intervals come from."""
    entries = configuration_values(scored)
    best, rest = entries[0], entries[1:]
    seeds = f"{len(best.values)} seed{'s' if len(best.values) > 1 else ''}"
    head = f"Best mean {metric}: {_label(best.method, best.config)} ({best.mean:.4f}, {seeds})"
    if all(len(e.values) == 1 for e in entries if e.method != ZERO_SHOT):
        return f"{head}. {_one_seed(scored, metric, best)}"
    verdicts: dict[str, list[str]] = {"yes": [], "no": [], NO_INTERVAL: []}
    for entry in rest:
        diff, half, larger = compare(entry, best)
        label = _label(entry.method, entry.config)
        verdicts[larger].append(label if larger == NO_INTERVAL else f"{label} ({_signed(diff)} ± {half:.4f})")
    clauses = []
    if verdicts["yes"]:
        clauses.append(
            "told apart from it (worse by more than the 95% interval of the difference, Welch's t): "
            + _listed(verdicts["yes"])
        )
    if verdicts["no"]:
        clauses.append(
            "not told apart from it at these seeds (the difference is within its 95% interval): "
            + _listed(verdicts["no"])
        )
    if verdicts[NO_INTERVAL]:
        clauses.append("one seed on a side, so no interval: " + _listed(verdicts[NO_INTERVAL]))
    return head + "".join(f"; {clause}" for clause in clauses) + "."


def _one_seed(scored: pd.DataFrame, metric: str, best: ConfigValues) -> str:
    """With one seed per configuration: no difference is set against seeds; what the tables' intervals are."""
    said = "One seed per configuration, so no difference is set against seed-to-seed variation"
    samples = sorted({int(n) for n in pd.to_numeric(scored["eval_samples"], errors="coerce").dropna()})
    if metric not in PROPORTIONS or not samples:
        why = "is not a share of the evaluation samples" if metric not in PROPORTIONS else "has no sample count"
        return f"{said}, and {metric} {why}, so the tables give it no interval: no difference can be told apart."
    counts = "/".join(map(str, samples))
    low, high = wilson_interval(best.mean, samples[0]) if len(samples) == 1 else (float("nan"), float("nan"))
    interval = "" if low != low else f" (the best's: [{low:.4f}, {high:.4f}])"
    return (
        f"{said}: the intervals in the tables are binomial, from the {counts} evaluation samples, not from "
        f"seeds{interval}; they show how far a score could move on another draw of evaluation examples, not on "
        "another seed."
    )


def _contended(group: pd.DataFrame) -> str | None:
    """The configurations with a window measured on a contended machine, and which phases."""
    named = []
    for _, row in summarise(group).iterrows():
        phases = [PHASE_WORDS[phase] for phase in CONTENDED if contended_in(row, phase)]
        if phases:
            named.append(f"{_label(row['method'], row['config'])} ({', '.join(phases)})")
    if not named:
        return None
    return (
        "Measured while other processes kept the machine's CPUs busy, so their time, energy and latency may be "
        f"worse than on an idle machine (marked {CONTENDED_MARK} in the tables): {_listed(named)}."
    )


__all__ = ["HEADING", "bottom_line"]
