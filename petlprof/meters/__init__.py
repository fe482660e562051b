"""Meters: which ones exist, which work on this machine, and which one a run uses.

``auto`` picks the best *measured* source for the device (NVML on CUDA, RAPL on CPU) and falls
back to the labelled estimate only when none can be read; a meter asked for by name that is not
usable here is an error, never a silent fallback.
"""

from __future__ import annotations

from petlprof.errors import UsageError, unknown_choice
from petlprof.meters.base import ESTIMATED, MEASURED, Meter, Window, synchronize
from petlprof.meters.energy import EstimateEnergyMeter, NvmlEnergyMeter, RaplEnergyMeter
from petlprof.meters.memory import CpuMemoryMeter, CudaMemoryMeter

ENERGY_METERS: dict[str, type[Meter]] = {
    "nvml": NvmlEnergyMeter,
    "rapl": RaplEnergyMeter,
    "estimate": EstimateEnergyMeter,
}
MEMORY_METERS: dict[str, type[Meter]] = {"cuda-allocator": CudaMemoryMeter, "cpu-rss": CpuMemoryMeter}
METER_HELP = {
    "nvml": "GPU energy (J, measured) from the NVML total-energy counter",
    "rapl": "CPU package + DRAM energy (J, measured) from /sys/class/powercap",
    "estimate": "energy (J, estimated): " + EstimateEnergyMeter.MODEL.removeprefix("estimate: "),
    "cuda-allocator": "peak CUDA memory (bytes, measured) from the caching allocator",
    "cpu-rss": "peak process memory (bytes, measured) from the RSS high-water mark above the runtime baseline",
    "timer": "wall time and per-step latency (s, measured), device-synchronised, warm-up excluded",
}


def meter_status() -> list[tuple[str, bool, str, str]]:
    """(name, available, why, what it measures) for every meter, for ``petlprof list``."""
    rows = [("timer", True, "always available", METER_HELP["timer"])]
    for name, cls in {**ENERGY_METERS, **MEMORY_METERS}.items():
        ok, why = cls.available()
        rows.append((name, ok, why, METER_HELP[name]))
    return rows


def check_energy_meter(name: str, need_available: bool = True) -> None:
    """A known name, and (unless ``need_available`` is false) usable on this machine; else UsageError."""
    if name == "auto":
        return
    if name not in ENERGY_METERS:
        raise unknown_choice("energy meter", name, [*ENERGY_METERS, "auto"])
    if need_available:
        ok, why = ENERGY_METERS[name].available()
        if not ok:
            raise UsageError(f"energy meter '{name}' was asked for but is not usable here: {why}")


def energy_meter_for(device: str, requested: str = "auto") -> Meter:
    if requested != "auto":
        check_energy_meter(requested)
        return ENERGY_METERS[requested](device)
    order = ["nvml"] if device.startswith("cuda") else ["rapl"]
    for name in order:
        if ENERGY_METERS[name].available()[0]:
            return ENERGY_METERS[name](device)
    return EstimateEnergyMeter(device)


def memory_meter_for(device: str, baseline_bytes: int | None = None) -> Meter:
    if device.startswith("cuda"):
        return CudaMemoryMeter(device)
    return CpuMemoryMeter(device, baseline_bytes=baseline_bytes)


__all__ = [
    "ENERGY_METERS",
    "ESTIMATED",
    "MEASURED",
    "Meter",
    "Window",
    "check_energy_meter",
    "energy_meter_for",
    "memory_meter_for",
    "meter_status",
    "synchronize",
]
