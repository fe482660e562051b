"""The report's learning-rate search section: what each tuned configuration's search (``--tune lr``) tried, chose,
and cost, and that cost's share of everything the configuration spent.

One row per configuration whose runs carry ``tuning``: the space, the chosen learning rate and the validation
score that chose it, the trials (pilot runs, recorded in the output folder's ``trials.jsonl``), their train phases'
energy and time, and the search's share of the configuration's training energy (the search plus every seed's final
train phase).  The search is paid once per configuration, so the share falls as seeds are added.
"""

from __future__ import annotations

from collections.abc import Sequence

from petlprof.report.records import config_key, is_ok, run_label
from petlprof.report.table import render_markdown
from petlprof.results.figures import ENERGY
from petlprof.results.result import RunResult, TuningResult
from petlprof.vocabulary import LR


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _warmups(tuning: TuningResult) -> str:
    """How much of the search's energy its trials' warm-up steps took (nothing for a search that did not meter them)."""
    return "" if tuning.warmup_energy_j is None else f"; warm-ups {tuning.warmup_energy_j:,.1f} J of it"


def _row(runs: Sequence[RunResult], tuning: TuningResult) -> list[str]:
    trains = [r.train[ENERGY] if r.train is not None else None for r in runs]
    known = [float(t) for t in trains if t is not None]
    total = None if tuning.energy_j is None or len(known) != len(trains) else tuning.energy_j + sum(known)
    share = None if total is None or total <= 0 or tuning.energy_j is None else tuning.energy_j / total
    space = ("; " if len(tuning.targets) > 1 else ", ").join(tuning.text(point) for point in tuning.space)
    failed = f" ({tuning.failed_trials} failed)" if tuning.failed_trials else ""
    return [
        run_label(runs[0]),
        space,
        "-" if tuning.chosen is None else tuning.text(tuning.chosen),
        f"{_number(tuning.validation_score, '.4f')} {tuning.metric or ''}".strip(),
        f"{tuning.trials if tuning.trials is not None else '-'}{failed}",
        f"{_number(tuning.energy_j, ',.1f')} ({tuning.energy_kind or 'unknown kind'}{_warmups(tuning)})",
        _number(tuning.time_s, ",.1f"),
        f"{len(runs)}",
        "-" if share is None else f"{share:.0%}",
    ]


def search_section(records: Sequence[RunResult]) -> list[str]:
    """The section's lines (none when no run was tuned)."""
    configurations: dict[str, list[RunResult]] = {}
    for record in records:
        if record.tuning is not None and is_ok(record):
            configurations.setdefault(config_key(record), []).append(record)
    if not configurations:
        return []
    rows = []
    for runs in configurations.values():
        tuning = runs[0].tuning
        if tuning is not None:
            rows.append(_row(runs, tuning))
    strategy = next((r[0].tuning.strategy for r in configurations.values() if r[0].tuning), None) or "a search"
    knobs = any(r[0].tuning is not None and r[0].tuning.targets != (LR,) for r in configurations.values())
    headers = [
        "configuration",
        "points tried" if knobs else "learning rates tried",
        "chosen" if knobs else "chosen lr",
        "validation score",
        "trials",
        "search energy (J)",
        "search train time (s, measured)",
        "seeds",
        "search share of energy",
    ]
    what = "learning rate and Pareto knob were" if knobs else "learning rate was"
    flags = "`--tune lr`, `--tune METHOD.KNOB`" if knobs else "`--tune lr`"
    return [
        "## Search" if knobs else "## Learning-rate search",
        "",
        f"Each configuration's {what} chosen before its runs ({flags}) by {strategy}, never on the "
        "evaluation split the tables report. Every trial is a real run, recorded in the output folder's "
        "`trials.jsonl`; the search's energy and time are its trials' train phases (their validation checks "
        "included, and their warm-up steps where the energy cell says so), by the runs' own energy meter. "
        "*Search share of energy*: the search's energy over the search "
        "plus every seed's train phase. The plot *including the learning-rate search* charges each run its "
        "configuration's whole search.",
        "",
        render_markdown(headers, rows, [False, False, True, True, True, True, True, True, True]),
        "",
    ]
