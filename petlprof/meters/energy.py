"""Energy of a window: the NVML energy counter on NVIDIA GPUs, RAPL on CPUs, else a stated estimate.

* ``nvml`` — ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since driver load) read at both
  edges of the window on the GPU the run uses (matched by UUID, since CUDA and NVML number
  devices differently), and the same window's power timeline from the sampler process
  (:mod:`petlprof.meters.power`) integrated over time.  Both figures are recorded; ``energy_j``
  is the counter where the GPU has one, else the integrated power.  The counter updates every
  ~20–100 ms and power readings cover only part of each update period, so windows shorter than
  :data:`SHORT_WINDOW_S` are flagged ``energy_low_confidence``.  Other processes on the same
  GPU during the window are named in a warning.
* ``rapl`` — ``/sys/class/powercap/intel-rapl:*`` package domains plus their ``dram``
  sub-domains (``core``/``uncore`` are inside the package figure and are not added again), with
  counter wrap-around undone through ``max_energy_range_uj``.
* ``estimate`` — where nothing can be read: process CPU time × a per-core power (the CPU's TDP
  from CodeCarbon's CPU power table divided by its cores, else :data:`CPU_WATTS_PER_CORE`), plus
  DRAM power proportional to resident memory.  Its readings are labelled ``estimated`` and carry
  the model, with the CPU named.

Every reading carries its provenance: ``energy_meter``, ``energy_source``, ``energy_kind``
(measured or estimated), ``energy_samples``, ``energy_sample_rate_hz``, ``energy_window_s``,
``energy_low_confidence`` and ``energy_warnings``; with an idle baseline (:mod:`petlprof.meters.idle`)
also ``energy_above_idle_j``.
"""

from __future__ import annotations

import csv
import functools
import os
import re
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

from petlprof.meters.base import ESTIMATED, MEASURED, Meter
from petlprof.meters.idle import sweep_idle
from petlprof.meters.memory import rss_bytes

SHORT_WINDOW_S = 5.0
RAPL_MAX_WATTS = 400.0  # for the wrap-around check: a counter can wrap at most once per window
POWERCAP = Path("/sys/class/powercap")
CPU_WATTS_PER_CORE = 10.0  # a busy server core: ~4-7 W (EPYC/Xeon TDP / cores), desktop cores more
MAX_PLAUSIBLE_WATTS_PER_CORE = 30.0  # above this, TDP / visible cores means a VM slice of a big chip
DRAM_WATTS_PER_GIB = 0.375  # CodeCarbon's DRAM figure: 3 W per 8 GiB


def provenance(
    meter: Meter, source: str, kind: str, samples: int, warnings: list[str], sample_rate_hz: float | None = None
) -> dict[str, Any]:
    """The provenance fields every energy reading carries.  ``sample_rate_hz``: how often the source
    updates or was sampled (a counter's update rate, the power timeline's achieved rate); None where
    the figure is a difference of two readings of a source whose rate is not known."""
    window_s = meter.window_s
    low = window_s < SHORT_WINDOW_S
    if low and kind == MEASURED:
        warnings = [
            *warnings,
            f"window {window_s:.2f} s < {SHORT_WINDOW_S:g} s: the {source} reading covers too "
            "few counter updates, so this figure is low-confidence",
        ]
    return {
        "energy_kind": kind,
        "energy_source": source,
        "energy_meter": meter.name,
        "energy_samples": samples,
        "energy_sample_rate_hz": sample_rate_hz,
        "energy_window_s": window_s,
        "energy_low_confidence": low,
        "energy_warnings": warnings,
    }


def above_idle(energy_j: float | None, idle_w: float | None, window_s: float) -> dict[str, Any]:
    if energy_j is None or idle_w is None:
        return {}
    return {"energy_above_idle_j": energy_j - idle_w * window_s, "idle_power_w": idle_w}


