"""The learning-rate search (``--tune lr``): its space, its rungs, its trials and its choice; nothing here runs.

Each configuration of a sweep (every field of its runs' key but the seed and the learning rate) searches its own
learning rate over a declared space: ``--tune-points`` values log-spaced over the method's default x 10^[-1, 1]
(:func:`lr_space`; ``petlprof list`` states it).  The search is successive halving (Jamieson and Talwalkar, 2016)
over short pilots: every point trains ``B / ETA**R`` optimiser steps (``B``: the final runs' budget), the best
third (by the validation score at the pilot's last step) trains ``ETA`` times longer, and so on until a rung keeps
one point or runs the full budget (:func:`rungs`).  A pilot is a real run (:func:`trial_spec`): the
configuration with the point's learning rate, ``max_steps`` of its rung, one validation check at its end and the
first seed, trained alone (``train_only``): it never scores the evaluation split, which the final runs alone are
reported on.  The chosen value (:func:`choose`: the best score of the last rung; ties go to the value nearest the
default) then trains at the full budget on every seed.

Why not Optuna (the issue names its ask-and-tell with RDB storage): every trial here is a run of the sweep with a
run key of its own, stored as it finishes in the output folder's ``trials.jsonl``; a rerun skips the finished ones
and works the same rungs out again from their scores (the halving is deterministic).  That is the sweep's own
resume, already tested against SIGINT and kill -9; a study in SQLite beside it would be a second store of the same
facts, and one that can disagree with the first after a kill.  A grid of a handful of points needs no sampler; a
search over several fields at once would, and is where Optuna's TPE belongs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from petlprof.results.figures import ENERGY, ENERGY_KIND, HIGHER, TIME
from petlprof.results.result import RunResult
from petlprof.sweep.spec import RunSpec
from petlprof.tasks.metrics import direction
from petlprof.vocabulary import LR

ETA = 3  # successive halving's reduction factor: a third of each rung goes on, trained three times longer
DECADES = 1.0  # the space spans the default learning rate x 10^[-DECADES, DECADES]
STRATEGY = f"successive halving (eta {ETA}) over pilots of the configuration, scored on the validation split"
TRIAL_KIND = "trial"


def lr_space(default: float, points: int) -> list[float]:
    """``points`` learning rates log-spaced over ``default`` x 10^[-DECADES, DECADES] (the default itself among them
    for an odd count), each rounded to three significant figures so that run keys read as written."""
    if points < 2:
        raise ValueError(f"a search space needs at least 2 points, got {points}")
    exponents = [DECADES * (2 * i / (points - 1) - 1) for i in range(points)]
    return [float(f"{default * 10**e:.3g}") for e in exponents]


def space_text(default: float, points: int) -> str:
    """The space as ``petlprof list`` and the report state it."""
    values = ", ".join(f"{v:g}" for v in lr_space(default, points))
    return f"lr {default:g} x 10^[-{DECADES:g}, {DECADES:g}], {points} log-spaced points ({values})"


def rungs(budget_steps: int, points: int) -> list[tuple[int, int]]:
    """(optimiser steps, trials) of each rung of successive halving over ``points`` values for a final budget of
    ``budget_steps``: the last rung keeps more than one value, and trains at most the full budget."""
    kept = [points]
    while math.ceil(kept[-1] / ETA) > 1:
        kept.append(math.ceil(kept[-1] / ETA))
    last = len(kept) - 1
    return [(max(1, math.ceil(budget_steps / ETA ** (last - r))), n) for r, n in enumerate(kept)]


def configuration_key(spec: RunSpec) -> str:
    """What one search serves: the run key of the configuration's first seed with its learning rate left out."""
    return RunSpec(**{**spec.to_dict(), "lr": None, "seed": 0}).run_key


def trial_spec(spec: RunSpec, lr: float, steps: int, seed: int) -> RunSpec:
    """The pilot of ``lr`` for the configuration of ``spec``: ``steps`` optimiser steps, one validation check at the
    last, no target or time limit (it is scored at its end), the first seed of the sweep."""
    return dataclasses.replace(
        spec,
        lr=lr,
        max_steps=steps,
        eval_every=steps,
        target_value=None,
        max_train_time_s=None,
        seed=seed,
        train_only=True,
    )


