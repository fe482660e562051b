"""``petlprof meters --check``: a self-test of the meters on the user's own machine.

For each meter that works here it measures what the meter reads and how often that really updates,
the timer's resolution, the spread of repeated short windows over the same work, idle power, and
the memory meters against an allocation of known size; on a GPU also the energy counter against
integrated power under a steady and a bursty load, and the allocator against NVML's process memory
(:mod:`petlprof.meters.check_gpu`).  Each check is one line with a value, a unit, a verdict
(``pass`` / ``warn`` / ``fail``) and why; ``--json`` prints the same as
``{"meters": [{"meter", "available", "detail", "checks": [{"name", "value", "unit", "verdict", "detail"}]}]}``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from petlprof.meters import meter_status
from petlprof.meters.base import Window
from petlprof.meters.carbon import CodecarbonMeter
from petlprof.meters.check_gpu import cuda_allocator_checks, nvml_checks
from petlprof.meters.contention import CONTENDED_SHARE, ContentionMeter
from petlprof.meters.cpu_power_model import EstimateEnergyMeter, cpu_power_per_core, estimate_model
from petlprof.meters.devices import rapl
from petlprof.meters.energy import NvmlEnergyMeter, RaplEnergyMeter
from petlprof.meters.idle import rapl_power_w
from petlprof.meters.memory import CpuMemoryMeter
from petlprof.meters.tensors import CpuTensorMeter
from petlprof.meters.verdicts import FAIL, KNOWN_BYTES, PASS, REPEATS, WARN, Check, MeterReport, graded
from petlprof.meters.zeus import zeus_checks
from petlprof.results.figures import CODECARBON_ENERGY_J, ENERGY, PEAK_MEMORY
from petlprof.vocabulary import ESTIMATED

SHORT_WINDOW_S = 0.25  # the repeated-window spread check
SPREAD_PASS, SPREAD_WARN = 0.05, 0.20  # coefficient of variation of repeated identical windows


def busy_cpu(seconds: float) -> None:
    """Fixed CPU work for about ``seconds`` (the same operations every call)."""
    deadline = time.perf_counter() + seconds
    block = np.arange(50_000.0)
    while time.perf_counter() < deadline:
        np.sqrt(block).sum()


def timer_checks() -> list[Check]:
    deltas = []
    for _ in range(20_000):
        t0 = time.perf_counter()
        t1 = time.perf_counter()
        if t1 > t0:
            deltas.append(t1 - t0)
    step = min(deltas) if deltas else None
    info = time.get_clock_info("perf_counter")
    verdict = FAIL if step is None else graded(step, 1e-6, 1e-3)
    return [
        Check(
            "timer resolution",
            step,
            "s",
            verdict,
            f"smallest step of perf_counter seen in 20000 back-to-back reads ({info.implementation}, "
            f"declared {info.resolution:g} s); window and step times rest on it",
        )
    ]


def update_period_s(read: Callable[[], Any], watch_s: float = 1.0, busy: bool = True) -> tuple[float | None, int]:
    """Median seconds between changes of ``read()`` over ``watch_s`` (while the CPU is busy, so an
    energy counter has something to count), and the number of changes seen."""
    changes, last = [], read()
    deadline = time.perf_counter() + watch_s
    block = np.arange(5_000.0)
    while time.perf_counter() < deadline:
        if busy:
            np.sqrt(block).sum()
        value = read()
        if value != last:
            changes.append(time.perf_counter())
            last = value
    gaps = np.diff(changes)
    return (float(statistics.median(gaps)) if len(gaps) else None), len(changes)


def spread_check(meter_factory: Callable[[], Any], what: str) -> Check:
    """Coefficient of variation of ``energy_j`` over :data:`REPEATS` windows of the same CPU work."""
    energies: list[float | None] = []
    for _ in range(REPEATS):
        meter = meter_factory()
        with Window([meter]) as window:
            busy_cpu(SHORT_WINDOW_S)
        meter.close()
        energies.append(window.reading.value(ENERGY))
    measured = [e for e in energies if e is not None]
    if len(measured) < len(energies) or not np.mean(measured):
        return Check("short-window spread", None, "cv", FAIL, f"a {what} window gave no energy: {energies}")
    cv = float(np.std(measured) / np.mean(measured))
    return Check(
        "short-window spread",
        round(cv, 4),
        "cv",
        graded(cv, SPREAD_PASS, SPREAD_WARN),
        f"{REPEATS} windows of {SHORT_WINDOW_S:g} s of the same CPU work: mean {np.mean(measured):.2f} J, "
        f"std/mean {cv:.1%} (pass < {SPREAD_PASS:.0%}, warn < {SPREAD_WARN:.0%}); the rest is noise of "
        "the machine and of the meter",
    )


def rapl_checks(root=rapl.POWERCAP) -> list[Check]:

    domains = rapl.domains(root)
    period, changes = update_period_s(lambda: rapl.read_uj(domains))
    checks = [
        Check(
            "counter update period",
            period,
            "s",
            PASS if period is not None and period < 0.1 else WARN,
            f"{', '.join(rapl.names(domains))} energy_uj changed {changes} times in 1 s of CPU work"
            + ("" if period is not None else ": it never changed, so windows read nothing"),
        ),
        spread_check(lambda: RaplEnergyMeter(root=root), "rapl"),
    ]
    idle_w = rapl_power_w(1.0, root)
    checks.append(
        Check(
            "idle power",
            round(idle_w, 2),
            "W",
            PASS if idle_w > 0 else FAIL,
            "CPU package + DRAM over 1 s of sleep (other processes on the machine count too)",
        )
    )
    return checks


def estimate_checks(why_not_measured: list[str]) -> list[Check]:

    model = estimate_model(cpu_power_per_core())
    resolution = time.get_clock_info("process_time").resolution
    measured = "; ".join(why_not_measured)
    return [
        Check(
            "energy source",
            ESTIMATED,
            None,
            WARN if why_not_measured else PASS,
            (f"no measured energy here ({measured}); " if why_not_measured else "")
            + f"energy figures are a model, not a measurement: {model}",
        ),
        Check(
            "cpu-time resolution",
            resolution,
            "s",
            graded(resolution, 1e-3, 2e-2),
            "declared resolution of process_time, which the estimate multiplies by a per-core power",
        ),
        spread_check(EstimateEnergyMeter, "estimate"),
    ]


def cpu_rss_checks() -> list[Check]:

    with Window([CpuMemoryMeter("cpu")]) as window:
        block = np.ones(KNOWN_BYTES // 8)
        block[::512] = 2.0  # every page touched
        del block
    peak = window.reading.value(PEAK_MEMORY)
    ratio = peak / KNOWN_BYTES
    return [
        Check(
            "known allocation",
            round(ratio, 3),
            "x",
            PASS if 0.95 <= ratio <= 1.3 else WARN if 0.8 <= ratio <= 2 else FAIL,
            f"peak {peak / 2**20:.1f} MiB for a {KNOWN_BYTES // 2**20} MiB numpy array allocated and freed "
            f"in the window ({window.reading.provenance[PEAK_MEMORY].source}; pass 0.95-1.3x)",
        )
    ]


def cpu_tensor_checks() -> list[Check]:
    # torch: slow to import, loaded only when used
    import torch

    size = 10_000_000
    with Window([CpuTensorMeter("cpu")]) as window:
        block = torch.ones(size)
        view = block.detach()
        del block  # still alive through its view
        second = torch.ones(size)
        del second, view
    peak, expected = window.reading["tensor_peak_new_bytes"], 2 * size * 4
    return [
        Check(
            "known allocation",
            peak,
            "bytes",
            PASS if peak == expected else FAIL,
            f"two {size * 4}-byte tensors, the first kept alive only by a detached view: the peak of new "
            f"tensor bytes must be exactly {expected}",
        )
    ]


def codecarbon_checks() -> list[Check]:

    with Window([CodecarbonMeter("cpu")]) as window:
        busy_cpu(1.0)
    energy = window.reading.value(CODECARBON_ENERGY_J)
    return [
        Check(
            "runs",
            None if energy is None else round(energy, 3),
            "J",
            PASS if energy is not None and energy >= 0 else FAIL,
            f"1 s of CPU work; CodeCarbon's own figure (tracking mode "
            f"{window.reading.get('codecarbon_tracking_mode')}), never petlprof's energy_j",
        )
    ]


def contention_checks() -> list[Check]:

    with Window([ContentionMeter()]) as quiet:
        time.sleep(0.5)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the hog is running before the window opens
        with Window([ContentionMeter()]) as loaded:
            time.sleep(1.0)
    finally:
        hog.kill()
        hog.wait()
    now, hogged = quiet.reading["others_cpu_cores"], loaded.reading["others_cpu_cores"]
    return [
        Check(
            "others now",
            None if now is None else round(now, 2),
            "cores",
            FAIL if now is None else WARN if quiet.reading["contended"] else PASS,
            f"other processes' CPU use over 0.5 s of this process sleeping; above {CONTENDED_SHARE:g} x the CPUs "
            "the windows of a run started now would be flagged contended",
        ),
        Check(
            "one busy process",
            None if hogged is None else round(hogged, 2),
            "cores",
            FAIL if hogged is None or not loaded.reading["contended"] else PASS if abs(hogged - 1.0) < 0.2 else WARN,
            "other processes' CPU use over 1 s while one process spins: flagged (else fail), about 1 core (pass "
            "within 0.2; more on a busy machine)",
        ),
    ]


def _zeus_checks(status: dict[str, tuple[bool, str]]) -> list[Check]:
    """Zeus against petlprof's own measured meter here (NVML where a GPU is, else RAPL), on the same window."""
    if status["nvml"][0]:
        return zeus_checks(NvmlEnergyMeter("cuda"))
    if status["rapl"][0]:
        return zeus_checks(RaplEnergyMeter())
    return [Check("agrees", None, None, WARN, "no measured petlprof meter here (NVML, RAPL) to compare Zeus with")]