class NvmlEnergyMeter(Meter):
    """GPU energy: the total-energy counter and, with a :class:`PowerTimeline`, integrated power."""

    name = "nvml"
    FIGURES = ("energy_j", "energy_kind", "energy_source")

    def __init__(self, device: str = "cuda", timeline=None):
        super().__init__(device)
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self.uuid = cuda_uuid(device)
        self.handles = [pynvml.nvmlDeviceGetHandleByUUID(self.uuid)]
        self.timeline = timeline
        self.has_counter = _has_counter(pynvml, self.handles)
        if not self.has_counter and timeline is None:
            raise RuntimeError(f"GPU {self.uuid} has no energy counter and no power timeline was started")
        self._start: list[int] = []
        self._t0 = 0.0

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
            counter = _has_counter(pynvml, handles)
            if not counter:
                for handle in handles:
                    pynvml.nvmlDeviceGetPowerUsage(handle)
        except pynvml.NVMLError as exc:
            return False, f"GPU energy counter and power reading not supported: {exc}"
        finally:
            pynvml.nvmlShutdown()
        what = "total-energy counter + power timeline" if counter else "power timeline only (no energy counter)"
        return True, f"NVML {what} on {len(handles)} GPU(s)"

    def _read(self) -> list[int]:
        return [int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]

    def _begin(self) -> None:
        self._t0 = time.perf_counter()
        self._start = self._read() if self.has_counter else []

    def _end(self) -> dict[str, Any]:
        t1 = time.perf_counter()
        warnings: list[str] = []
        counter_j = None
        if self.has_counter:
            # the counter only resets with the driver; a smaller value means it was reset mid-window
            end = self._read()
            counter_j = sum(e - s if e >= s else e for s, e in zip(self._start, end)) / 1000.0
            if any(e < s for s, e in zip(self._start, end)):
                warnings.append("the energy counter went back (driver reloaded?): counted from zero")
        timeline = self._timeline_window(self._t0, t1, warnings)
        integrated_j = timeline.get("integrated_energy_j")
        period = timeline.get("update_period_s")
        if counter_j is not None:
            energy, source, samples = counter_j, "nvml-energy-counter", 2
            rate = 1.0 / period if period else None  # the counter's own update rate, when detected
        else:
            energy, source, samples = integrated_j, "nvml-power-integrated", timeline.get("samples", 0)
            rate = timeline.get("sample_rate_hz")
            if energy is None:
                raise RuntimeError("no energy counter and the power timeline does not cover the window")
        reading = {
            "energy_j": energy,
            "energy_counter_j": counter_j,
            "energy_integrated_j": integrated_j,
            "power_field": timeline.get("power_field"),
            "power_samples": timeline.get("samples"),
            "power_sample_rate_hz": timeline.get("sample_rate_hz"),
            "mean_power_w": timeline.get("mean_power_w"),
            "counter_update_period_s": timeline.get("update_period_s"),
            "nvml_peak_process_memory_bytes": timeline.get("own_peak_bytes"),
            **provenance(self, source, MEASURED, samples, warnings, rate),
        }
        idle = sweep_idle().get("nvml_w", {}).get(self.uuid)
        return {**reading, **above_idle(energy, idle, self.window_s)}

    def _timeline_window(self, t0: float, t1: float, warnings: list[str]) -> dict[str, Any]:
        if self.timeline is None:
            return {}
        if not self.timeline.alive:
            warnings.append("the power sampler process is not running: no power timeline for this window")
            return {}
        data = self.timeline.window(t0, t1)
        if data["other_pids"]:
            warnings.append(
                f"other processes used the GPU during the window (pids {data['other_pids']}): "
                "its energy includes their work"
            )
        if data["integrated_energy_j"] is None:
            warnings.append("the power timeline does not cover the whole window")
        return data

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _has_counter(pynvml, handles) -> bool:
    try:
        for handle in handles:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError:
        return False
    return True


