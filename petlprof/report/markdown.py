"""report.md: what was run, a table per task of every configuration, which differences in the metric
are larger than their intervals, the cost to reach the target (runs with one), the Pareto plots, every run,
how each figure was obtained, warnings on results and measurements, failed and diverged runs and the
environment; written next to the plots
by :func:`write_report`, which also writes the same text as a self-contained report.html.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from petlprof.errors import shown
from petlprof.report.bottom_line import bottom_line
from petlprof.report.curves import CurvePlot, learning_curve_figures
from petlprof.report.differences import difference_tables
from petlprof.report.frame import runs_frame, summarise
from petlprof.report.html import write_html
from petlprof.report.intervals import DEFAULT_INTERVAL, INTERVALS, check_interval
from petlprof.report.lifecycle import LIFECYCLE_AXES, LifecyclePlot, lifecycle_plots, lifecycle_section, with_served
from petlprof.report.page import page_data
from petlprof.report.plots import PlotResult, pareto_figures
from petlprof.report.power_plot import PowerPlot, power_limit_figures
from petlprof.report.records import (
    MISSING,
    ZERO_SHOT_LABEL,
    config_label,
    distinct,
    grouped_run_warnings,
    is_ok,
    is_zero_shot,
    method_name,
    overhead_line,
    result_warnings,
    run_label,
    sort_key,
    text,
)
from petlprof.report.search import search_section
from petlprof.report.table import (
    CONSTANT_OUTPUT,
    COSTS_CAPTION,
    GENERATION_CAPTION,
    MAJORITY,
    MORE_CAPTION,
    REFERENCE,
    TARGET_CAPTION,
    VS_CAPTION,
    configuration_sections,
    render_markdown,
    summary_table,
)
from petlprof.report.target import NOT_RECORDED, target_tables
from petlprof.report.target_plot import TargetPlot, cost_to_target_figures
from petlprof.results.figures import (
    CO2,
    CODECARBON_ENERGY_J,
    ENERGY,
    ENERGY_KIND,
    ENERGY_SOURCE,
    LATENCY,
    MEMORY_SOURCE,
    PEAK_MEMORY,
    PEAK_TENSORS,
)
from petlprof.results.grades import GRADES, Grade
from petlprof.results.records import DIVERGED
from petlprof.results.result import BATCHED_PHASES, RunResult, energy_kinds, results_of
from petlprof.results.store import Rejected
from petlprof.results.units import EnergyUnits, GridIntensity, measured_intensity
from petlprof.values import is_number
from petlprof.vocabulary import ESTIMATED, LOCAL

REPORT_FILE = "report.md"
PHASES = ("train", "eval")
ERROR_LINES = 15  # the last lines of a failed run's error shown in report.md


def _names(values: Iterable[str | None]) -> str:
    """Distinct values, comma-separated."""
    return ", ".join(str(v) for v in distinct(values)) or "-"


def _describe_backbone(record: RunResult) -> str:
    info = record.backbone_info
    facts = [info.family] if info.family else []
    if info.num_layers:
        facts.append(f"{info.num_layers} layers")
    if info.hidden_size:
        facts.append(f"hidden size {info.hidden_size}")
    return f"`{text(record.backbone)}`" + (f" ({', '.join(facts)})" if facts else "")


def _describe_task(record: RunResult) -> str:
    info = record.task_info
    facts = [f"primary metric {text(record.primary_metric)}"]
    if info.num_labels:
        names = info.label_names
        facts.append(f"{info.num_labels} labels" + (f" ({', '.join(names)})" if names else ""))
    if info.train_samples is not None and info.eval_samples is not None:
        facts.append(f"{info.train_samples} train / {info.eval_samples} eval samples")
    described = f"`{text(record.task)}` ({'; '.join(facts)})"
    return described + (f": {info.description}" if info.description else "")


def _first_per(records: Sequence[RunResult], key: Callable[[RunResult], str | None]) -> list[RunResult]:
    """The first record for each distinct value of ``key``."""
    first: dict[str, RunResult] = {}
    for record in records:
        first.setdefault(text(key(record)), record)
    return list(first.values())


def _what_was_run(records: Sequence[RunResult]) -> list[str]:
    statuses = Counter(text(r.status) for r in records)
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    lines = ["## What was run", "", f"{len(records)} run(s): {counts}.", ""]
    backbones = _first_per(records, lambda r: r.backbone)
    lines.append("- **Backbones:** " + "; ".join(_describe_backbone(r) for r in backbones))
    lines.append("- **Tasks:** " + "; ".join(_describe_task(r) for r in _first_per(records, lambda r: r.task)))
    methods = []
    for method in distinct(r.method for r in records):
        configs = distinct(config_label(r, width=1000) for r in records if r.method == method)
        methods.append(f"{method} ({'; '.join(configs)})")
    lines.append("- **Methods (configurations):** " + ", ".join(methods or ["-"]))
    seeds = sorted(distinct(r.seed for r in records), key=str)
    lines.append("- **Seeds:** " + (", ".join(map(str, seeds)) or "-"))
    settings = []
    for key in distinct(k for r in records for k in r.training):
        values = distinct(r.training.get(key) for r in records)  # nulls (not set) are left out
        if key in ("lr", "lr_source") and len(values) > 1:  # per-method defaults: say whose is whose
            if key == "lr":
                settings.append("lr per method: " + ", ".join(_lr_per_method(records)))
            continue  # each method's learning-rate source is in the table of defaults in docs/running.md
        if values:
            shown = " / ".join(_setting(v) for v in values)
            settings.append(f"{key}={shown}" + (" (varies)" if len(values) > 1 else ""))
    lines.append("- **Training settings:** " + ("; ".join(settings) or "-"))
    if overhead := overhead_line(records):
        lines.append(f"- **Time outside the measurements:** {overhead.removeprefix('harness overhead: ')}.")
    return lines + [""]


def _lr_per_method(records: Sequence) -> list[str]:
    """``method=lr`` per method; ``method on task=lr`` for a method whose runs on different tasks took different
    learning rates (its defaults on the classification and LM objectives in one sweep)."""
    several = {
        m
        for m in distinct(r.method for r in records)
        if len(distinct(r.training.get("lr") for r in records if r.method == m)) > 1
    }
    return distinct(
        f"{r.method}{f' on {r.task}' if r.method in several else ''}={_setting(r.training.get('lr'))}" for r in records
    )


def _setting(value: Any) -> str:
    """A training setting's value: numbers with %g, containers as compact JSON, text as it is."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _figures(figures: Sequence[PlotResult], interval: str) -> list[str]:
    lines = [
        "## Pareto fronts",
        "",
        f"Each point is one configuration: the mean over its seeds, with thin bars for the {INTERVALS[interval]} "
        "when it has several seeds (`petlprof report --interval` chooses: "
        + ", ".join(f"`{kind}`" for kind in INTERVALS)
        + ").  The axes follow the points, not the bars: a bar that runs past the axes is cut at the edge and "
        "ends in a caret there instead of a cap.  A method's grid points are "
        "joined in the order of its Pareto knob, whose value labels each point.  The dashed step line "
        "is the frontier over all methods: the ringed configurations are those no other configuration "
        "beats on both quality and the cost at once.  Up and to the left is better.  Each plot is "
        "also written as SVG beside the PNG.",
        "",
    ]
    shots = [fig.zero_shot for fig in figures if fig.zero_shot is not None]
    if shots:
        lines[-2] += (
            f"  The dash-dot line is the *{ZERO_SHOT_LABEL}* score: the model before any training, whose "
            "training cost is zero (so it has no point: a log axis cannot show 0); a configuration on the line's "
            "worse side scores worse than not tuning at all."
        )
    if not figures:
        lines += ["No plots: there are no finished runs to plot.", ""]
    for fig in figures:
        lines += [f"### {fig.metric} vs {fig.axis.title.lower()} — {fig.backbone} on {fig.task}", ""]
        if fig.path is None:
            lines += [f"Not plotted: {fig.skipped}.", ""]
            continue
        svg = next((p.name for p in fig.paths if p.suffix == ".svg"), None)
        lines += [
            f"![{fig.metric} vs {fig.axis.title.lower()}, {fig.backbone} on {fig.task}]({fig.path.name})",
            "",
            f"{fig.runs} finished run(s) in {fig.configs} configuration(s) plotted"
            + (f" ([SVG]({svg}))" if svg else "")
            + f"; configurations on the Pareto front: {', '.join(fig.on_front)}.  {_sentence(fig.caption)}",
            "",
        ]
    return lines


