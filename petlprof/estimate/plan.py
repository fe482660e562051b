"""``petlprof plan``: the method configurations predicted to fit a memory, energy and time budget, ranked, with the
share of each budget they leave (issue 38).

A plan is an estimate (:func:`petlprof.estimate.command.price`: the same options, the same records in
``estimates.jsonl``) judged against budgets: ``--device-memory`` (the training peak against what a step can use of
it, as every fit verdict: less the CUDA context and the allocator's slack), ``--max-energy`` and ``--max-time`` (the
predicted totals of the training run that ``--train-size``, ``--epochs`` or ``--max-steps`` describe).  The
configurations that fit come first, the least predicted energy first (then time, then peak memory); those that do
not follow, each naming the budgets it breaks and by how much.  With ``--price-per-kwh`` each row also gets its
energy's cost.  Accuracy is not predicted: the plan says which configurations are worth running, and ``petlprof
run`` then measures what each reaches.  Every figure is the estimate's: *predicted*, on a calibrated profile or the
GPU table's uncalibrated figures, as the output's first line says.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from petlprof.errors import UsageError, printable
from petlprof.estimate import gpus
from petlprof.estimate.command import (
    add_estimate_options,
    aligned,
    config_label,
    duration,
    joules,
    price,
    size,
    totals_line,
)
from petlprof.results.figures import ENERGY, TIME
from petlprof.results.units import cost_text, read_price
from petlprof.values import DURATION_UNITS, ENERGY_UNITS, J_PER_KWH, Number, flag, parse_bytes

PLAN_FILE = "plan.jsonl"
DEFAULT_PILOT_STEPS = 6  # a pilot's measured steps: a median of six, after the run's warm-up steps
MAX_PILOT_STEPS = 10_000
_STEPS = Number(0, maximum=MAX_PILOT_STEPS, integer=True)


@dataclass(frozen=True)
class Budgets:
    """What a plan judges each configuration against (None: no such budget)."""

    device_memory_bytes: int | None
    max_energy_j: float | None
    max_time_s: float | None
    price_per_kwh: float | None

    def needs_prediction(self) -> str:
        """The budget options that need predicted time and energy, as the user named them ("" for none)."""
        return " and ".join(
            flag(name) for name, value in (("max_energy", self.max_energy_j), ("max_time", self.max_time_s)) if value
        )


@dataclass(frozen=True)
class Candidate:
    """One method configuration of a plan: its predicted figures, whether it fits every budget, the share of each
    budget it leaves (negative: over), and the budgets it breaks, in words."""

    backbone: str
    method: str
    config: str
    quantize: str
    peak_train_bytes: int | None
    train_time_s: float | None
    train_energy_j: float | None
    cost: float | None
    fits: bool
    left_share: dict[str, float]  # budget -> (budget - figure) / budget: a fraction, negative when over
    over: list[str]
    error: str | None = None


def add_plan_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``plan`` on the ``petlprof`` sub-command parsers: the estimate's options and the budgets."""
    parser = sub.add_parser(
        "plan",
        help="rank the methods (and with --grid their knob values) predicted to fit memory, energy and time budgets",
    )
    add_estimate_options(parser, "plan")
    parser.add_argument(
        "--max-energy",
        help="the training run's predicted energy may not pass this, with its unit: 5kWh, 900kJ (J, kJ, Wh, kWh); "
        "the run's length is --train-size with --epochs or --max-steps",
    )
    parser.add_argument(
        "--max-time",
        help="the training run's predicted time may not pass this, with its unit: 12h, 90min (s, min, h, d)",
    )
    parser.add_argument(
        "--price-per-kwh", help="the price of a kWh, in any currency: each configuration's energy cost in it"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="then run a short pilot of each configuration on this machine (--verify-steps optimiser steps on "
        "--task), scale each one's predicted time, energy and (on a GPU) memory by what its pilot measured against "
        "what it predicted, and print the plan again so corrected (pilots under <output>/pilots)",
    )
    parser.add_argument(
        "--verify-steps",
        type=_STEPS.read,
        default=DEFAULT_PILOT_STEPS,
        help=f"measured optimiser steps of each pilot, after its warm-up steps (default {DEFAULT_PILOT_STEPS})",
    )
    return parser


