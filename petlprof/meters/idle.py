"""Idle power measured once before a sweep, so every run can report energy above idle.

``petlprof run`` calls :func:`measure_idle` before the first run, while nothing of the sweep runs
yet: GPU idle power over :data:`IDLE_S` seconds for every visible GPU by UUID, from the energy
counter where the GPUs have one (the source of the energy meter's figure, so the two compare), else
from the sampler process's power timeline; CPU package + DRAM idle power from RAPL, where readable.
The figures travel to the runs' processes in the environment variable :data:`IDLE_ENV`; a run
reads them once (:func:`sweep_idle`) and hands them to its energy meters, which subtract
``idle power × window time`` to give ``energy_above_idle_j`` beside the gross ``energy_j``.
Nothing is measured for the estimate (its model counts only the process's own CPU time, which is
already work above idle).
"""

from __future__ import annotations

import json
import os
import time
from typing import TypedDict, cast

from petlprof.meters.devices import nvml as nvml_dev
from petlprof.meters.devices import rapl
from petlprof.meters.power import NvmlPowerSource, PowerTimeline

IDLE_ENV = "PETLPROF_IDLE_BASELINE"
IDLE_S = 2.0
EDGE_WAIT_S = 0.5  # longer than any energy counter's update period (20-100 ms)


class _IdleMeasured(TypedDict):
    seconds: float  # how long idle power was read (0 when the measurement failed)
    notes: list[str]  # what could not be measured, and why


class IdleBaseline(_IdleMeasured, total=False):
    """A sweep's idle baseline (:func:`measure_idle`), as :data:`IDLE_ENV` and the record's ``idle_baseline``
    carry it: the GPUs' or the CPU's idle power, whichever the device is metered by and could be read."""

    nvml_w: dict[str, float]  # GPU UUID -> idle W
    nvml_source: str  # what the GPUs' idle power was read from: the energy counter, else the power timeline
    rapl_w: float  # CPU package + DRAM
    measured_at: float  # Unix time at the end of the measurement: a window's grade reads the baseline's age
    spread: float  # the largest relative difference between the two halves of the idle window, over the devices


def sweep_idle() -> IdleBaseline | None:
    """The idle baseline of this sweep (None when none was measured): the :class:`IdleBaseline` the sweep put
    in :data:`IDLE_ENV` (JSON), read back."""
    try:
        value = json.loads(os.environ.get(IDLE_ENV, "{}"))
    except json.JSONDecodeError:
        return None
    return cast(IdleBaseline, value) if isinstance(value, dict) and value else None


def measure_idle(device: str, seconds: float = IDLE_S) -> IdleBaseline:
    """Idle power of the GPUs (``nvml_w``: UUID -> W) or of the CPU (``rapl_w``), whichever this
    device is metered by and can be read here; notes say what could not be measured."""
    idle: IdleBaseline = {"seconds": seconds, "notes": []}
    if device.startswith("cuda"):
        ok, why = nvml_dev.availability()
        if ok:
            halves, idle["nvml_source"] = _gpu_idle_halves_w(seconds)
            idle["nvml_w"] = {uuid: (a + b) / 2 for uuid, (a, b) in halves.items()}
            idle["spread"] = max((spread(a, b) for a, b in halves.values()), default=0.0)
        else:
            idle["notes"].append(f"no GPU idle power: {why}")
    else:
        ok, why = rapl.availability()
        if ok:
            first, second = rapl_power_w(seconds / 2), rapl_power_w(seconds / 2)
            idle["rapl_w"], idle["spread"] = (first + second) / 2, spread(first, second)
        else:
            idle["notes"].append(f"no CPU idle power: {why}")
    if "nvml_w" not in idle and "rapl_w" not in idle:
        idle["seconds"] = 0.0  # nothing was read (the records had said 2.0 s)
    idle["measured_at"] = time.time()
    return idle


def spread(first_w: float, second_w: float) -> float:
    """How far the two halves of an idle window differ, relative to their mean (0 for two zeros)."""
    mean = (first_w + second_w) / 2
    return abs(first_w - second_w) / mean if mean > 0 else 0.0