def _sentence(caption: str) -> str:
    """A plot's caption (``bars: ...``) as a sentence of the report."""
    return (caption[0].upper() + caption[1:] + ".") if caption else ""


def _differences(records: Sequence[RunResult], runs: pd.DataFrame) -> list[str]:
    tables = difference_tables(runs)
    if not tables:
        return []
    lines = [
        "## Which differences are larger than their intervals",
        "",
        "Each configuration's mean primary metric against the best configuration's and against "
        f"`{REFERENCE}`'s (where it ran): the difference of the means ± the half-width of its 95% confidence "
        "interval (Welch's t: the two configurations' seeds, unequal variances).  *Larger than its interval* "
        "is *yes* where the difference exceeds that half-width (its interval does not contain 0), *no* "
        "where it does not — the two cannot be told apart at this number of seeds — and — where a side has "
        "one seed.  Many comparisons are made at once and none is corrected for that: at 95%, about one "
        "in twenty *yes* is expected by chance among configurations that do not really differ.  Runs on random "
        "weights (`--random-init`, cost-only) are left out."
        + (
            "  Against the zero-shot row (one deterministic score: greedy decoding of the model before "
            "tuning), the interval is the configuration's own."
            if any(is_zero_shot(r) for r in records)
            else ""
        ),
        "",
    ]
    for task, backbone, table in tables:
        if len(tables) > 1:
            lines += [f"### {task} on {backbone}", ""]
        lines += [table, ""]
    return lines


