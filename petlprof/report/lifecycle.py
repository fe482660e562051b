"""The whole life of an adapter: training once, then serving requests; when one configuration's total energy
overtakes another's, and the energy in kWh, grams of CO2e and money.

A configuration's energy after ``n`` requests is its training energy plus ``n`` times its energy per request
(:func:`petlprof.report.frame.serving_figures`: per generated response, or per classified sample), at batch 1 or
at the largest batch measured, served the cheaper way where the method merges (merged or as tuned: both are
shown).  Against a reference (full fine-tuning; the zero-shot model, which trained
nothing) with training energy ``E_r`` and per-request energy ``e_r``, a configuration with ``E`` and ``e`` costs
the same after ``n* = (E - E_r) / (e_r - e)`` requests; :func:`break_even` says which of the two is cheaper
before and after, or that one is cheaper (or dearer) at every number of requests.  Means over seeds throughout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from petlprof.report.frame import (
    GROUP,
    REQUEST_B1,
    REQUEST_B1_MERGED,
    REQUEST_BATCH,
    REQUEST_BATCH_MERGED,
    REQUEST_ENERGY_KIND,
    REQUEST_KIND,
    REQUEST_PROMPT_TOKENS,
    REQUEST_RESPONSE_TOKENS,
    SERVING_BATCH,
)
from petlprof.report.page import Axis
from petlprof.report.plotkit import save_figure
from petlprof.report.plots import FORMATS, file_slug
from petlprof.report.records import method_name, text
from petlprof.report.table import CONTENDED_MARK, CONTENDED_NOTE, contended_in, marked, render_markdown
from petlprof.results.figures import ENERGY, MIB
from petlprof.results.result import finite
from petlprof.results.units import EnergyUnits, cost_text, kwh
from petlprof.vocabulary import ZERO_SHOT

REFERENCES = ("full", ZERO_SHOT)  # what each configuration is weighed against
MAX_LINES = 12  # past this many configurations a plot shows the references and those cheapest at some point
NEVER_PAST = 1e12  # a break-even past a trillion requests is "not within" it: the per-request figures barely differ
SERVED_B1, SERVED_BATCH = "served_j_b1", "served_j_batch"  # per request as served: merged where the method merges
LIFECYCLE_AXES = (
    Axis(SERVED_B1, "energy per request served, batch 1", "J", "lower", "cost", True, energy_kind=REQUEST_ENERGY_KIND),
    Axis(
        SERVED_BATCH,
        "energy per request served, largest batch",
        "J",
        "lower",
        "cost",
        True,
        energy_kind=REQUEST_ENERGY_KIND,
    ),
)


@dataclass(frozen=True)
class BreakEven:
    """Where a configuration's total energy meets a reference's: ``requests`` (None when the lines never cross)
    and which is cheaper ``before`` and ``after`` it (a name, or the same name twice when one always is)."""

    requests: float | None
    before: str
    after: str

    def text(self, unit: str = "requests") -> str:
        if self.requests is None:
            return f"never: {self.before} costs less at any number of {unit}"
        if self.requests > NEVER_PAST:
            return f"{self.before} costs less within {NEVER_PAST:.0e} {unit}"
        return f"{self.after} cheaper after {_count(self.requests)} {unit}"


def _count(value: float) -> str:
    return f"{math.ceil(value):,}" if value < 1e7 else f"{value:.2e}"


def break_even(
    name: str, train_j: float, per_request_j: float, ref: str, ref_train_j: float, ref_request_j: float
) -> BreakEven:
    """When ``name`` (training energy ``train_j``, ``per_request_j`` a request) and the reference ``ref`` cost the
    same energy in all (see the module); ties go to the configuration."""
    d_train, d_request = train_j - ref_train_j, per_request_j - ref_request_j
    if d_train <= 0 and d_request <= 0:
        return BreakEven(None, name, name)
    if d_train >= 0 and d_request >= 0:
        return BreakEven(None, ref, ref)
    crossing = d_train / -d_request
    return BreakEven(crossing, ref, name) if d_train > 0 else BreakEven(crossing, name, ref)


def with_served(configs: pd.DataFrame) -> pd.DataFrame:
    """``configs`` with the per-request energy as served (:data:`SERVED_B1`, :data:`SERVED_BATCH`): the cheaper of
    merged and as tuned where the configuration has both (a user serves the cheaper way), else as tuned."""
    configs = configs.copy()
    for served, tuned, merged in (
        (SERVED_B1, REQUEST_B1, REQUEST_B1_MERGED),
        (SERVED_BATCH, REQUEST_BATCH, REQUEST_BATCH_MERGED),
    ):
        as_tuned = configs[tuned] if tuned in configs else pd.Series(math.nan, index=configs.index)
        configs[served] = pd.concat([as_tuned, configs[merged]], axis=1).min(axis=1) if merged in configs else as_tuned
    return configs


@dataclass(frozen=True)
class Line:
    """A configuration's energy against requests: its name, training energy and per-request energy (J)."""

    name: str
    train_j: float
    per_request_j: float


