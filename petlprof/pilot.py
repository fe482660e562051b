"""``petlprof plan --verify``: a short pilot run of each planned configuration on this machine, and the plan corrected
by what the pilots measured.

A plan's time and energy are predictions (:mod:`petlprof.estimate.plan`).  Each pilot is a ``petlprof run`` of one
configuration with the plan's options, ``--verify-steps`` measured optimiser steps after the run's warm-up steps,
one seed, a small evaluation; the run records its own prediction beside what it measured (``predicted.train``), so
each configuration gets three ratios, measured / predicted: the median train step's time, the energy per step and
(on a GPU, where both read the allocator's peak) the peak memory.  The corrected plan multiplies the plan's predicted
totals and peak by its configuration's ratios and judges them against the same budgets; a configuration whose pilot
failed keeps its prediction and says why.  On a CPU the peak is not corrected: the run's meter reads the process's
RSS high-water mark (the data, the tokenizer, the interpreter), not the step's tensors the estimate prices.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from petlprof.api import estimated_peak, predictions_of
from petlprof.errors import UsageError, printable
from petlprof.estimate.command import aligned
from petlprof.estimate.plan import Candidate, Plan, judge, plan_table, ranked
from petlprof.execution.sweep import drive
from petlprof.execution.warm import stop_forking_from_this_process
from petlprof.results.figures import ENERGY, LATENCY, PEAK_MEMORY, TIME
from petlprof.results.result import RunResult
from petlprof.sweep.config import build_options
from petlprof.sweep.options import TRAINING_SETTINGS, RunOptions

PILOTS = "pilots"  # the pilots' sweeps, one folder each, under the plan's output
VERIFIED_FILE = "plan_verified.jsonl"
RATIOS = ("time", "energy", "memory")


@dataclass(frozen=True)
class Pilot:
    """One configuration's pilot: its ratios measured / predicted (None where not measured or not applied), where its
    run was written, and why it has no ratios (a failed run, no prediction)."""

    method: str
    config: str
    folder: str
    ratios: dict[str, float | None]
    why: str | None = None


def pilot_device(args: argparse.Namespace) -> str:
    """The device the pilots run on, which must be the one the plan priced (an estimate prices a GPU for auto)."""
    # torch: seconds to import, needed only once the plan is made and its pilots are about to run
    import torch

    has_cuda = torch.cuda.is_available()
    priced = "cuda" if args.device == "auto" else args.device
    if priced.startswith("cuda") and not has_cuda:
        raise UsageError(
            "--verify runs a pilot of each configuration on this machine, which has no CUDA device, and the plan "
            f"priced {priced}: give --device cpu to plan (and verify) for this machine's CPU"
        )
    return priced


def pilot_options(args: argparse.Namespace, record: Mapping[str, Any], device: str, folder: Path) -> RunOptions:
    """The run options of one configuration's pilot: the plan's options, its method and method config, a few steps,
    checked as ``petlprof run`` checks its options (a UsageError naming the bad one)."""
    batch = int(record["batch_size"])
    steps = int(args.verify_steps)
    options: dict[str, Any] = {
        "methods": [record["method"]],
        "method_config": {record["method"]: dict(record.get("method_config") or {})},
        "backbone": [record["backbone"]],
        "num_layers": args.num_layers,
        "task": [args.task] if args.task else None,
        "objective": args.objective,
        "batch_size": batch,
        "max_length": args.max_length,
        "precision": args.precision,
        "device": device,
        "seeds": [0],
        "max_steps": steps,
        "train_size": batch * (steps + 8),  # the run's warm-up steps come out of these too
        "eval_size": batch,
        "output": str(folder),
        "quantize": record.get("quantize"),
        "quantize_compute_dtype": record.get("quantize_compute_dtype"),
        "quantize_double": record.get("quantize_double"),
    }
    for name in TRAINING_SETTINGS:
        options[name] = getattr(args, name, None)
    return build_options({}, {name: value for name, value in options.items() if value is not None})


def pilot_ratios(record: RunResult, device: str) -> tuple[dict[str, float | None], str | None]:
    """Measured / predicted per step for a pilot's record: time (median step), energy per step, peak memory (a GPU
    only); with why there are none."""
    if record.status != "ok" or record.train is None:
        return dict.fromkeys(RATIOS), f"the pilot run {record.status}: {(record.error or '').strip()[-200:]}"
    predicted = record.predicted.get("train")
    if not isinstance(predicted, Mapping):
        return dict.fromkeys(RATIOS), "the pilot run recorded no prediction (no device profile: petlprof calibrate)"
    steps = record.train.raw("steps")
    energy = record.train[ENERGY]
    measured = {
        "time": record.train[LATENCY],
        "energy": energy / steps if energy is not None and isinstance(steps, int) and steps else None,
        "memory": record.train[PEAK_MEMORY] if device.startswith("cuda") else None,
    }
    keys = {"time": "step_time_s", "energy": ENERGY.name, "memory": PEAK_MEMORY.name}
    ratios: dict[str, float | None] = {}
    for name in RATIOS:
        value, guess = measured[name], predicted.get(keys[name])
        if value is None or not math.isfinite(value) or not isinstance(guess, (int, float)) or not 0 < guess < math.inf:
            ratios[name] = None
        else:
            ratios[name] = value / guess
    return ratios, None


def corrected(record: Mapping[str, Any], ratios: Mapping[str, float | None]) -> dict:
    """The estimate record with its predicted totals and peak scaled by the pilot's ratios (a missing ratio: 1)."""
    fixed = copy.deepcopy(dict(record))
    total = (fixed.get("predicted") or {}).get("train_total") or {}
    for name, figure in (("time", TIME.name), ("energy", ENERGY.name)):
        if isinstance(total.get(figure), (int, float)) and ratios.get(name):
            total[figure] *= ratios[name]
    memory = fixed.get("memory") or {}
    if isinstance(memory.get("peak_train_bytes"), (int, float)) and ratios.get("memory"):
        memory["peak_train_bytes"] = int(memory["peak_train_bytes"] * ratios["memory"])
    return fixed