def _cost_to_target(runs: pd.DataFrame, plots: Sequence[TargetPlot]) -> list[str]:
    tables = target_tables(runs)
    if not tables:
        return []
    lines = [
        "## Cost to reach the target",
        "",
        "Runs trained with a target stop once their held-out checks reach it, so their train time and energy are "
        "the cost of getting there, *including the checks* (scoring the check slice every few steps).  Each "
        "cost is shown as measured and without the checks' own measured cost; the checks' share is that cost "
        "over the cost to the target.  Figures are means ± the 95% CI over the seeds that reached the target "
        f"(*reached k of n*); `vs {REFERENCE}` is the ratio of the means to `{REFERENCE}`'s (0.25× = a quarter).  "
        f"{NOT_RECORDED} marks a figure there is none of: no seed reached the target, or records written before "
        "petlprof metered the checks' energy separately.",
        "",
    ]
    for key, heading, table in tables:
        lines += [f"### {heading}", "", table, ""]
        for plot in plots:
            if plot.key != key or plot.path is None:
                continue
            svg = next((p.name for p in plot.paths if p.suffix == ".svg"), None)
            lines += [f"![{plot.title}]({plot.path.name})", "", _sentence(plot.caption) + f" ([SVG]({svg}))", ""]
    return lines


def _configurations(records: Sequence[RunResult], runs: pd.DataFrame) -> list[str]:
    sections = configuration_sections(runs)
    lines = ["## Results per configuration", ""]
    if not sections:
        return lines + ["No run finished, so there is nothing to compare.", ""]
    lines += [
        "One row per configuration of a task: figures are the mean over its finished seeds, ± the half-width "
        "of the 95% confidence interval of that mean (Student's t; none for one seed).  Costs are for the "
        "train phase, latency for the eval phase.  *On frontier of* names the costs (energy, memory, time, "
        "params) for which no other configuration is at least as good on both the metric and that cost and "
        "better on one."
        + (MAJORITY_NOTE if any(MAJORITY in s.tables[0][1] for s in sections) else "")
        + (ZERO_SHOT_NOTE if any(is_zero_shot(r) and is_ok(r) for r in records) else "")
        + (CONSTANT_NOTE if any(r.constant_output and is_ok(r) for r in records) else ""),
        "",
    ]
    for section in sections:
        if len(sections) > 1:
            lines += [f"### {section.task} on {section.backbone}", ""]
        for caption, table in section.tables:
            lines += [f"**{caption}.** {TABLE_NOTES[caption]}", "", table, ""]
    return lines