def read_budgets(args: argparse.Namespace) -> Budgets:
    """The budgets ``args`` name, each checked (one line, exit 2): at least one of them, energy and time with their
    units, a price a positive finite number."""
    price_per_kwh = read_price(args.price_per_kwh)
    budgets = Budgets(
        parse_bytes(args.device_memory, "--device-memory"),
        ENERGY_UNITS.parse(args.max_energy, "--max-energy"),
        DURATION_UNITS.parse(args.max_time, "--max-time"),
        price_per_kwh,
    )
    if budgets.device_memory_bytes is None and budgets.max_energy_j is None and budgets.max_time_s is None:
        raise UsageError("petlprof plan needs a budget to judge against: --device-memory, --max-energy or --max-time")
    if budgets.device_memory_bytes is not None and gpus.usable_bytes(budgets.device_memory_bytes) == 0:
        raise UsageError(
            f"--device-memory {args.device_memory} leaves no memory for a step once the CUDA context "
            f"({size(gpus.CUDA_CONTEXT_BYTES)}) is taken: give the device's whole memory, e.g. 24GiB"
        )
    if budgets.needs_prediction() and args.train_size is None and args.max_steps is None:
        raise UsageError(
            f"{budgets.needs_prediction()} judge a whole training run: give --train-size a number of examples "
            "(an estimate has no data to count for 'all') or --max-steps"
        )
    return budgets


def judge(record: dict, budgets: Budgets) -> Candidate:
    """``record`` (an estimate's) against ``budgets``."""
    names = {"backbone": record["backbone"], "method": record["method"], "config": config_label(record)}
    names["quantize"] = record.get("quantize", "none")
    if record["status"] != "ok":
        return Candidate(**names, peak_train_bytes=None, train_time_s=None, train_energy_j=None, cost=None,
                         fits=False, left_share={}, over=["not estimated"], error=record.get("error"))  # fmt: skip
    peak = int(record["memory"]["peak_train_bytes"])
    total = (record.get("predicted") or {}).get("train_total") or {}
    time_s, energy_j = total.get(TIME.name), total.get(ENERGY.name)
    left: dict[str, float] = {}
    over: list[str] = []
    memory = None if budgets.device_memory_bytes is None else gpus.usable_bytes(budgets.device_memory_bytes)
    checks = (
        ("memory", peak, memory, lambda count: size(int(count))),
        ("energy", energy_j, budgets.max_energy_j, joules),
        ("time", time_s, budgets.max_time_s, duration),
    )
    for name, figure, budget, unit in checks:
        if budget is None:
            continue
        if figure is None:  # a budget nothing priced cannot be said to fit
            over.append(f"{name} not predicted")
            continue
        left[name] = (budget - figure) / budget
        if figure > budget:
            over.append(f"{name} {unit(figure)} > {unit(budget)}")
    cost = None if energy_j is None or budgets.price_per_kwh is None else energy_j / J_PER_KWH * budgets.price_per_kwh
    return Candidate(**names, peak_train_bytes=peak, train_time_s=time_s, train_energy_j=energy_j, cost=cost,
                     fits=not over, left_share=left, over=over)  # fmt: skip


