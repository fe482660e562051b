"""The summary table: one row per run, every number column with its unit in the header.

Rendered as aligned plain text for the terminal or as a GitHub Markdown table for report.md.
Columns that would say nothing are left out: ``task``/``backbone`` appear only when the records
span several, ``error`` only when a run did not finish.  Missing figures show as ``-``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from petlprof.errors import unknown_choice
from petlprof.report.intervals import PROPORTIONS, wilson_interval
from petlprof.report.records import (
    MISSING,
    ZERO_SHOT_LABEL,
    config_label,
    distinct,
    is_ok,
    is_random_init,
    is_zero_shot,
    method_name,
    short_error,
    sort_key,
    text,
)
from petlprof.results.figures import (
    CO2,
    ENERGY,
    ENERGY_ABOVE_IDLE,
    ENERGY_KIND,
    ENERGY_PER_RESPONSE,
    ENERGY_PER_TOKEN,
    EVAL,
    LATENCY,
    PEAK_MEMORY,
    PER_TOKEN_LATENCY,
    SIDE_SHARE_OF_PER_TOKEN,
    TIME,
    TIME_TO_FIRST_TOKEN,
    TOKENS_PER_S,
    TRAIN,
    Figure,
)
from petlprof.results.grades import ABOVE_IDLE_GRADE_KEY, GRADE_KEY
from petlprof.results.result import RunResult, results_of
from petlprof.vocabulary import ZERO_SHOT

if TYPE_CHECKING:  # pandas comes with the per-configuration tables, not with the summary table
    import pandas as pd

FORMATS = ("text", "markdown")


@dataclass(frozen=True)
class Column:
    """One table column: its header, how to get a cell from a record, and whether it is numeric."""

    header: str
    cell: Callable[[RunResult], str]
    numeric: bool = False


def _fixed(value: float | None, decimals: int) -> str:
    """A number with thousands separators and fixed decimals, ``-`` when missing."""
    return MISSING if value is None else f"{value:,.{decimals}f}"


def _params(record: RunResult) -> str:
    """Trainable parameters as ``148,226 (0.65%)``."""
    trainable, total = record.trainable_params, record.total_params
    if trainable is None:
        return MISSING
    share = f" ({100.0 * trainable / total:.2f}%)" if total else ""
    return f"{int(trainable):,}{share}"


def _phase_column(phase: str, figure: Figure) -> Column:
    """One phase's figure, in its declared unit and format, for every run."""

    inflated = figure.unit in CONTENDED_UNITS  # what other processes slow down: times, energies, rates

    def cell(record: RunResult) -> str:
        window = record.phase(phase)
        value = None if window is None else window[figure]
        shown = _fixed(None if value is None else value * figure.scale, figure.decimals)
        return marked(shown, inflated and window is not None and window.raw("contended") is True)

    return Column(f"{phase} {figure.header}", cell, numeric=True)


def _metric(name: str) -> Callable[[RunResult], str]:
    """A cell getter for a quality metric, shown only on the runs whose primary metric it is (and
    marked cost-only on runs with random weights, and where every generated response was one text)."""

    def cell(record: RunResult) -> str:
        if record.primary_metric != name:
            return MISSING
        return _score(_fixed(record.metrics.get(name), 4), is_random_init(record), int(record.constant_output))

    return cell


def _energy_kind(record: RunResult) -> str:
    return text(None if record.train is None else record.train.text(ENERGY_KIND))


def _energy_grade(record: RunResult) -> str:
    """The train phase's energy grade (:mod:`petlprof.results.grades`); none for the zero-shot row's exact 0 J."""
    grade = None if record.train is None or is_zero_shot(record) else record.train.energy_grade
    return MISSING if grade is None else grade.letter


