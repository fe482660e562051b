"""Reading result records from the run store, and the small views of them every report part shares.

:func:`load_records` reads ``results.jsonl`` files into typed :class:`~petlprof.results.result.RunResult`
objects (schema 1 on disk, unchanged); every part of the report reads their attributes.  A failed run has no
phases and any figure may be missing: a RunResult answers ``None`` for those instead of raising, so the table,
plots and report.md never crash on an incomplete record.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from petlprof.errors import UsageError
from petlprof.results.records import RESULTS_FILE
from petlprof.results.result import RunResult, energy_kinds, results_of
from petlprof.results.store import Rejected, read_store
from petlprof.sweep.spec import spec_identity
from petlprof.values import known_total
from petlprof.vocabulary import ZERO_SHOT

MISSING = "-"
COST_ONLY = "accuracy of random-init runs is meaningless: cost-only"  # said wherever such a run's score shows
ZERO_SHOT_LABEL = "zero-shot (before tuning)"


class RecordList(list[RunResult]):
    """The records :func:`load_records` returns, with the lines it rejected (``rejected``), so that
    :func:`petlprof.report.markdown.write_report` can name them in report.md."""

    rejected: list[Rejected]


def load_records(paths: Path | str | Sequence[Path | str], skipped: list[str] | None = None) -> RecordList:
    """The valid records of one or more ``results.jsonl`` files (or folders holding one; one path alone or a
    list), in file order, the last attempt of each run only.

    A missing file, a folder in its place or an unreadable one raises :class:`~petlprof.errors.UsageError`.
    A line that cannot be used — torn by a crash, not a JSON object, of another schema version, missing
    ``status``/``method`` or with a field of the wrong type (:func:`petlprof.results.store.read_store`, the reader
    ``petlprof run`` uses too) — is rejected: a message naming the file and line number is appended to
    ``skipped``, and the line is kept in the result's ``rejected``.
    """
    records: list[RunResult] = []
    rejected: list[Rejected] = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        good, bad = read_store(_results_file(Path(path)))
        records += results_of(good)
        rejected += bad
    if skipped is not None:
        skipped += [str(line) for line in rejected]
    result = RecordList(latest_per_run(records))
    result.rejected = rejected
    return result


def latest_per_run(records: list[RunResult]) -> list[RunResult]:
    """One record per run key, the last one written: a run cancelled or failed and then resumed
    shows as its final outcome (the earlier attempts stay in the store)."""
    last = {r.run_key or id(r): i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.run_key or id(r)] == i]


def _results_file(path: Path) -> Path:
    """The results file ``path`` names: itself, or the ``results.jsonl`` inside a folder."""
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"no results file at '{path}' (expected a {RESULTS_FILE} file or a folder holding one)")
    return path


def is_ok(record: RunResult) -> bool:
    """True for a run that finished (status ``ok``)."""
    return record.ok


def is_zero_shot(record: RunResult) -> bool:
    """The model before any tuning (method ``zero_shot``): a reference score at no training cost, shown as
    a line on the plots and its own row in the tables, never a point or a member of a frontier."""
    return record.method == ZERO_SHOT


def method_name(method: Any) -> str:
    """A method as tables show it: the zero-shot row by what it is."""
    return ZERO_SHOT_LABEL if method == ZERO_SHOT else text(method)


def is_random_init(record: RunResult) -> bool:
    """A run on random weights (``petlprof run --random-init``): its costs are measured, its score means nothing."""
    return record.backbone_info.random_init


def random_init_backbones(records: Sequence[RunResult]) -> list[str]:
    """The backbones some of whose runs had random weights, in order of appearance."""
    return [text(name) for name in distinct(r.backbone for r in records if is_random_init(r))]


def text(value: Any) -> str:
    """A value as table/report text, with ``-`` for a missing one."""
    return MISSING if value is None or value == "" else str(value)


def _knob_value(value: Any) -> str:
    """One config value, compactly: floats with %g, containers as compact JSON."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def config_label(record: RunResult, width: int = 32, power_limit: bool = True) -> str:
    """The method's Pareto knob and any non-default hyper-parameters as ``r=8 alpha=8``, then the
    backbone's quantisation and a reduced precision (``r=8 nf4``; ``-`` for none of these).

    Records name their knob (``pareto_knob``) and the fields changed from the method's defaults
    (``method_config_changed``); older or foreign records without them show every field.  ``power_limit``: with
    the GPU power limit the run was set to (``300W``), as tables name a configuration; without it, the line one
    configuration draws across the limits of a power-limit sweep.
    """
    config, knob, changed = record.method_config, record.pareto_knob, record.method_config_changed
    keys = list(config) if changed is None else [k for k in config if k == knob or k in changed]
    parts = [f"{key}={_knob_value(config[key])}" for key in keys]
    label = " ".join(parts + _numerics(record, power_limit))
    if not label:
        return MISSING
    return label if len(label) <= width else label[: width - 1] + "…"