def rapl_power_w(seconds: float, root=None) -> float:
    """Mean package + DRAM power over ``seconds`` of sleep."""
    domains = rapl.domains(root or rapl.POWERCAP)
    start = rapl.read_uj(domains)
    t0 = time.perf_counter()
    time.sleep(seconds)
    end = rapl.read_uj(domains)
    elapsed = time.perf_counter() - t0
    ranges = rapl.max_range_uj(domains)
    return sum(rapl.delta_uj(s, e, r) for s, e, r in zip(start, end, ranges)) / 1e6 / elapsed


def _gpu_idle_halves_w(seconds: float) -> tuple[dict[str, tuple[float, float]], str]:
    """(UUID -> idle W over each half of the window, the source): from the energy counters where every GPU has
    one (the source the energy meter's ``energy_j`` comes from), else from the power timeline."""
    with nvml_dev.session() as nvml:
        handles = nvml_dev.visible_handles(nvml)
        uuids = [nvml_dev.uuid_of(nvml, h) for h in handles]
        if nvml_dev.has_counter(nvml, handles):
            edges = [_counter_edge(nvml, handles)]
            for _ in range(2):
                time.sleep(seconds / 2)
                edges.append(_counter_edge(nvml, handles))
            (t0, e0), (t1, e1), (t2, e2) = edges
            return {
                u: ((b - a) / 1000.0 / (t1 - t0), (c - b) / 1000.0 / (t2 - t1)) for u, a, b, c in zip(uuids, e0, e1, e2)
            }, "nvml-energy-counter"
    timeline = PowerTimeline(NvmlPowerSource(uuids, os.getpid())).start()
    try:
        t0 = time.perf_counter()
        time.sleep(seconds)
        t2 = time.perf_counter()
        t1 = (t0 + t2) / 2
        first, second = (timeline.window(a, b).mean_power_per_gpu_w for a, b in ((t0, t1), (t1, t2)))
    finally:
        timeline.stop()
    if first is None or second is None:
        raise RuntimeError("the power timeline took no sample in the idle window")
    return {u: (a, b) for u, a, b in zip(uuids, first, second)}, "nvml-power-integrated"


def _counter_edge(nvml, handles) -> tuple[float, list[int]]:
    """The first update of the energy counters (within :data:`EDGE_WAIT_S`) and the time it was seen, so
    an idle figure spans whole update periods instead of carrying up to one period of error."""
    first = nvml_dev.energy_mj(nvml, handles)
    deadline = time.perf_counter() + EDGE_WAIT_S
    while time.perf_counter() < deadline:
        values = nvml_dev.energy_mj(nvml, handles)
        if values[0] != first[0]:
            return time.perf_counter(), values
        time.sleep(0.001)
    return time.perf_counter(), nvml_dev.energy_mj(nvml, handles)


def prepare_sweep_idle(device: str, energy_meter: str) -> str:
    """Measure the idle baseline for this sweep, hand it to the runs (environment), and say what it is."""
    if energy_meter == "estimate":
        os.environ[IDLE_ENV] = "{}"
        return "no idle baseline: the estimate counts only the run's own CPU time"
    try:
        idle = measure_idle(device)
    except Exception as error:  # the baseline is an extra: a sweep must not die for it
        idle = {"seconds": 0, "notes": [f"idle measurement failed: {type(error).__name__}: {error}"]}
    os.environ[IDLE_ENV] = json.dumps(idle)
    source = f" ({idle['nvml_source']})" if "nvml_source" in idle else ""
    parts = [f"GPU {uuid} {watts:.1f} W{source}" for uuid, watts in idle.get("nvml_w", {}).items() if watts is not None]
    if "rapl_w" in idle:
        parts.append(f"CPU package + DRAM {idle['rapl_w']:.1f} W (RAPL)")
    if not parts:
        return "no idle baseline (energy above idle not reported): " + "; ".join(idle["notes"])
    return f"idle power over {idle['seconds']:g} s before the sweep: " + ", ".join(parts)