@dataclass(frozen=True)
class LifecyclePlot:
    task: str
    backbone: str
    unit: str  # what a request is: "responses" or "samples"
    batch: str  # "batch 1" or "batch N"
    lines: tuple[Line, ...]
    left_out: int = 0  # configurations not drawn (past MAX_LINES): never the cheapest in all
    paths: list[Path] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.paths[0]


def _name(row: pd.Series) -> str:
    config = text(row.get("config"))
    return method_name(row["method"]) + ("" if config in ("-", "") else f" ({config})")


def _unit(runs: pd.DataFrame) -> str:
    kinds = set(runs[REQUEST_KIND].dropna()) if REQUEST_KIND in runs else set()
    return "responses" if kinds == {"response"} else "samples" if kinds == {"sample"} else "requests"


def _train_j(row: pd.Series) -> float | None:
    """A configuration's training energy; exactly 0 for the zero-shot row, which trained nothing."""
    return 0.0 if row["method"] == ZERO_SHOT else finite(row.get(ENERGY.name))


def lifecycle_plots(configs: pd.DataFrame, runs: pd.DataFrame, out_dir: Path) -> list[LifecyclePlot]:
    """Per task and backbone with serving figures: cumulative energy against requests at batch 1 and at the
    evaluation batch (PNG and SVG), one line per configuration (past :data:`MAX_LINES`, those the plot's title
    names)."""
    plots = []
    for (task, backbone), group in configs.groupby(GROUP, sort=True, dropna=False):
        unit = _unit(runs[(runs["task"] == task) & (runs["backbone"] == backbone)])
        for column, batch in ((SERVED_B1, "batch 1"), (SERVED_BATCH, _batch_words(group))):
            references = {
                group.index[group["method"] == ref][0] for ref in REFERENCES if (group["method"] == ref).any()
            }
            drawn = [
                (index in references, Line(_name(row), train, request))
                for index, row in group.iterrows()
                if (train := _train_j(row)) is not None and (request := finite(row.get(column))) is not None
            ]
            if len(drawn) < 2:
                continue
            lines = [line for _, line in drawn]
            if len(lines) > MAX_LINES:  # the references and the cheapest somewhere: a hundred lines tell nothing
                keep = cheapest_somewhere(lines)
                lines = [line for i, (reference, line) in enumerate(drawn) if reference or i in keep]
            plot = LifecyclePlot(text(task), text(backbone), unit, batch, tuple(lines), len(drawn) - len(lines))
            slug = f"lifecycle_{file_slug(text(task))}_{file_slug(text(backbone))}"
            paths = [out_dir / f"{slug}_{'b1' if column == SERVED_B1 else 'batch'}.{f}" for f in FORMATS]
            save_figure(draw_lifecycle(plot), paths)
            plots.append(dataclasses.replace(plot, paths=paths))
    return plots


def _points(span: float) -> list[float]:
    """Request counts from 1 to ``span``, 20 a decade."""
    return [10 ** (i / 20) for i in range(int(20 * math.log10(span)) + 1)]


def cheapest_somewhere(lines: Sequence[Line]) -> set[int]:
    """The indices of the lines that are the cheapest in all at some number of requests in the plot's span."""
    return {
        min(range(len(lines)), key=lambda i: lines[i].train_j + n * lines[i].per_request_j)
        for n in _points(_span(lines))
    }


def _batch_words(group: pd.DataFrame) -> str:
    sizes = sorted({int(s) for s in group.get(SERVING_BATCH, pd.Series(dtype=float)).dropna()})
    return f"batch {'/'.join(map(str, sizes))}" if sizes else "the evaluation batch"


def _span(lines: Sequence[Line]) -> float:
    """How many requests the plot spans: ten times the last crossing of two lines, at least 1,000."""
    last = 0.0
    for a in lines:
        for b in lines:
            if a.per_request_j < b.per_request_j and a.train_j > b.train_j:
                last = max(last, (a.train_j - b.train_j) / (b.per_request_j - a.per_request_j))
    return min(max(10 * last, 1e3), NEVER_PAST)


