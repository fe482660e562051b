"""The search of a configuration's learning rate and Pareto knob (``--tune lr``, ``--tune METHOD.KNOB``): its space,
its rungs, its trials and its choice; nothing here runs.

Each configuration of a sweep (every field of its runs' key but the seed and the searched values) searches its own
values over a declared space: the learning rate over ``--tune-points`` values log-spaced over the method's default
x 10^[-1, 1] (:func:`lr_space`), a method's Pareto knob (``--tune lora.r``) over the knob's declared grid (the
values ``--grid`` sweeps), both at once over their product; ``petlprof list`` states each.  The search is
successive halving (Jamieson and Talwalkar, 2016) over short pilots: every point trains ``B / ETA**R`` optimiser
steps (``B``: the final runs' budget), the best third (by the validation score at the pilot's last step) trains
``ETA`` times longer, and so on until a rung keeps one point or runs the full budget (:func:`rungs`).  A pilot is a
real run (:func:`trial_spec`): the configuration with the point's values, ``max_steps`` of its rung, one validation
check at its end and the first seed, trained alone (``train_only``): it never scores the evaluation split, which the
final runs alone are reported on.  The chosen point (:func:`choose`: the best score of the last rung; ties go to the
point nearest the default) then trains at the full budget on every seed.  A knob changes what the method costs as
well as what it scores: the search picks the best validation score whatever it costs, so a frontier across the knob
is ``--grid``'s, and ``--tune METHOD.KNOB`` answers "which value scores best here"; the report's search section
shows the energy the choice cost.

Why not Optuna (the issue names its ask-and-tell with RDB storage): every trial here is a run of the sweep with a
run key of its own, stored as it finishes in the output folder's ``trials.jsonl``; a rerun skips the finished ones
and works the same rungs out again from their scores (the halving is deterministic).  That is the sweep's own
resume, already tested against SIGINT and kill -9; a study in SQLite beside it would be a second store of the same
facts, and one that can disagree with the first after a kill.  A grid of a handful of points needs no sampler; a
search over several fields at once would, and is where Optuna's TPE belongs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from petlprof.registry import get_method
from petlprof.results.figures import ENERGY, ENERGY_KIND, HIGHER, TIME, WARMUP_ENERGY, WARMUP_TIME
from petlprof.results.result import PhaseResult, RunResult, energy_kinds
from petlprof.sweep.options import knob_target
from petlprof.sweep.spec import RunSpec
from petlprof.tasks.metrics import direction
from petlprof.values import known_total
from petlprof.vocabulary import LR

ETA = 3  # successive halving's reduction factor: a third of each rung goes on, trained three times longer
DECADES = 1.0  # the space spans the default learning rate x 10^[-DECADES, DECADES]
STRATEGY = f"successive halving (eta {ETA}) over pilots of the configuration, scored on the validation split"
TRIAL_KIND = "trial"
Point = tuple[tuple[str, float], ...]  # (target, value) of each searched target, in the search's target order


def targets_of(spec: RunSpec) -> list[str]:
    """What ``spec``'s configuration searches: ``lr`` (where the run has one) and its own method's knob."""
    method = get_method(spec.method)
    own = knob_target(method)
    return [t for t in spec.tune if (t == LR and spec.lr) or (t != LR and t == own)]


def target_space(target: str, spec: RunSpec, points: int) -> list[float]:
    """One target's values: the learning rate's log-spaced space, or the knob's declared grid."""
    if target == LR:
        return lr_space(float(spec.lr or 0.0), points)
    return [float(v) if isinstance(v, float) else v for v in get_method(spec.method).default_grid]


def target_default(target: str, spec: RunSpec) -> float:
    """The value a target takes untuned: the run's learning rate, or the knob's value in the method's config."""
    if target == LR:
        return float(spec.lr or 0.0)
    method = get_method(spec.method)
    return getattr(method.make_config(spec.method_config), target.split(".", 1)[1])


def space_of(targets: Sequence[str], spec: RunSpec, points: int) -> list[Point]:
    """The points searched: the product of the targets' values."""
    spaces = [target_space(t, spec, points) for t in targets]
    return [tuple(zip(targets, values)) for values in itertools.product(*spaces)]


def applied(spec: RunSpec, point: Point) -> RunSpec:
    """``spec`` with ``point``'s values: its learning rate, and its method's knob in its method config."""
    fields = dict(point)
    lr = fields.pop(LR, spec.lr)
    config = {**spec.method_config, **{target.split(".", 1)[1]: value for target, value in fields.items()}}
    return dataclasses.replace(spec, lr=lr, method_config=config)


def point_text(point: Point) -> str:
    """``lr 0.002, lora.r 8``."""
    return ", ".join(f"{target} {value:g}" for target, value in point)


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