def trial_score(record: Mapping[str, Any]) -> float | None:
    """A finished trial's validation score: its last check's (None for a run that failed, diverged or never
    checked, which the choice ranks last), read through the typed record."""
    result = RunResult.of(record)
    if not result.ok or result.budget is None or not result.budget.checks:
        return None
    return result.budget.checks[-1].value


def ranked(scores: Mapping[float, float | None], metric: str, default: float) -> list[float]:
    """The learning rates best first by ``scores`` (in ``metric``'s better direction); a tie goes to the value
    nearer ``default`` on the log scale, then to the smaller; values without a score come last."""
    sign = -1.0 if direction(metric) == HIGHER else 1.0

    def key(lr: float) -> tuple:
        score = scores[lr]
        return (score is None, sign * score if score is not None else 0.0, abs(math.log(lr / default)), lr)

    return sorted(scores, key=key)


def promoted(scores: Mapping[float, float | None], keep: int, metric: str, default: float) -> list[float]:
    """The ``keep`` best learning rates of a rung (:func:`ranked`)."""
    return ranked(scores, metric, default)[:keep]


def choose(scores: Mapping[float, float | None], metric: str, default: float) -> float:
    """The learning rate the last rung chose."""
    return ranked(scores, metric, default)[0]


@dataclasses.dataclass
class Search:
    """One configuration's search as it stands: its space, rungs, the trials finished by rung and their records."""

    spec: RunSpec  # the configuration's first final run, its learning rate the method's default
    metric: str
    space: list[float]
    rungs: list[tuple[int, int]]
    records: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)
    scores: list[dict[float, float | None]] = dataclasses.field(default_factory=list)  # per rung done
    chosen: float | None = None

    @property
    def default(self) -> float:
        return float(self.spec.lr) if self.spec.lr else self.space[len(self.space) // 2]

    def next_trials(self) -> list[RunSpec]:
        """The trials of the next rung (none once the value is chosen)."""
        if self.chosen is not None:
            return []
        rung = len(self.scores)
        steps, keep = self.rungs[rung]
        values = self.space if rung == 0 else promoted(self.scores[-1], keep, self.metric, self.default)
        return [trial_spec(self.spec, lr, steps, self.spec.seed) for lr in values]

    def record_rung(self, trials: Sequence[RunSpec], records: Mapping[str, Mapping[str, Any]]) -> None:
        """Take a rung's finished ``records`` (by run key); the last rung's best value is the choice."""
        rung_records = [records[t.run_key] for t in trials if t.run_key in records]
        self.records += rung_records
        self.scores.append({float(t.lr or 0.0): trial_score(records.get(t.run_key, {})) for t in trials})
        if len(self.scores) == len(self.rungs):
            self.chosen = choose(self.scores[-1], self.metric, self.default)

    def summary(self) -> dict[str, Any]:
        """What the final runs' records carry as ``tuning``: the search's trials, its energy (with how it was
        obtained) and time, both the trials' train phases' with their checks, and their processes' wall time
        (measured), the space, the strategy, the chosen value and the validation score that chose it."""
        results = [RunResult.of(r) for r in self.records]
        trains = [r.train for r in results]
        energies = [None if t is None else t[ENERGY] for t in trains]
        known = [float(e) for e in energies if e is not None]
        last = self.scores[-1] if self.scores else {}
        return {
            "target": LR,
            "strategy": STRATEGY,
            "space": list(self.space),
            "rungs": [{"steps": steps, "trials": n} for steps, n in self.rungs],
            "trials": len(results),
            "failed_trials": sum(1 for r in results if not r.ok),
            ENERGY.name: sum(known) if len(known) == len(energies) else None,
            ENERGY_KIND: "/".join(sorted({k for t in trains if t is not None and (k := t.text(ENERGY_KIND))})) or None,
            TIME.name: sum(float(t[TIME] or 0.0) for t in trains if t is not None),
            "wall_time_s": sum(float(r.process_wall_time_s or r.data.get("wall_time_s") or 0.0) for r in results),
            "chosen": self.chosen,
            "metric": self.metric,
            "validation_score": last.get(self.chosen) if self.chosen is not None else None,
            "trial_keys": [str(r.run_key) for r in results],
        }