def draw_lifecycle(plot: LifecyclePlot) -> Figure:
    """Cumulative energy (training plus serving) against requests served, log-log."""
    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    points = _points(_span(plot.lines))
    for line in plot.lines:
        ax.plot(points, [line.train_j + n * line.per_request_j for n in points], label=line.name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{plot.unit} served ({plot.batch})")
    ax.set_ylabel("training + serving energy (J, means over seeds)")
    ax.set_title(f"{plot.backbone} on {plot.task}: energy over the adapter's life, {plot.batch}")
    if plot.left_out:
        ax.set_title(
            f"{plot.left_out} more configurations left out: none is the cheapest at any number of {plot.unit}",
            loc="left",
            fontsize="small",
            y=-0.2,
        )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


def _j(value: float | None, ci: float | None = None) -> str:
    if value is None:
        return "-"
    shown = f"{value:,.4g}"
    return shown + (f" ± {ci:,.2g}" if ci is not None and ci > 0 else "")


def lifecycle_section(
    configs: pd.DataFrame, runs: pd.DataFrame, plots: Sequence[LifecyclePlot], units: EnergyUnits
) -> list[str]:
    """The report's lifecycle section: per task and backbone a table of training and serving energy, one of the
    break-even points against full fine-tuning and the zero-shot model, one in the units of a budget; the plots."""
    configs = with_served(configs)
    if configs.empty:
        return []
    lines = [
        "## Lifecycle: training once, then serving",
        "",
        "Each configuration's training energy, its checkpoint, and the energy of one request served afterwards "
        "(per generated response on the evaluation prompts for a language model, per classified sample otherwise), "
        "at batch 1 and at the largest batch measured; a method that merges is served the cheaper way, merged or as "
        "tuned (both shown; language models only: a classifier's inference phase measures the model as tuned).  "
        "Means over seeds, training energy ± its 95% interval where there are two or more.  The break-even is the "
        "number of requests after which the two totals (training + requests × energy per request) cross.",
        "",
    ]
    for (task, backbone), group in configs.groupby(GROUP, sort=False, dropna=False):
        unit = _unit(runs[(runs["task"] == task) & (runs["backbone"] == backbone)])
        lines += [f"### {text(backbone)} on {text(task)}", ""]
        lines += _serving_table(group, unit) + _break_even_table(group, unit) + _units_table(group, unit, units)
        for plot in plots:
            if (plot.task, plot.backbone) == (text(task), text(backbone)):
                lines += [f"![energy over the adapter's life, {plot.batch}]({plot.path.name})", ""]
    return lines + ["How the units were obtained: " + " ".join(units.how), ""]


def _kind(group: pd.DataFrame, column: str) -> str:
    """How a column's energies were obtained across the group: measured, estimated, or both."""
    kinds = sorted({str(k) for k in group[column].dropna()}) if column in group else []
    return "/".join(kinds) or "kind not recorded"


def _marked(cell: str, row: pd.Series, phase: str) -> str:
    """``cell`` with the contention mark where that phase's window was contended (in any seed)."""
    return marked(cell, contended_in(row, phase))


def _serving_table(group: pd.DataFrame, unit: str) -> list[str]:
    serving = "generation" if unit == "responses" else "inference"
    rows, missing = [], []
    for _, row in group.iterrows():
        train = _train_j(row)
        ci = finite(row.get(f"{ENERGY.name}_ci95"))
        checkpoint = finite(row.get("checkpoint_bytes"))
        columns = (REQUEST_B1, REQUEST_B1_MERGED, REQUEST_BATCH, REQUEST_BATCH_MERGED)
        cells = [_marked(_j(finite(row.get(c))), row, serving) for c in columns]
        if all(c == "-" for c in cells):
            missing.append(_name(row))
        tokens = [finite(row.get(c)) for c in (REQUEST_PROMPT_TOKENS, REQUEST_RESPONSE_TOKENS)]
        shown_tokens = "-" if tokens[0] is None or tokens[1] is None else f"{tokens[0]:.1f} / {tokens[1]:.1f}"
        checkpoint_mib = "-" if checkpoint is None else f"{checkpoint / MIB:,.3f}"
        trained = _marked(_j(train, ci), row, "train") if row["method"] != ZERO_SHOT else _j(train)
        rows.append([_name(row), trained, checkpoint_mib, *cells] + ([shown_tokens] if unit == "responses" else []))
    per = unit.removesuffix("s")
    served_kind = _kind(group, REQUEST_ENERGY_KIND)
    headers = [
        "configuration",
        f"training energy (J, {_kind(group, 'energy_kind')})",
        "checkpoint (MiB)",
        f"J per {per}, batch 1 ({served_kind})",
        f"J per {per}, batch 1, merged",
        f"J per {per}, {_batch_words(group)}",
        f"J per {per}, {_batch_words(group)}, merged",
    ] + (["prompt / response tokens (mean)"] if unit == "responses" else [])
    lines = [render_markdown(headers, rows, [False] + [True] * (len(headers) - 1)), ""]
    if unit == "responses":
        lines += [
            "A request is an evaluation prompt; its response is as long as the configuration makes it (the "
            "batch-1 window's mean tokens), and a longer response costs more energy.",
            "",
        ]
    if any(CONTENDED_MARK in cell for row in rows for cell in row):
        lines += [CONTENDED_NOTE, ""]
    if group["checkpoint_bytes"].isna().all() if "checkpoint_bytes" in group else True:
        lines += ["No checkpoint sizes: these records were written before runs recorded them.", ""]
    if missing:
        lines += [
            f"No serving figures for {', '.join(missing)}: the run measured no inference or generation phase "
            "(a failed or older run, or one without an evaluation batch), so its cells are empty.",
            "",
        ]
    sizes = sorted({int(s) for s in group[SERVING_BATCH].dropna()}) if SERVING_BATCH in group else []
    if len(sizes) > 1:
        lines += [
            f"The largest batch measured differs between configurations ({', '.join(map(str, sizes))}): the "
            "break-even at it compares energies per request at different batch sizes.",
            "",
        ]
    return lines


def _break_even_table(group: pd.DataFrame, unit: str) -> list[str]:
    refs = {ref: group[group["method"] == ref].iloc[0] for ref in REFERENCES if (group["method"] == ref).any()}
    if not refs:
        return ["No break-even: neither full fine-tuning nor the zero-shot model ran here to weigh against.", ""]
    several = [ref for ref in refs if (group["method"] == ref).sum() > 1]
    first = [f"the first {ref} configuration, {_name(refs[ref])}" for ref in several]
    headers, columns = ["configuration"], []
    for ref_row in refs.values():
        for served, batch in ((SERVED_B1, "batch 1"), (SERVED_BATCH, _batch_words(group))):
            headers.append(f"against {_name(ref_row)}, {batch}")
            columns.append((ref_row, served))
    rows = []
    for _, row in group.iterrows():
        cells = [_name(row)]
        for ref_row, served in columns:
            cells.append(_break_even_cell(row, ref_row, served, unit))
        rows.append(cells)
    table = render_markdown(headers, rows, [False] * len(headers))
    against = f"; against {' and '.join(first)}" if first else ""
    return [f"Break-even ({unit} served until the totals cross{against}):", "", table, ""]


def _break_even_cell(row: pd.Series, ref_row: pd.Series, served: str, unit: str) -> str:
    if row.name == ref_row.name:
        return "(reference)"
    train, ref_train = _train_j(row), _train_j(ref_row)
    request, ref_request = finite(row.get(served)), finite(ref_row.get(served))
    if None in (train, ref_train, request, ref_request):
        return "- (no serving figure)" if train is not None and ref_train is not None else "- (no training energy)"
    assert train is not None and ref_train is not None and request is not None and ref_request is not None
    return break_even(_name(row), train, request, _name(ref_row), ref_train, ref_request).text(unit)


def _units_table(group: pd.DataFrame, unit: str, units: EnergyUnits) -> list[str]:
    per = f"per 1,000 {unit}, batch 1"
    trained, served = _kind(group, "energy_kind"), _kind(group, REQUEST_ENERGY_KIND)
    headers = ["configuration", f"training (kWh, {trained})", f"{per} (kWh, {served})"]
    if units.carbon is not None:
        headers += ["training (g CO2e)", f"{per} (g CO2e)"]
    if units.price_per_kwh is not None:
        headers += ["training (money)", f"{per} (money)"]
    rows = []
    for _, row in group.iterrows():
        train, request = _train_j(row), finite(row.get(SERVED_B1))
        thousand = None if request is None else 1000 * request
        cells = [_name(row), _kwh(train), _kwh(thousand)]
        if units.carbon is not None:
            cells += [_number(units.co2_g(train)), _number(units.co2_g(thousand))]
        if units.price_per_kwh is not None:
            cells += [_money(units.money(train)), _money(units.money(thousand))]
        rows.append(cells)
    return [render_markdown(headers, rows, [False] + [True] * (len(headers) - 1)), ""]


def _kwh(joules: float | None) -> str:
    return "-" if joules is None else f"{kwh(joules):.3g}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3g}"


def _money(value: float | None) -> str:
    return "-" if value is None else cost_text(value)


__all__ = ["LIFECYCLE_AXES", "BreakEven", "break_even", "lifecycle_plots", "lifecycle_section", "with_served"]