CONSTANT_NOTE = (
    f"  A score marked *{CONSTANT_OUTPUT}* is of a run that generated the same text for every evaluation prompt "
    "(the records' `constant_output`): the model ignored its prompts, so the score is not the method's; such a "
    "configuration is on no frontier."
)
MAJORITY_NOTE = (
    f"  The *{MAJORITY}* row is the accuracy of always answering the evaluation set's most common class "
    "(the records' `task_info.majority_rate`): a score near it is no sign of learning."
)
ZERO_SHOT_NOTE = (
    f"  The *{ZERO_SHOT_LABEL}* row is the model as loaded, evaluated without any training (its training "
    "took no time and no energy): what each configuration gained, or lost, by tuning.  It is a reference, "
    "not a configuration: it is on no frontier and is left out of the comparison with "
    f"`{REFERENCE}`."
)
TABLE_NOTES = {
    COSTS_CAPTION: "The primary metric and what it cost to train.",
    VS_CAPTION: f"The means compared with `{REFERENCE}` fine-tuning on the same task and backbone (−72% = 72% "
    "less; for the metric, the difference).",
    MORE_CAPTION: "Latency of evaluation, and the figures only some runs record.",
    TARGET_CAPTION: "Runs with a target (time-to-accuracy): how many seeds reached it, and the steps, time and "
    "energy it took (means over the seeds that reached it; checks included).",
    GENERATION_CAPTION: "Greedy decoding of evaluation prompts after evaluation, KV cache kept, per batch size "
    "(1 and the evaluation batch; *merged*: the same with the method's weights folded into the backbone).  "
    "Tokens are those the model chose, each response's closing end-of-sequence token included; energy per "
    "token and tokens/s are over the whole window, time to first token is from the call to the first chosen "
    "token (median over the window's calls), per-token latency the gaps between tokens, peak memory the "
    "window's (weights, activations and the KV cache).  The side network's share (READ, LST) comes from one "
    "unmetered call timed with forward hooks.",
}


def _graded_windows(records: Sequence[RunResult]) -> list[tuple[RunResult, str, Grade]]:
    """(record, window name, grade) of every metered window with an energy figure, the zero-shot row's untrained
    phase (exactly 0 J, by construction) left out."""
    out = []
    for record in records:
        phases = ("eval", "eval_merged") if is_zero_shot(record) else ("train", "eval", "eval_merged")
        named = [(p, record.phase(p)) for p in phases]
        named += [(f"{p} {k}", w) for p in BATCHED_PHASES for k, w in record.windows(p).items()]
        out += [(record, name, grade) for name, window in named if window and (grade := window.energy_grade)]
    return out


def _trust(records: Sequence[RunResult]) -> list[str]:
    """The sweep's worst energy grade first, what it rests on, and how many windows got each grade."""
    graded = _graded_windows(records)
    if not graded:
        return []
    record, name, grade = max(graded, key=lambda item: GRADES.index(item[2].letter))
    counts = Counter(g.letter for _, _, g in graded)
    where = f"{name} phase of {method_name(record.method)} ({config_label(record)}), seed {text(record.seed)}"
    reasons = "; ".join(grade.reasons) or "every check passed"
    return [
        "## How far to trust the energy figures",
        "",
        f"Worst energy grade in this sweep: **{grade.letter}**, the {where} ({reasons}).",
        "",
        "Grades of the "
        + f"{len(graded)} metered windows: "
        + ", ".join(f"{letter} {counts[letter]}" for letter in GRADES if counts[letter])
        + ". A grade says how far an energy figure can be trusted, from A (a counter read often enough, on a "
        "settled device) to D (an estimate, not a measurement); the rule is in docs/reports.md#energy-grades.",
        "",
    ]