def _nvml_uuid(text: str) -> str:
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def cuda_uuid(device: str) -> str:
    """UUID of the CUDA device torch calls ``device``: the only reliable link to an NVML handle
    (CUDA orders devices fastest first, NVML by PCI bus)."""
    import torch

    index = torch.device(device).index
    return _nvml_uuid(
        str(torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index).uuid)
    )


def nvml_gpu_details() -> list[str]:
    """One line per visible GPU for ``petlprof meters``: energy counter, power field, other processes."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # NVML absent: meter_status already says why
        return []
    lines = []
    try:
        for handle in visible_gpu_handles(pynvml):
            name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
            counter = "energy counter" if _has_counter(pynvml, [handle]) else "NO energy counter (integrated power)"
            field = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])[0]
            power = "instantaneous power field" if field.nvmlReturn == 0 else "averaged power only"
            others = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            busy = f"; busy: pids {others}" if others else ""
            lines.append(f"{name} {uuid}: {counter}, {power}{busy}")
    except pynvml.NVMLError as exc:
        lines.append(f"NVML error while listing GPUs: {exc}")
    finally:
        pynvml.nvmlShutdown()
    return lines


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
            return False, (
                f"RAPL files under {root} are not readable (root-only on current kernels; "
                "run as root or relax the permissions of energy_uj)"
            )
        except OSError as exc:
            return False, f"RAPL not readable: {exc}"
        return True, f"RAPL {', '.join(d.name for d in domains)}"

    def _read(self) -> list[int]:
        return read_rapl(self.domains)

    def _begin(self) -> None:
        self._start = self._read()

    def _end(self) -> dict[str, Any]:
        total_uj, warnings = 0, []
        for domain, start, end in zip(self.domains, self._start, self._read()):
            max_range = int((domain / "max_energy_range_uj").read_text())
            total_uj += rapl_delta_uj(start, end, max_range)
            if self.window_s * RAPL_MAX_WATTS * 1e6 > max_range:
                warnings.append(
                    f"{domain.name}: a {self.window_s:.0f} s window may span more than one counter "
                    f"wrap ({max_range / 1e6:.0f} J at up to {RAPL_MAX_WATTS:g} W); energy may be low"
                )
        energy = total_uj / 1e6
        return {
            "energy_j": energy,
            "energy_domains": [(d / "name").read_text().strip() for d in self.domains],
            **provenance(self, "rapl", MEASURED, 2, warnings),
            **above_idle(energy, sweep_idle().get("rapl_w"), self.window_s),
        }


def rapl_delta_uj(start: int, end: int, max_range_uj: int) -> int:
    """Energy between two readings of one counter; a smaller end value means it wrapped (once)."""
    return end - start if end >= start else end + max_range_uj - start


def read_rapl(domains: list[Path]) -> list[int]:
    try:
        return [int((d / "energy_uj").read_text()) for d in domains]
    except PermissionError as exc:
        raise PermissionError(
            f"{exc.filename} is not readable (RAPL counters are root-only on current "
            "kernels; run as root or relax the permissions of energy_uj)"
        ) from None


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

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        self.cpu = cpu_power_per_core()
        self.model = estimate_model(self.cpu)
        self._cpu0 = 0.0
        self._rss0 = 0

    def _begin(self) -> None:
        self._cpu0 = time.process_time()
        self._rss0 = rss_bytes() or 0

    def _end(self) -> dict[str, Any]:
        cpu_s = time.process_time() - self._cpu0
        mean_rss_gib = ((self._rss0 + (rss_bytes() or 0)) / 2) / 2**30
        energy = cpu_s * self.cpu["watts_per_core"] + DRAM_WATTS_PER_GIB * mean_rss_gib * self.window_s
        warnings = [] if self.device == "cpu" else [f"device {self.device} not covered by the estimate"]
        return {
            "energy_j": energy,
            "energy_model": self.model,
            "cpu_model": self.cpu["cpu_model"],
            "cpu_watts_per_core": self.cpu["watts_per_core"],
            "cpu_time_s": cpu_s,
            **provenance(self, "estimate", ESTIMATED, 2, warnings),
        }


def cpu_model_name(cpuinfo: str = "/proc/cpuinfo") -> tuple[str | None, int | None]:
    """(``model name``, physical ``cpu cores`` per package) from /proc/cpuinfo, None where absent."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None, None
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    cores = re.search(r"^cpu cores\s*:\s*(\d+)$", text, re.M)
    return (name.group(1).strip() if name else None), (int(cores.group(1)) if cores else None)


