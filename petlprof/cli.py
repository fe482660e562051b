"""The ``petlprof`` command: ``run`` a sweep, ``list`` what is available, ``report`` a result store.

Importing this module is cheap (no torch, no NVML): ``petlprof --help`` imports only the parser's
declarations, and each sub-command imports what it needs inside its function (each such import says why).
A :class:`~petlprof.errors.UsageError` is printed as one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from petlprof import __version__
from petlprof.errors import UsageError, printable
from petlprof.estimate.command import add_estimate_parser, cmd_estimate
from petlprof.report.intervals import DEFAULT_INTERVAL, INTERVALS
from petlprof.sweep.options import add_run_arguments
from petlprof.values import check_file
from petlprof.vocabulary import LOCAL


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="petlprof", description="Energy, memory and latency profiling of parameter-efficient fine-tuning methods."
    )
    parser.add_argument("--version", action="version", version=f"petlprof {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train and evaluate methods under the meters; write results and a report")
    add_run_arguments(run)
    run.add_argument(
        "--config",
        help="TOML or YAML file with the same options (underscores for dashes), "
        "including a sweep: [method_grid.<method>] tables of value lists",
    )

    sub.add_parser("list", help="show methods, tasks, backbones and meters (and whether each meter works here)")
    meters = sub.add_parser("meters", help="show which meters work on this machine, and why not")
    meters.add_argument(
        "--check",
        action="store_true",
        help="self-test every meter that works here: update rates, timer resolution, counter vs integrated "
        "energy, spread of short windows, idle power, memory against a known allocation (pass/warn/fail; "
        "under a minute on CPU, a few minutes on a GPU; exit code 1 if a check fails)",
    )
    meters.add_argument("--json", action="store_true", help="with --check: print the results as JSON")

    report = sub.add_parser(
        "report",
        help="Pareto plots (PNG, SVG), report.md and a self-contained report.html from one or more results.jsonl files",
    )
    report.add_argument("dirs", nargs="+", help="output folders (or results.jsonl files)")
    report.add_argument("--output", help="where to write the report (default: the first folder)")
    report.add_argument(
        "--interval",
        choices=list(INTERVALS),
        default=DEFAULT_INTERVAL,
        help=(
            "what the plots' error bars show: "
            + "; ".join(f"{kind}: {what}" for kind, what in INTERVALS.items())
            + f" (default {DEFAULT_INTERVAL}; petlprof run's report uses the default)"
        ).replace("%", "%%"),  # argparse formats help with %
    )
    add_estimate_parser(sub)
    return parser


class StoreWriteError(Exception):
    """The results file could not be written; the message has already been printed."""


class Terminated(BaseException):
    """Raised in the sweep process by SIGTERM, so the run in flight is stopped and recorded
    (a BaseException, like KeyboardInterrupt, so no ``except Exception`` in a run swallows it)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def cmd_run(args: argparse.Namespace) -> int:
    # not for --help: the options' checks (the registry's entry points), the executors and the store's lock
    from petlprof.execution.executors import make_executor
    from petlprof.results.store import StoreLock, check_writable
    from petlprof.sweep.config import (
        build_options,
        default_output_dir,
        load_config_file,
        parse_method_grids,
        parse_method_overrides,
        preflight,
        resolve_device,
    )
    from petlprof.values import parse_bytes

    cli_values = {k: v for k, v in vars(args).items() if k not in ("command", "config", "debug")}
    cli_values["method_config"] = parse_method_overrides(args.method_config) if args.method_config else None
    cli_values["method_grid"] = parse_method_grids(args.method_grid) if args.method_grid else None
    file_values = load_config_file(args.config) if args.config else {}
    options = build_options(file_values, cli_values)
    out_dir = Path(options.output) if options.output else default_output_dir()
    max_memory = parse_bytes(options.max_memory)

    def make():
        return make_executor(
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
    executor = make() if local and _cpu_sweep_likely(options, out_dir) else None
    try:
        if executor is not None:
            executor.prestart()
        for note in preflight(options, meters_here=local):
            _say(f"petlprof: note: {note}")
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
            if lock.taken_over is not None:
                _say(f"petlprof: took over the lock of a petlprof run that is gone ({lock.taken_over})")
            if executor is None:
                executor = make()
            return _run_sweep(options, executor, out_dir, device)
    finally:
        if executor is not None:
            executor.close()


NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present where NVIDIA's kernel driver is loaded


def _cpu_sweep_likely(options, out_dir: Path) -> bool:
    """Whether a local sweep will fork CPU runs from a warm worker, told without importing torch: one process
    per run, ``--device cpu`` (or ``auto`` on a machine without NVIDIA's driver), and no other sweep holding
    ``out_dir``.  Its worker then starts before the checks; where this guesses wrong, the worker is killed
    unused (seconds of imports beside whatever else runs)."""
    from petlprof.results.store import lock_held  # not for --help: as in cmd_run

    if options.nproc_per_run != 1 or options.device not in ("auto", "cpu"):
        return False
    if options.device == "auto" and NVIDIA_DRIVER.exists():
        return False
    return not lock_held(out_dir)


def _run_sweep(options, executor, out_dir: Path, device: str | None) -> int:
    """The sweep, with ``out_dir`` locked: the device (``None``: check it against the Ray cluster's,
    as a driver may have no GPU of its own), the runs not yet recorded, each record as it finishes."""
    # kept out of petlprof --help's imports
    from petlprof.results.store import RESULTS_FILE, finished_keys
    from petlprof.sweep.config import expand, resolve_device, unsupported_pairs  # not for --help: as in cmd_run

    if device is None:
        device = resolve_device(
            options.device, options.nproc_per_run, executor.cluster_gpus(), memory_snapshot=options.memory_snapshot
        )
    specs = expand(options, device)
    for spec in specs:  # a cache that outgrows its budget spills next to the results
        spec.cache_dir = str(out_dir / "cache") if spec.cache_hidden_states else None
        spec.memory_snapshot_dir = str(out_dir / "memory-snapshots") if options.memory_snapshot else None
    store = out_dir / RESULTS_FILE
    done = finished_keys(store)
    todo = [s for s in specs if s.run_key not in done]
    _say(
        f"petlprof: {len(specs)} run(s) on {device}; {len(specs) - len(todo)} already in {store}; "
        f"writing to {out_dir}; runs execute on {executor.describe()}"
    )
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        if todo:  # idle power before the first run (after the warm worker's imports), for energy above idle
            _say(f"petlprof: {executor.prepare_idle(device, options.energy_meter)}")
        failed = _sweep(todo, store, executor, done=len(specs) - len(todo), total=len(specs))
    except StoreWriteError:
        return 1
    except (KeyboardInterrupt, Terminated) as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else 143
        print(file=sys.stderr)
        _say(
            f"petlprof: interrupted; finished runs are in {store}. Resume with the same command "
            f"(with --output {out_dir}): recorded runs are skipped."
        )
        return code
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    _finish(store, out_dir)
    for pair in unsupported_pairs(options) if options.skip_unsupported else ():  # left out before any run
        _say(f"petlprof: skipped (--skip-unsupported): {pair}")
    return 1 if failed else 0


def _say(line: str) -> None:
    """A status line on stderr, with the control characters of the values it echoes escaped."""
    print(printable(line), file=sys.stderr)


def _progress(spec, position: int, total: int, started: float, finished: int) -> str:
    """``[7/24] lora r=8 on minilm / tweets, seed 1 (elapsed 3m10s, about 8m left)``."""
    from petlprof.registry import get_method  # not for --help: it reads the installed plug-ins' entry points

    method = get_method(spec.method)
    point = f" {method.pareto_knob}={spec.method_config.get(method.pareto_knob)}" if method.pareto_knob else ""
    line = f"[{position}/{total}] {method.name}{point} on {spec.backbone} / {spec.task}, seed {spec.seed}"
    if finished:
        elapsed = time.monotonic() - started
        left = elapsed / finished * (total - position + 1)
        line += f" (elapsed {elapsed // 60:.0f}m{elapsed % 60:02.0f}s, about {left // 60:.0f}m{left % 60:02.0f}s left)"
    return line


def _sweep(todo, store, executor, done: int = 0, total: int | None = None) -> int:
    """Run ``todo`` on ``executor``, appending each record as it comes back; ``done`` runs of
    ``total`` were recorded before (a resumed sweep), so progress counts the whole sweep.  On an
    interrupt the runs in flight are recorded ``cancelled`` and stopped."""
    # kept out of petlprof --help's imports
    from petlprof.execution.child import release_signals  # not for --help: a run's whole machinery
    from petlprof.results.store import append_record
    from petlprof.run.execute import cancelled_record

    failed, finished, started, total = 0, 0, time.monotonic(), total if total is not None else len(todo)
    position = iter(range(done + 1, total + 1))
    span = _Span()

    def on_start(spec) -> None:
        span.start()
        _say(_progress(spec, next(position), total, started, finished))

    try:
        for spec, record in executor.results(todo, on_start=on_start):
            try:
                append_record(store, record)
            except OSError as exc:  # disk full, folder removed, ...: say so, and keep the result on the terminal
                _say(
                    f"petlprof: error: could not write to {store}: {exc.strerror or exc}. Runs recorded before "
                    "are intact; this run's record follows so it is not lost:"
                )
                print(json.dumps(record, default=str), file=sys.stderr)
                raise StoreWriteError() from None
            finally:
                release_signals()  # a signal held while the finished run was stored is delivered now
            finished += 1
            span.end(record)
            if record["status"] != "ok":
                failed += 1
                _say(f"  {spec.method} seed {spec.seed} {record['status']}: {record['error']}")
    except (KeyboardInterrupt, Terminated) as exc:
        name = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        in_flight = list(executor.in_flight)
        executor.cancel()
        for spec in in_flight:
            try:
                append_record(store, cancelled_record(spec, name))
            except OSError as error:
                _say(f"petlprof: could not record the cancelled run in {store}: {error}")
        raise
    # local runs go one after another, so the span less their phases is the harness's (Ray's overlap)
    if getattr(executor, "name", "") == LOCAL and (line := span.line()):
        _say(line)
    return failed


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
        # not for --help: the records bring the statistics module
        from petlprof.results.records import measured_phases_s

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


def _finish(store: Path, out_dir: Path) -> None:
    from petlprof.report import load_records, write_report  # not for --help: pandas and matplotlib

    skipped: list[str] = []
    records = load_records([store], skipped)
    _print_summary(records, skipped)
    for path in write_report(records, out_dir):
        _say(f"wrote {path}")
    _say(f"wrote {store}")


def cmd_list(args: argparse.Namespace) -> int:
    # not for --help: the meters probe NVML and RAPL, the tasks bring numpy, the registry reads entry points
    from petlprof.meters import meter_status
    from petlprof.method_api import PEFT_PREFIX
    from petlprof.models.backbones import BACKBONES
    from petlprof.models.shapes import shape_names
    from petlprof.registry import config_field_help, get_method, method_names
    from petlprof.tasks.labelled import TASKS

    print("Methods (name: what trains; Pareto knob; default learning rate; objectives; options for --method-config):")
    for name in method_names():
        method = get_method(name)
        knob = f"knob {method.pareto_knob}" if method.pareto_knob else "no knob"
        if method.default_grid:
            knob += f" (grid {', '.join(str(v) for v in method.default_grid)})"
        side = "; side-tuning (no backbone autograd)" if method.side_tuning else ""
        objectives = "+".join(method.objectives)
        print(f"  {name:<13} {method.description}; {knob}; lr {method.default_lr:g}; {objectives}{side}")
        for field_name, default, text in config_field_help(method.config_cls):
            print(f"  {'':<15}{name}.{field_name}={default}  {text}")
    # not the names themselves: they come from PEFT's registry, seconds of imports for one line
    print(
        f"  {PEFT_PREFIX + 'TYPE':<13} PEFT's tuners by their PeftType in lower case ({PEFT_PREFIX}vera, "
        f"{PEFT_PREFIX}loha, ...; {PEFT_PREFIX}dora is LoRA with use_dora); options under the PEFT config's own "
        f"field names (--method-config {PEFT_PREFIX}vera.r=256); an unknown {PEFT_PREFIX}TYPE is refused with "
        "the list of all, and one that cannot adapt the backbone with the reason"
    )
    print("\nTasks:")
    for name, text in TASKS.items():
        print(f"  {name:<10} {text}")
    print("  <path>     your own CSV/TSV/JSONL/Parquet file or folder of train/validation files")
    print("\nBackbones:")
    for name, text in BACKBONES.items():
        print(f"  {name:<10} {text}")
    print("  <path|id>  a local model folder or a Hugging Face id (encoder, encoder-decoder or decoder)")
    print(
        "\nModel shapes (configs without weights: `petlprof estimate --backbone NAME`, or `petlprof run --backbone "
        "NAME --random-init` for a cost-only run):"
    )
    print(textwrap.fill(", ".join(shape_names()), width=100, initial_indent="  ", subsequent_indent="  "))
    print("\nMeters on this machine:")
    for name, ok, why, what in meter_status():
        print(f"  {name:<15} {'available' if ok else 'unavailable':<11} {what}\n  {'':<27}({why})")
    return 0


def cmd_meters(args: argparse.Namespace) -> int:
    if args.json and not args.check:
        raise UsageError("--json prints the results of --check; add --check")
    if args.check:
        from petlprof.meters.check import main as check_main  # not for --help: torch

        return check_main(as_json=args.json)
    # not for --help: the meters probe NVML and RAPL
    from petlprof.meters import meter_status
    from petlprof.meters.devices.nvml import gpu_details

    print("Meters on this machine (name, status, what it gives, and why it is or is not usable):")
    for name, ok, why, what in meter_status():
        print(f"  {name:<15} {'available' if ok else 'unavailable':<11} {what}\n  {'':<27}({why})")
    for line in gpu_details():
        print(f"  {'':<27}{line}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    # not for --help: the report brings pandas and matplotlib, the store (its records) the statistics module
    from petlprof.report import load_records, write_report
    from petlprof.results.store import check_writable

    paths = [Path(d) for d in args.dirs]
    for path in paths:
        check_file(path, "results", folder=True)  # a FIFO would be read forever
    skipped: list[str] = []
    records = load_records(paths, skipped)
    if not records:
        why = f" ({len(skipped)} unusable line(s) skipped, e.g. {skipped[0]})" if skipped else ""
        raise UsageError(f"no result records in {', '.join(repr(str(p)) for p in paths)}{why}; nothing to report")
    first = paths[0] if paths[0].is_dir() else paths[0].parent
    out_dir = Path(args.output) if args.output else first
    check_writable(out_dir)  # before the summary: a folder that cannot take the report is one line
    _print_summary(records, skipped)
    for path in write_report(records, out_dir, interval=args.interval):
        _say(f"wrote {path}")
    return 0


def _print_summary(records: Sequence[Mapping[str, Any]], skipped: list[str]) -> None:
    # not for --help: the records bring the statistics module, the report pandas and matplotlib
    from petlprof.report import run_warnings, summary_table
    from petlprof.results.records import overhead_line

    if skipped:
        _say(f"petlprof: skipped {len(skipped)} unusable line(s) of the results:")
        for line in skipped[:10]:
            _say(f"  {line}")
    print(summary_table(records, fmt="text"))
    estimated = {
        r["train"].get("energy_model")
        for r in records
        if isinstance(r.get("train"), dict) and r["train"].get("energy_kind") == "estimated"
    }
    for model in sorted(m for m in estimated if m):
        print(f"energy marked 'estimated' is a model, not a measurement: {model}")
    if overhead := overhead_line(records):
        print(overhead)
    for warning in _grouped(run_warnings(records)):
        print(printable(f"warning: {warning}"))


def _grouped(warnings: list[str], examples: int = 3) -> list[str]:
    """``<run>, seed N, <phase>: <text>`` lines, one per distinct text: a text that many runs or phases
    share (a warm-up too long for short phases) is said once, with how many and the first few."""
    by_text: dict[str, list[str]] = {}
    for line in warnings:
        where, _, text = line.partition(": ")
        by_text.setdefault(text or where, []).append(where if text else "")
    out = []
    for text, places in by_text.items():
        if len(places) == 1:
            out.append(f"{places[0]}: {text}" if places[0] else text)
            continue
        more = f", ... ({len(places) - examples} more)" if len(places) > examples else ""
        out.append(f"{text} [{len(places)} phases: {'; '.join(places[:examples])}{more}]")
    return out


MAX_ERROR_CHARS = 2000  # an error line is cut here, whatever value it echoes


def _quiet_libraries() -> None:
    """Transformers' per-run "Loading weights" bars (HF_HUB_DISABLE_PROGRESS_BARS, passed on to each
    run's process; a user who sets it keeps theirs) and its FutureWarnings about its own API (the
    user cannot act on them); every other warning stays."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"run": cmd_run, "list": cmd_list, "meters": cmd_meters, "report": cmd_report, "estimate": cmd_estimate}
    handler = handlers[args.command]
    _quiet_libraries()
    try:
        return handler(args)
    except UsageError as exc:
        if args.debug:
            raise
        line = printable(" ".join(str(exc).split()))
        if len(line) > MAX_ERROR_CHARS:
            line = f"{line[:MAX_ERROR_CHARS]}... ({len(line)} characters)"
        print(f"petlprof: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
