"""How far to trust an energy figure: a grade from A (best) to D per metered window, from what its record says.

The rule, written once (docs/reports.md#energy-grades quotes it).  A window's energy figure starts at A; each
check below that fails caps it at the grade it names, and the figure gets the worst cap, with every failed check's
reason:

* **D** — the figure is estimated (a model of power, not a measurement), or its kind is unknown.
* **C** — fewer than :data:`MIN_UPDATES_B` counter updates in the window (one update's quantisation at each
  edge is then 20% or more); a lower bound (RAPL read too rarely to undo every wrap); power integrated from the
  ~1 s moving-average field; the counter went back mid-window, or did not move at all (a stuck driver).
* **B** — fewer than :data:`MIN_UPDATES_A` counter updates, or a source or window whose updates are not known;
  power integrated from the instantaneous field without a counter (it covers part of each update period); the
  counter and the integrated power disagree; the GPU's temperature moved more than
  :data:`MAX_TEMPERATURE_DRIFT_C` or its SM clock more than :data:`MAX_CLOCK_CHANGE` across the window (not
  settled), or a GPU window without its temperature recorded; other processes kept CPU cores busy.

Energy above idle (``energy_above_idle_j``) takes the energy figure's grade, capped further: C when it came out
negative (the baseline does not hold), B when the idle baseline was older than :data:`MAX_IDLE_AGE_S` or its two
halves differed by more than :data:`MAX_IDLE_SPREAD`.

Counter updates: NVML's energy counter every ``counter_update_period_s`` (detected by the power sampler; where it
was not, :data:`ASSUMED_NVML_UPDATE_S`, the slowest published, and the reason says so); RAPL every ~1 ms
(:data:`RAPL_UPDATE_S`, Intel's documented update interval); an integrated power timeline's samples.

The grade is computed when a window closes (:class:`petlprof.meters.base.Window`) and stored in the phase under
:data:`GRADE_KEY`, :data:`REASONS_KEY` and :data:`ABOVE_IDLE_GRADE_KEY`; a record from before grades existed is
graded from the same keys when read (what it lacks, as the temperature, counts as not known).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from petlprof.results.figures import ENERGY, ENERGY_ABOVE_IDLE, ENERGY_KIND, ENERGY_SOURCE, ENERGY_WINDOW
from petlprof.values import is_number
from petlprof.vocabulary import ESTIMATED, MEASURED

GRADES = ("A", "B", "C", "D")  # best first
GRADE_KEY = cast(str, ENERGY.grade)  # the keys are declared with the figures they grade
REASONS_KEY = f"{GRADE_KEY}_reasons"
ABOVE_IDLE_GRADE_KEY = cast(str, ENERGY_ABOVE_IDLE.grade)
KEYS = (GRADE_KEY, REASONS_KEY, ABOVE_IDLE_GRADE_KEY)

MIN_UPDATES_A = 50  # counter updates in a window for an A
MIN_UPDATES_B = 10  # ... for a B; fewer: C
ASSUMED_NVML_UPDATE_S = 0.1  # the slowest NVML energy-counter update period published (A100/H100: 20-100 ms)
RAPL_UPDATE_S = 0.001  # Intel SDM: the RAPL energy status counters update about every 1 ms
MAX_TEMPERATURE_DRIFT_C = 5.0
MAX_CLOCK_CHANGE = 0.10  # relative change of the SM clock across a window
MAX_IDLE_AGE_S = 3600.0
MAX_IDLE_SPREAD = 0.10  # relative difference of the idle baseline's two halves
STUCK_WINDOW_S = 1.0  # a counter that has not moved in a window this long is stuck: a GPU draws tens of W idle
RAPL_GAP_WINDOW_S = 5.0  # a RAPL window this long flagged low-confidence missed reads (shorter ones are just short)

# the sources the energy meters write (petlprof.meters.energy, petlprof.meters.cpu_power_model)
NVML_COUNTER, NVML_INTEGRATED, RAPL = "nvml-energy-counter", "nvml-power-integrated", "rapl"
GPU_SOURCES = (NVML_COUNTER, NVML_INTEGRATED)
# the keys the NVML energy meter writes at a window's edges
TEMPERATURE_KEYS = ("gpu_temperature_start_c", "gpu_temperature_end_c")
CLOCK_KEYS = ("gpu_sm_clock_start_mhz", "gpu_sm_clock_end_mhz")
# the keys the energy meters write about the idle baseline (petlprof.meters.energy.above_idle)
IDLE_AGE_KEY, IDLE_SPREAD_KEY = "idle_baseline_age_s", "idle_power_spread"


@dataclass(frozen=True)
class Grade:
    """A figure's grade and why it is not better (empty for an A)."""

    letter: str
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.letter not in GRADES:
            raise ValueError(f"grade {self.letter!r} is not one of {', '.join(GRADES)}")

    def capped(self, letter: str, reason: str) -> Grade:
        """This grade, no better than ``letter``, with ``reason`` added."""
        return Grade(worst((self.letter, letter)) or letter, (*self.reasons, f"{letter}: {reason}"))

    def line(self) -> str:
        """``C (B: ...; C: ...)``, or ``A`` alone."""
        return self.letter + (f" ({'; '.join(self.reasons)})" if self.reasons else "")


