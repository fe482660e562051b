"""How much of the machine other processes took during a window, so a reader knows which figures to distrust.

On a shared machine the same configuration's latency swings by 5x between runs when another process
trains beside it.  This meter reads the kernel's system-wide CPU time (``/proc/stat``: user, nice, system,
irq, softirq and steal, summed over every CPU) and this process's own (``getrusage``) at both edges of a
window: what the system spent beyond this process is *others'* CPU time (steal counts: it is time the
hypervisor gave to other guests).  A window where others used more than :data:`CONTENDED_SHARE` of the
machine's CPUs on average is flagged ``contended``, with a warning in its phase, and the 1-minute load
average at its end is recorded beside it.

The kernel counts CPU time in clock ticks (usually 10 ms), so a window shorter than a few ticks per CPU
reads coarsely; the reading says the window's length.  Where ``/proc/stat`` cannot be read (not Linux),
the figures are None and the reading says why.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from petlprof.meters.base import Meter, Reading
from petlprof.vocabulary import MEASURED

CONTENDED_SHARE = 0.1  # of the machine's CPUs, used by other processes on average over the window
_STAT = Path("/proc/stat")
_BUSY = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (guest time is inside user)


def system_busy_s(stat: Path = _STAT) -> tuple[float, int]:
    """(CPU seconds every CPU of the machine has been busy since boot, the number of CPUs)."""
    lines = stat.read_text().splitlines()
    fields = lines[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"{stat} does not start with the 'cpu' line")
    ticks = sum(int(fields[1 + i]) for i in _BUSY if 1 + i < len(fields))
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return ticks / os.sysconf("SC_CLK_TCK"), max(cpus, 1)


def own_cpu_s() -> float:
    """CPU seconds this process (every thread of it) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ContentionMeter(Meter):
    """Other processes' CPU use and the load average over the window; flags a contended window."""

    name = "contention"
    OWN = ("others_cpu_cores", "load_avg_1m", "contended", "contention_source")

    def __init__(self, device: str = "cpu", stat: Path = _STAT, own=own_cpu_s, loadavg=os.getloadavg):
        super().__init__(device)
        self.stat, self.own, self.loadavg = stat, own, loadavg
        self._start: tuple[float, float] = (0.0, 0.0)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            system_busy_s()
        except (OSError, ValueError, IndexError) as error:
            return False, f"cannot read {_STAT}: {error}"
        return True, f"{_STAT} (system-wide CPU time) minus this process's getrusage"

    def _begin(self) -> None:
        self._start = (system_busy_s(self.stat)[0], self.own())

    def _end(self) -> Reading:
        busy, cpus = system_busy_s(self.stat)
        own = self.own()
        window_s = self.window_s or 0.0
        others_s = max(0.0, (busy - self._start[0]) - (own - self._start[1]))
        cores = others_s / window_s if window_s > 0 else None
        load = self.loadavg()[0]
        contended = cores is not None and cores > CONTENDED_SHARE * cpus
        source = f"{MEASURED}: {self.stat} busy time minus this process's, over {cpus} CPUs"
        # one text for every window, so a report lists it once with the windows it covers
        warning = (
            f"contended: other processes used more than {CONTENDED_SHARE:g} of the CPUs during the window "
            "(others_cpu_cores and load_avg_1m in the record say how much): its time, latency and energy "
            "figures are inflated by them"
        )
        figures = dict(zip(self.OWN, (cores, load, contended, source)))
        return Reading(extras=figures, warnings=[warning] if contended else [])
