"""What measuring costs: training step time with the meters on versus off, in one process.

Windows of ``STEPS`` training steps of BitFit on the pretrained 2-layer slice run in
alternation — no meters; the offline default (energy ``auto`` + peak memory); the default plus a
power-sampler process at ~100 Hz started before the window (what a GPU run adds, here with a cheap
stand-in power source); and every extra meter (``codecarbon``, ``cpu-tensors``) — and the median time per step of each
is compared with the unmetered one, both as wall time and as this process's CPU time (what the
meters add to the training process, much less sensitive to other load on shared cores); the
sampler process's own CPU use is reported as a fraction of one core.  The figures are printed and
recorded as test properties.  The target is at most 1% for the offline default; the assertion
allows :data:`ALLOWED_OVERHEAD` of CPU time because single-percent timings on two shared cores are
noise.
"""

from __future__ import annotations

import os
import statistics
import time

from petlprof.bench import MethodStep, time_alternating
from petlprof.meters import Window, energy_meter_for, extra_meters_for, memory_meter_for
from petlprof.meters.memory import release_free_memory
from petlprof.meters.power import PowerTimeline

STEPS = 3
ROUNDS = 6
ALLOWED_OVERHEAD = 0.05
REAL = {"backbone": "minilm", "num_layers": 2, "batch_size": 16, "seq_len": 64}


class SteadyPowerSource:
    """Stands in for NVML in the sampler process: a constant power that changes every 20 ms."""

    power_field = "instant"

    def open(self) -> None:
        self.t0 = time.perf_counter()

    def read_power_w(self) -> list[float]:
        return [100.0 + (int((time.perf_counter() - self.t0) / 0.02) % 2)]

    def read_energy_mj(self) -> None:
        return None

    def read_processes(self) -> tuple[int, list[int]]:
        return 0, []

    def close(self) -> None:
        pass


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_meter_overhead_on_training_steps(record_property):
    step = MethodStep("bitfit", **REAL)
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    sampler_core_fraction: list[float] = []
    modes = {
        "off": lambda: [],
        "default": lambda: [energy_meter_for(step.device), memory_meter_for(step.device)],
        "default+sampler": lambda: [energy_meter_for(step.device), memory_meter_for(step.device)],
        "all": lambda: [energy_meter_for(step.device), memory_meter_for(step.device),
                        *extra_meters_for(["codecarbon", "cpu-tensors"], step.device)],
    }

    def phase(mode: str):
        def run():
            timeline = PowerTimeline(SteadyPowerSource()).start() if mode == "default+sampler" else None
            release_free_memory()  # every mode starts from the same heap
            try:
                sampler0 = _cpu_s(timeline._proc.pid) if timeline else 0.0
                with Window(modes[mode](), step.device) as window:
                    cpu0 = time.process_time()  # the meters' preparation is outside the window, by design
                    for _ in range(STEPS):
                        step.train_step()
                    cpu.setdefault(mode, []).append((time.process_time() - cpu0) / STEPS)
                if timeline is not None:  # read the window's samples as the nvml meter does
                    sampler_core_fraction.append((_cpu_s(timeline._proc.pid) - sampler0) / window.time_s)
                    end = time.perf_counter()
                    assert timeline.window(end - window.time_s, end)["samples"] > 0
            finally:
                if timeline is not None:
                    timeline.stop()
            wall.setdefault(mode, []).append(window.time_s / STEPS)
        return run

    time_alternating({mode: phase(mode) for mode in modes}, rounds=ROUNDS, warmup=1)
    figures = {}
    for name, table in (("wall", wall), ("cpu", cpu)):
        off = statistics.median(table["off"])
        figures[f"{name} step off (ms)"] = off * 1000
        for mode in modes:
            if mode != "off":
                figures[f"{name} overhead {mode} (%)"] = (statistics.median(table[mode]) / off - 1) * 100
    figures["sampler process (% of one core)"] = statistics.median(sampler_core_fraction) * 100
    print("\n" + "\n".join(f"{key}: {value:+.2f}" for key, value in figures.items()))
    for key, value in figures.items():
        record_property(key, value)
    # process CPU time is what the meters add to the training process; shared cores make wall time noisy
    assert figures["cpu overhead default (%)"] <= ALLOWED_OVERHEAD * 100, figures