def columns(records: Sequence[RunResult]) -> list[Column]:
    """The columns the summary table of ``records`` shows."""
    cols = []
    if len(distinct(r.task for r in records)) > 1:
        cols.append(Column("task", lambda r: text(r.task)))
    if len(distinct(r.backbone for r in records)) > 1:
        cols.append(Column("backbone", lambda r: text(r.backbone)))
    cols += [
        Column("method", lambda r: method_name(r.method)),
        Column("config", config_label),
        Column("seed", lambda r: text(r.seed), numeric=True),
        Column("status", lambda r: text(r.status)),
    ]
    cols += [Column(name, _metric(name), numeric=True) for name in distinct(r.primary_metric for r in records)]
    cols += [
        Column("trainable params (count, % of total)", _params, numeric=True),
        _phase_column("train", TIME),
        _phase_column("train", PEAK_MEMORY),
        _phase_column("train", ENERGY),
        Column("energy kind", _energy_kind),
        Column("energy grade", _energy_grade),
        _phase_column("eval", LATENCY),
    ]
    if not all(is_ok(r) for r in records):
        cols.append(Column("error", lambda r: MISSING if is_ok(r) else short_error(r, width=48)))
    return cols


CONSTANT_OUTPUT = "one answer to every prompt"


def _score(score: str, random_init: bool, constant: int = 0, seeds: int = 1) -> str:
    """A score as shown: marked when the run had random weights (--random-init), so it is not read as the method's,
    and when ``constant`` of its ``seeds`` generated one text for every prompt (kept off the frontiers)."""
    if score == MISSING:
        return score
    if random_init:
        score = f"{score} (cost-only)"
    if constant:
        score = f"{score} ({CONSTANT_OUTPUT}{f': {constant} of {seeds} seeds' if seeds > 1 else ''})"
    return score


