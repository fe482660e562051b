"""The ``petlprof`` command: ``run`` a sweep, ``list`` what is available, ``report`` a result store.

Importing this module is cheap (no torch, no NVML); each sub-command imports what it needs.
A :class:`~petlprof.errors.UsageError` is printed as one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from petlprof import __version__
from petlprof.errors import UsageError


def _size_or_all(text: str):
    """A number of examples, or ``all`` (kept as the word, so that it is not mistaken for "not given")."""
    if text.lower() in ("all", "none"):
        return "all"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of examples or 'all', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="petlprof", description="Energy, memory and latency profiling of parameter-efficient fine-tuning methods."
    )
    parser.add_argument("--version", action="version", version=f"petlprof {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train and evaluate methods under the meters; write results and a report")
    run.add_argument("--methods", help="comma list of methods, e.g. read,lora (see `petlprof list`)")
    run.add_argument(
        "--backbone",
        help="minilm (offline default), tiny-bert|tiny-t5|tiny-gpt2|tiny-llama, "
        "a local model folder or a Hugging Face id; comma list for several",
    )
    run.add_argument(
        "--num-layers",
        type=int,
        help="keep only the first N layers of a pretrained backbone (a tiny-* preset is built with N layers)",
    )
    run.add_argument(
        "--task",
        help="tweets (offline default), a GLUE task (sst2, cola, ...), or a CSV/TSV/"
        "JSONL/Parquet file or folder of your own; comma list for several",
    )
    run.add_argument("--data-dir", help="local files for a GLUE task (same columns as the hub dataset)")
    run.add_argument("--text-column", help="text column of your own data (default: text/sentence)")
    run.add_argument("--text-pair-column", help="second text column of a pair task")
    run.add_argument("--label-column", help="label column of your own data (default: label)")
    run.add_argument("--seeds", help="comma list of seeds (default 0)")
    run.add_argument("--epochs", type=int, help="training epochs (default 1)")
    run.add_argument("--max-steps", type=int, help="train exactly N optimiser steps (overrides --epochs)")
    run.add_argument("--train-size", type=_size_or_all, help="training examples (default 2000; 'all')")
    run.add_argument("--eval-size", type=_size_or_all, help="evaluation examples (default 1000; 'all')")
    run.add_argument("--batch-size", type=int, help="batch size (default 32)")
    run.add_argument("--lr", type=float, help="learning rate for every method (default: each method's own)")
    run.add_argument("--max-length", type=int, help="truncate inputs to N tokens (default 64)")
    run.add_argument("--warmup-steps", type=int, help="steps per phase excluded from the figures (default 2)")
    run.add_argument(
        "--method-config",
        action="append",
        metavar="METHOD.FIELD=VALUE",
        help="a method hyper-parameter, e.g. lora.r=16 (repeatable)",
    )
    run.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    run.add_argument("--energy-meter", help="auto (default: best measured source, else estimate), nvml, rapl, estimate")
    run.add_argument(
        "--output",
        help="output folder (default petlprof-out/run-<time>); re-running into it skips runs already recorded",
    )
    run.add_argument(
        "--in-process",
        action="store_true",
        default=None,
        help="run everything in this process (debugging; memory figures then depend on run order)",
    )
    run.add_argument("--timeout", type=float, help="seconds a run may take before it is killed and recorded 'timeout'")
    run.add_argument(
        "--max-memory",
        help="memory a run may allocate beyond the runtime, e.g. 2GiB (CUDA: "
        "per-process fraction; CPU: address-space limit of the run's process); past it the run is 'oom'",
    )
    run.add_argument(
        "--executor",
        help="where runs execute: local (default: one after the other on this machine, "
        "a fresh process each) or ray (each run a Ray task on a cluster; pip install 'petlprof[ray]')",
    )
    run.add_argument(
        "--address",
        help="--executor ray: the cluster to join, e.g. auto or ray://head:10001 "
        "(default: RAY_ADDRESS, or a cluster `ray start` began on this machine, else a new local instance)",
    )
    run.add_argument(
        "--retries",
        type=int,
        help="--executor ray: times a run whose worker or node was lost is "
        "retried before it is recorded 'failed' (default 0)",
    )
    run.add_argument(
        "--cpus-per-run",
        type=float,
        help="--executor ray: CPUs each run's task asks for, per rank "
        "(default 1; each rank's OMP_NUM_THREADS is set to it)",
    )
    run.add_argument(
        "--nproc-per-run",
        type=int,
        help="data-parallel ranks of each run (torchrun semantics: one "
        "process per rank, one GPU each on CUDA; --batch-size stays the global batch). Default 1",
    )
    run.add_argument(
        "--cache-hidden-states",
        action="store_true",
        default=None,
        help="side-tuning methods (read, lst): keep the frozen backbone's hidden states after epoch 1, "
        "so later epochs run only the side network",
    )
    run.add_argument(
        "--cache-budget",
        help="memory for that cache, e.g. 2GiB (default 1GiB); past it the cache "
        "spills to a memory-mapped file in the output folder",
    )
    run.add_argument("--cache-dtype", help="precision of the cached states: float16 (default), bfloat16, float32")
    run.add_argument(
        "--grid",
        action="store_true",
        default=None,
        help="sweep each method's default grid of its Pareto knob (see `petlprof list`)",
    )
    run.add_argument(
        "--method-grid",
        action="append",
        metavar="METHOD.FIELD=V1,V2,...",
        help="values of a method hyper-parameter to sweep, e.g. lora.r=4,16,64 (repeatable; "
        "several fields of one method are crossed)",
    )
    run.add_argument(
        "--target-value",
        type=float,
        help="stop each run's training once the target metric reaches "
        "this value (time-to-accuracy), checked every --eval-every steps",
    )
    run.add_argument("--target-metric", help="metric of --target-value (default: the task's primary metric)")
    run.add_argument("--eval-every", type=int, help="optimiser steps between target checks (default 10)")
    run.add_argument(
        "--target-eval-size",
        type=_size_or_all,
        help="first N eval examples scored at each target check (default 200; 'all')",
    )
    run.add_argument("--max-train-time", type=float, help="stop each run's training after this many seconds")
    run.add_argument(
        "--meters",
        help="extra meters beside energy and memory, comma list: codecarbon (g CO2-eq), "
        "cpu-tensors (peak live CPU tensor bytes; slows the run). Off by default",
    )
    run.add_argument("--country-code", help="ISO alpha-3 country for codecarbon's carbon intensity (default USA)")
    run.add_argument(
        "--memory-snapshot",
        action="store_true",
        default=None,
        help="CUDA: dump a memory snapshot of each phase into <output>/memory-snapshots "
        "(open it at https://pytorch.org/memory_viz)",
    )
    run.add_argument(
        "--inference-window-s",
        type=float,
        help="seconds the inference phase repeats each batch "
        "size for (default 5 with a measured energy meter, 0.5 with the estimate)",
    )
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
    return parser


class StoreWriteError(Exception):
    """The results file could not be written; the message has already been printed."""


class Terminated(BaseException):
    """Raised in the sweep process by SIGTERM, so the run in flight is stopped and recorded
    (a BaseException, like KeyboardInterrupt, so no ``except Exception`` in a run swallows it)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def cmd_run(args: argparse.Namespace) -> int:
    from petlprof.config import (
        build_options,
        default_output_dir,
        load_config_file,
        parse_bytes,
        parse_method_grids,
        parse_method_overrides,
    )

    cli_values = {k: v for k, v in vars(args).items() if k not in ("command", "config", "debug")}
    cli_values["method_config"] = parse_method_overrides(args.method_config) if args.method_config else None
    cli_values["method_grid"] = parse_method_grids(args.method_grid) if args.method_grid else None
    file_values = load_config_file(args.config) if args.config else {}
    options = build_options(file_values, cli_values)
    out_dir = Path(options.output) if options.output else default_output_dir()
    max_memory = parse_bytes(options.max_memory)

    from petlprof.config import preflight, resolve_device
    from petlprof.executors import make_executor
    from petlprof.store import StoreLock, check_writable

    # every check of the input and the output folder before an executor starts: a bad data path or
    # a folder another sweep holds is one error line, not a Ray start-up followed by one
    local = options.executor == "local"
    for note in preflight(options, meters_here=local):
        print(f"petlprof: note: {note}", file=sys.stderr)
    # a local device is checked here, so a bad --device leaves no output folder; a cluster's needs Ray
    device = (
        resolve_device(options.device, options.nproc_per_run, memory_snapshot=options.memory_snapshot)
        if local
        else None
    )
    check_writable(out_dir)
    with StoreLock(out_dir) as lock:
        if lock.taken_over is not None:
            print(f"petlprof: took over the lock of a petlprof run that is gone ({lock.taken_over})", file=sys.stderr)
        executor = make_executor(
            options.executor,
            address=options.address,
            in_process=options.in_process,
            timeout_s=options.timeout,
            max_memory_bytes=max_memory,
            retries=options.retries,
            cpus_per_run=options.cpus_per_run,
        )
        try:
            return _run_sweep(options, executor, out_dir, device)
        finally:
            executor.close()


