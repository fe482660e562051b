"""The ``petlprof`` command: ``run`` a sweep, ``list`` what is available, ``report`` a result store.

Importing this module is cheap (no torch, no NVML): ``petlprof --help`` imports only the parser's
declarations, and each sub-command imports what it needs inside its function (each such import says why).
A :class:`~petlprof.errors.UsageError` is printed as one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from petlprof import __version__
from petlprof.errors import UsageError, printable, say
from petlprof.estimate.command import add_estimate_parser, cmd_estimate
from petlprof.estimate.plan import add_plan_parser, make_plan, show_plan
from petlprof.execution.process import exit_now
from petlprof.execution.warm import fork_warm_workers_from_this_process
from petlprof.report.intervals import DEFAULT_INTERVAL, INTERVALS
from petlprof.sweep.options import add_run_arguments
from petlprof.values import check_file

if TYPE_CHECKING:
    pass


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
    report.add_argument(
        "--country-code",
        help="grams of CO2e at this country's grid intensity (ISO 3166 alpha-3, e.g. FRA), from CodeCarbon's table",
    )
    report.add_argument("--carbon-intensity", help="grams of CO2e at this grid intensity, in g CO2e per kWh")
    report.add_argument("--price-per-kwh", help="the price of a kWh, in any currency: the energy's cost in it")
    calibrate = sub.add_parser(
        "calibrate",
        help="measure this machine's device for `petlprof estimate`'s time and energy predictions: matrix "
        "throughput, memory bandwidth, the cost of a kernel and of a random number, busy and idle power "
        "(about 17 s on a CPU)",
    )
    calibrate.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    add_estimate_parser(sub)
    add_plan_parser(sub)
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    # not for --help: the options' checks (the registry's entry points), the sweep's executors and store
    from petlprof.api import estimated_peak, predictions_of
    from petlprof.execution.sweep import drive
    from petlprof.report.terminal import report_sweep
    from petlprof.sweep.config import build_options, load_config_file, parse_method_grids, parse_method_overrides

    cli_values = {k: v for k, v in vars(args).items() if k not in ("command", "config", "debug")}
    cli_values["method_config"] = parse_method_overrides(args.method_config) if args.method_config else None
    cli_values["method_grid"] = parse_method_grids(args.method_grid) if args.method_grid else None
    file_values = load_config_file(args.config) if args.config else {}
    options = build_options(file_values, cli_values)
    return drive(options, finish=report_sweep, peak=estimated_peak, predict=predictions_of(options)).exit_code


def _lr_text(method) -> str:
    """A method's default learning rate for ``petlprof list``, with the space ``--tune lr`` searches around it; one
    per objective where the LM objective's differs."""
    # the tuning module: as cmd_list's imports, not for --help
    from petlprof.sweep.options import DEFAULT_TUNE_POINTS
    from petlprof.sweep.tuning import lr_space
    from petlprof.vocabulary import CLASSIFICATION, LM

    if not method.default_lr:
        return "lr 0"
    shown = [CLASSIFICATION, LM] if method.lr_for(LM)[0] != method.default_lr else [CLASSIFICATION]
    texts = []
    for objective in shown:
        lr = method.lr_for(objective)[0]
        space = lr_space(lr, DEFAULT_TUNE_POINTS)
        label = "lr" if len(shown) == 1 else f"lr ({objective})"
        texts.append(f"{label} {lr:g} (--tune lr: {space[0]:g}..{space[-1]:g})")
    return "; ".join(texts)


