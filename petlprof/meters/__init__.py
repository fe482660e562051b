"""Meters: which ones exist, which work on this machine, and which one a run uses.

``auto`` picks the best *measured* source for the device (NVML on CUDA, RAPL on CPU) and falls
back to the labelled estimate only when none can be read; a meter asked for by name that is not
usable here is an error, never a silent fallback.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from petlprof.errors import UsageError
from petlprof.lookup import Registry
from petlprof.meters.base import Meter, Window, synchronize
from petlprof.meters.carbon import CodecarbonMeter
from petlprof.meters.contention import ContentionMeter
from petlprof.meters.cpu_power_model import EstimateEnergyMeter, cpu_power_per_core, estimate_model
from petlprof.meters.devices import nvml as nvml_dev
from petlprof.meters.energy import NvmlEnergyMeter, RaplEnergyMeter
from petlprof.meters.memory import CpuMemoryMeter, CudaMemoryMeter
from petlprof.meters.tensors import CpuTensorMeter
from petlprof.meters.zeus import ZeusEnergyMeter

if TYPE_CHECKING:
    from petlprof.meters.idle import IdleBaseline

# each kind of meter by name (the classes: their available() says whether one works here)
ENERGY_METERS: Registry[type[Meter]] = Registry(
    "energy meter",
    {"nvml": NvmlEnergyMeter, "rapl": RaplEnergyMeter, "estimate": EstimateEnergyMeter, "zeus": ZeusEnergyMeter},
    subclass_of=Meter,
)
MEMORY_METERS: Registry[type[Meter]] = Registry(
    "memory meter", {"cuda-allocator": CudaMemoryMeter, "cpu-rss": CpuMemoryMeter}, subclass_of=Meter
)
EXTRA_METERS: Registry[type[Meter]] = Registry(
    "extra meter (--meters)", {"codecarbon": CodecarbonMeter, "cpu-tensors": CpuTensorMeter}, subclass_of=Meter
)
METER_HELP = {
    "nvml": "GPU energy (J, measured) from the NVML total-energy counter, and integrated power sampled "
    "in a separate process (both recorded)",
    "rapl": "CPU package + DRAM energy (J, measured) from /sys/class/powercap",
    "zeus": "GPU or CPU + DRAM energy (J, measured) as the zeus package's monitor reads it: a second opinion, and "
    "devices petlprof does not read itself (AMD GPUs, Apple silicon); never picked by auto",
    "cuda-allocator": "peak CUDA memory (bytes, measured) from the caching allocator, per phase",
    "cpu-rss": "peak process memory (bytes, measured) from the RSS high-water mark above the runtime baseline",
    "codecarbon": "emissions (g CO2-eq, estimated) and CodeCarbon's energy breakdown; off by default",
    "cpu-tensors": "peak live CPU tensor bytes (measured, allocator-independent); off by default, costs a "
    "Python call per tensor operation",
    "timer": "wall time and per-step latency (s, measured), CUDA events on GPU, warm-up excluded",
    "contention": "other processes' CPU use (cores, measured) and the load average over each window; "
    "a window where others used over a tenth of the CPUs is flagged contended",
}


def meter_help(name: str) -> str:
    if name == "estimate":
        return "energy (J, estimated): " + estimate_model(cpu_power_per_core()).removeprefix("estimate: ")
    return METER_HELP[name]


def meter_status() -> list[tuple[str, bool, str, str]]:
    """(name, available, why, what it measures) for every meter, for ``petlprof meters``/``list``."""
    rows = [("timer", True, "always available", METER_HELP["timer"])]
    rows.append(("contention", *ContentionMeter.available(), METER_HELP["contention"]))
    for name, cls in [*ENERGY_METERS.items(), *MEMORY_METERS.items(), *EXTRA_METERS.items()]:
        ok, why = cls.available()
        rows.append((name, ok, why, meter_help(name)))
    return rows


def check_extra_meters(names: list[str]) -> None:
    for name in names:
        EXTRA_METERS.get(name)


def extra_meters_for(
    names: list[str], device: str, *, country_code: str | None = None, resident_bytes: int = 0
) -> list[Meter]:
    """The extra meters asked for by name; one that is not usable here is an error."""
    check_extra_meters(names)
    meters: list[Meter] = []
    for name in names:
        ok, why = EXTRA_METERS.get(name).available()
        if not ok:
            raise UsageError(f"meter '{name}' was asked for but is not usable here: {why}")
        if name == "codecarbon":
            meters.append(CodecarbonMeter(device, country_code=country_code))
        else:
            meters.append(CpuTensorMeter(device, resident_bytes=resident_bytes))
    return meters


def start_power_timeline(device: str, energy_meter: str = "auto"):
    """The power sampler process for the GPU ``device`` uses, or None off CUDA, without NVML, or when
    another energy meter was asked for."""
    if energy_meter not in ("auto", "nvml") or not device.startswith("cuda") or not NvmlEnergyMeter.available()[0]:
        return None
    # petlprof.meters.power (numpy): slow to import, loaded only when used
    from petlprof.meters.power import NvmlPowerSource, PowerTimeline

    return PowerTimeline(NvmlPowerSource([nvml_dev.cuda_uuid(device)], os.getpid())).start()


def check_energy_meter(name: str, need_available: bool = True) -> None:
    """A known name, and (unless ``need_available`` is false) usable on this machine; else UsageError."""
    if name == "auto":
        return
    if name not in ENERGY_METERS:
        raise ENERGY_METERS.unknown(name, also=["auto"])
    if need_available:
        ok, why = ENERGY_METERS.get(name).available()
        if not ok:
            raise UsageError(f"energy meter '{name}' was asked for but is not usable here: {why}")


def _make(name: str, device: str, timeline, idle: IdleBaseline | None) -> Meter:
    if name == "nvml":
        return NvmlEnergyMeter(device, timeline=timeline, idle=idle)
    if name == "rapl":
        return RaplEnergyMeter(device, idle=idle)
    if name == "zeus":
        return ZeusEnergyMeter(device)
    return EstimateEnergyMeter(device)


def energy_meter_for(device: str, requested: str = "auto", timeline=None, idle: IdleBaseline | None = None) -> Meter:
    """The energy meter for ``device``; ``timeline``: a started :class:`PowerTimeline` for nvml;
    ``idle``: the sweep's idle baseline (:func:`petlprof.meters.idle.sweep_idle`) for energy above idle."""
    if requested != "auto":
        check_energy_meter(requested)
        return _make(requested, device, timeline, idle)
    name = "nvml" if device.startswith("cuda") else "rapl"
    ok, why = ENERGY_METERS.get(name).available()
    if ok:
        return _make(name, device, timeline, idle)
    return EstimateEnergyMeter(device, why_not_measured=f"{name}: {why}")


def contention_meters() -> list[Meter]:
    """The contention meter where ``/proc/stat`` can be read (every window carries it), else none."""
    return [ContentionMeter()] if ContentionMeter.available()[0] else []


def memory_meter_for(device: str, baseline_bytes: int | None = None, snapshot_path: str | None = None) -> Meter:
    if device.startswith("cuda"):
        return CudaMemoryMeter(device, snapshot_path=snapshot_path)
    return CpuMemoryMeter(device, baseline_bytes=baseline_bytes)


__all__ = [
    "ENERGY_METERS",
    "EXTRA_METERS",
    "Meter",
    "Window",
    "check_energy_meter",
    "check_extra_meters",
    "energy_meter_for",
    "extra_meters_for",
    "memory_meter_for",
    "meter_status",
    "start_power_timeline",
    "synchronize",
]