def _run_sweep(options, executor, out_dir: Path, device: str | None) -> int:
    """The sweep, with ``out_dir`` locked: the device (``None``: check it against the Ray cluster's,
    as a driver may have no GPU of its own), the runs not yet recorded, each record as it finishes."""
    from petlprof.config import expand, resolve_device
    from petlprof.store import RESULTS_FILE, finished_keys

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
    print(
        f"petlprof: {len(specs)} run(s) on {device}; {len(specs) - len(todo)} already in {store}; "
        f"writing to {out_dir}; runs execute on {executor.describe()}",
        file=sys.stderr,
    )
    if todo:  # idle power before the first run, for each run's energy above idle
        print(f"petlprof: {executor.prepare_idle(device, options.energy_meter)}", file=sys.stderr)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        failed = _sweep(todo, store, executor, done=len(specs) - len(todo), total=len(specs))
    except StoreWriteError:
        return 1
    except (KeyboardInterrupt, Terminated) as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else 143
        print(
            f"\npetlprof: interrupted; finished runs are in {store}. Resume with the same command "
            f"(with --output {out_dir}): recorded runs are skipped.",
            file=sys.stderr,
        )
        return code
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    _finish(store, out_dir)
    return 1 if failed else 0


def _progress(spec, position: int, total: int, started: float, finished: int) -> str:
    """``[7/24] lora r=8 on minilm / tweets, seed 1 (elapsed 3m10s, about 8m left)``."""
    import time

    from petlprof.registry import get_method

    knob = get_method(spec.method).pareto_knob
    point = f" {knob}={spec.method_config.get(knob)}" if knob else ""
    line = f"[{position}/{total}] {spec.method}{point} on {spec.backbone} / {spec.task}, seed {spec.seed}"
    if finished:
        elapsed = time.monotonic() - started
        left = elapsed / finished * (total - position + 1)
        line += f" (elapsed {elapsed // 60:.0f}m{elapsed % 60:02.0f}s, about {left // 60:.0f}m{left % 60:02.0f}s left)"
    return line