def worst(letters: Iterable[str | None]) -> str | None:
    """The worst of ``letters`` (None entries skipped; None when there is none)."""
    known = [letter for letter in letters if letter in GRADES]
    return max(known, key=GRADES.index) if known else None


def _number(phase: Mapping[str, Any], key: str) -> float | None:
    """``phase[key]`` as a float; None where it is missing, not a finite number, or past a float's range."""
    value = phase.get(key)
    if not is_number(value):
        return None
    try:
        return float(cast(float, value))
    except OverflowError:  # an int such as 10**400
        return None


def _updates(phase: Mapping[str, Any], window_s: float) -> tuple[float | None, str]:
    """(counter updates in the window, how they were counted) for the window's energy source."""
    source = phase.get(ENERGY_SOURCE)
    if source == NVML_COUNTER:
        period = _number(phase, "counter_update_period_s")
        if period and period > 0:
            return window_s / period, f"the counter updates every {period * 1000:.0f} ms"
        assumed = f"update period not detected, {ASSUMED_NVML_UPDATE_S * 1000:.0f} ms assumed"
        return window_s / ASSUMED_NVML_UPDATE_S, assumed
    if source == RAPL:
        return window_s / RAPL_UPDATE_S, f"RAPL updates every ~{RAPL_UPDATE_S * 1000:.0f} ms"
    if source == NVML_INTEGRATED:
        samples = _number(phase, "power_samples")
        return samples, "power samples integrated"
    return None, ""


def _checks(phase: Mapping[str, Any], grade: Grade) -> Grade:
    """``grade`` capped by every check of the measured figure's window (see the module's table)."""
    window_s = _number(phase, ENERGY_WINDOW.name)
    source = phase.get(ENERGY_SOURCE)
    if source not in (*GPU_SOURCES, RAPL):
        grade = grade.capped("B", f"source {source!r}: petlprof does not know how often it updates")
    elif window_s is None:
        grade = grade.capped("B", "the window's length was not recorded, so its counter updates are not known")
    else:
        updates, how = _updates(phase, window_s)
        counted = f"{updates or 0:.0f} updates in the {window_s:.2f} s window ({how}): fewer than"
        if updates is not None and updates < MIN_UPDATES_B:
            grade = grade.capped("C", f"{counted} {MIN_UPDATES_B}")
        elif updates is not None and updates < MIN_UPDATES_A:
            grade = grade.capped("B", f"{counted} {MIN_UPDATES_A}")
    if source == RAPL and phase.get("energy_low_confidence") and (window_s or 0) >= RAPL_GAP_WINDOW_S:
        grade = grade.capped("C", "RAPL was not read often enough to undo every counter wrap: a lower bound")
    if source == NVML_INTEGRATED:
        if phase.get("power_field_averaged"):
            grade = grade.capped("C", "integrated from the ~1 s moving-average power field (it lags the load)")
        else:
            grade = grade.capped("B", "no energy counter: the power field covers part of each update period")
    if source == NVML_COUNTER and phase.get(ENERGY.name) == 0 and (window_s or 0) >= STUCK_WINDOW_S:
        grade = grade.capped("C", f"the energy counter did not move in {window_s:.1f} s (a stuck driver?)")
    if phase.get("energy_counter_went_back"):
        grade = grade.capped("C", "the energy counter went back mid-window (driver reloaded)")
    if phase.get("energy_sources_disagree"):
        ratio = _number(phase, "energy_integrated_vs_counter")
        said = f" (integrated/counter {ratio:.2f})" if ratio is not None else ""
        grade = grade.capped("B", f"the energy counter and the integrated power disagree{said}")
    if source in GPU_SOURCES:
        grade = _settled(phase, grade)
    if phase.get("contended"):
        cores = _number(phase, "others_cpu_cores")
        said = f" ({cores:.1f} cores)" if cores is not None else ""
        grade = grade.capped("B", f"other processes kept CPU cores busy during the window{said}")
    return grade


