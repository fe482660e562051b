"""A second opinion from Zeus (the ``zeus`` package, optional: ``pip install zeus``): an energy meter backed by its
``ZeusMonitor``, and the ``petlprof meters --check`` comparison of petlprof's NVML or RAPL reading with Zeus's on
the same windows.

``--energy-meter zeus`` measures a run with Zeus: on ``cuda:N`` the energy of that GPU as Zeus reads it (NVIDIA
through NVML, AMD through amdsmi), on the CPU the packages and DRAM Zeus reads (RAPL; Apple silicon through its own
counters), so devices petlprof does not read itself can be metered.  The figure is ``measured`` with source
``zeus``; petlprof does not know how often Zeus's sources update, so its grade is at most B
(:mod:`petlprof.results.grades`).  ``auto`` never picks it: NVML and RAPL are read directly where they exist.
"""

from __future__ import annotations

import time
from importlib import metadata

from petlprof.meters.base import Meter, Reading, Window
from petlprof.meters.energy import PROVENANCE_KEYS, provenance
from petlprof.meters.verdicts import FAIL, PASS, WARN, Check
from petlprof.results.figures import ENERGY, ENERGY_WINDOW
from petlprof.vocabulary import MEASURED

SOURCE = "zeus"
WINDOW_NAME = "petlprof"
AGREE_PASS, AGREE_WARN = 0.05, 0.20  # |Zeus / petlprof - 1| on the same window
CHECK_S = 2.0


def _zeus_version() -> str | None:
    try:
        return metadata.version("zeus")
    except metadata.PackageNotFoundError:
        try:
            return metadata.version("zeus-ml")
        except metadata.PackageNotFoundError:
            return None


class ZeusEnergyMeter(Meter):
    """Energy of the run's GPU (``cuda:N``) or of the CPU packages and DRAM (``cpu``) as Zeus's monitor reads it."""

    name = "zeus"
    FIGURES = (ENERGY,)
    MORE_FIGURES = (ENERGY_WINDOW,)
    EXTRAS = ("zeus_gpu_energy_j", "zeus_cpu_energy_j", "zeus_dram_energy_j", "zeus_version", *PROVENANCE_KEYS)

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        # zeus: optional, imported only when asked for
        from zeus.monitor import ZeusMonitor

        gpu = device.startswith("cuda")
        index = int(device.partition(":")[2] or 0) if gpu else None
        self.monitor = ZeusMonitor(gpu_indices=[index] if gpu else [], cpu_indices=[] if gpu else None)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        version = _zeus_version()
        if version is None:
            return False, "the zeus package is not installed (pip install zeus)"
        try:
            import zeus.monitor  # noqa: F401
        except Exception as error:  # an install that cannot import: say why
            return False, f"zeus {version} does not import: {type(error).__name__}: {error}"
        return True, f"Zeus {version}: the GPUs and CPUs its monitor reads (NVIDIA, AMD, RAPL, Apple silicon)"

    def _begin(self) -> None:
        self.monitor.begin_window(WINDOW_NAME, sync_execution=False)  # the Window synchronises the device

    def _end(self) -> Reading:
        measured = self.monitor.end_window(WINDOW_NAME, sync_execution=False)
        parts = {
            "zeus_gpu_energy_j": sum((measured.gpu_energy or {}).values()) if measured.gpu_energy else None,
            "zeus_cpu_energy_j": sum(measured.cpu_energy.values()) if measured.cpu_energy else None,
            "zeus_dram_energy_j": sum(measured.dram_energy.values()) if measured.dram_energy else None,
        }
        if self.device.startswith("cuda"):
            energy = parts["zeus_gpu_energy_j"]
        else:
            energy = sum(v for k, v in parts.items() if k != "zeus_gpu_energy_j" and v is not None)
        if energy is None:
            raise RuntimeError(f"Zeus measured no energy for {self.device}")
        reading = Reading({ENERGY: float(energy)}, extras={**parts, "zeus_version": _zeus_version()})
        return reading.merge(provenance(self, SOURCE, MEASURED, 2, []))


def zeus_checks(petlprof_meter: Meter, work=None, seconds: float = CHECK_S) -> list[Check]:
    """Zeus against ``petlprof_meter`` (NVML or RAPL) over the same window of ``work`` (default: ``seconds`` of a
    busy CPU loop): their ratio, within 5% a pass, within 20% a warning."""
    device = petlprof_meter.device
    zeus = ZeusEnergyMeter(device)

    def busy() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sum(i * i for i in range(1000))

    with Window([petlprof_meter, zeus], "cpu") as window:  # ended in reverse: petlprof's figure is merged last
        (work or busy)()
    ours = window.reading.value(ENERGY)
    theirs = window.reading.get("zeus_gpu_energy_j") if device.startswith("cuda") else None
    if theirs is None:
        theirs = sum(window.reading.get(k) or 0.0 for k in ("zeus_cpu_energy_j", "zeus_dram_energy_j"))
    if not ours:
        return [Check("agrees with zeus", None, "x", FAIL, f"{petlprof_meter.name} gave no energy in the window")]
    ratio = theirs / ours
    off = abs(ratio - 1)
    verdict = PASS if off <= AGREE_PASS else WARN if off <= AGREE_WARN else FAIL
    return [
        Check(
            f"agrees with {petlprof_meter.name}",
            round(ratio, 3),
            "x",
            verdict,
            f"Zeus {_zeus_version()} / petlprof's {petlprof_meter.name} over one window of work ({theirs:.1f} J / "
            f"{ours:.1f} J); pass within {AGREE_PASS:.0%}, warn within {AGREE_WARN:.0%}",
        )
    ]