def cmd_list(args: argparse.Namespace) -> int:
    # not for --help: the meters probe NVML and RAPL, the tasks bring numpy, the registry reads entry points
    from petlprof.meters import meter_status
    from petlprof.method_api import PEFT_PREFIX
    from petlprof.models.backbones import BACKBONES
    from petlprof.models.shapes import shape_names
    from petlprof.registry import config_field_help, get_method, method_names
    from petlprof.sweep.options import DEFAULT_TUNE_POINTS, knob_target
    from petlprof.tasks.labelled import TASKS

    print("Methods (name: what trains; Pareto knob; default learning rate; objectives; options for --method-config):")
    for name in method_names():
        method = get_method(name)
        knob = f"knob {method.pareto_knob}" if method.pareto_knob else "no knob"
        if method.default_grid:
            knob += f" (grid {', '.join(str(v) for v in method.default_grid)}; --tune {knob_target(method)})"
        side = "; side-tuning (no backbone autograd)" if method.side_tuning else ""
        objectives = "+".join(method.objectives)
        print(f"  {name:<13} {method.description}; {knob}; {_lr_text(method)}; {objectives}{side}")
        for field_name, default, text in config_field_help(method.config_cls):
            print(f"  {'':<15}{name}.{field_name}={default}  {text}")
    # not the names themselves: they come from PEFT's registry, seconds of imports for one line
    print(
        f"  --tune lr searches {DEFAULT_TUNE_POINTS} learning rates (--tune-points) log-spaced over each method's "
        "default on the run's objective x 10^[-1, 1] by successive halving on the validation split; --tune "
        "METHOD.KNOB searches a method's knob over its grid (with lr too: over their product)"
    )
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
    for name, preset in BACKBONES.items():
        print(f"  {name:<10} {preset.description}")
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    device = str(args.device)
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise UsageError(f"--device {device!r} is not cpu, cuda or cuda:N")
    # not for --help: torch and the meters
    from petlprof.estimate.calibrate import calibrate
    from petlprof.estimate.profiles import save_profile

    if device.startswith("cuda"):
        import torch  # not for --help: slow to import

        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: torch sees no CUDA device here")
    say(
        f"petlprof: calibrating {device} (measured: matrix products, copies, tiny kernels, random numbers, the "
        "optimiser, fresh memory, power busy and idle)"
    )
    profile = calibrate(device)
    model = profile["model"]
    for dtype, flops in model["flops_per_s"].items():
        say(f"  matrix throughput ({dtype}): {flops / 1e9:,.1f} GFLOP/s (measured)")
    say(f"  memory bandwidth: {model['bytes_per_s'] / 1e9:,.2f} GB/s (measured, copies)")
    say(f"  cost of a kernel: {model['kernel_overhead_s'] * 1e6:,.1f} us (measured, tiny additions)")
    say(f"  cost of a random number: {model['random_s_per_number'] * 1e9:,.2f} ns (measured, a dropout mask's draws)")
    (small, small_s), (large, large_s) = model["optimizer_s"][0], model["optimizer_s"][-1]
    say(
        f"  optimiser (gradient clipping + an AdamW step): {small_s * 1e6:,.1f} us a tensor of {small:,} elements, "
        f"{large_s / large * 1e9:,.2f} ns an element at {large:,} (measured)"
    )
    if device == "cpu":
        say(
            f"  cost of fresh memory: {model['fresh_s_per_byte'] * 2**20 * 1e3:,.2f} ms a MiB first written, beyond "
            "the write (measured; allocations of 32 MiB or more are mapped anew each time)"
        )
    power_kind = "estimated" if model["power_source"] == "estimate" else "measured"
    say(
        f"  power busy / idle: {model['busy_w']:,.1f} W / {model['idle_w']:,.1f} W "
        f"({power_kind}, energy source {model['power_source']})"
    )
    say(f"wrote {save_profile(profile, device)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    # not for --help: the report brings pandas and matplotlib, the store (its records) the statistics module
    from petlprof.report import load_records, write_report
    from petlprof.report.terminal import print_summary
    from petlprof.results.store import check_writable
    from petlprof.results.units import energy_units

    units = energy_units(args.country_code, args.carbon_intensity, args.price_per_kwh)  # before reading anything
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
    print_summary(records, skipped)
    for path in write_report(records, out_dir, interval=args.interval, units=units):
        say(f"wrote {path}")
    return 0


def cmd_plan_and_verify(args: argparse.Namespace) -> int:
    """``petlprof plan``, then with ``--verify`` a pilot of each configuration and the plan corrected by them."""
    plan = make_plan(args)
    show_plan(plan)
    if not args.verify:
        return 0
    # the pilots' sweeps: the run's machinery, loaded only when asked for
    from petlprof.pilot import verify

    return verify(args, plan)


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
    handlers = {
        "run": cmd_run,
        "list": cmd_list,
        "meters": cmd_meters,
        "report": cmd_report,
        "estimate": cmd_estimate,
        "plan": cmd_plan_and_verify,
    }
    handlers["calibrate"] = cmd_calibrate
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


def entry() -> NoReturn:
    """The ``petlprof`` command: :func:`main`, then the end of the process without the interpreter's teardown
    (:func:`petlprof.execution.process.exit_now`: 1.3-1.6 s of CPU after a sweep or an estimate has imported torch).
    Its sweeps fork their warm worker from this process
    (:func:`~petlprof.execution.warm.fork_warm_workers_from_this_process`):
    the command's state is its own, so its runs may inherit it.  Ctrl-C outside a sweep's runs (its imports, its
    checks) is one line and exit code 130, not a traceback; a program calling :func:`main` gets the
    KeyboardInterrupt.  Ctrl-C and SIGTERM are unblocked first, as a run's worker does: a signal mask is inherited,
    and a command started with them blocked (seen under a test runner's worker) held a Ctrl-C until its run ended."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
    fork_warm_workers_from_this_process()
    try:
        code = main()
    except KeyboardInterrupt:  # outside a sweep's runs (which record it): while importing or checking the input
        print("petlprof: interrupted (Ctrl-C); every run recorded before it is kept", file=sys.stderr)
        code = 130
    exit_now(code)


if __name__ == "__main__":
    entry()