def _sweep(todo, store, executor, done: int = 0, total: int | None = None) -> int:
    """Run ``todo`` on ``executor``, appending each record as it comes back; ``done`` runs of
    ``total`` were recorded before (a resumed sweep), so progress counts the whole sweep.  On an
    interrupt the runs in flight are recorded ``cancelled`` and stopped."""
    import time

    from petlprof.runner import cancelled_record, release_signals
    from petlprof.store import append_record

    failed, finished, started, total = 0, 0, time.monotonic(), total if total is not None else len(todo)
    position = iter(range(done + 1, total + 1))

    def on_start(spec) -> None:
        print(_progress(spec, next(position), total, started, finished), file=sys.stderr)

    try:
        for spec, record in executor.results(todo, on_start=on_start):
            try:
                append_record(store, record)
            except OSError as exc:  # disk full, folder removed, ...: say so, and keep the result on the terminal
                print(
                    f"petlprof: error: could not write to {store}: {exc.strerror or exc}. Runs recorded before "
                    f"are intact; this run's record follows so it is not lost:\n{json.dumps(record, default=str)}",
                    file=sys.stderr,
                )
                raise StoreWriteError() from None
            finally:
                release_signals()  # a signal held while the finished run was stored is delivered now
            finished += 1
            if record["status"] != "ok":
                failed += 1
                print(f"  {spec.method} seed {spec.seed} {record['status']}: {record['error']}", file=sys.stderr)
    except (KeyboardInterrupt, Terminated) as exc:
        name = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        in_flight = list(executor.in_flight)
        executor.cancel()
        for spec in in_flight:
            try:
                append_record(store, cancelled_record(spec, name))
            except OSError as error:
                print(f"petlprof: could not record the cancelled run in {store}: {error}", file=sys.stderr)
        raise
    return failed


