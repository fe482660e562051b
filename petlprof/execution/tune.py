"""Running a sweep's searches (``--tune lr``, ``--tune METHOD.KNOB``) before its final runs.

:func:`search` groups the sweep's runs by configuration, and runs each configuration's search
(:class:`petlprof.sweep.tuning.Search`) rung by rung: every configuration's trials of a rung go to the executor
together, each recorded as it finishes in the output folder's ``trials.jsonl`` (never in ``results.jsonl``, so a
trial is never a result); a rung's trials already recorded are skipped, so an interrupted search resumes like a
sweep.  It returns the final runs with their chosen values, and what each final run's record carries of its search
(``tuning``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from petlprof.errors import say
from petlprof.results.figures import ENERGY, ENERGY_KIND, TIME
from petlprof.results.records import FINAL_STATUSES
from petlprof.results.store import read_store
from petlprof.sweep.config import sweep_task
from petlprof.sweep.options import RunOptions
from petlprof.sweep.resources import optimiser_steps
from petlprof.sweep.spec import RunSpec
from petlprof.sweep.tuning import Search, applied, configuration_key, point_text, rungs, space_of, targets_of
from petlprof.vocabulary import ZERO_SHOT

TRIALS_FILE = "trials.jsonl"  # the trials of an output folder's searches, one record per trial

RunTrials = Callable[[list[RunSpec], Path], None]  # runs the trials not yet in the store, appending their records


def searches(options: RunOptions, specs: list[RunSpec]) -> dict[str, Search]:
    """Configuration key -> its search, for every configuration of ``specs`` with something to search (the zero-shot
    row and a method with nothing to train have no learning rate; a method is searched only for its own knob)."""
    out: dict[str, Search] = {}
    for spec in specs:
        targets = _targets(spec)
        if not targets:
            continue
        key = configuration_key(spec)
        if key in out:
            continue
        task = sweep_task(options, spec.task)
        budget = optimiser_steps(
            len(task.train), spec.batch_size, spec.epochs, spec.max_steps, spec.gradient_accumulation
        )
        space = space_of(targets, spec, spec.tune_points or 2)
        out[key] = Search(
            spec=spec,
            metric=spec.target_metric or task.primary_metric,
            targets=targets,
            space=space,
            rungs=rungs(budget, len(space)),
        )
    return out


def _targets(spec: RunSpec) -> list[str]:
    return [] if not spec.tune or spec.method == ZERO_SHOT else targets_of(spec)


def latest_records(store: Path) -> dict[str, dict[str, Any]]:
    """Run key -> its record in ``store``: the last one with a final status, else the last one."""
    if not store.exists():
        return {}
    records, _ = read_store(store)
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        key = str(record.get("run_key"))
        if key not in out or record.get("status") in FINAL_STATUSES or out[key].get("status") not in FINAL_STATUSES:
            out[key] = dict(record)
    return out


def search(
    options: RunOptions, specs: list[RunSpec], out_dir: Path, run_trials: RunTrials
) -> tuple[list[RunSpec], dict[str, dict[str, Any]]]:
    """Run the searches of ``specs``'s configurations, rung by rung, through ``run_trials``; returns the final runs
    (each configuration's with its chosen values, the others as they were) and run key -> its ``tuning``."""
    store = out_dir / TRIALS_FILE
    pending = searches(options, specs)
    rung = 0
    while unfinished := {key: s for key, s in pending.items() if s.chosen is None}:
        batch = {key: s.next_trials() for key, s in unfinished.items()}
        trials = [t for ts in batch.values() for t in ts]
        steps = "/".join(str(n) for n in sorted({t.max_steps for t in trials if t.max_steps}))
        searched = ", ".join(sorted({t for found in unfinished.values() for t in found.targets}))
        say(
            f"petlprof: search of {searched}, rung {rung + 1}: {len(trials)} trial(s) of {len(unfinished)} "
            f"configuration(s), {steps} optimiser step(s) each; trials are recorded in {store}"
        )
        run_trials(trials, store)
        records = latest_records(store)
        for key, ts in batch.items():
            pending[key].record_rung(ts, records)
        rung += 1
    final: list[RunSpec] = []
    tuning: dict[str, dict[str, Any]] = {}
    for spec in specs:
        found = pending.get(configuration_key(spec)) if _targets(spec) else None
        if found is None or found.chosen is None:
            final.append(spec)
            continue
        tuned = applied(spec, found.chosen)
        final.append(tuned)
        tuning[tuned.run_key] = found.summary()
    for found in pending.values():
        summary = found.summary()
        say(
            f"petlprof: {found.spec.method} on {found.spec.backbone} / {found.spec.task}: "
            f"{point_text(found.chosen or ())} chosen by {summary['trials']} trial(s) (validation {found.metric} "
            f"{_score(summary['validation_score'])}"
            f"; search {_joules(summary[ENERGY.name], summary[ENERGY_KIND])}, {summary[TIME.name]:.1f} s of "
            "training, measured)"
        )
    return list({s.run_key: s for s in final}.values()), tuning


def _score(value: float | None) -> str:
    return "none: every trial failed" if value is None else f"{value:.4g}"


def _joules(value: float | None, kind: str | None) -> str:
    return "energy unknown" if value is None else f"{value:,.1f} J ({kind or 'unknown kind'})"