SHORT_PRECISIONS = {"bfloat16": "bf16", "float16": "fp16", "bf16": "bf16", "fp16": "fp16"}


def _numerics(record: RunResult, power_limit: bool = True) -> list[str]:
    """How the run's numbers differ from the float32 default, as label words: the backbone's
    quantisation (``nf4``, ``int8``; ``training.quantization``), a reduced precision (``bf16``) and a GPU power
    limit (``300W``), so two configurations that differ only there are told apart in tables and plots."""
    words = [record.quantization_method] if record.quantization_method else []
    if record.precision in SHORT_PRECISIONS:
        words.append(SHORT_PRECISIONS[record.precision])
    if power_limit and record.power_limit_w is not None:
        words.append(f"{record.power_limit_w:g}W")
    return words


def run_label(record: RunResult) -> str:
    """``method config`` as one name for a configuration (its seeds share it)."""
    config = config_label(record)
    method = text(record.method)
    return method if config == MISSING else f"{method} {config}"


def config_key(record: RunResult) -> str:
    """What identifies a configuration across seeds: everything that defines the run (its run key's
    fields: backbone, task, method and its config, data, training budget, cache, meters that cost
    time) except the seed."""
    if record.spec is not None:
        return json.dumps(spec_identity(dict(record.spec), include_seed=False), sort_keys=True, default=str)
    parts = {key: record.data.get(key) for key in ("backbone", "task", "method", "method_config", "training")}
    return json.dumps(parts, sort_keys=True, default=str)


def short_error(record: RunResult, width: int = 60) -> str:
    """The last non-empty line of a run's error (a traceback's message), cut to ``width``."""
    lines = [line.strip() for line in (record.error or "").splitlines() if line.strip()]
    if not lines:
        return MISSING if is_ok(record) else "(no error text)"
    message = lines[-1]
    return message if len(message) <= width else message[: width - 1] + "…"


def distinct(values: Iterable[Any]) -> list[Any]:
    """Values in order of first appearance without repeats, None dropped."""
    seen: list[Any] = []
    for value in values:
        if value is not None and value not in seen:
            seen.append(value)
    return seen


def _natural(label: str) -> tuple:
    """A sort key that orders the numbers inside a label by value (``r=4`` before ``r=64``)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", label) if part)


def sort_key(record: RunResult) -> tuple:
    """Order runs so that a configuration's seeds sit together: task, backbone, method, config, seed."""
    return (
        text(record.task),
        text(record.backbone),
        text(record.method),
        _natural(config_label(record, width=1000)),
        record.seed if record.seed is not None else -1,
    )


BATCHED_NAMES = {"inference": "inference", "generation": "generation", "generation_merged": "merged generation"}


def _phase_warnings(record: RunResult) -> list[tuple[str, str]]:
    """(phase, warning) for every measurement warning of one run, and a failed merge's error."""
    phases = [("train", record.train), ("eval", record.eval), ("merged eval", record.eval_merged)]
    for key, name in BATCHED_NAMES.items():
        phases += [(f"{name} {batch.replace('_', ' ')}", window) for batch, window in record.windows(key).items()]
    out = []
    for phase, window in phases:
        if window is None:
            continue
        notes = list(window.warnings)
        if window.error:  # a merge that failed: the unmerged results stand
            notes.append(f"failed: {window.error}")
        out += [(phase, note) for note in notes]
    return out


def _phase_order(phase: str) -> tuple:
    """Phases in the order a run goes through them: train, eval, merged eval, then inference batches."""
    named = ("train", "eval", "merged eval")
    return (named.index(phase) if phase in named else len(named), _natural(phase))


def run_warnings(records: Sequence[RunResult]) -> list[str]:
    """Every measurement warning a run recorded, as ``<run>, seed N, <phase>: <warning>``."""
    return [
        f"{run_label(record)}, seed {text(record.seed)}, {phase}: {warning}"
        for record in sorted(records, key=sort_key)
        for phase, warning in _phase_warnings(record)
    ]