def ranked(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Those that fit first, the least predicted energy first, then time, then peak memory; then those that do not,
    the least over their tightest budget first; the unestimated last."""

    def key(candidate: Candidate) -> tuple:
        worst = min(candidate.left_share.values(), default=0.0)
        figures = (candidate.train_energy_j, candidate.train_time_s, candidate.peak_train_bytes)
        return (
            candidate.error is not None,
            not candidate.fits,
            -worst if not candidate.fits else 0.0,
            *(math.inf if figure is None else figure for figure in figures),
        )

    return sorted(candidates, key=key)


def plan_table(candidates: Sequence[Candidate], budgets: Budgets, basis: str = "predicted") -> str:
    """The ranked candidates, one row each, every figure with its unit; ``basis`` names what the time and energy
    columns hold (``predicted``; ``corrected``: predicted x a pilot's ratio)."""
    rows = []
    for rank, candidate in enumerate(candidates, 1):
        row = {
            "rank": str(rank),
            "backbone": candidate.backbone,
            "method": candidate.method,
            "config": candidate.config,
        }
        if any(c.quantize != "none" for c in candidates):
            row["quantize"] = candidate.quantize
        row["peak_train"] = "-" if candidate.peak_train_bytes is None else size(candidate.peak_train_bytes)
        if budgets.device_memory_bytes is not None:
            row["memory_left"] = _share(candidate.left_share.get("memory"))
        row[f"train_time_{basis}"] = "-" if candidate.train_time_s is None else duration(candidate.train_time_s)
        if budgets.max_time_s is not None:
            row["time_left"] = _share(candidate.left_share.get("time"))
        row[f"train_energy_{basis}"] = "-" if candidate.train_energy_j is None else joules(candidate.train_energy_j)
        if budgets.max_energy_j is not None:
            row["energy_left"] = _share(candidate.left_share.get("energy"))
        if budgets.price_per_kwh is not None:
            row["energy_cost"] = "-" if candidate.cost is None else cost_text(candidate.cost)
        row["verdict"] = "fits" if candidate.fits else f"over: {'; '.join(candidate.over)}"
        if candidate.error:
            row["verdict"] = f"not estimated: {candidate.error}"
        rows.append(row)
    return "\n".join(aligned(rows))


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def budget_line(budgets: Budgets) -> str:
    """The budgets in words, with what each is compared against."""
    parts = []
    if budgets.device_memory_bytes is not None:
        usable = gpus.usable_bytes(budgets.device_memory_bytes)
        parts.append(
            f"memory: the training peak against {size(usable)} usable of --device-memory "
            f"{size(budgets.device_memory_bytes)} (less the CUDA context and the allocator's slack)"
        )
    if budgets.max_energy_j is not None:
        parts.append(f"energy: the training run's predicted total against --max-energy {joules(budgets.max_energy_j)}")
    if budgets.max_time_s is not None:
        parts.append(f"time: the training run's predicted total against --max-time {duration(budgets.max_time_s)}")
    if budgets.price_per_kwh is not None:
        parts.append(
            f"energy_cost: predicted kWh x --price-per-kwh {budgets.price_per_kwh:g}, in that price's currency"
        )
    return "budgets: " + "; ".join(parts)


@dataclass(frozen=True)
class Plan:
    """A plan made: where it was written, its budgets, its candidates ranked and the estimate record of each."""

    out: Path
    budgets: Budgets
    candidates: list[Candidate]
    records: list[Any]  # the estimate record each candidate was judged from, in the candidates' order
    basis: str  # what the figures rest on, in words


def make_plan(args: argparse.Namespace) -> Plan:
    """Estimate what ``args`` name, judge each configuration against the budgets, rank them and write plan.jsonl."""
    _STEPS.check("verify_steps", args.verify_steps)  # before anything is traced: a bad count is one line
    budgets = read_budgets(args)
    out, priced = price(args, "plan", budgets.needs_prediction())
    judged = [(judge(dict(record), budgets), dict(record)) for each in priced for record in each.records]
    order = ranked([candidate for candidate, _ in judged])
    records = [next(r for c, r in judged if c is candidate) for candidate in order]
    with open(out / PLAN_FILE, "w") as fh:
        for candidate in order:
            fh.write(json.dumps({**asdict(candidate), "budgets": asdict(budgets), "kind": "predicted"}) + "\n")
    first: Any = next((r.get("predicted") for r in records if r.get("predicted")), None)
    basis = (
        f"predicted on {first['device']} ({first['model'] if not first['calibrated'] else 'calibrated here'})"
        if first
        else "memory alone: no time or energy predicted on this device (petlprof calibrate)"
    )
    return Plan(out, budgets, order, records, basis)


def show_plan(plan: Plan) -> None:
    """The plan on the terminal: its budgets, what its figures rest on, the ranked table and what to run next."""
    fitting = [c for c in plan.candidates if c.fits]
    print(printable(budget_line(plan.budgets)))
    if totals := totals_line(plan.records):
        print(printable(totals))
    print(
        printable(f"figures: {plan.basis}; ranked: those that fit, least predicted energy first, then time, then peak")
    )
    print(plan_table(plan.candidates, plan.budgets))
    print()
    summary = f"{len(fitting)} of {len(plan.candidates)} configuration(s) predicted to fit"
    if fitting:
        methods = ",".join(dict.fromkeys(c.method for c in fitting))
        summary += f"; accuracy is not predicted: `petlprof run --methods {methods}` with the same options measures it"
    print(printable(summary))
    print(printable(f"wrote {plan.out / PLAN_FILE}"))
    print(printable(f"wrote {plan.out / 'estimates.jsonl'}"))


def plan_records(folder: Path) -> list[dict]:
    """The candidates a plan wrote, in rank order."""
    return [json.loads(line) for line in (Path(folder) / PLAN_FILE).read_text().splitlines()]