def _predicted(records: Sequence[RunResult]) -> list[str]:
    """Predicted against measured, per configuration: the train step's time, energy and peak memory (means over the
    seeds that finished), each as predicted / measured."""
    rows = []
    by_config: dict[str, list[RunResult]] = {}
    for record in sorted(records, key=sort_key):
        if is_ok(record) and record.predicted.get("train") and record.train is not None:
            by_config.setdefault(f"{record.task} / {record.backbone} / {run_label(record)}", []).append(record)
    # live tensors (the cpu-tensors meter) where every run has them: what the prediction counts, unlike the RSS
    tensors = all(is_number(r.train.raw(PEAK_TENSORS)) for group in by_config.values() for r in group if r.train)
    for name, group in by_config.items():
        predicted = group[0].predicted["train"]
        steps = [r.train.raw("steps") or 0 for r in group if r.train is not None]
        measured = {
            "time": _mean([r.train[LATENCY] for r in group if r.train is not None]),
            "energy": _mean([(r.train[ENERGY] or 0) / s for r, s in zip(group, steps) if r.train is not None and s]),
            "memory": _mean(
                [r.train.raw(PEAK_TENSORS) if tensors else r.train[PEAK_MEMORY] for r in group if r.train is not None]
            ),
        }
        cells = [name, str(len(group))]
        for key, what, scale, unit in (
            ("time", "step_time_s", 1000.0, "ms"),
            ("energy", ENERGY.name, 1.0, "J"),
            ("memory", PEAK_MEMORY.name, 1 / 2**20, "MiB"),
        ):
            value, seen = predicted.get(what), measured[key]
            ratio = f"{value / seen:.2f}" if isinstance(value, (int, float)) and seen else MISSING
            cells += [
                MISSING if not isinstance(value, (int, float)) else f"{value * scale:,.1f} {unit}",
                MISSING if not seen else f"{seen * scale:,.1f} {unit}",
                ratio,
            ]
        rows.append(cells)
    if not rows:
        return []
    first = next(iter(by_config.values()))[0].predicted
    calibrated = "calibrated on this machine" if first.get("calibrated") else "uncalibrated"
    kinds = energy_kinds(r.train for group in by_config.values() for r in group) or MISSING
    headers = ["configuration", "seeds"]
    memory = "measured: live tensors, cpu-tensors" if tensors else "measured"
    for what, run in (("step time", "measured"), ("energy per step", kinds), ("peak memory", memory)):
        headers += [f"{what} predicted", f"in the runs ({run})", "predicted / in the runs"]
    meter = (
        "the live tensors the `cpu-tensors` meter counted, as the prediction counts them (that meter slows each step: "
        "time a sweep without it)"
        if tensors
        else "as the run's memory meter reads it: on a CPU the RSS high-water mark, which also holds the data, the "
        "tokenizer and the allocator's cache; `--meters cpu-tensors` counts tensors as the prediction does"
    )
    return [
        "## Predicted and measured",
        "",
        f"What the sweep predicted of each configuration before running it ({first.get('device')}, {calibrated}; "
        f"{first.get('priced')}), against what its runs recorded: the median train step (latency p50), the train "
        f"phase's energy per optimiser step and its peak memory ({meter}), means over the seeds.  The model and its "
        "known misses: docs/estimating.md.",
        "",
        render_markdown(headers, rows, [False, True] + [True] * 9),
        "",
    ]


