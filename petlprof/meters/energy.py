"""Energy of a window: the NVML energy counter on NVIDIA GPUs, RAPL on CPUs, else a stated estimate.

* ``nvml`` — ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since driver load) read at both
  edges of the window on the GPU the run uses (matched by UUID, since CUDA and NVML number
  devices differently); ``petlprof list`` reports the GPUs named by ``CUDA_VISIBLE_DEVICES``.  The counter updates every ~20–100 ms, so windows shorter than
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
RAPL_MAX_WATTS = 400.0  # for the wrap-around check: a counter can wrap at most once per window
POWERCAP = Path("/sys/class/powercap")
CPU_WATTS_PER_CORE = 10.0  # a busy server core: ~4-7 W (EPYC/Xeon TDP / cores), desktop cores more
DRAM_WATTS_PER_GIB = 0.375  # CodeCarbon's DRAM figure: 3 W per 8 GiB


class NvmlEnergyMeter(Meter):
    name = "nvml"
    FIGURES = ("energy_j", "energy_kind", "energy_source")

    def __init__(self, device: str = "cuda"):
        super().__init__(device)
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [device_handle(pynvml, device)]
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
            warnings.append(f"window {self.window_s:.2f} s < {SHORT_WINDOW_S:g} s: the NVML counter updates "
                            "every ~20-100 ms, so this figure is low-confidence")
        return {
            "energy_j": sum(deltas_mj) / 1000.0,
            "energy_kind": MEASURED,
            "energy_source": "nvml-energy-counter",
            "energy_warnings": warnings,
        }

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _nvml_uuid(text: str) -> str:
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def cuda_uuid(device: str) -> str:
    """UUID of the CUDA device torch calls ``device``: the only reliable link to an NVML handle
    (CUDA orders devices fastest first, NVML by PCI bus)."""
    import torch

    index = torch.device(device).index
    return _nvml_uuid(str(torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).uuid))


def device_handle(pynvml, device: str):
    """The NVML handle of the one GPU this run uses."""
    return pynvml.nvmlDeviceGetHandleByUUID(cuda_uuid(device))


def visible_gpu_handles(pynvml) -> list:
    """NVML handles of the GPUs named by CUDA_VISIBLE_DEVICES (indices or UUIDs), all if unset."""
    count = pynvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for item in (x.strip() for x in visible.split(",")):
        if item.isdigit():
            if int(item) < count:
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(item)))
        elif item:
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(_nvml_uuid(item)))
    return handles


class RaplEnergyMeter(Meter):
    name = "rapl"
    FIGURES = ("energy_j", "energy_kind", "energy_source")

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
        total_uj, warnings = 0, []
        for domain, start, end in zip(self.domains, self._start, self._read()):
            max_range = int((domain / "max_energy_range_uj").read_text())
            if end < start:  # wrapped around (once: see the warning below)
                end += max_range
            total_uj += end - start
            if self.window_s * RAPL_MAX_WATTS * 1e6 > max_range:
                warnings.append(f"{domain.name}: a {self.window_s:.0f} s window may span more than one counter "
                                f"wrap ({max_range / 1e6:.0f} J at up to {RAPL_MAX_WATTS:g} W); energy may be low")
        return {
            "energy_j": total_uj / 1e6,
            "energy_kind": MEASURED,
            "energy_source": "rapl",
            "energy_domains": [(d / "name").read_text().strip() for d in self.domains],
            "energy_warnings": warnings,
        }


def rapl_domains(root: Path = POWERCAP) -> list[Path]:
    """Package domains and their dram sub-domains.

    core/uncore are inside the package figure, and a top-level ``psys`` domain (client CPUs)
    contains the packages, so neither is added again.
    """
    if not root.is_dir():
        return []
    domains = []
    for package in sorted(root.glob("intel-rapl:[0-9]*")):
        try:
            is_package = package.name.count(":") == 1 and (package / "name").read_text().startswith("package")
        except OSError:
            continue
        if not is_package:
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
    FIGURES = ("energy_j", "energy_kind", "energy_source")
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