def run_checks(progress: Callable[[str], None] = lambda name: None) -> list[MeterReport]:
    """Every meter, available or not, with the checks of those that work here."""
    status = {name: (ok, why) for name, ok, why, _ in meter_status()}
    # CPU runs fall back to the estimate without RAPL (GPU runs without NVML too): then it is what they get
    missing = [f"{name}: {status[name][1]}" for name in ("rapl", "nvml") if not status[name][0]]
    runners: dict[str, Callable[[], list[Check]]] = {
        "timer": timer_checks,
        "contention": contention_checks,
        "nvml": nvml_checks,
        "rapl": rapl_checks,
        "estimate": lambda: estimate_checks(missing if not status["rapl"][0] else []),
        "cuda-allocator": cuda_allocator_checks,
        "cpu-rss": cpu_rss_checks,
        "cpu-tensors": cpu_tensor_checks,
        "codecarbon": codecarbon_checks,
        "zeus": lambda: _zeus_checks(status),
    }
    reports = []
    for name, (ok, why) in status.items():
        report = MeterReport(name, ok, why)
        if ok and name in runners:
            progress(name)
            try:
                report.checks = runners[name]()
            except Exception as error:  # a check that cannot run is a failed check, not a crash
                report.checks = [Check("runs", None, None, FAIL, f"{type(error).__name__}: {error}")]
        reports.append(report)
    return reports


