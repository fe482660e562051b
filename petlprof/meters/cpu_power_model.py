"""``estimate``: energy where nothing can be read, from a stated model.

Process CPU time (at most wall time × the physical cores the process may use, since hyper-threads
share a core's power) × a per-core power (the CPU's TDP from CodeCarbon's CPU power table divided by its
cores, else :data:`CPU_WATTS_PER_CORE`), plus DRAM power proportional to resident memory.  Its
readings are labelled ``estimated`` and carry the model, with the CPU named.
"""

from __future__ import annotations

import csv
import functools
import os
import re
import time
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path

from petlprof.meters.base import Meter, Reading
from petlprof.meters.energy import PROVENANCE_KEYS, provenance
from petlprof.meters.memory import rss_bytes
from petlprof.results.figures import CPU_CORES, CPU_TIME, ENERGY, ENERGY_WINDOW
from petlprof.vocabulary import ESTIMATED

CPU_WATTS_PER_CORE = 10.0  # a busy server core: ~4-7 W (EPYC/Xeon TDP / cores), desktop cores more
MAX_PLAUSIBLE_WATTS_PER_CORE = 30.0  # above this, TDP / visible cores means a VM slice of a big chip
DRAM_WATTS_PER_GIB = 0.375  # CodeCarbon's DRAM figure: 3 W per 8 GiB


class EstimateEnergyMeter(Meter):
    """Estimated energy: CPU time × per-core power + resident memory × DRAM power × wall time."""

    name = "estimate"
    FIGURES = (ENERGY,)
    MORE_FIGURES = (ENERGY_WINDOW, CPU_TIME, CPU_CORES)
    EXTRAS = ("energy_model", "cpu_model", "cpu_watts_per_core", *PROVENANCE_KEYS)

    def __init__(self, device: str = "cpu", why_not_measured: str | None = None, cpuinfo: str = "/proc/cpuinfo"):
        """``why_not_measured``: why the measured meter for the device could not be used (``auto``)."""
        super().__init__(device)
        self.why_not_measured = why_not_measured
        self.cpu = cpu_power_per_core(cpuinfo)
        self.model = estimate_model(self.cpu)
        self._cpu0 = 0.0
        self._rss0 = 0

    def _begin(self) -> None:
        self._cpu0 = time.process_time()
        self._rss0 = rss_bytes() or 0

    def _end(self) -> Reading:
        cpu_s = time.process_time() - self._cpu0
        window_s = self.closed_window_s()
        core_s = min(cpu_s, window_s * usable_cores(self.cpu.threads_per_core))  # hyper-threads share a core
        mean_rss_gib = ((self._rss0 + (rss_bytes() or 0)) / 2) / 2**30
        energy = core_s * self.cpu.watts_per_core + DRAM_WATTS_PER_GIB * mean_rss_gib * window_s
        warnings = [] if self.device == "cpu" else [f"device {self.device} not covered by the estimate"]
        if self.why_not_measured:
            warnings.append(f"energy is estimated because it could not be measured ({self.why_not_measured})")
        reading = Reading(
            {ENERGY: energy, CPU_TIME: cpu_s, CPU_CORES: core_s},
            extras={
                "energy_model": self.model,
                "cpu_model": self.cpu.cpu_model,
                "cpu_watts_per_core": self.cpu.watts_per_core,
            },
        )
        return reading.merge(provenance(self, "estimate", ESTIMATED, 2, warnings))


@dataclass(frozen=True)
class CpuTopology:
    """What /proc/cpuinfo says of the CPU (:func:`cpu_topology`)."""

    name: str | None  # the model name
    cores: int | None  # physical cores per package
    siblings: int | None  # logical CPUs per package
    threads_per_core: int  # hyper-threads (1 if unknown)
    virtual: bool  # the hypervisor flag: the guest sees a slice of the chip, and its ``cpu cores`` are not the chip's


@dataclass(frozen=True)
class CpuPower:
    """The per-core power the estimate multiplies CPU time by (:func:`cpu_power_per_core`), and where it came
    from: the CPU power table's entry and TDP, or the generic figure (``table_entry`` None) and why."""

    cpu_model: str  # the model name ("unknown CPU" without one)
    watts_per_core: float
    table_entry: str | None  # the table's model name matched
    tdp_w: float | None  # that entry's TDP
    cores: int | None  # what the TDP is divided by: the cores the model name gives, else /proc/cpuinfo's
    threads_per_core: int
    fallback_reason: str | None  # why a matched entry's TDP was not used (None: not matched, or used)