def trial_spec(spec: RunSpec, point: Point, steps: int, seed: int) -> RunSpec:
    """The pilot of ``point`` for the configuration of ``spec``: ``steps`` optimiser steps, one validation check at
    the last, no target or time limit (it is scored at its end), the first seed of the sweep."""
    return dataclasses.replace(
        applied(spec, point),
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


def _log_distance(value: float, default: float) -> float:
    """How far ``value`` is from ``default`` on the log scale (a grid such as ``last = 1, 4, 0`` has values a log
    cannot take: 0 from itself, infinitely far from the rest)."""
    if value > 0 and default > 0:
        return abs(math.log(value / default))
    return 0.0 if value == default else math.inf


def ranked(scores: Mapping[Point, float | None], metric: str, default: Point) -> list[Point]:
    """The points best first by ``scores`` (in ``metric``'s better direction); a tie goes to the point nearer
    ``default`` on the log scale (summed over its targets; a knob value or default of 0 or below is no distance from
    itself and infinitely far from anything else), then to the smaller values; points without a score come last."""
    sign = -1.0 if direction(metric) == HIGHER else 1.0
    defaults = dict(default)

    def key(point: Point) -> tuple:
        score = scores[point]
        distance = sum(_log_distance(value, defaults[target]) for target, value in point)
        return (score is None, sign * score if score is not None else 0.0, distance, tuple(v for _, v in point))

    return sorted(scores, key=key)


def promoted(scores: Mapping[Point, float | None], keep: int, metric: str, default: Point) -> list[Point]:
    """The ``keep`` best points of a rung (:func:`ranked`)."""
    return ranked(scores, metric, default)[:keep]


def choose(scores: Mapping[Point, float | None], metric: str, default: Point) -> Point:
    """The point the last rung chose."""
    return ranked(scores, metric, default)[0]


def _warmups(trains: Sequence[PhaseResult | None]) -> tuple[float, float] | None:
    """(J, s) of the trials' training warm-up steps, metered apart from their windows
    (:class:`~petlprof.meters.energy.WarmUp`); None unless every trial recorded both (energy and time are charged
    together or not at all)."""
    energy = known_total(None if t is None else t[WARMUP_ENERGY] for t in trains)
    time_s = known_total(None if t is None else t.raw(WARMUP_TIME) for t in trains)
    return None if energy is None or time_s is None else (energy, time_s)


@dataclasses.dataclass
class Search:
    """One configuration's search as it stands: its targets, space and rungs, the trials finished by rung and their
    records."""

    spec: RunSpec  # the configuration's first final run, at the method's defaults
    metric: str
    targets: list[str]
    space: list[Point]
    rungs: list[tuple[int, int]]
    records: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)
    scores: list[dict[Point, float | None]] = dataclasses.field(default_factory=list)  # per rung done
    chosen: Point | None = None
    points: dict[str, Point] = dataclasses.field(default_factory=dict)  # trial run key -> its point

    @property
    def default(self) -> Point:
        return tuple((t, target_default(t, self.spec)) for t in self.targets)

    def next_trials(self) -> list[RunSpec]:
        """The trials of the next rung (none once the point is chosen)."""
        if self.chosen is not None:
            return []
        rung = len(self.scores)
        steps, keep = self.rungs[rung]
        values = self.space if rung == 0 else promoted(self.scores[-1], keep, self.metric, self.default)
        trials = []
        for point in values:
            trial = trial_spec(self.spec, point, steps, self.spec.seed)
            self.points[trial.run_key] = point
            trials.append(trial)
        return trials

    def record_rung(self, trials: Sequence[RunSpec], records: Mapping[str, Mapping[str, Any]]) -> None:
        """Take a rung's finished ``records`` (by run key); the last rung's best point is the choice."""
        rung_records = [records[t.run_key] for t in trials if t.run_key in records]
        self.records += rung_records
        self.scores.append({self.points[t.run_key]: trial_score(records.get(t.run_key, {})) for t in trials})
        if len(self.scores) == len(self.rungs):
            self.chosen = choose(self.scores[-1], self.metric, self.default)

    def summary(self) -> dict[str, Any]:
        """What the final runs' records carry as ``tuning``: the search's trials, its energy (with how it was
        obtained) and time, both the trials' train phases' with their checks and, where every trial metered them,
        their warm-up steps (that part also on its own: ``warmup_energy_j``, ``warmup_time_s``; None where a trial
        written before warm-ups were metered has none), and their processes' wall time (measured), the space, the
        strategy, the chosen point and the validation score that chose it.  A search of the learning rate alone
        keeps the first form of the record (``target`` ``lr``, ``space`` and ``chosen`` as numbers); one with a
        knob names its targets and gives each point as ``{target: value}``."""
        results = [RunResult.of(r) for r in self.records]
        trains = [r.train for r in results]
        train_j = known_total(None if t is None else t[ENERGY] for t in trains)
        warmup_j, warmup_s = _warmups(trains) or (None, None)
        last = self.scores[-1] if self.scores else {}
        lr_only = self.targets == [LR]
        chosen = self.chosen
        return {
            "target": LR if lr_only else list(self.targets),
            "strategy": STRATEGY,
            "space": [p[0][1] if lr_only else dict(p) for p in self.space],
            "rungs": [{"steps": steps, "trials": n} for steps, n in self.rungs],
            "trials": len(results),
            "failed_trials": sum(1 for r in results if not r.ok),
            ENERGY.name: None if train_j is None else train_j + (warmup_j or 0.0),
            ENERGY_KIND: energy_kinds(trains),
            TIME.name: sum(float(t[TIME] or 0.0) for t in trains if t is not None) + (warmup_s or 0.0),
            WARMUP_ENERGY.name: warmup_j,
            WARMUP_TIME: warmup_s,
            "wall_time_s": sum(float(r.process_wall_time_s or r.data.get("wall_time_s") or 0.0) for r in results),
            "chosen": None if chosen is None else chosen[0][1] if lr_only else dict(chosen),
            "metric": self.metric,
            "validation_score": last.get(chosen) if chosen is not None else None,
            "trial_keys": [str(r.run_key) for r in results],
        }
