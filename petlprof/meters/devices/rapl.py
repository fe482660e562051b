"""RAPL access: the package and DRAM energy counters under ``/sys/class/powercap``.

A domain's ``energy_uj`` counts microjoules and wraps to zero at ``max_energy_range_uj``.  Package
domains are counted with their ``dram`` sub-domains; ``core``/``uncore`` sub-domains are part of
the package figure and are not added again.  A top-level ``psys`` domain (platform energy on some
client CPUs) is not read: it covers more than the packages (it includes them), so adding it would
count them twice.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")


def domains(root: Path = POWERCAP) -> list[Path]:
    """Package domains and their dram sub-domains, in a stable order."""
    if not root.is_dir():
        return []
    found = []
    for package in sorted(root.glob("intel-rapl:[0-9]*")):
        try:
            is_package = package.name.count(":") == 1 and (package / "name").read_text().startswith("package")
        except OSError:
            continue
        if not is_package:
            continue
        found.append(package)
        for sub in sorted(root.glob(f"{package.name}:*")):  # sysfs lists every zone at the top level
            try:
                if (sub / "name").read_text().strip() == "dram":
                    found.append(sub)
            except OSError:
                continue
    return found


def read_uj(paths: list[Path]) -> list[int]:
    """The counters of ``paths`` (µJ); PermissionError saying how to fix it."""
    try:
        return [int((d / "energy_uj").read_text()) for d in paths]
    except PermissionError as exc:
        raise PermissionError(
            f"{exc.filename} is not readable (RAPL counters are root-only on current "
            "kernels; run as root or relax the permissions of energy_uj)"
        ) from None


def max_range_uj(paths: list[Path]) -> list[int]:
    """Where each counter wraps (µJ)."""
    return [int((d / "max_energy_range_uj").read_text()) for d in paths]


def names(paths: list[Path]) -> list[str]:
    return [(d / "name").read_text().strip() for d in paths]


def delta_uj(start: int, end: int, max_range: int) -> int:
    """Energy between two readings of one counter; a smaller end value means it wrapped (once)."""
    return end - start if end >= start else end + max_range - start


def availability(root: Path = POWERCAP) -> tuple[bool, str]:
    """(usable, why) for the RAPL counters under ``root``."""
    found = domains(root)
    if not found:
        return False, f"no RAPL domains under {root}"
    try:
        for domain in found:
            int((domain / "energy_uj").read_text())
    except PermissionError:
        return False, (
            f"RAPL files under {root} are not readable (root-only on current kernels; "
            "run as root or relax the permissions of energy_uj)"
        )
    except OSError as exc:
        return False, f"RAPL not readable: {exc}"
    return True, f"RAPL {', '.join(d.name for d in found)}"


class WrapTracker:
    """Energy of several RAPL counters since :meth:`start`, every wrap undone.

    A counter wraps after ``max_energy_range_uj`` (262 kJ on many Intel packages: 22 min at 200 W),
    and two readings can undo at most one wrap, so :meth:`update` must run at least once per wrap
    period; :class:`~petlprof.meters.energy.RaplEnergyMeter` calls it from a polling thread.
    ``max_gap_s`` is the longest stretch between two readings, to tell whether a wrap may be lost.
    """

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.max_range = max_range_uj(paths)
        self._lock = threading.Lock()
        self._last: list[int] = []
        self.total_uj = [0] * len(paths)
        self.readings = 0
        self.max_gap_s = 0.0
        self._last_t = 0.0

    def wrap_period_s(self, watts: float) -> float:
        """Seconds until the smallest counter wraps at ``watts``."""
        return min(self.max_range, default=0) / 1e6 / watts

    def start(self) -> None:
        with self._lock:
            self._last = read_uj(self.paths)
            self._last_t = time.perf_counter()
            self.total_uj = [0] * len(self.paths)
            self.readings, self.max_gap_s = 1, 0.0

    def update(self) -> None:
        with self._lock:
            now = read_uj(self.paths)
            t = time.perf_counter()
            for i, (last, value, top) in enumerate(zip(self._last, now, self.max_range)):
                self.total_uj[i] += delta_uj(last, value, top)
            self.max_gap_s = max(self.max_gap_s, t - self._last_t)
            self._last, self._last_t = now, t
            self.readings += 1
