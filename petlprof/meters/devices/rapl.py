"""RAPL access: the package and DRAM energy counters under ``/sys/class/powercap``.

A domain's ``energy_uj`` counts microjoules and wraps to zero at ``max_energy_range_uj``.  Package
domains are counted with their ``dram`` sub-domains; ``core``/``uncore`` sub-domains are part of
the package figure and are not added again.  A top-level ``psys`` domain (platform energy on some
client CPUs) is not read: it covers more than the packages (it includes them), so adding it would
count them twice.
"""

from __future__ import annotations

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
