"""Energy of a window: the NVML energy counter on NVIDIA GPUs, RAPL on CPUs, else a stated estimate.

* ``nvml`` — ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since driver load) read at both
  edges of the window, summed over the GPUs this process can see (``CUDA_VISIBLE_DEVICES`` is
  honoured, by index or UUID).  The counter updates every ~20–100 ms, so windows shorter than
  :data:`SHORT_WINDOW_S` are flagged ``low_confidence``.
* ``rapl`` — ``/sys/class/powercap/intel-rapl:*`` package domains plus their ``dram``
  sub-domains (``core``/``uncore`` are inside the package figure and are not added again), with
  counter wrap-around undone through ``max_energy_range_uj``.
* ``estimate`` — where nothing can be read: process CPU time × a per-core power, plus DRAM power
  proportional to resident memory.  Its readings are labelled ``estimated`` and carry the model.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from petlprof.meters.base import ESTIMATED, MEASURED, Meter
from petlprof.meters.memory import rss_bytes

SHORT_WINDOW_S = 5.0
POWERCAP = Path("/sys/class/powercap")
CPU_WATTS_PER_CORE = 10.0  # a busy server core: ~4-7 W (EPYC/Xeon TDP / cores), desktop cores more
DRAM_WATTS_PER_GIB = 0.375  # CodeCarbon's DRAM figure: 3 W per 8 GiB


class NvmlEnergyMeter(Meter):
    name = "nvml"

    def __init__(self, device: str = "cuda"):
        super().__init__(device)
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self.handles = visible_gpu_handles(pynvml)
        self._start: list[int] = []

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return False, f"NVML not usable: {exc}"
        try:
            handles = visible_gpu_handles(pynvml)
            if not handles:
                return False, "no NVIDIA GPU visible (CUDA_VISIBLE_DEVICES)"
            for handle in handles:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as exc:
            return False, f"GPU energy counter not supported: {exc}"
        finally:
            pynvml.nvmlShutdown()
        return True, f"NVML total-energy counter on {len(handles)} GPU(s)"

    def _read(self) -> list[int]:
        return [int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]

    def _begin(self) -> None:
        self._start = self._read()

    def _end(self) -> dict[str, Any]:
        end = self._read()
        # the counter only resets with the driver; a smaller value means it was reset mid-window
        deltas_mj = [e - s if e >= s else e for s, e in zip(self._start, end)]
        warnings = []
        if self.window_s < SHORT_WINDOW_S:
            warnings.append(f"window {self.window_s:.2f} s < {SHORT_WINDOW_S} s: the NVML counter updates "
                            "every ~20-100 ms, so this figure is low-confidence")
        return {
            "energy_j": sum(deltas_mj) / 1000.0,
            "energy_kind": MEASURED,
            "energy_source": "nvml-energy-counter",
            "energy_devices": len(self.handles),
            "energy_warnings": warnings,
        }

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def visible_gpu_handles(pynvml) -> list:
    """NVML handles of the GPUs named by CUDA_VISIBLE_DEVICES (indices or UUIDs), all if unset."""
    count = pynvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for item in (x.strip() for x in visible.split(",")):
        if not item:
            continue
        if item.isdigit():
            if int(item) < count:
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(item)))
        else:
            uuid = item if item.startswith("GPU-") else f"GPU-{item}"
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(uuid))
    return handles


class RaplEnergyMeter(Meter):
    name = "rapl"

    def __init__(self, device: str = "cpu", root: Path = POWERCAP):
        super().__init__(device)
        self.domains = rapl_domains(root)
        self._start: list[int] = []

    @classmethod
    def available(cls, root: Path = POWERCAP) -> tuple[bool, str]:
        domains = rapl_domains(root)
        if not domains:
            return False, f"no RAPL domains under {root}"
        try:
            for domain in domains:
                int((domain / "energy_uj").read_text())
        except PermissionError:
            return False, (f"RAPL files under {root} are not readable (root-only on current kernels; "
                           "run as root or relax the permissions of energy_uj)")
        except OSError as exc:
            return False, f"RAPL not readable: {exc}"
        return True, f"RAPL {', '.join(d.name for d in domains)}"

    def _read(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self.domains]

    def _begin(self) -> None:
        self._start = self._read()

    def _end(self) -> dict[str, Any]:
        total_uj = 0
        for domain, start, end in zip(self.domains, self._start, self._read()):
            if end < start:  # wrapped around
                end += int((domain / "max_energy_range_uj").read_text())
            total_uj += end - start
        return {
            "energy_j": total_uj / 1e6,
            "energy_kind": MEASURED,
            "energy_source": "rapl",
            "energy_domains": [(d / "name").read_text().strip() for d in self.domains],
            "energy_warnings": [],
        }


def rapl_domains(root: Path = POWERCAP) -> list[Path]:
    """Package domains and their dram sub-domains; core/uncore are already in the package figure."""
    if not root.is_dir():
        return []
    domains = []
    for package in sorted(root.glob("intel-rapl:[0-9]*")):
        if package.name.count(":") != 1:
            continue
        domains.append(package)
        for sub in sorted(root.glob(f"{package.name}:*")):  # sysfs lists every zone at the top level
            try:
                if (sub / "name").read_text().strip() == "dram":
                    domains.append(sub)
            except OSError:
                continue
    return domains


class EstimateEnergyMeter(Meter):
    """Estimated energy: CPU time × per-core power + resident memory × DRAM power × wall time."""

    name = "estimate"
    MODEL = (f"estimate: process CPU time x {CPU_WATTS_PER_CORE:g} W per busy core "
             f"+ {DRAM_WATTS_PER_GIB:g} W/GiB x mean resident memory x wall time")

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        self._cpu0 = 0.0
        self._rss0 = 0

    def _begin(self) -> None:
        self._cpu0 = time.process_time()
        self._rss0 = rss_bytes() or 0

    def _end(self) -> dict[str, Any]:
        cpu_s = time.process_time() - self._cpu0
        mean_rss_gib = ((self._rss0 + (rss_bytes() or 0)) / 2) / 2**30
        energy = cpu_s * CPU_WATTS_PER_CORE + DRAM_WATTS_PER_GIB * mean_rss_gib * self.window_s
        warnings = [] if self.device == "cpu" else [f"device {self.device} not covered by the estimate"]
        return {
            "energy_j": energy,
            "energy_kind": ESTIMATED,
            "energy_source": "estimate",
            "energy_model": self.MODEL,
            "cpu_time_s": cpu_s,
            "energy_warnings": warnings,
        }