def run_pilot(options: RunOptions) -> list[RunResult]:
    """Run one pilot sweep (no report: the plan is the report) and return its records."""
    outcome = drive(options, finish=None, peak=estimated_peak, predict=predictions_of(options))
    if outcome.exit_code in (130, 143):  # Ctrl-C or SIGTERM: the plan stops with its pilot, as a sweep would
        raise KeyboardInterrupt
    lines = Path(outcome.results_file).read_text(encoding="utf-8").splitlines()
    return [RunResult.from_json(json.loads(line)) for line in lines if line.strip()]


def verify(args: argparse.Namespace, plan: Plan) -> int:
    """Run each configuration's pilot, print the ratios and the corrected plan, write plan_verified.jsonl."""
    device = pilot_device(args)
    stop_forking_from_this_process()  # the plan ran torch here: a fork of this process would hang
    pilots: list[Pilot] = []
    fixed_records = []
    # every pilot's options checked as petlprof run checks them, before the first pilot runs: one line, exit 2
    checked = {
        index: pilot_options(args, record, device, plan.out / PILOTS / f"{index}-{candidate.method}")
        for index, (candidate, record) in enumerate(zip(plan.candidates, plan.records), 1)
        if candidate.error is None
    }
    for index, (candidate, record) in enumerate(zip(plan.candidates, plan.records), 1):
        folder = plan.out / PILOTS / f"{index}-{candidate.method}"
        if candidate.error is not None:
            none = dict.fromkeys(RATIOS)
            pilots.append(Pilot(candidate.method, candidate.config, str(folder), none, "not estimated"))
            fixed_records.append(record)
            continue
        print(printable(f"pilot {index}/{len(plan.candidates)}: {candidate.method} {candidate.config}"), flush=True)
        results = run_pilot(checked[index])
        ratios, why = pilot_ratios(results[-1], device) if results else (dict.fromkeys(RATIOS), "no record written")
        pilots.append(Pilot(candidate.method, candidate.config, str(folder), ratios, why))
        fixed_records.append(corrected(record, ratios))
    judged = [judge(record, plan.budgets) for record in fixed_records]
    order = ranked(judged)
    with open(plan.out / VERIFIED_FILE, "w") as fh:
        for candidate, pilot in zip(judged, pilots):
            line = {**asdict(candidate), "pilot": asdict(pilot), "kind": "predicted x pilot ratio"}
            fh.write(json.dumps(line) + "\n")
    print()
    print(printable(f"pilots on {device}: {args.verify_steps} measured steps each; measured / predicted per step:"))
    print(pilot_table(plan.candidates, pilots))
    print()
    print(printable("the plan corrected by its pilots (each prediction x its configuration's ratio):"))
    print(plan_table(order, plan.budgets, basis="corrected"))
    print()
    fitting = sum(c.fits for c in order)
    print(printable(f"{fitting} of {len(order)} configuration(s) fit once corrected; wrote {plan.out / VERIFIED_FILE}"))
    return 0


def pilot_table(candidates: list[Candidate], pilots: list[Pilot]) -> str:
    """One row per configuration: its ratios and what the pilot corrected, or why it could not."""
    rows = []
    for candidate, pilot in zip(candidates, pilots):
        row = {"method": candidate.method, "config": candidate.config}
        for name, header in zip(RATIOS, ("step time", "energy per step", "peak memory")):
            row[header] = "-" if pilot.ratios[name] is None else f"{pilot.ratios[name]:.2f}x"
        row["note"] = pilot.why or ("" if pilot.ratios["memory"] is not None else "peak not corrected on a CPU (RSS)")
        rows.append(row)
    return "\n".join(aligned(rows))


__all__ = ["Pilot", "corrected", "pilot_options", "pilot_ratios", "run_pilot", "verify"]