def _settled(phase: Mapping[str, Any], grade: Grade) -> Grade:
    """``grade`` capped where the GPU's temperature or clock moved across the window, or was not recorded."""
    start, end = (_number(phase, key) for key in TEMPERATURE_KEYS)
    if start is None or end is None:
        return grade.capped("B", "the GPU's temperature at the window's edges was not recorded")
    if abs(end - start) > MAX_TEMPERATURE_DRIFT_C:
        grade = grade.capped(
            "B",
            f"the GPU's temperature moved {end - start:+.0f} °C across the window (more than "
            f"{MAX_TEMPERATURE_DRIFT_C:g} °C): not settled (--settle)",
        )
    clock_start, clock_end = (_number(phase, key) for key in CLOCK_KEYS)
    if clock_start and clock_end is not None and abs(clock_end / clock_start - 1) > MAX_CLOCK_CHANGE:
        grade = grade.capped(
            "B", f"the SM clock moved from {clock_start:.0f} to {clock_end:.0f} MHz across the window (throttling?)"
        )
    return grade


def energy_grade(phase: Mapping[str, Any]) -> Grade | None:
    """The grade of a window's ``energy_j`` (None where the window has no energy figure)."""
    if not is_number(phase.get(ENERGY.name)):
        return None
    kind, source = phase.get(ENERGY_KIND), phase.get(ENERGY_SOURCE)
    if kind == ESTIMATED:
        return Grade("D", (f"D: estimated by the {source or 'unnamed'} meter, a model of power, not a measurement",))
    if kind != MEASURED:
        return Grade("D", ("D: not said to be measured (no energy_kind)",))
    return _checks(phase, Grade("A"))


def above_idle_grade(phase: Mapping[str, Any], grade: Grade | None) -> Grade | None:
    """The grade of the window's ``energy_above_idle_j``: ``grade`` capped by the idle baseline's checks."""
    if grade is None or not is_number(phase.get(ENERGY_ABOVE_IDLE.name)):
        return None
    if phase.get("energy_above_idle_low_confidence"):
        grade = grade.capped("C", "energy above idle came out negative: the idle baseline does not hold")
    age = _number(phase, IDLE_AGE_KEY)
    if age is not None and age > MAX_IDLE_AGE_S:
        grade = grade.capped("B", f"the idle baseline was {age / 60:.0f} min old (more than {MAX_IDLE_AGE_S / 60:.0f})")
    spread = _number(phase, IDLE_SPREAD_KEY)
    if spread is not None and spread > MAX_IDLE_SPREAD:
        grade = grade.capped("B", f"the idle baseline's halves differed by {spread:.0%} (unstable idle)")
    return grade


def graded(phase: Mapping[str, Any]) -> dict[str, str | list[str] | None]:
    """The grade keys of one window (:data:`KEYS`), None where it has no energy figure."""
    grade = energy_grade(phase)
    above = above_idle_grade(phase, grade)
    return {
        GRADE_KEY: None if grade is None else grade.letter,
        REASONS_KEY: None if grade is None else list(grade.reasons),
        ABOVE_IDLE_GRADE_KEY: None if above is None else above.letter,
    }


def grade_of(phase: Mapping[str, Any] | None) -> Grade | None:
    """A phase's energy grade: as recorded, else graded now from its keys (a record from before grades)."""
    if not isinstance(phase, Mapping):
        return None
    letter = phase.get(GRADE_KEY)
    if letter in GRADES:
        reasons = phase.get(REASONS_KEY)
        return Grade(letter, tuple(str(r) for r in reasons) if isinstance(reasons, list) else ())
    return energy_grade(phase)