def _runs_named(runs: Sequence[RunResult], total: int) -> str:
    """``every run (51 runs, 17 configurations)``, or ``lora r=8 (seeds 0, 1); read (seed 2)``."""
    seeds: dict[str, list[str]] = {}
    for record in runs:
        seeds.setdefault(run_label(record), []).append(text(record.seed))
    if len(runs) == total > 1:
        return f"every run ({total} runs, {len(seeds)} configurations)"
    return "; ".join(f"{label} (seed{'s' if len(s) > 1 else ''} {', '.join(s)})" for label, s in seeds.items())


def grouped_run_warnings(records: Sequence[RunResult]) -> list[str]:
    """The measurement warnings, each distinct text once: with its phase and run when one run said it,
    else with how many times, in which phases and which runs (or configurations) said it."""
    said: dict[str, list[tuple[RunResult, str]]] = {}
    ordered = sorted(records, key=sort_key)
    for record in ordered:
        for phase, warning in _phase_warnings(record):
            said.setdefault(warning, []).append((record, phase))
    out = []
    for warning, places in said.items():
        if len(places) == 1:
            record, phase = places[0]
            out.append(f"{run_label(record)}, seed {text(record.seed)}, {phase}: {warning}")
            continue
        runs = [r for r in ordered if any(r is place for place, _ in places)]
        phases = ", ".join(sorted(distinct(phase for _, phase in places), key=_phase_order))
        out.append(f"{warning} — {len(places)} times, phases {phases}; {_runs_named(runs, len(ordered))}")
    return out


def result_warnings(records: Sequence[RunResult]) -> list[str]:
    """Every warning a run recorded about its result (``warnings``: e.g. every prediction one class), as
    ``<run>, seed N: <warning>``), after one line per backbone run with random weights."""
    cost_only = [
        f"backbone {name} (--random-init, random weights): {COST_ONLY}" for name in random_init_backbones(records)
    ]
    return cost_only + [
        f"{run_label(record)}, seed {text(record.seed)}: {warning}"
        for record in sorted(records, key=sort_key)
        for warning in record.warnings or ()
    ]


def overhead_line(results: Sequence[RunResult]) -> str | None:
    """How much of the runs' wall time the harness spent outside the measured phases, as one sentence
    (None when no record carries ``overhead_s``)."""
    pairs = [
        (r.overhead_s, r.process_wall_time_s)
        for r in results
        if r.overhead_s is not None and r.process_wall_time_s is not None
    ]
    wall = sum(w for _, w in pairs)
    if not pairs or wall <= 0:
        return None
    overhead = sum(o for o, _ in pairs)
    median = statistics.median(o for o, _ in pairs)
    line = (
        f"harness overhead: {overhead:,.1f} s of the {len(pairs)} runs' {wall:,.1f} s of wall time "
        f"({overhead / wall:.0%}, measured) fell outside the measured phases, median {median:.1f} s a run: "
        "process start, imports, loading the model and data, warm-up steps, writing the record"
    )
    # the runs whose warm-ups were timed (a record written before they were, or one that failed before its phases,
    # has none): their overhead split into warm-ups and the rest
    timed = [
        (r.overhead_s, r.process_wall_time_s, r.warmup_time_s)
        for r in results
        if r.overhead_s is not None and r.process_wall_time_s is not None and r.warmup_time_s is not None
    ]
    if not timed:
        return line
    warmups, rest = sum(w for _, _, w in timed), [o - w for o, _, w in timed]
    timed_wall = sum(t for _, t, _ in timed)
    which = "" if len(timed) == len(pairs) else f" (over the {len(timed)} runs whose warm-ups were timed)"
    # their energy where every one of those runs metered it (records since warm-ups were metered, with an energy
    # meter), and how the runs' meter obtained it: measured or estimated, as their phases' energy says
    counted = [r for r in results if r.warmup_time_s is not None and r.overhead_s is not None]
    joules = known_total(r.warmup_energy_j for r in counted)
    kind = energy_kinds(p for r in counted for p in (r.train, r.eval)) or "of unknown kind"
    metered = "" if joules is None else f"; {joules:,.1f} J by the runs' energy meter, {kind}"
    return (
        f"{line}; of it{which} {warmups:,.1f} s ({warmups / timed_wall:.0%}) the phases' warm-up steps "
        f"(timed{metered}), the rest {sum(rest):,.1f} s ({sum(rest) / timed_wall:.0%}), "
        f"median {statistics.median(rest):.1f} s a run"
    )
