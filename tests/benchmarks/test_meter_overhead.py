"""What measuring costs the training it measures, in one process.

The issue's target is an overhead of at most 1 % of the training step time for the offline
default's meters (energy ``auto``, here the CPU-time estimate, plus the RSS peak).  Two independent
measurements, both printed and recorded as test properties:

1. **What the meters do, measured directly** (asserted against the 1 % target).  A meter can cost
   the window it measures in two ways only: work done when it starts and stops (``begin``/``end``,
   inside the window's timed span), and work done *during* the window (a polling thread in this
   process, or a separate sampler process competing for the cores).  The first is timed as the CPU
   time of opening and closing a window with nothing in it, per mode, over many repetitions; the
   second as this process's CPU time while a window sits idle, above the same with no meters.  Set
   against the measured step time (with the window conservatively covering only ``STEPS`` steps,
   where a real phase covers all of its steps) these give the overhead with no subtraction of two
   noisy timings.  The power sampler (GPU runs) does its work in its own process; its share of one
   core is read from ``/proc`` and bounded.  It costs training nothing while the host has a core to
   spare, which a GPU host has; on this 2-core machine it competes with training (see part 2).
2. **End to end** (a guard against gross regressions only).  Windows of ``STEPS`` BitFit training
   steps on the pretrained 2-layer MiniLM slice run in rounds, every mode once per round in a
   shuffled order — no meters, no meters again (an A/A control that shows this run's noise), the
   default, the default plus a power sampler process at ~100 Hz (what a GPU run adds, with a cheap
   stand-in power source), and every extra meter (``codecarbon``, ``cpu-tensors``) — and each metered
   window is compared with the unmetered window of the same round.  On this VM the CPU time of one
   identical training step varies by ±25 % from one window to the next, and the median of the
   paired ratios by about ±10 % from run to run (the A/A row shows this run's), so this part cannot
   check 1 %; it does catch a meter that
   makes training markedly slower by a route the direct measurement does not model.

Training runs on one intra-op thread here: with two threads on two shared cores the process's CPU
time includes OpenMP spin-waiting whose amount depends on whatever else the machine runs.
"""

from __future__ import annotations

import os
import statistics
import time
from functools import partial

import torch
from sensors import SteadyPowerSource

from petlprof.bench.profile import MethodStep, time_rounds
from petlprof.meters import Window, energy_meter_for, extra_meters_for, memory_meter_for
from petlprof.meters.memory import release_free_memory
from petlprof.meters.power import PowerTimeline

STEPS = 3
ROUNDS = 4  # medians here: ~2 % end to end against a 50 % guard, the sampler's ~1.5 % of a core against 10 %
TARGET_OVERHEAD = 0.01  # the target, checked on the direct measurement
# end to end: above the noise of shared cores (single steps vary by ±25 % there), below a meter that doubles the step
GROSS_OVERHEAD = 0.50
SAMPLER_CORE_LIMIT = 0.10  # a ~100 Hz sampler that needs a tenth of a core is doing something wrong
OPEN_CLOSE_REPEATS = 10
IDLE_WINDOW_S = 1.0
REAL = {"backbone": "minilm", "num_layers": 2, "batch_size": 16, "seq_len": 64}


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _meters(mode: str, device: str) -> list:
    if mode.startswith("off"):
        return []
    default = [energy_meter_for(device), memory_meter_for(device)]
    return default + extra_meters_for(["codecarbon", "cpu-tensors"], device) if mode == "all" else default


def _open_close_cpu_s(mode: str, device: str) -> float:
    """Median CPU seconds between a window's start of timing and the last meter's stop, empty window."""
    costs = []
    for _ in range(OPEN_CLOSE_REPEATS):
        meters = _meters(mode, device)
        for meter in meters:  # preparation happens before the window's timing starts, by design
            meter.prepare()
        cpu0 = time.process_time()
        for meter in meters:
            meter.begin()
        for meter in reversed(meters):
            meter.end()
        costs.append(time.process_time() - cpu0)
    return statistics.median(costs)


