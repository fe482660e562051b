"""What every meter shares: a measurement window and a reading that carries units and provenance.

A meter's window synchronises the device at both edges (so queued GPU work lands inside the
window it belongs to).  Readings are plain dicts whose keys carry units (``energy_j``,
``peak_memory_bytes``, ``time_s``) and say where the figure came from (``*_source``) and whether
it was ``measured`` or ``estimated``.
"""

from __future__ import annotations

import time
from typing import Any

MEASURED = "measured"
ESTIMATED = "estimated"


def synchronize(device: str) -> None:
    """Wait for queued work on ``device`` so a timestamp or counter read covers it."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


class Meter:
    """Base class: ``available()``, ``begin()``/``end()`` (or ``with meter.window():``), ``reading()``."""

    name = "meter"

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._t0: float | None = None
        self.window_s: float | None = None

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """(usable here, why or why not) — never raises."""
        return True, "always available"

    def begin(self) -> None:
        synchronize(self.device)
        self._t0 = time.perf_counter()
        self._begin()

    def end(self) -> dict[str, Any]:
        synchronize(self.device)
        self.window_s = time.perf_counter() - self._t0
        return self._end()

    def _begin(self) -> None:  # pragma: no cover - overridden
        pass

    def _end(self) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def close(self) -> None:
        """Release what the meter holds (NVML handles, ...)."""


class Window:
    """Context manager running several meters' windows together; ``reading`` merges their results."""

    def __init__(self, meters: list[Meter]):
        self.meters = meters
        self.reading: dict[str, Any] = {}

    def __enter__(self) -> "Window":
        for meter in self.meters:
            meter.begin()
        return self

    def __exit__(self, *exc) -> None:
        for meter in reversed(self.meters):
            self.reading.update(meter.end())