def _normalise(name: str) -> str:
    name = re.sub(r"\((R|TM|tm|r)\)|\bCPU\b|\bProcessor\b|\b\d+-Core\b|@.*$", " ", name)
    return " ".join(name.split()).lower()


@functools.lru_cache(maxsize=1)
def cpu_power_table() -> dict[str, float]:
    """CodeCarbon's CPU power table (model name -> TDP in W, from the vendors' product pages)."""
    table = {}
    with (files("codecarbon") / "data" / "hardware" / "cpu_power.csv").open() as fh:
        for row in csv.DictReader(fh):
            key, tdp = _normalise(row.get("Name") or ""), row.get("TDP") or ""
            if key and re.fullmatch(r"\d+(\.\d+)?", tdp.strip()):  # a few rows of the table are malformed
                table[key] = float(tdp)
    return table


def cpu_power_per_core(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """Per-core power of this CPU: its TDP over its cores where the model is in the table (longest
    whole-word match), else :data:`CPU_WATTS_PER_CORE`.

    The core count comes from the model name (``24-Core``) where it says so: in a VM or container
    ``cpu cores`` counts only the cores given to the guest, and dividing the whole chip's TDP by
    them would inflate the figure many times.  A quotient above
    :data:`MAX_PLAUSIBLE_WATTS_PER_CORE` is taken as that case and falls back to the generic figure."""
    name, cores = cpu_model_name(cpuinfo)
    fallback = {
        "cpu_model": name or "unknown CPU",
        "watts_per_core": CPU_WATTS_PER_CORE,
        "table_entry": None,
        "tdp_w": None,
        "cores": cores,
        "fallback_reason": None,
    }
    named_cores = re.search(r"(\d+)-Core", name or "")
    cores = int(named_cores.group(1)) if named_cores else cores
    if name and cores:
        text = f" {_normalise(name)} "
        matches = [key for key in cpu_power_table() if f" {key} " in text]
        if matches:
            key = max(matches, key=len)
            tdp = cpu_power_table()[key]
            if tdp / cores > MAX_PLAUSIBLE_WATTS_PER_CORE:
                return {
                    **fallback,
                    "fallback_reason": f"TDP {tdp:g} W / {cores} visible cores is implausible per "
                    "core (a VM sees only part of the chip)",
                }
            return {
                "cpu_model": name,
                "watts_per_core": tdp / cores,
                "table_entry": key,
                "tdp_w": tdp,
                "cores": cores,
                "fallback_reason": None,
            }
    return fallback


def estimate_model(cpu: dict[str, Any]) -> str:
    """The estimate's model in words, naming the CPU and where its per-core power came from."""
    if cpu["table_entry"]:
        core = (
            f"{cpu['watts_per_core']:.2f} W per busy core ({cpu['cpu_model']}: TDP {cpu['tdp_w']:g} W / "
            f"{cpu['cores']} cores, CodeCarbon CPU power table)"
        )
    else:
        reason = cpu.get("fallback_reason")
        why = f": {reason}" if reason else " not in CodeCarbon's CPU power table"
        core = f"{cpu['watts_per_core']:g} W per busy core ({cpu['cpu_model']}{why}: generic server-core figure)"
    return f"estimate: process CPU time x {core} + {DRAM_WATTS_PER_GIB:g} W/GiB x mean resident memory x wall time"