def _finish(store: Path, out_dir: Path) -> None:
    from petlprof.report import load_records, write_report

    skipped: list[str] = []
    records = load_records([store], skipped)
    _print_summary(records, skipped)
    for path in write_report(records, out_dir):
        print(f"wrote {path}", file=sys.stderr)
    print(f"wrote {store}", file=sys.stderr)


def cmd_list(args: argparse.Namespace) -> int:
    from petlprof.backbones import BACKBONES
    from petlprof.meters import meter_status
    from petlprof.registry import config_field_help, get_method, method_names
    from petlprof.tasks import TASKS

    print("Methods (name: what trains; Pareto knob; default learning rate; options for --method-config):")
    for name in method_names():
        spec = get_method(name)
        knob = f"knob {spec.pareto_knob}" if spec.pareto_knob else "no knob"
        if spec.default_grid:
            knob += f" (grid {', '.join(str(v) for v in spec.default_grid)})"
        side = "; side-tuning (no backbone autograd)" if spec.side_tuning else ""
        print(f"  {name:<13} {spec.description}; {knob}; lr {spec.default_lr:g}{side}")
        for field_name, default, text in config_field_help(spec.config_cls):
            print(f"  {'':<15}{name}.{field_name}={default}  {text}")
    print("\nTasks:")
    for name, text in TASKS.items():
        print(f"  {name:<10} {text}")
    print("  <path>     your own CSV/TSV/JSONL/Parquet file or folder of train/validation files")
    print("\nBackbones:")
    for name, text in BACKBONES.items():
        print(f"  {name:<10} {text}")
    print("  <path|id>  a local model folder or a Hugging Face id (encoder, encoder-decoder or decoder)")
    print("\nMeters on this machine:")
    for name, ok, why, what in meter_status():
        print(f"  {name:<15} {'available' if ok else 'unavailable':<11} {what}\n  {'':<27}({why})")
    return 0


def cmd_meters(args: argparse.Namespace) -> int:
    if args.json and not args.check:
        raise UsageError("--json prints the results of --check; add --check")
    if args.check:
        from petlprof.meters.check import main as check_main

        return check_main(as_json=args.json)
    from petlprof.meters import meter_status
    from petlprof.meters.devices.nvml import gpu_details

    print("Meters on this machine (name, status, what it gives, and why it is or is not usable):")
    for name, ok, why, what in meter_status():
        print(f"  {name:<15} {'available' if ok else 'unavailable':<11} {what}\n  {'':<27}({why})")
    for line in gpu_details():
        print(f"  {'':<27}{line}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from petlprof.report import load_records, write_report

    paths = [Path(d) for d in args.dirs]
    skipped: list[str] = []
    records = load_records(paths, skipped)
    if not records:
        why = f" ({len(skipped)} unusable line(s) skipped, e.g. {skipped[0]})" if skipped else ""
        raise UsageError(f"no result records in {', '.join(repr(str(p)) for p in paths)}{why}; nothing to report")
    first = paths[0] if paths[0].is_dir() else paths[0].parent
    out_dir = Path(args.output) if args.output else first
    _print_summary(records, skipped)
    for path in write_report(records, out_dir):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _print_summary(records: list[dict], skipped: list[str]) -> None:
    from petlprof.report import run_warnings, summary_table

    if skipped:
        print(f"petlprof: skipped {len(skipped)} unusable line(s) of the results:", file=sys.stderr)
        for line in skipped[:10]:
            print(f"  {line}", file=sys.stderr)
    print(summary_table(records, fmt="text"))
    estimated = {
        r["train"].get("energy_model")
        for r in records
        if isinstance(r.get("train"), dict) and r["train"].get("energy_kind") == "estimated"
    }
    for model in sorted(m for m in estimated if m):
        print(f"energy marked 'estimated' is a model, not a measurement: {model}")
    for warning in run_warnings(records):
        print(f"warning: {warning}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"run": cmd_run, "list": cmd_list, "meters": cmd_meters, "report": cmd_report}[args.command]
    try:
        return handler(args)
    except UsageError as exc:
        if args.debug:
            raise
        print(f"petlprof: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