def _idle_cpu_rate(mode: str, device: str) -> float:
    """This process's CPU seconds per second while a window of ``mode`` sits idle."""
    with Window(_meters(mode, device), device):
        cpu0, t0 = time.process_time(), time.perf_counter()
        time.sleep(IDLE_WINDOW_S)
        rate = (time.process_time() - cpu0) / (time.perf_counter() - t0)
    return rate


def test_meter_overhead_on_training_steps(record_property):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        figures = _measure()
    finally:
        torch.set_num_threads(threads)
    print("\n" + "\n".join(f"{key}: {value:+.3f}" for key, value in figures.items()))
    for key, value in figures.items():
        record_property(key, value)
    assert figures["direct overhead default (%)"] <= TARGET_OVERHEAD * 100, figures
    assert figures["sampler process (% of one core)"] <= SAMPLER_CORE_LIMIT * 100, figures
    assert figures["end-to-end cpu overhead default (%)"] <= GROSS_OVERHEAD * 100, figures


def _measure() -> dict[str, float]:
    step = MethodStep("bitfit", **REAL)
    modes = ["off", "off again (A/A)", "default", "default+sampler", "all"]
    wall = {mode: [] for mode in modes}
    cpu = {mode: [] for mode in modes}
    sampler_core_fraction: list[float] = []

    def window_of(mode: str) -> None:
        timeline = PowerTimeline(SteadyPowerSource()).start() if mode == "default+sampler" else None
        release_free_memory()  # every mode starts from the same heap
        try:
            sampler0 = _cpu_s(timeline._proc.pid) if timeline else 0.0
            with Window(_meters(mode, step.device), step.device) as window:
                cpu0 = time.process_time()
                for _ in range(STEPS):
                    step.train_step()
                cpu[mode].append((time.process_time() - cpu0) / STEPS)
            if timeline is not None:  # read the window's samples as the nvml meter does
                sampler_core_fraction.append((_cpu_s(timeline._proc.pid) - sampler0) / window.time_s)
                end = time.perf_counter()
                assert timeline.window(end - window.time_s, end).samples > 0
        finally:
            if timeline is not None:
                timeline.stop()
        wall[mode].append(window.time_s / STEPS)

    time_rounds({mode: partial(window_of, mode) for mode in modes}, rounds=ROUNDS, warmup=1)
    for mode in modes:  # the round-by-round figures, without the warm-up's
        wall[mode][:], cpu[mode][:] = wall[mode][-ROUNDS:], cpu[mode][-ROUNDS:]

    figures: dict[str, float] = {}
    step_wall, step_cpu = statistics.median(wall["off"]), statistics.median(cpu["off"])
    figures["step wall, no meters (ms)"] = step_wall * 1000
    figures["step cpu, no meters (ms)"] = step_cpu * 1000
    figures["sampler process (% of one core)"] = statistics.median(sampler_core_fraction) * 100

    # 1. direct: start/stop work spread over the window's steps, plus in-window background work
    idle_off = _idle_cpu_rate("off", step.device)
    for mode in ("default", "all"):
        open_close = _open_close_cpu_s(mode, step.device)
        background = max(_idle_cpu_rate(mode, step.device) - idle_off, 0.0)
        figures[f"meters start+stop {mode} (ms cpu per window)"] = open_close * 1000
        figures[f"meters background {mode} (ms cpu per s)"] = background * 1000
        figures[f"direct overhead {mode} (%)"] = (open_close / STEPS + background * step_wall) / step_cpu * 100

    # 2. end to end: each metered window against the unmetered window of the same round
    for name, table in (("wall", wall), ("cpu", cpu)):
        for mode in modes[1:]:
            ratios = [metered / off for metered, off in zip(table[mode], table["off"])]
            figures[f"end-to-end {name} overhead {mode} (%)"] = (statistics.median(ratios) - 1) * 100
    return figures
