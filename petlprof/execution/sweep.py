"""A sweep, driven from its checked options to its last record: what ``petlprof run`` and
:func:`petlprof.api.run_sweep` both run.

:func:`drive` takes :class:`~petlprof.sweep.options.RunOptions` (built and validated by
:func:`~petlprof.sweep.config.build_options`) and, in order: starts a local sweep's warm worker where CPU runs will
fork from it (its imports overlap the checks), runs the preflight, resolves the device, locks the output folder
(then says the preflight's notes as status lines, so a refused command prints its one error line alone), expands
the options into runs and leaves out those already recorded, runs the rest on the executor with each record appended
as it comes back, records the runs in flight ``cancelled`` on Ctrl-C or SIGTERM, and says what the harness cost.
A bad input is a :class:`~petlprof.errors.UsageError` before any executor starts or any file is written.  Status
lines go to stderr.  The report is the caller's ``finish`` (the report layer stands above this one), called with
the folder still locked.
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from petlprof.errors import say
from petlprof.execution import executors, tune
from petlprof.execution.child import release_signals
from petlprof.execution.warm import forks_from_this_process
from petlprof.meters.power_limit import PowerLimiter
from petlprof.registry import get_method
from petlprof.results import store as results_store
from petlprof.results.records import RESULTS_FILE, measured_phases_s
from petlprof.results.store import StoreLock, check_writable, finished_keys, lock_held
from petlprof.run.execute import cancelled_record
from petlprof.sweep.config import (
    check_backbone_shapes,
    default_output_dir,
    expand,
    preflight,
    resolve_device,
    sweep_task,
    unsupported_pairs,
)
from petlprof.sweep.lengths import PeakEstimate
from petlprof.sweep.options import RunOptions
from petlprof.sweep.resources import trained_examples
from petlprof.sweep.spec import RunSpec
from petlprof.sweep.tuning import TRIAL_KIND
from petlprof.values import parse_bytes
from petlprof.vocabulary import LOCAL, LR, ZERO_SHOT

NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present where NVIDIA's kernel driver is loaded

Finish = Callable[[Path, Path], None]  # (the results file, the output folder): the report of a finished sweep


class StoreWriteError(Exception):
    """The results file could not be written; the message has already been printed."""


class Terminated(BaseException):
    """Raised in the sweep process by SIGTERM, so the run in flight is stopped and recorded
    (a BaseException, like KeyboardInterrupt, so no ``except Exception`` in a run swallows it)."""


def _on_sigterm(signum, frame):
    raise Terminated()


@dataclass(frozen=True)
class SweepOutcome:
    """What one :func:`drive` did."""

    output: Path  # the output folder
    results_file: Path  # its results.jsonl
    runs: int  # the runs of the sweep
    recorded: int  # of them, those in the results file before (skipped)
    ran: int  # of the others, those run to a record (of any status) by this call
    failed: int  # of those, the ones whose record's status is not ok
    exit_code: int  # what `petlprof run` exits with: 0; 1 (a run failed, or a record could not be written);
    # 130 (Ctrl-C) or 143 (SIGTERM): the runs in flight were recorded cancelled


Predict = Callable[[list[RunSpec]], Mapping[str, Mapping[str, object]]]  # run key -> its record's ``predicted`` block


def drive(
    options: RunOptions, finish: Finish | None = None, peak: PeakEstimate | None = None, predict: Predict | None = None
) -> SweepOutcome:
    """Run the sweep ``options`` describe into their output folder (a new ``petlprof-out/run-...`` unless given),
    skipping the runs it holds already; ``finish`` writes the report once every run is recorded; ``peak`` predicts
    a training peak for the preflight (:func:`petlprof.sweep.config.preflight`); ``predict`` each run's predicted
    costs (``petlprof estimate``'s, which this layer cannot import: the front passes it in), kept in its record."""
    out_dir = Path(options.output) if options.output else default_output_dir()
    max_memory = parse_bytes(options.max_memory)

    def make():
        return executors.make_executor(
            options.executor,
            address=options.address,
            in_process=options.in_process,
            timeout_s=options.timeout,
            max_memory_bytes=max_memory,
            retries=options.retries,
            cpus_per_run=options.cpus_per_run,
        )

    # every check of the input and the output folder before an executor starts: a bad data path or
    # a folder another sweep holds is one error line, not a Ray start-up followed by one.  A local sweep's
    # warm worker is the exception: it only imports, so it starts first and its imports overlap the checks
    # (and it is killed at once if they fail)
    local = options.executor == LOCAL
    executor = make() if local and cpu_sweep_likely(options, out_dir) else None
    try:
        if executor is not None:
            if forks_from_this_process():  # the command forks its warm worker once it has imported the runtime:
                check_backbone_shapes(options, presets=False)  # what a config answers first, not after the imports
            executor.prestart(fork=True)  # nothing computed yet: a fork carries no thread pool
        notes = preflight(
            options, meters_here=local, peak=peak
        )  # said once the output folder is ours: a refusal is one line
        # a local device is checked here, so a bad --device leaves no output folder; a cluster's needs Ray
        device = (
            resolve_device(options.device, options.nproc_per_run, memory_snapshot=options.memory_snapshot)
            if local
            else None
        )
        if executor is not None and device != "cpu":
            executor.close()  # GPU runs never fork from its warm worker
        check_writable(out_dir)
        with StoreLock(out_dir) as lock:
            for note in notes:
                say(f"petlprof: note: {note}")
            if lock.taken_over is not None:
                say(f"petlprof: took over the lock of a petlprof run that is gone ({lock.taken_over})")
            if executor is None:
                executor = make()
            return _run_locked(options, executor, out_dir, device, finish, predict)
    finally:
        if executor is not None:
            executor.close()


def _predictions(predict: Predict | None, specs: list[RunSpec]) -> Mapping[str, Mapping[str, object]]:
    """Each run's predicted costs, made once per configuration before any run; none where it fails (said once)."""
    if predict is None or not specs:
        return {}
    try:
        return predict(specs)
    except Exception as error:  # a prediction is an extra: the sweep runs without it
        say(f"petlprof: no predictions for this sweep ({type(error).__name__}: {error})")
        return {}


def cpu_sweep_likely(options: RunOptions, out_dir: Path) -> bool:
    """Whether a local sweep will fork CPU runs from a warm worker, told without importing torch: one process
    per run, ``--device cpu`` (or ``auto`` on a machine without NVIDIA's driver), and no other sweep holding
    ``out_dir``.  Its worker then starts before the checks; where this guesses wrong, the worker is killed
    unused (seconds of imports beside whatever else runs)."""
    if options.nproc_per_run != 1 or options.device not in ("auto", "cpu"):
        return False
    if options.device == "auto" and NVIDIA_DRIVER.exists():
        return False
    return not lock_held(out_dir)


@dataclass
class _Tally:
    """The runs of this call run to a record, and those of them not ok."""

    ran: int = 0
    failed: int = 0


def _run_locked(
    options: RunOptions,
    executor,
    out_dir: Path,
    device: str | None,
    finish: Finish | None,
    predict: Predict | None = None,
):
    """The sweep, with ``out_dir`` locked: the device (``None``: check it against the Ray cluster's,
    as a driver may have no GPU of its own), the runs not yet recorded, each record as it finishes."""
    if device is None:
        device = resolve_device(
            options.device, options.nproc_per_run, executor.cluster_gpus(), memory_snapshot=options.memory_snapshot
        )
    specs = expand(options, device, out_dir)
    store = out_dir / RESULTS_FILE
    done = finished_keys(store)
    todo = [s for s in specs if s.run_key not in done]
    predictions = _predictions(predict, todo)
    tally = _Tally()
    tuning: dict[str, dict] = {}

    limiter = PowerLimiter(out_dir) if options.power_limit else None

    def run_trials(trials: list[RunSpec], trials_store: Path) -> None:
        recorded = finished_keys(trials_store)
        left = [t for t in trials if t.run_key not in recorded]
        done = len(trials) - len(left)
        _sweep(left, trials_store, executor, tally, done, len(trials), _work(options), TRIAL_KIND, limiter=limiter)

    def outcome(exit_code: int) -> SweepOutcome:
        return SweepOutcome(out_dir, store, len(specs), len(specs) - len(todo), tally.ran, tally.failed, exit_code)

    def announce() -> None:
        say(
            f"petlprof: {len(specs)} run(s) on {device}; {len(specs) - len(todo)} already in {store}; "
            f"writing to {out_dir}; runs execute on {executor.describe()}"
        )

    if options.tune:  # the final runs are known once each configuration's search has chosen its learning rate
        searched = " and ".join(options.tune)
        say(f"petlprof: searching each configuration's {searched} first; writing to {out_dir}")
    else:
        announce()
    in_main = threading.current_thread() is threading.main_thread()  # a handler can be set in the main thread only
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        if limiter is not None and (note := limiter.restore_left_behind()):
            say(f"petlprof: {note}")
        if todo or options.tune:  # idle power before the first run (after the warm worker's imports)
            say(f"petlprof: {executor.prepare_idle(device, options.energy_meter)}")
        if options.tune:  # each configuration's learning rate, then its final runs at the chosen value
            specs, tuning = tune.search(options, specs, out_dir, run_trials)
            todo = [s for s in specs if s.run_key not in done]
            announce()
        _sweep(
            todo,
            store,
            executor,
            tally,
            done=len(specs) - len(todo),
            total=len(specs),
            work=_work(options),
            tuning=tuning,
            limiter=limiter,
            predictions=predictions,
        )
    except StoreWriteError:
        return outcome(1)
    except (KeyboardInterrupt, Terminated) as exc:
        print(file=sys.stderr)
        say(
            f"petlprof: interrupted; finished runs are in {store}. Resume with the same command "
            f"(with --output {out_dir}): recorded runs are skipped."
        )
        return outcome(130 if isinstance(exc, KeyboardInterrupt) else 143)
    finally:
        if limiter is not None:  # finished, failed or interrupted: the GPUs' own limits back
            limiter.restore()
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    if finish is not None:
        finish(store, out_dir)
    for pair in unsupported_pairs(options) if options.skip_unsupported else ():  # left out before any run
        say(f"petlprof: skipped (--skip-unsupported): {pair}")
    return outcome(1 if tally.failed else 0)


def _progress(spec, position: int, total: int, started: float, finished: int, left_s: float | None = None) -> str:
    """``[7/24] lora r=8 on minilm / tweets, seed 1 (elapsed 3m10s, about 8m00s left)``: the time left, once
    ``finished`` runs of this call have a record, is ``left_s`` (:func:`expected_left_s`)."""
    method = get_method(spec.method)
    point = f" {method.pareto_knob}={spec.method_config.get(method.pareto_knob)}" if method.pareto_knob else ""
    trial = ""
    if getattr(spec, "train_only", False) and spec.tune:  # a search's pilot: what it tries (a knob: in `point`)
        lr = f"lr {spec.lr:g}, " if LR in spec.tune and spec.lr else ""
        trial = f" (trial: {lr}{spec.max_steps} steps)"
    line = f"[{position}/{total}] {method.name}{point} on {spec.backbone} / {spec.task}, seed {spec.seed}{trial}"
    if finished and left_s is not None:
        line += f" (elapsed {_clock(time.monotonic() - started)}, about {_clock(left_s)} left)"
    return line


def _clock(seconds: float) -> str:
    """``3m10s``: whole seconds, rounded once (59.7 s is ``1m00s``, not ``0m60s``)."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


Work = Callable[[RunSpec], int]  # the training examples a run passes through (0 for a run that trains nothing)


@dataclass(frozen=True)
class CostKey:
    """What a run's expected wall time is read by (:func:`expected_left_s`): its configuration (every field of
    the run key but the seed: method, method config, backbone, task, the budget), its method and backbone, and
    the training examples it passes through."""

    configuration: str
    method: str
    backbone: str
    work: int

    @classmethod
    def of(cls, spec: RunSpec, work: Work) -> CostKey:
        configuration = json.dumps(spec.identity(include_seed=False), sort_keys=True, default=str)
        return cls(configuration, spec.method, spec.backbone, work(spec))


def expected_left_s(remaining: Sequence[CostKey], finished: Sequence[tuple[CostKey, float]]) -> float | None:
    """Seconds the ``remaining`` runs are expected to take: the sum of each one's expected wall time, read from the
    ``finished`` runs (each with its wall time in seconds): the mean over those of its configuration, else over
    those of its method on its backbone, else the mean over all of them scaled by its work relative to their mean
    work (unscaled where theirs is 0).  None before any run has finished."""
    if not finished:
        return None
    configurations: dict[str, list[float]] = {}
    methods: dict[tuple[str, str], list[float]] = {}
    for key, wall_s in finished:
        configurations.setdefault(key.configuration, []).append(wall_s)
        methods.setdefault((key.method, key.backbone), []).append(wall_s)
    mean_s = statistics.fmean(wall_s for _, wall_s in finished)
    mean_work = statistics.fmean(key.work for key, _ in finished)
    left_s = 0.0
    for key in remaining:
        same = configurations.get(key.configuration) or methods.get((key.method, key.backbone))
        if same:
            left_s += statistics.fmean(same)
        else:
            left_s += mean_s * key.work / mean_work if mean_work else mean_s
    return left_s


def _work(options: RunOptions) -> Work:
    """The training examples a run of the sweep ``options`` describe passes through (its task's training split as
    the sweep loads it, :func:`~petlprof.sweep.resources.trained_examples`); none for the zero-shot row."""

    def work(spec: RunSpec) -> int:
        if spec.method == ZERO_SHOT:
            return 0
        examples = len(sweep_task(options, spec.task).train)
        return trained_examples(examples, spec.batch_size, spec.epochs, spec.max_steps, spec.gradient_accumulation)

    return work


def _wall_s(record) -> float:
    """A finished run's wall time: its process's, from its start to its record (the run's own where there is none),
    less the warm worker's start the sweep's first forked run carries (paid once, not by the runs to come)."""
    wall_s = record.get("process_wall_time_s") or record.get("wall_time_s") or 0.0
    return max(float(wall_s) - float(record.get("warm_worker_start_s") or 0.0), 0.0)


def _sweep(
    todo,
    store: Path,
    executor,
    tally: _Tally,
    done: int = 0,
    total: int | None = None,
    work: Work | None = None,
    kind: str | None = None,
    tuning: Mapping[str, dict] | None = None,
    limiter: PowerLimiter | None = None,
    predictions: Mapping[str, Mapping[str, object]] | None = None,
) -> None:
    """Run ``todo`` on ``executor``, appending each record as it comes back (counted in ``tally``); ``done`` runs
    of ``total`` were recorded before (a resumed sweep), so progress counts the whole sweep; ``work``: the training
    examples of a run, for the time left (:func:`expected_left_s`; without it every run counts alike); ``kind``:
    what each record is (``trial``: a search's pilot); ``tuning``: run key -> the search its record carries;
    ``limiter``: sets the GPUs to each run's power limit as it starts.  On an interrupt the runs in flight are
    recorded ``cancelled`` and stopped."""
    started, total = time.monotonic(), total if total is not None else len(todo)
    position = iter(range(done + 1, total + 1))
    span = _Span()
    pending = {spec.run_key: CostKey.of(spec, work or (lambda spec: 1)) for spec in todo}  # not yet recorded
    finished: list[tuple[CostKey, float]] = []

    def on_start(spec) -> None:
        if limiter is not None:
            limiter.set(spec.power_limit_w)
        span.start()
        left_s = expected_left_s(list(pending.values()), finished)
        say(_progress(spec, next(position), total, started, tally.ran, left_s))

    try:
        for spec, record in executor.results(todo, on_start=on_start):
            if kind is not None:
                record["kind"] = kind
            if tuning and spec.run_key in tuning:
                record["tuning"] = tuning[spec.run_key]
            if predictions and spec.run_key in predictions:
                record["predicted"] = predictions[spec.run_key]
            try:  # looked up at each record, not bound at import: tests replace append_record
                results_store.append_record(store, record)
            except OSError as exc:  # disk full, folder removed, ...: say so, and keep the result on the terminal
                say(
                    f"petlprof: error: could not write to {store}: {exc.strerror or exc}. Runs recorded before "
                    "are intact; this run's record follows so it is not lost:"
                )
                print(json.dumps(record, default=str), file=sys.stderr)
                raise StoreWriteError() from None
            finally:
                release_signals()  # a signal held while the finished run was stored is delivered now
            tally.ran += 1
            span.end(record)
            if spec.run_key in pending:
                finished.append((pending.pop(spec.run_key), _wall_s(record)))
            if record["status"] != "ok":
                tally.failed += 1
                say(f"  {spec.method} seed {spec.seed} {record['status']}: {record['error']}")
    except (KeyboardInterrupt, Terminated) as exc:
        name = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        in_flight = list(executor.in_flight)
        executor.cancel()
        for spec in in_flight:
            try:
                results_store.append_record(store, cancelled_record(spec, name))
            except OSError as error:
                say(f"petlprof: could not record the cancelled run in {store}: {error}")
        raise
    # local runs go one after another, so the span less their phases is the harness's (Ray's overlap)
    if getattr(executor, "name", "") == LOCAL and (line := span.line()):
        say(line)


class _Span:
    """The sweep's own figure of what the harness costs: from the first run's start to the last run's record
    stored (monotonic clock, this invocation's runs), less every run's measured phases."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.phases_s, self.runs = 0.0, 0

    def start(self) -> None:
        if self.first is None:
            self.first = time.monotonic()

    def end(self, record) -> None:
        self.last = time.monotonic()
        self.phases_s += measured_phases_s(record)
        self.runs += 1

    def line(self) -> str | None:
        if self.first is None or self.last is None or not self.runs:
            return None
        span = self.last - self.first
        outside = max(span - self.phases_s, 0.0)
        return (
            f"petlprof: {self.runs} run(s) in {span:,.1f} s from the first start to the last record stored "
            f"(measured, monotonic clock); {outside:,.1f} s of it, {outside / self.runs:,.1f} s a run, outside "
            "their measured phases: process starts, imports, loading, warm-ups, writing and the gaps between runs"
        )
