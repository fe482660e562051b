"""What every meter shares: a measurement window and a reading that carries units and provenance.

A :class:`Window` synchronises the device at both edges (so queued GPU work lands inside the
window it belongs to) and runs every meter's expensive preparation before any of them starts.
Readings are plain dicts whose keys carry units (``energy_j``,
``peak_memory_bytes``, ``time_s``) and say where the figure came from (``*_source``) and whether
it was ``measured`` or ``estimated``.
"""

from __future__ import annotations

import time
from typing import Any

from petlprof.figures import Figure

MEASURED = "measured"
ESTIMATED = "estimated"


def kind_key(figure: Figure) -> str:
    """The reading key of ``figure``'s measured/estimated flag, for a meter that writes it."""
    if figure.kind is None:
        raise ValueError(f"figure {figure.name} declares no kind key; a meter cannot write its provenance")
    return figure.kind


def source_key(figure: Figure) -> str:
    """The reading key naming where ``figure`` came from, for a meter that writes it."""
    if figure.source is None:
        raise ValueError(f"figure {figure.name} declares no source key; a meter cannot write its provenance")
    return figure.source


def synchronize(device: str) -> None:
    """Wait for queued work on ``device`` so a timestamp or counter read covers it."""
    if device.startswith("cuda"):
        # torch: slow to import, loaded only when used
        import torch

        torch.cuda.synchronize(device)


class Meter:
    """Base class: ``available()``, ``prepare()``, ``begin()``/``end()``, ``close()``.

    ``prepare`` does whatever must happen *before* any meter of a window starts (collect garbage,
    reset peaks), so that work is never inside another meter's time or energy figure.
    """

    name = "meter"
    FIGURES: tuple[str, ...] = ()  # the reading keys this meter provides

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._t0: float | None = None
        self.window_s: float | None = None

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """(usable here, why or why not) — never raises."""
        return True, "always available"

    def prepare(self) -> None:
        """Work that must finish before the window opens (not timed, not metered)."""

    def begin(self) -> None:
        self._begin()
        self._t0 = time.perf_counter()  # after the start-up: window_s covers the work, not the meter

    def end(self) -> dict[str, Any]:
        self.window_s = time.perf_counter() - self.started_at()
        return self._end()

    def started_at(self) -> float:
        """``perf_counter()`` when the window opened (after the meter's own start-up)."""
        if self._t0 is None:
            raise RuntimeError(f"meter {self.name!r} has no open window: begin() was not called")
        return self._t0

    def closed_window_s(self) -> float:
        """Seconds of the window just closed (``end`` sets it before ``_end`` reads it)."""
        if self.window_s is None:
            raise RuntimeError(f"meter {self.name!r} has no closed window: end() was not called")
        return self.window_s

    def _begin(self) -> None:
        """Read the starting counter values."""

    def _end(self) -> dict[str, Any]:
        """Read the final values and return the reading."""
        return {}

    def close(self) -> None:
        """Release what the meter holds (NVML handles, ...)."""

    def invalid_reading(self, error: Exception) -> dict[str, Any]:
        """What the window records when this meter failed: no figures, and why."""
        return {
            **{key: None for key in self.FIGURES},
            "meter_errors": [f"{self.name} failed: {type(error).__name__}: {error}; its figures are missing"],
        }


def phase_warnings(reading: dict[str, Any]) -> list[str]:
    """Pop every meter's warnings (``*_warnings`` lists and ``meter_errors``) out of a window's
    reading, as one list for the phase's ``warnings``."""
    keys = [key for key in reading if key.endswith("_warnings") or key == "meter_errors"]
    return [text for key in keys for text in (reading.pop(key) or [])]


class Window:
    """Runs several meters over one stretch of work; ``reading`` merges their results.

    All meters are prepared first, then the device is synchronised and every meter starts; at the
    end the device is synchronised once more before any meter stops, so queued GPU work lands in
    the window it belongs to.  ``time_s`` is the window's own device-synchronised wall time, from the
    last meter's start to the first meter's stop: the work only, never a meter's start-up or
    shut-down (CodeCarbon's take a second or more).
    """

    def __init__(self, meters: list[Meter], device: str = "cpu"):
        self.meters = meters
        self.device = device
        self.reading: dict[str, Any] = {}
        self.time_s: float | None = None
        self._t0 = 0.0
        self._running: list[Meter] = []

    def __enter__(self) -> Window:
        for meter in self.meters:
            meter.prepare()
        synchronize(self.device)
        self._running = []
        for meter in self.meters:
            try:
                meter.begin()
                self._running.append(meter)
            except Exception as error:  # a meter that cannot start leaves its figures missing, with the reason
                self._record_failure(meter, error)
        self._t0 = time.perf_counter()  # after every start: no meter's start-up is inside time_s
        return self

    def _record_failure(self, meter: Meter, error: Exception) -> None:
        bad = meter.invalid_reading(error)
        self.reading.setdefault("meter_errors", []).extend(bad.pop("meter_errors"))
        for key, value in bad.items():
            self.reading.setdefault(key, value)

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.time_s = time.perf_counter() - self._t0
        for meter in reversed(self._running):
            try:
                self.reading.update(meter.end())
            except Exception as error:  # a meter failing mid-run invalidates its figures, not the run
                self._record_failure(meter, error)