def _mean(values: Sequence[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
    return sum(numbers) / len(numbers) if numbers else None


def _provenance(records: Sequence[RunResult]) -> list[str]:
    lines = ["## How the figures were obtained", ""]
    for phase in PHASES:
        with_phase = [r for r in records if r.phase(phase) is not None]
        untrained = phase == "train" and any(is_zero_shot(r) for r in with_phase)
        windows = [w for r in with_phase if not (phase == "train" and is_zero_shot(r)) and (w := r.phase(phase))]
        lines += [f"### {phase.capitalize()} phase", ""]
        if untrained:
            lines.append(f"- The *{ZERO_SHOT_LABEL}* row trained nothing: its train time and energy are exactly 0.")
        if not windows:
            lines += [f"No run recorded the {phase} phase.", ""]
            continue
        energy = Counter(
            (w.raw(ENERGY_SOURCE), w.raw(ENERGY_KIND), w.raw("energy_model"))
            for w in windows
            if w.raw(ENERGY.name) is not None
        )
        for (source, kind, model), n in energy.items():
            line = f"- Energy (J): **{text(kind)}**, source `{text(source)}`, {n} run(s)"
            lines.append(line + (f"; estimate model: {model}" if kind == ESTIMATED and model else ""))
        missing = sum(1 for w in windows if w.raw(ENERGY.name) is None)
        if missing:
            lines.append(f"- Energy (J): no figure for {missing} run(s) (no meter could give one)")
        for source, n in Counter(w.raw(MEMORY_SOURCE) for w in windows).items():
            lines.append(f"- Peak memory (bytes, shown in MiB): source `{text(source)}`, {n} run(s)")
        lines.append(
            "- Latency (s per batch, shown in ms): percentiles p50/p90/p99 over the timed batches; "
            "warm-up steps are excluded."
        )
        lines.append("")
    return lines + _generation_provenance(records)


def _generation_provenance(records: Sequence[RunResult]) -> list[str]:
    """How the generation phases' figures were obtained (nothing when no run has one)."""
    windows = [w for r in records for phase in ("generation", "generation_merged") for w in r.windows(phase).values()]
    if not windows:
        return []
    lines = ["### Generation phase", ""]
    energy = Counter((w.raw(ENERGY_SOURCE), w.raw(ENERGY_KIND)) for w in windows if w.raw(ENERGY.name) is not None)
    for (source, kind), n in energy.items():
        lines.append(f"- Energy (J, per token and response): **{text(kind)}**, source `{text(source)}`, {n} windows")
    for source, n in Counter(w.raw("latency_source") for w in windows).items():
        lines.append(f"- Time to first token and per-token latency: `{text(source)}`, {n} windows")
    lines.append(
        "- Each batch size is one window of whole greedy-decoding calls after unmeasured warm-up calls; "
        "a window is capped at a number of prompts (its `max_prompts`) so a CPU run stays short, and says "
        "so in its warnings when that left it shorter than its target."
    )
    return lines + [""]


def _failed(records: Sequence[RunResult]) -> list[str]:
    lines = ["## Failed runs", ""]
    failed = sorted((r for r in records if not is_ok(r)), key=sort_key)
    if not failed:
        return lines + ["None: every run finished.", ""]
    if any(r.status == DIVERGED for r in failed):
        lines += [
            "A `diverged` run trained until its loss stopped being a finite number; it has no scores and "
            "appears in no table of results, frontier or plot.",
            "",
        ]
    for record in failed:
        error = [line.rstrip() for line in (record.error or "(no error text)").splitlines()]
        if len(error) > ERROR_LINES:
            error = ["…"] + error[-ERROR_LINES:]
        lines += [
            f"- **{run_label(record)}**, seed {text(record.seed)}, "
            f"{text(record.backbone)} on {text(record.task)}: status `{text(record.status)}`",
            "",
            "````text",  # not indented under the item: Python-Markdown (report.html) reads fences only at the margin
            *error,
            "````",
            "",
        ]
    return lines


def _warnings(records: Sequence[RunResult]) -> list[str]:
    lines = []
    results = result_warnings(records)
    if results:
        lines += ["## Warnings on results", "", *(f"- {w}" for w in results), ""]
    measurements = grouped_run_warnings(records)
    if measurements:
        lines += ["## Measurement warnings", "", *(f"- {w}" for w in measurements), ""]
    return lines


def _rejected(rejected: Sequence[Rejected]) -> list[str]:
    """The lines of the store no table shows: where they are, their run key if readable, and why."""
    if not rejected:
        return []
    lines = [
        "## Rejected lines of the results",
        "",
        f"{len(rejected)} line(s) of the results are not usable records, so no table, plot or frontier shows "
        "them.  `petlprof run` with the same output folder runs their run keys again; the lines stay in the "
        "file (it is only ever appended to) for whoever wrote them to inspect.",
        "",
    ]
    rows = [[str(r.path), str(r.line), text(r.run_key and shown(r.run_key, quote=False)), r.why] for r in rejected]
    return lines + [render_markdown(["file", "line", "run key", "why"], rows, [False, True, False, False]), ""]


ENV_CHARS = 300  # an environment value longer than this is cut in the report (the record keeps it whole)


def _environment(records: Sequence[RunResult]) -> list[str]:
    lines = ["## Environment", ""]
    env = records[0].env if records else None
    if not env:
        return lines + ["Not recorded.", ""]
    # values come from the machine's environment (allocator settings, paths): control characters escaped,
    # and cut past a few settings' length, so one cannot break the report's layout
    lines += ["From the first record:", ""]
    lines += [
        f"- **{shown(key, quote=False)}:** {shown(text(value), quote=False, limit=ENV_CHARS)}"
        for key, value in env.items()
    ]
    # a key missing from some records (written before it was recorded) differs too
    envs: list[Mapping[str, Any]] = [r.env or {} for r in records]
    keys = distinct(k for e in envs for k in e)
    differing = [k for k in keys if len({json.dumps(e.get(k), sort_keys=True, default=str) for e in envs}) > 1]
    if differing:
        lines += ["", f"Other records differ in: {', '.join(shown(k, quote=False) for k in differing)}."]
    return lines + [""] + _where_run(records)


def _where_run(records: Sequence[RunResult]) -> list[str]:
    """Runs per executor and host (each run's meters read the devices of the host it ran on)."""
    places: Counter = Counter()
    for record in records:
        host = record.where.hostname or "an unrecorded host"
        where = f"{record.where.executor or LOCAL} executor on {host}"
        ranks = record.where.world_size
        places[where + (f", {ranks} ranks per run" if ranks is not None and ranks > 1 else "")] += 1
    lines = ["Where the runs executed (each run's meters read the devices of its own host):", ""]
    return lines + [f"- {where}: {count} run(s)" for where, count in sorted(places.items())] + [""]


def _curves(plots: Sequence[CurvePlot], interval: str) -> list[str]:
    """The learning-curve section: the validation checks' scores against steps, training energy and time (none
    without checks)."""
    if not plots:
        return []
    lines = [
        "## Learning curves",
        "",
        "Each check's score on the validation split (carved from the training pool, never the evaluation split "
        "the tables report) against optimiser steps and against the training energy and time spent by then, the "
        "checks' own left out: the mean over the seeds still training at each step (thick) with, where two or more "
        f"seeds reached a step, the {INTERVALS[interval]} as a band; single seeds (thin), the target (dashed) "
        "where it is near the curves, the zero-shot row's evaluation score (dotted). A run with a target stops at its "
        "first check at or past it.",
        "",
    ]
    for plot in plots:
        lines += [f"![learning curves, {plot.task} / {plot.backbone}]({plot.path.name})", ""]
        lines += _level_table(plot)
    return lines


def _power_limits(plots: Sequence[PowerPlot]) -> list[str]:
    """The power-limit sweep: per task and backbone its plot and a table of each configuration at each limit."""
    if not plots:
        return []
    lines = [
        "## Power limit",
        "",
        "Each configuration at each GPU power limit it ran at (`--power-limit`; means over seeds).  The knee "
        "(ringed) is the limit where lowering it stops paying: on the configuration's curve of energy against time "
        "across the limits, both scaled to [0, 1], the inner point farthest from the line between its ends "
        "(Kneedle); none with fewer than three limits or without a bend.",
        "",
    ]
    for plot in plots:
        lines += [
            f"### {plot.backbone} on {plot.task}",
            "",
            f"![power limit, {plot.task} / {plot.backbone}]({plot.path.name})",
            "",
        ]
        rows = [
            [line.name, f"{limit:g}", f"{energy:,.1f}", f"{time:,.1f}", "knee" if limit == line.knee_w else ""]
            for line in plot.lines
            for limit, energy, time in zip(line.limits_w, line.energy_j, line.time_s)
        ]
        headers = ["configuration", "power limit (W)", plot.energy_label, plot.time_label, ""]
        lines += [render_markdown(headers, rows, [False, True, True, True, False]), ""]
    return lines


def _level_table(plot: CurvePlot) -> list[str]:
    """Each configuration's cost to the score every configuration's mean curve reaches, read from the curves."""
    if plot.level is None or not plot.costs:
        return []

    def number(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    headers = [
        "configuration",
        f"best {plot.metric} (mean curve)",
        f"first step at {plot.level:.4g}",
        f"training energy to it (J, {plot.energy_kind})",
        "training time to it (s, measured)",
    ]
    rows = [
        [c.label, f"{c.best:.4f}", number(c.step, "d"), number(c.energy_j, ",.1f"), number(c.time_s, ",.2f")]
        for c in plot.costs
    ]
    return [
        f"To the {plot.metric} every configuration's mean curve reaches on the {plot.split} split "
        f"({plot.level:.4g}): the first check at or past it, with the training spent by then (checks left out; "
        "means over the seeds checked there).",
        "",
        render_markdown(headers, rows, [False, True, True, True, True]),
        "",
    ]


def render_report(
    records: Sequence[RunResult | Mapping[str, Any]],
    runs: pd.DataFrame,
    figures: Sequence[PlotResult],
    target_plots: Sequence[TargetPlot] = (),
    interval: str = DEFAULT_INTERVAL,
    curve_plots: Sequence[CurvePlot] = (),
    rejected: Sequence[Rejected] = (),
    power_plots: Sequence[PowerPlot] = (),
    lifecycle_plots: Sequence[LifecyclePlot] = (),
    units: EnergyUnits | None = None,
) -> str:
    """The text of report.md for ``records``, their runs table (:func:`petlprof.report.frame.runs_frame`,
    which every table of results reads) and the plots drawn from it (bars of kind ``interval``), naming the
    ``rejected`` lines of the store."""
    if not records:
        return "# petlprof report\n\nNo result records were given, so there is nothing to report.\n"
    records = results_of(records)
    lines = [f"# petlprof report: {_names(r.backbone for r in records)} on {_names(r.task for r in records)}", ""]
    lines += bottom_line(runs)
    lines += _trust(records)
    lines += _what_was_run(records)
    lines += _configurations(records, runs)
    lines += _differences(records, runs)
    lines += lifecycle_section(summarise(runs), runs, lifecycle_plots, with_measured_carbon(units, records))
    lines += _cost_to_target(runs, target_plots)
    lines += _curves(curve_plots, interval)
    lines += _power_limits(power_plots)
    lines += _predicted(records)
    lines += search_section(records)
    lines += _figures(figures, interval)
    lines += [
        "## All runs",
        "",
        "One row per run. Trainable parameters are counted and given as a share of all parameters; "
        "time, peak memory and energy are for the train phase, latency for the eval phase. "
        "The energy kind says whether the energy was measured or estimated.",
        "",
        summary_table(records, fmt="markdown"),
        "",
    ]
    lines += _provenance(records)
    lines += _warnings(records)
    lines += _rejected(rejected)
    lines += _failed(records)
    lines += _environment(records)
    return "\n".join(lines)


def measured_carbon(records: Sequence[RunResult]) -> GridIntensity | None:
    """CodeCarbon's own grid intensity over the training windows it measured (``--meters codecarbon``), if any."""
    windows = [r.train for r in records if r.train is not None]
    return measured_intensity((w[CO2], w[CODECARBON_ENERGY_J], w.text("co2eq_source")) for w in windows)


def with_measured_carbon(units: EnergyUnits | None, records: Sequence[RunResult]) -> EnergyUnits:
    """``units`` (none: kWh alone), with CodeCarbon's measured intensity where they name no grid."""
    units = units or EnergyUnits()
    return units if units.carbon is not None else dataclasses.replace(units, carbon=measured_carbon(records))


def write_report(
    records: Sequence[RunResult | Mapping[str, Any]],
    out_dir: Path,
    interval: str = DEFAULT_INTERVAL,
    units: EnergyUnits | None = None,
) -> list[Path]:
    """Write the Pareto, cost-to-target and lifecycle plots (PNG and SVG, bars of kind ``interval``), report.md
    and the self-contained report.html for ``records`` into ``out_dir``; return the written paths.  Energy is
    also shown in ``units`` (:func:`petlprof.results.units.energy_units`), CodeCarbon's
    measured grid intensity where they name none (:func:`measured_carbon`).
    Records from :func:`~petlprof.report.records.load_records` carry the store's rejected lines, which
    report.md names."""
    check_interval(interval)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rejected = getattr(records, "rejected", ())
    records = results_of(records)
    runs = runs_frame(records)  # the one table every plot and table of results reads
    figures = pareto_figures(runs, out_dir, interval)
    target_plots = cost_to_target_figures(runs, out_dir, interval)
    curve_plots = learning_curve_figures(records, out_dir, interval)
    power_plots = power_limit_figures(runs, out_dir)
    configs = with_served(summarise(runs))
    life_plots = lifecycle_plots(configs, runs, out_dir)
    report = out_dir / REPORT_FILE
    text_md = render_report(
        records, runs, figures, target_plots, interval, curve_plots, rejected, power_plots, life_plots, units
    )
    report.write_text(text_md, encoding="utf-8")
    plots: list[PlotResult | TargetPlot | CurvePlot | PowerPlot | LifecyclePlot] = [
        *figures,
        *target_plots,
        *curve_plots,
        *power_plots,
        *life_plots,
    ]
    written = [path for plot in plots for path in plot.paths]
    metrics = distinct(name for r in records for name in r.metrics)
    return written + [report, write_html(text_md, out_dir, page_data(configs, metrics, LIFECYCLE_AXES))]