def as_json_text(reports: list[MeterReport]) -> str:
    return json.dumps({"meters": [dataclasses.asdict(r) for r in reports]}, indent=2)


def as_text(reports: list[MeterReport]) -> str:
    lines = []
    for report in reports:
        state = "available" if report.available else "unavailable"
        lines.append(f"{report.meter} ({state}: {report.detail})")
        for check in report.checks:
            value = (
                "-" if check.value is None else f"{check.value:.4g}" if isinstance(check.value, float) else check.value
            )
            unit = f" {check.unit}" if check.unit and check.value is not None else ""
            lines.append(f"  {check.verdict.upper():<4}  {check.name}: {value}{unit}  ({check.detail})")
    counts = {v: sum(c.verdict == v for r in reports for c in r.checks) for v in (PASS, WARN, FAIL)}
    lines.append(f"{counts[PASS]} pass, {counts[WARN]} warn, {counts[FAIL]} fail")
    return "\n".join(lines)


def failed(reports: list[MeterReport]) -> bool:
    return any(check.verdict == FAIL for report in reports for check in report.checks)


def main(as_json: bool = False) -> int:
    """``petlprof meters --check [--json]``: progress on stderr, results on stdout; 1 if a check failed."""
    reports = run_checks(lambda name: print(f"petlprof: checking {name} ...", file=sys.stderr, flush=True))
    print(as_json_text(reports) if as_json else as_text(reports))
    return 1 if failed(reports) else 0