def cpu_topology(cpuinfo: str = "/proc/cpuinfo") -> CpuTopology:
    """From /proc/cpuinfo: the model name, cores, siblings and hyper-threads (:class:`CpuTopology`)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""

    def field(key: str) -> str | None:
        match = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
        return match.group(1).strip() if match else None

    cores_text, siblings_text = field("cpu cores"), field("siblings")
    cores = int(cores_text) if cores_text and cores_text.isdigit() else None
    siblings = int(siblings_text) if siblings_text and siblings_text.isdigit() else None
    threads = siblings // cores if cores and siblings and siblings >= cores else 1
    return CpuTopology(
        name=field("model name"),
        cores=cores,
        siblings=siblings,
        threads_per_core=max(threads, 1),
        virtual="hypervisor" in (field("flags") or "").split(),
    )


def usable_cores(threads_per_core: int) -> float:
    """Physical cores this process may run on: its logical CPUs over the hyper-threads per core."""
    try:
        logical = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        logical = os.cpu_count() or 1
    return max(logical / threads_per_core, 1.0)


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


def cpu_power_per_core(cpuinfo: str = "/proc/cpuinfo") -> CpuPower:
    """Per-core power of this CPU: its TDP over its cores where the model is in the table (longest
    whole-word match), else :data:`CPU_WATTS_PER_CORE`.

    The core count comes from the model name (``24-Core``) where it says so: in a VM or container
    ``cpu cores`` counts only the cores given to the guest, and dividing the whole chip's TDP by
    them would inflate the figure many times.  On a virtual machine (the ``hypervisor`` flag) whose
    model name does not give the chip's cores, and where the quotient is above
    :data:`MAX_PLAUSIBLE_WATTS_PER_CORE`, the generic figure is used instead, with the reason."""
    topology = cpu_topology(cpuinfo)
    name, cores = topology.name, topology.cores
    fallback = CpuPower(
        cpu_model=name or "unknown CPU",
        watts_per_core=CPU_WATTS_PER_CORE,
        table_entry=None,
        tdp_w=None,
        cores=cores,
        threads_per_core=topology.threads_per_core,
        fallback_reason=None,
    )
    named_cores = re.search(r"(\d+)-Core", name or "")
    guest_cores = topology.virtual and not named_cores  # a VM's cores are not the chip's
    cores = int(named_cores.group(1)) if named_cores else cores
    if name and cores:
        text = f" {_normalise(name)} "
        matches = [key for key in cpu_power_table() if f" {key} " in text]
        if matches:
            key = max(matches, key=len)
            tdp = cpu_power_table()[key]
            if guest_cores:
                return replace(
                    fallback,
                    fallback_reason=f"a virtual machine's {cores} cores are a slice of a chip whose core count "
                    "the model name does not give, so its TDP cannot be divided",
                )
            if tdp / cores > MAX_PLAUSIBLE_WATTS_PER_CORE:
                return replace(
                    fallback,
                    fallback_reason=f"TDP {tdp:g} W / {cores} visible cores is implausible per "
                    "core (a VM sees only part of the chip)",
                )
            return replace(
                fallback, cpu_model=name, watts_per_core=tdp / cores, table_entry=key, tdp_w=tdp, cores=cores
            )
    return fallback


def estimate_model(cpu: CpuPower) -> str:
    """The estimate's model in words, naming the CPU and where its per-core power came from."""
    if cpu.table_entry:
        core = (
            f"{cpu.watts_per_core:.2f} W per busy core ({cpu.cpu_model}: TDP {cpu.tdp_w:g} W / "
            f"{cpu.cores} cores, CodeCarbon CPU power table)"
        )
    else:
        reason = cpu.fallback_reason
        why = f": {reason}" if reason else " not in CodeCarbon's CPU power table"
        core = f"{cpu.watts_per_core:g} W per busy core ({cpu.cpu_model}{why}: generic server-core figure)"
    threads = cpu.threads_per_core
    cap = (
        f" (at most wall time x the physical cores it may use: {threads} hyper-threads share a core)"
        if threads > 1
        else ""
    )
    return f"estimate: process CPU time{cap} x {core} + {DRAM_WATTS_PER_GIB:g} W/GiB x mean resident memory x wall time"