def _render_text(headers: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    """An aligned plain-text table: numbers right-aligned, text left-aligned, a rule under the header."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric))
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def render_markdown(headers: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    """A GitHub Markdown table with numeric columns right-aligned; pipes in cells are escaped."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if num else "---" for num in numeric) + "|"
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def summary_table(records: Sequence[RunResult | Mapping[str, Any]], fmt: str = "text") -> str:
    """One row per run (seeds of a configuration together): method, config, seed, status, the
    primary metric, trainable parameters, train time/peak memory/energy (and whether the energy
    was measured or estimated), eval latency p50, and a short error for runs that did not finish.

    ``fmt`` is ``text`` (aligned, for the terminal) or ``markdown`` (GitHub table).
    """
    if fmt not in FORMATS:
        raise unknown_choice("table format", fmt, FORMATS)
    records = results_of(records)
    cols = columns(records)
    headers = [c.header for c in cols]
    numeric = [c.numeric for c in cols]
    rows = [[c.cell(r) for c in cols] for r in sorted(records, key=sort_key)]
    render = _render_text if fmt == "text" else render_markdown
    return with_contended_note(render(headers, rows, numeric), rows)


# --- one row per configuration (seeds merged), per task and backbone -------------------------------

REFERENCE = "full"  # relative columns are against this method, as the READ paper reports them


def _mean_ci(row: Mapping[str, Any], column: str, factor: float, decimals: int) -> str:
    """``mean ± ci`` (the 95% CI half-width over seeds), or the mean alone for one seed."""
    mean, ci = row.get(column), row.get(f"{column}_ci95")
    if mean is None or mean != mean:
        return MISSING
    shown = f"{mean * factor:,.{decimals}f}"
    return shown if ci is None or ci != ci else f"{shown} ± {ci * factor:,.{decimals}f}"


def _figure_ci(row: Mapping[str, Any], figure: Figure, phase: str = TRAIN) -> str:
    """A figure's column of the per-configuration frame as ``mean ± ci`` in its declared unit and format."""
    return _mean_ci(row, figure.frame_column(phase), figure.scale, figure.decimals)


CONTENDED_MARK = "†"
CONTENDED_UNITS = ("s", "J", "1/s")  # the figures other processes inflate: times, energies, rates
CONTENDED_NOTE = (
    f"{CONTENDED_MARK} measured while other processes kept the machine's CPUs busy (the window's `contended` flag; "
    "with several seeds, in at least one): the time, energy, latency or throughput it marks may be worse than on an "
    "idle machine.  Counts and memory, which other processes do not change, are not marked."
)


def contended_in(row: Mapping[str, Any], phase: str) -> bool:
    """Whether a configuration's window of ``phase`` was measured on a contended machine (in any seed)."""
    # petlprof.report.frame (pandas): slow to import, loaded only when used
    from petlprof.report.frame import CONTENDED

    value = row.get(CONTENDED[phase])
    return value is not None and value == value and bool(value)


def marked(cell: str, contended: bool, missing: str = MISSING) -> str:
    """``cell`` with :data:`CONTENDED_MARK` when its figure was measured on a contended machine (not a ``missing``
    one)."""
    return f"{cell}{CONTENDED_MARK}" if contended and cell != missing else cell


def with_contended_note(table: str, rows: list[list[str]]) -> str:
    """``table`` with the line explaining :data:`CONTENDED_MARK` under it where a cell of ``rows`` carries it."""
    return table + (f"\n\n{CONTENDED_NOTE}" if any(c.endswith(CONTENDED_MARK) for r in rows for c in r) else "")


def _samples(row: Mapping[str, Any]) -> int | None:
    """The evaluation samples a configuration's score was taken on (``eval_samples``), None when unknown."""
    value = row.get("eval_samples")
    return int(value) if isinstance(value, (int, float)) and value == value and value >= 1 else None


def _binomial(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """The 95% Wilson interval of a one-seed score that is a share of the evaluation samples (:data:`PROPORTIONS`),
    from their number; None for several seeds (their interval is over seeds), another metric or no count."""
    if int(row["n_seeds"]) != 1 or text(row.get("primary_metric")) not in PROPORTIONS:
        return None
    low, high = wilson_interval(row.get("quality"), _samples(row))
    return None if math.isnan(low) else (low, high)


def _quality(row: Mapping[str, Any]) -> str:
    """The score as ``mean ± ci`` over seeds, or with one seed as ``score [low, high]``: its binomial interval."""
    shown = _mean_ci(row, "quality", 1.0, 4)
    interval = None if shown == MISSING or row.get("random_init") else _binomial(row)
    return shown if interval is None else f"{shown} [{interval[0]:.4f}, {interval[1]:.4f}]"


def _interval_notes(rows) -> list[str]:
    """What the one-seed scores' intervals are (binomial, from the evaluation samples) or why there are none."""
    single = [row for row in rows if int(row["n_seeds"]) == 1 and not row.get("random_init")]
    single = [row for row in single if row.get("quality") == row.get("quality") and row.get("quality") is not None]
    binomial = [row for row in single if _binomial(row) is not None]
    notes = []
    if binomial:
        samples = {count for row in binomial if (count := _samples(row)) is not None}
        counts = "/".join(str(count) for count in sorted(samples))
        notes.append(
            f"[low, high] after a score: its 95% interval, binomial (Wilson), from the {counts} evaluation samples; "
            "one seed, so it says how far the score could move on another draw of evaluation examples, not on "
            "another seed."
        )
    metrics = [row.get("primary_metric") for row in single]
    others = distinct(text(m) for m in metrics if m is not None and m not in PROPORTIONS)
    if others:
        what = ", ".join(others)
        notes.append(
            f"A one-seed {what} has no interval: one seed gives no spread over seeds, and {what} is not a share of "
            "the evaluation samples, so no binomial interval fits either."
        )
    return notes


def _signed(value: Any, fmt: str, suffix: str = "") -> str:
    """``+5%`` / ``−72%`` with a real minus sign; ``-`` when missing."""
    if value is None or value != value:
        return MISSING
    if suffix == "%" and abs(value) >= 99.5:  # -99.9% and -100% differ by 10x in what is left
        fmt = ".2f" if abs(value) >= 99.95 else ".1f"
    return f"{value:+{fmt}}{suffix}".replace("-", "−")


# figures shown only where some run has them: (column, header, unit factor, decimals)
OPTIONAL_COLUMNS = (
    ("checkpoint_bytes", "checkpoint (MiB, safetensors)", 1 / 2**20, 3),
    (
        ENERGY_ABOVE_IDLE.frame_column(),
        f"train {ENERGY_ABOVE_IDLE.header}",
        ENERGY_ABOVE_IDLE.scale,
        ENERGY_ABOVE_IDLE.decimals,
    ),
    (CO2.frame_column(), f"train {CO2.label} ({CO2.unit}, CodeCarbon)", CO2.scale, CO2.decimals),
    ("infer_b1_latency_p50_s", "inference p50, batch 1 (ms)", 1000.0, 2),
    ("infer_latency_per_sample_p50_s", "inference p50 per sample, train batch (ms)", 1000.0, 2),
    ("merged_latency_p50_s", "merged eval p50 (ms/batch)", 1000.0, 1),
)
OPTIONAL_PHASES = {  # the phase whose window measured an optional column's figure (marked when it was contended)
    ENERGY_ABOVE_IDLE.frame_column(): TRAIN,
    CO2.frame_column(): TRAIN,
    "infer_b1_latency_p50_s": "inference",
    "infer_latency_per_sample_p50_s": "inference",
    "merged_latency_p50_s": "eval_merged",
}
COSTS_CAPTION = "Quality and costs"
VS_CAPTION = f"Against `{REFERENCE}`"
MORE_CAPTION = "Latency and other figures"
TARGET_CAPTION = "Time to the target"
GENERATION_CAPTION = "Generation cost"
MAJORITY = "majority class"  # the reference row: always answering the eval set's most common class


@dataclass(frozen=True)
class ConfigTables:
    """The tables of one task and backbone's configurations, as (caption, Markdown table) pairs: quality and
    costs first, then the comparison with ``full`` (where it ran), latency and other figures, time to target."""

    task: str
    backbone: str
    tables: list[tuple[str, str]]


def configuration_sections(runs: pd.DataFrame) -> list[ConfigTables]:
    """The tables of every task and backbone of the runs table (:func:`petlprof.report.frame.runs_frame`),
    one row per configuration (seeds merged: mean ± 95% CI).  Only finished (``ok``) runs count."""
    # via petlprof (pandas, matplotlib): slow to import, loaded only when used
    from petlprof.report.frame import frontier, of_task, relative_to
    from petlprof.report.plots import COST_AXES

    random_init = set(runs.loc[runs["random_init"].astype(bool), "config_key"])  # their scores are meaningless
    ok = runs[runs["status"] == "ok"]
    if ok.empty:
        return []
    configs = relative_to(frontier(ok, x=COST_AXES[0].column))
    configs["fronts"] = [[] for _ in range(len(configs))]
    for axis in COST_AXES:
        marks = frontier(ok, x=axis.column)["on_front"]
        for i in configs.index[marks.to_numpy()]:
            configs.at[i, "fronts"].append(axis.slug)
    configs["random_init"] = configs["config_key"].isin(random_init)
    return [
        ConfigTables(
            text(task), text(backbone), _tables(_ordered(group), _accuracy_majority(of_task(runs, task, backbone)))
        )
        for (task, backbone), group in configs.groupby(["task", "backbone"], sort=True, dropna=False)
    ]


def configuration_tables(records: Sequence[RunResult | Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(task, backbone, Markdown table of quality and costs) per task and backbone of ``records``: the first
    table of :func:`configuration_sections`."""
    # petlprof.report.frame (pandas): slow to import, loaded only when used
    from petlprof.report.frame import runs_frame

    return [(s.task, s.backbone, s.tables[0][1]) for s in configuration_sections(runs_frame(records))]


def _accuracy_majority(runs: pd.DataFrame) -> float | None:
    """The majority-class rate of one task and backbone's runs when every one of them scores accuracy
    (None for another metric)."""
    # petlprof.report.frame (pandas): slow to import, loaded only when used
    from petlprof.report.frame import majority_rate

    metrics = runs["primary_metric"]
    return majority_rate(runs) if metrics.notna().all() and set(metrics) == {"accuracy"} else None


def _ordered(group):
    """A task and backbone's configurations by method, then knob value, then config."""
    # petlprof.report.frame (pandas): slow to import, loaded only when used
    from petlprof.report.frame import knob_sort_value

    order = sorted(
        range(len(group)),
        key=lambda k: (group["method"].iloc[k], knob_sort_value(group["knob_value"].iloc[k]), group["config"].iloc[k]),
    )
    return group.iloc[order]


def _tables(group, majority: float | None) -> list[tuple[str, str]]:
    """The zero-shot row (the model before tuning) is a reference row under the costs table, left out of
    the comparison with ``full`` and of time to target, and a row like any other for latency and generation."""
    # petlprof.report.frame (pandas): slow to import, loaded only when used
    from petlprof.report.frame import generation_batches

    tuned = group[group["method"] != ZERO_SHOT]
    tables = [(COSTS_CAPTION, _costs_table(tuned, majority, group[group["method"] == ZERO_SHOT]))]
    if (tuned["method"] == REFERENCE).any():
        tables.append((VS_CAPTION, _vs_table(tuned)))
    tables.append((MORE_CAPTION, _more_table(group)))
    if tuned["target_reached"].notna().any():
        tables.append((TARGET_CAPTION, _target_table(tuned)))
    if generation_batches(group):
        tables.append((GENERATION_CAPTION, _generation_table(group)))
    return tables


def _constant(row) -> int:
    """Seeds of a configuration whose generated responses were all one text (0 for records that do not say)."""
    value = row.get("constant_output")
    return int(value) if isinstance(value, (int, float)) and value == value else 0


def _names(row) -> list[str]:
    return [method_name(row["method"]), text(row["config"])]


def _costs_table(group, majority: float | None, zero_shot) -> str:
    """Quality, the four costs and the frontiers; the energy kind in the header when all agree; the
    majority-class rate and the ``zero_shot`` configurations as reference rows under the others."""
    metric = text((distinct([*group["primary_metric"], *zero_shot["primary_metric"]]) or [None])[0])
    kinds = [k for k in distinct(group["energy_kind"]) if isinstance(k, str)] if "energy_kind" in group else []
    energy = f"train {ENERGY.label} ({ENERGY.shown_unit}, {kinds[0]})" if len(kinds) == 1 else f"train {ENERGY.header}"
    headers = ["method", "config", "seeds", f"{metric} (mean ± 95% CI)", energy, "energy grade"]
    headers += [f"train {PEAK_MEMORY.header}", f"train {TIME.header}", "trainable params (count)", "on frontier of"]
    numeric = [False, False, True, True, True, False, True, True, True, False]
    if len(kinds) > 1:
        headers.append("energy kind")
        numeric.append(False)
    rows = [_costs_row(row, mixed=len(kinds) > 1) for _, row in group.iterrows()]
    rows += [_costs_row(row, mixed=len(kinds) > 1, reference=True) for _, row in zero_shot.iterrows()]
    if majority is not None:
        rows.append([f"*{MAJORITY}*", "", "", f"{majority:.4f}"] + [""] * (len(headers) - 4))
    notes = _interval_notes([row for _, row in group.iterrows()] + [row for _, row in zero_shot.iterrows()])
    return with_contended_note(render_markdown(headers, rows, numeric), rows) + "".join(f"\n\n{n}" for n in notes)


def _costs_row(row, mixed: bool, reference: bool = False) -> list[str]:
    """A configuration's row; a ``reference`` (the zero-shot row) is italic and on no frontier."""
    names = [f"*{ZERO_SHOT_LABEL}*", text(row["config"])] if reference else _names(row)
    cells = names + [
        str(int(row["n_seeds"])),
        _score(_quality(row), row["random_init"], _constant(row), int(row["n_seeds"])),
        marked(_figure_ci(row, ENERGY), contended_in(row, TRAIN)),
        "" if reference else text(row.get(GRADE_KEY)),  # the worst seed's
        _figure_ci(row, PEAK_MEMORY),
        marked(_figure_ci(row, TIME), contended_in(row, TRAIN)),
        _fixed(row.get("trainable_params"), 0),
        "" if reference else ", ".join(row["fronts"]) or MISSING,
    ]
    return cells + ([text(row.get("energy_kind"))] if mixed else [])


def _vs_table(group) -> str:
    """The change of each mean against ``full``'s: the metric's difference, the costs' percent change."""
    metric = text(group["primary_metric"].iloc[0])
    vs = f"vs {REFERENCE}"
    headers = ["method", "config", f"Δ {metric} {vs}", f"energy {vs}", f"memory {vs}", f"time {vs}", f"params {vs}"]
    rows = [_vs_row(row) for _, row in group.iterrows()]
    return with_contended_note(render_markdown(headers, rows, [False, False] + [True] * 5), rows)


def _vs_row(row) -> list[str]:
    contended = contended_in(row, TRAIN)  # marks the energy and time changes, each a ratio of its figure
    costs = ((ENERGY.name, contended), (PEAK_MEMORY.name, False), (TIME.name, contended), ("trainable_params", False))
    if row["method"] == REFERENCE:
        return _names(row) + ["ref"] + [marked("ref", inflated) for _, inflated in costs]
    quality = _score(
        _signed(row.get(f"quality_vs_{REFERENCE}"), ".4f"), row["random_init"], _constant(row), int(row["n_seeds"])
    )
    changes = [marked(_signed(row.get(f"{cost}_vs_{REFERENCE}_pct"), ".0f", "%"), inflated) for cost, inflated in costs]
    return _names(row) + [quality] + changes


def _more_table(group) -> str:
    """Eval latency and the figures only some runs have (energy above idle, CO2, inference, merged eval)."""
    optional = [c for c in OPTIONAL_COLUMNS if c[0] in group and group[c[0]].notna().any()]
    headers = ["method", "config", f"eval {LATENCY.header}"]
    numeric = [False, False, True]
    for column, title, _, _ in optional:
        headers.append(title)
        numeric.append(True)
        if column == ENERGY_ABOVE_IDLE.frame_column():  # its grade beside it
            headers.append("grade")
            numeric.append(False)
    rows = []
    for _, row in group.iterrows():
        cells = _names(row) + [marked(_figure_ci(row, LATENCY, EVAL), contended_in(row, EVAL))]
        for column, _, factor, decimals in optional:
            phase = OPTIONAL_PHASES.get(column)
            cells.append(
                marked(_mean_ci(row, column, factor, decimals), phase is not None and contended_in(row, phase))
            )
            if column == ENERGY_ABOVE_IDLE.frame_column():
                cells.append(text(row.get(ABOVE_IDLE_GRADE_KEY)))
        rows.append(cells)
    return with_contended_note(render_markdown(headers, rows, numeric), rows)


def _target_table(group) -> str:
    """Time-to-accuracy runs: how many seeds reached the target, and at what cost (means over those)."""
    headers = ["method", "config", "reached target (seeds)", "steps to target", "time to target (s)"]
    headers.append("energy to target (J)")
    rows = [
        _names(row)
        + [
            text(row.get("target_reached")),
            _mean_ci(row, "steps_to_target", 1.0, 0),
            marked(_mean_ci(row, "time_to_target_s", 1.0, 1), contended_in(row, TRAIN)),
            marked(_mean_ci(row, "energy_to_target_j", 1.0, 1), contended_in(row, TRAIN)),
        ]
        for _, row in group.iterrows()
    ]
    return with_contended_note(render_markdown(headers, rows, [False, False] + [True] * 4), rows)


# the generation table's figures, each with its header ({kind}: the energy kind when every run agrees on one); the
# energy grade of the batch's window follows the energy per response
ENERGY_PER_RESPONSE_TITLE = f"{ENERGY_PER_RESPONSE.label} ({ENERGY_PER_RESPONSE.shown_unit}{{kind}})"
GENERATION_COLUMNS: tuple[tuple[Figure, str], ...] = (
    (TOKENS_PER_S, TOKENS_PER_S.label),
    (ENERGY_PER_TOKEN, f"{ENERGY_PER_TOKEN.label} ({ENERGY_PER_TOKEN.shown_unit}{{kind}})"),
    (ENERGY_PER_RESPONSE, ENERGY_PER_RESPONSE_TITLE),
    (TIME_TO_FIRST_TOKEN, f"{TIME_TO_FIRST_TOKEN.label} ({TIME_TO_FIRST_TOKEN.shown_unit}, median)"),
    (PER_TOKEN_LATENCY, PER_TOKEN_LATENCY.header),
    (PEAK_MEMORY, f"{PEAK_MEMORY.label} incl. KV cache ({PEAK_MEMORY.shown_unit})"),
)
GENERATION_VARIANTS = (("generation", "as tuned"), ("generation_merged", "merged"))
SIDE_SHARE = (SIDE_SHARE_OF_PER_TOKEN, SIDE_SHARE_OF_PER_TOKEN.header)
# the generation figures a contended window changes (peak memory is a count; the side share is one unmetered call's)
GENERATION_TIMED = (TOKENS_PER_S, ENERGY_PER_TOKEN, ENERGY_PER_RESPONSE, TIME_TO_FIRST_TOKEN, PER_TOKEN_LATENCY)


def _generation_table(group) -> str:
    """One row per configuration, model (as tuned; merged for methods that merge) and batch size: tokens per
    second, energy per token and per response, time to first token, per-token latency and peak memory;
    the side network's share of the per-token time where a run timed one."""
    # petlprof.report.frame (pandas): slow to import, loaded only when used
    from petlprof.report.frame import generation_batches, generation_column, generation_grade_column

    kinds = [k for k in distinct(group.get("generation_energy_kind", [])) if isinstance(k, str)]
    kind = f", {kinds[0]}" if len(kinds) == 1 else ""
    variants = [(p, label) for p, label in GENERATION_VARIANTS if generation_batches(group, p)]
    shown = [*GENERATION_COLUMNS]
    side = SIDE_SHARE[0]
    if any(group[generation_column("generation", f"batch_{b}", side)].notna().any() for b in generation_batches(group)):
        shown.append(SIDE_SHARE)
    headers = ["method", "config"] + (["model"] if len(variants) > 1 else []) + ["batch"]
    headers += [title.format(kind=kind) for _, title in shown]
    headers.insert(headers.index(ENERGY_PER_RESPONSE_TITLE.format(kind=kind)) + 1, "energy grade")
    rows = []
    for _, row in group.iterrows():
        for phase, label in variants:
            for size in generation_batches(group, phase):
                batch = f"batch_{size}"
                tokens_per_s = row[generation_column(phase, batch, TOKENS_PER_S)]
                if tokens_per_s != tokens_per_s:
                    continue  # NaN: this configuration has no figures at this batch size
                contended = contended_in(row, phase)
                cells = [
                    marked(
                        _mean_ci(row, generation_column(phase, batch, figure), figure.scale, figure.decimals),
                        contended and figure in GENERATION_TIMED,
                    )
                    for figure, _ in shown
                ]
                cells.insert(3, text(row.get(generation_grade_column(phase, batch))))  # beside the energy figures
                rows.append(_names(row) + ([label] if len(variants) > 1 else []) + [str(size)] + cells)
    numeric = [False, False] + [False] * (len(variants) > 1) + [True] * 4 + [False] + [True] * (len(shown) - 3)
    return with_contended_note(render_markdown(headers, rows, numeric), rows)
