"""What every meter shares: a measurement window and a typed reading that carries units and provenance.

A :class:`Window` synchronises the device at both edges (so queued GPU work lands inside the
window it belongs to) and runs every meter's expensive preparation before any of them starts.
A meter's reading is a :class:`Reading`: its figures keyed by their declarations
(:mod:`petlprof.results.figures`, units in the names: ``energy_j``, ``peak_memory_bytes``), each figure's
provenance (``measured`` or ``estimated``, and by what), the meter's own keys (declared on its
class) and its warnings.  :meth:`Reading.record` turns it into the plain dict of a record's phase.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from petlprof.results.figures import ENERGY, FIGURES, Figure, provenance_keys
from petlprof.results.grades import graded

METER_ERRORS = "meter_errors"  # the warnings group of the meters that failed (each line names its meter)
_OWN_WARNINGS = ""  # a meter's warnings before its window files them under the meter's name
DECLARED_KEYS = frozenset({*(f.name for f in FIGURES), *provenance_keys()})


class UndeclaredKey(Exception):
    """A meter wrote a key it does not declare, or spelled a declared figure's key as a plain string: a
    bug in the meter, never a failed measurement, so a :class:`Window` lets it through."""


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


class Provenance(NamedTuple):
    """How a figure was obtained: ``kind`` (``MEASURED`` or ``ESTIMATED``, :mod:`petlprof.vocabulary`) and ``source``
    (what gave it), written under the keys its declaration names (None for both when its meter failed)."""

    kind: str | None
    source: str | None = None


class Reading(Mapping[str, Any]):
    """One meter's reading, or a window's merge of its meters'.

    ``figures``: declared figure -> value; ``provenance``: declared figure -> :class:`Provenance` (the
    figure must declare the keys it fills); ``extras``: the meter's own keys (settings, details, figures
    of its own), which may not spell a declared figure's key; ``warnings``/``errors``: lines for the
    phase's ``warnings``.  Read by key (``reading[ENERGY.name]``) it is the record's dict
    (:meth:`record`), warnings left out."""

    def __init__(
        self,
        figures: Mapping[Figure, Any] | None = None,
        *,
        provenance: Mapping[Figure, Provenance] | None = None,
        extras: Mapping[str, Any] | None = None,
        warnings: Iterable[str] = (),
        errors: Iterable[str] = (),
    ):
        self.figures: dict[Figure, Any] = {}
        self.provenance: dict[Figure, Provenance] = {}
        self.extras: dict[str, Any] = {}
        # warnings by what gave them (a meter's name, METER_ERRORS), in the order they first came
        self._warnings: dict[str, list[str]] = {}
        for figure, value in (figures or {}).items():
            if not isinstance(figure, Figure):
                raise UndeclaredKey(
                    f"a reading's figure {figure!r} is not a declared Figure (petlprof.results.figures)"
                )
            self.figures[figure] = value
        for figure, given in (provenance or {}).items():
            if not isinstance(figure, Figure):
                raise UndeclaredKey(f"a reading's provenance names {figure!r}, not a declared Figure")
            if given.kind is not None:
                kind_key(figure)
            if given.source is not None:
                source_key(figure)
            self.provenance[figure] = Provenance(*given)
        for key, value in (extras or {}).items():
            if key in DECLARED_KEYS:
                raise UndeclaredKey(
                    f"a reading spells the declared key {key!r} as a plain string: put the value under its "
                    "Figure (figures=) or its provenance (provenance=)"
                )
            self.extras[key] = value
        if lines := list(warnings):
            self._warnings[_OWN_WARNINGS] = lines
        if lines := list(errors):
            self._warnings[METER_ERRORS] = lines

    def value(self, figure: Figure) -> Any:
        """The value of ``figure`` (None where this reading does not have it)."""
        return self.figures.get(figure)

    @property
    def warnings(self) -> list[str]:
        """Every warning and meter error, in the order their groups first came."""
        return [line for lines in self._warnings.values() for line in lines]

    @property
    def errors(self) -> list[str]:
        """The lines of the meters that failed."""
        return list(self._warnings.get(METER_ERRORS, []))

    def take_warnings(self) -> list[str]:
        """:attr:`warnings`, removed from the reading (a phase's ``warnings`` takes them once)."""
        lines = self.warnings
        self._warnings.clear()
        return lines

    def merge(self, other: Reading, *, said_by: str | None = None, keep: bool = False) -> Reading:
        """Add ``other``'s figures, provenance and keys to this reading (``keep``: where this one has a key
        already, keep its value) and its warnings, its own filed under ``said_by``; returns this reading."""
        for figure, value in other.figures.items():
            if not keep or figure not in self.figures:
                self.figures[figure] = value
        for figure, given in other.provenance.items():
            if not keep or figure not in self.provenance:
                self.provenance[figure] = given
        for key, value in other.extras.items():
            if not keep or key not in self.extras:
                self.extras[key] = value
        for group, lines in other._warnings.items():
            self._warnings.setdefault(said_by if group == _OWN_WARNINGS and said_by else group, []).extend(lines)
        return self

    def record(self) -> dict[str, Any]:
        """The plain dict a record's phase carries: figures by name, provenance under the keys the figures
        declare, the meters' own keys; warnings are the phase's (:meth:`take_warnings`)."""
        record: dict[str, Any] = {figure.name: value for figure, value in self.figures.items()}
        for figure, given in self.provenance.items():
            if figure.kind is not None:
                record[figure.kind] = given.kind
            if figure.source is not None:
                record[figure.source] = given.source
        record.update(self.extras)
        return record

    # read by key, the reading is its record as it is now (never a copy kept from before a merge or a meter's
    # change to its extras)
    def __getitem__(self, key: str) -> Any:
        return self.record()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.record())

    def __len__(self) -> int:
        return len(self.record())

    def __repr__(self) -> str:
        return f"Reading({self.record()!r}, warnings={self.warnings!r})"


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

    A meter declares every key its reading may hold: ``FIGURES`` (declared figures it always
    reads, None with their provenance when it fails), ``MORE_FIGURES`` (declared figures it reads beside
    them where it can), ``OWN`` (figures of its own, not declared in :mod:`petlprof.results.figures`: no rank
    rule, no column; None when it fails) and ``EXTRAS`` (the other keys it may write: settings, sources,
    details).  A reading with anything else is refused (:class:`UndeclaredKey`).
    """

    name = "meter"
    FIGURES: tuple[Figure, ...] = ()
    MORE_FIGURES: tuple[Figure, ...] = ()
    OWN: tuple[str, ...] = ()
    EXTRAS: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for figure in (*cls.FIGURES, *cls.MORE_FIGURES):
            if not isinstance(figure, Figure):
                raise UndeclaredKey(f"meter {cls.name!r} declares {figure!r}, not a Figure, among its figures")
        if spelled := sorted(DECLARED_KEYS.intersection((*cls.OWN, *cls.EXTRAS))):
            raise UndeclaredKey(f"meter {cls.name!r} declares the figure keys {spelled} as its own: use the Figures")

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._t0: float | None = None
        self.window_s: float | None = None

    @classmethod
    def figures(cls) -> tuple[Figure, ...]:
        """Every declared figure its reading may hold."""
        return (*cls.FIGURES, *cls.MORE_FIGURES)

    @classmethod
    def declared_keys(cls) -> set[str]:
        """Every key of the record its reading may produce."""
        figures = cls.figures()
        keys = {key for figure in figures for key in figure.reading_keys}
        return keys | set(cls.OWN) | set(cls.EXTRAS)

    @classmethod
    def check(cls, reading: Reading) -> Reading:
        """``reading``, if it holds only what this meter declares; else :class:`UndeclaredKey`."""
        if not isinstance(reading, Reading):
            raise UndeclaredKey(f"meter {cls.name!r} returned a {type(reading).__name__}, not a Reading")
        figures = set(cls.figures())
        stray = [f.name for f in (*reading.figures, *reading.provenance) if f not in figures]
        stray += [key for key in reading.extras if key not in cls.OWN and key not in cls.EXTRAS]
        if stray:
            raise UndeclaredKey(
                f"meter {cls.name!r} wrote {sorted(set(stray))}, which its class does not declare "
                "(FIGURES, MORE_FIGURES, OWN, EXTRAS): a misspelled key, or one to declare"
            )
        return reading

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """(usable here, why or why not) — never raises."""
        return True, "always available"

    def prepare(self) -> None:
        """Work that must finish before the window opens (not timed, not metered)."""

    def begin(self) -> None:
        self._begin()
        self._t0 = time.perf_counter()  # after the start-up: window_s covers the work, not the meter

    def end(self) -> Reading:
        self.window_s = time.perf_counter() - self.started_at()
        return self.check(self._end())

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

    def _end(self) -> Reading:
        """Read the final values and return the reading."""
        return Reading()

    def close(self) -> None:
        """Release what the meter holds (NVML handles, ...)."""

    def invalid_reading(self, error: Exception) -> Reading:
        """What the window records when this meter failed: its figures (and their provenance, its own
        figures) None, and why."""
        return Reading(
            dict.fromkeys(self.FIGURES),
            provenance={f: Provenance(None) for f in self.FIGURES if f.kind is not None or f.source is not None},
            extras=dict.fromkeys(self.OWN),
            errors=[f"{self.name} failed: {type(error).__name__}: {error}; its figures are missing"],
        )


def phase_warnings(reading: Reading) -> list[str]:
    """Take every meter's warnings and errors out of a window's reading, as one list for the phase's
    ``warnings``."""
    return reading.take_warnings()


class Window:
    """Runs several meters over one stretch of work; ``reading`` merges their results.

    All meters are prepared first, then the device is synchronised and every meter starts; at the
    end the device is synchronised once more before any meter stops, so queued GPU work lands in
    the window it belongs to.  ``time_s`` is the window's own device-synchronised wall time, from the
    last meter's start to the first meter's stop: the work only, never a meter's start-up or
    shut-down (CodeCarbon's take a second or more).  A window with an energy figure also carries its grade
    (:mod:`petlprof.results.grades`).
    """

    def __init__(self, meters: list[Meter], device: str = "cpu"):
        self.meters = meters
        self.device = device
        self.reading = Reading()
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
        self.reading.merge(meter.invalid_reading(error), keep=True)

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.time_s = time.perf_counter() - self._t0
        for meter in reversed(self._running):
            try:
                self.reading.merge(meter.end(), said_by=meter.name)
            except UndeclaredKey:  # a bug in the meter, not a failed measurement
                raise
            except Exception as error:  # a meter failing mid-run invalidates its figures, not the run
                self._record_failure(meter, error)
        if ENERGY in self.reading.figures:  # how far to trust it, from what the meters just said
            self.reading.extras.update(graded(self.reading.record()))
