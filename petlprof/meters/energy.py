"""Energy of a window: the NVML energy counter on NVIDIA GPUs, RAPL on CPUs (the estimate is in
:mod:`petlprof.meters.cpu_power_model`).

* ``nvml`` — the total-energy counter (millijoules since driver load) read at both edges of the
  window on the GPU the run uses (matched by UUID, since CUDA and NVML number devices
  differently), and the same window's power timeline from the sampler process
  (:mod:`petlprof.meters.power`) integrated over time.  Both figures are recorded; ``energy_j``
  is the counter where the GPU has one, else the integrated power.  The counter updates every
  ~20–100 ms and power readings cover only part of each update period, so windows shorter than
  :data:`SHORT_WINDOW_S` are flagged ``energy_low_confidence``.  Other processes on the same
  GPU during the window are named in a warning.
* ``rapl`` — the package domains plus their ``dram`` sub-domains (:mod:`petlprof.meters.devices.rapl`),
  read by a polling thread at least four times per counter wrap period while the window is open, so
  every wrap is undone; a window whose reads were further apart than one wrap period (a stalled
  thread) is flagged low-confidence, its figure a lower bound.

Hardware is read only through :mod:`petlprof.meters.devices`.  Every reading carries its
provenance (:data:`PROVENANCE_KEYS`, the energy figure's kind and source, the window's length and its
warnings); given the sweep's idle baseline (:mod:`petlprof.meters.idle`, passed to the meter by its
caller) also the energy above idle (:data:`IDLE_KEYS`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from petlprof.meters.base import Meter, Provenance, Reading, Window
from petlprof.meters.devices import nvml as nvml_dev
from petlprof.meters.devices import rapl
from petlprof.results.figures import (
    ENERGY,
    ENERGY_ABOVE_IDLE,
    ENERGY_COUNTER,
    ENERGY_INTEGRATED,
    ENERGY_WINDOW,
    IDLE_POWER,
    MEAN_POWER,
    WARMUP_ENERGY,
    WARMUP_TIME,
)
from petlprof.results.grades import (
    ASSUMED_NVML_UPDATE_S,
    CLOCK_KEYS,
    IDLE_AGE_KEY,
    IDLE_SPREAD_KEY,
    MIN_UPDATES_A,
    NVML_COUNTER,
    NVML_INTEGRATED,
    TEMPERATURE_KEYS,
)
from petlprof.vocabulary import MEASURED

if TYPE_CHECKING:
    from petlprof.meters.idle import IdleBaseline

    # numpy (through the power sampler's module): slow to import, and only the nvml meter reads a timeline
    from petlprof.meters.power import TimelineWindow

SHORT_WINDOW_S = 5.0
AGREEMENT_TOLERANCE = 0.10  # counter vs integrated power, beyond the counter's own quantisation
RAPL_MAX_WATTS = 400.0  # the most one RAPL domain draws: sets how often its counter must be read
RAPL_MIN_POLL_S = 1.0
RAPL_MAX_POLL_S = 60.0
# the keys beside the figures that every energy reading carries (provenance), and those of energy above idle
PROVENANCE_KEYS = ("energy_meter", "energy_samples", "energy_sample_rate_hz", "energy_low_confidence")
IDLE_KEYS = ("idle_power_source", "energy_above_idle_low_confidence", IDLE_AGE_KEY, IDLE_SPREAD_KEY)
# the GPU's state at a window's edges (start, end), which its energy grade reads (petlprof.results.grades)
EDGE_KEYS = (*TEMPERATURE_KEYS, *CLOCK_KEYS)


class Agreement(TypedDict):
    """The nvml reading's cross-check of its two figures (:func:`cross_check`); None without both."""

    energy_integrated_vs_counter: float | None  # integrated power / the counter
    energy_sources_disagree: bool | None  # beyond AGREEMENT_TOLERANCE and the counter's quantisation


AGREEMENT_KEYS = tuple(Agreement.__annotations__)


def provenance(
    meter: Meter, source: str, kind: str, samples: int, warnings: list[str], sample_rate_hz: float | None = None
) -> Reading:
    """The provenance fields every energy reading carries.  ``sample_rate_hz``: how often the source
    updates or was sampled (a counter's update rate, the power timeline's achieved rate); None where
    the figure is a difference of two readings of a source whose rate is not known."""
    window_s = meter.closed_window_s()
    low = window_s < SHORT_WINDOW_S
    if low and kind == MEASURED:
        warnings = [
            *warnings,
            f"window {window_s:.2f} s < {SHORT_WINDOW_S:g} s: the {source} reading covers too "
            "few counter updates, so this figure is low-confidence",
        ]
    return Reading(
        {ENERGY_WINDOW: window_s},
        provenance={ENERGY: Provenance(kind, source)},
        extras=dict(zip(PROVENANCE_KEYS, (meter.name, samples, sample_rate_hz, low))),
        warnings=warnings,
    )


def above_idle(
    energy_j: float | None,
    idle_w: float | None,
    window_s: float,
    source: str,
    warnings: list[str],
    idle: IdleBaseline | None = None,
) -> Reading:
    """``energy_above_idle_j`` from a window's energy and an idle power read from the same ``source``;
    a negative result (the window drew less than idle) is flagged and explained in ``warnings``.  ``idle``:
    the baseline it came from, whose age and spread the figure's grade reads."""
    if energy_j is None or idle_w is None:
        return Reading()
    measured_at, spread = (idle.get("measured_at"), idle.get("spread")) if idle else (None, None)
    age_s = time.time() - measured_at if isinstance(measured_at, (int, float)) else None
    above = energy_j - idle_w * window_s
    if above < 0:
        warnings.append(
            f"energy above idle is negative ({above:.1f} J: {energy_j:.1f} J in {window_s:.2f} s is less than "
            f"the idle power {idle_w:.1f} W): the idle baseline does not hold for this window (load during the "
            "baseline, a power-state change, or sensor error)"
        )
    return Reading(
        {ENERGY_ABOVE_IDLE: above, IDLE_POWER: idle_w}, extras=dict(zip(IDLE_KEYS, (source, above < 0, age_s, spread)))
    )


def cross_check(
    counter_j: float | None,
    integrated_j: float | None,
    window_s: float,
    update_s: float | None,
    power_field: str | None,
    warnings: list[str],
) -> Agreement:
    """Counter against integrated power for one window: their ratio, and whether they disagree by more
    than :data:`AGREEMENT_TOLERANCE` plus the counter's quantisation (one update period at each edge).
    Power fields that cover only part of each update period, or average over a second, are off by
    tens of percent under a load in step with the sensor; the counter sees all of it."""
    if counter_j is None or integrated_j is None or counter_j <= 0:
        return {"energy_integrated_vs_counter": None, "energy_sources_disagree": None}
    ratio = integrated_j / counter_j
    allowed = AGREEMENT_TOLERANCE + 2 * (update_s or 0.1) / max(window_s, 1e-9)
    disagree = abs(ratio - 1) > allowed
    if disagree:
        warnings.append(
            f"integrated power ({power_field} field) gives {integrated_j:.1f} J, the energy counter {counter_j:.1f} J "
            f"({ratio - 1:+.0%}, more than the {allowed:.0%} allowed): the power field misses part of the load "
            "(part-time or averaged sampling); energy_j is the counter's"
        )
    return {"energy_integrated_vs_counter": ratio, "energy_sources_disagree": disagree}


class NvmlEnergyMeter(Meter):
    """GPU energy: the total-energy counter and, with a :class:`PowerTimeline`, integrated power.

    ``idle``: the sweep's idle baseline (:func:`petlprof.meters.idle.measure_idle`), or None."""

    name = "nvml"
    FIGURES = (ENERGY,)
    MORE_FIGURES = (ENERGY_COUNTER, ENERGY_INTEGRATED, MEAN_POWER, ENERGY_WINDOW, ENERGY_ABOVE_IDLE, IDLE_POWER)
    TIMELINE_KEYS = (  # the power timeline's provenance, by reading key -> its field of TimelineWindow
        ("power_field", "power_field"),
        ("power_samples", "samples"),
        ("power_sample_rate_hz", "sample_rate_hz"),
        ("counter_update_period_s", "update_period_s"),
        ("power_update_period_s", "power_update_period_s"),
        ("power_fallback_samples", "power_fallback_samples"),
        ("nvml_peak_process_memory_bytes", "own_peak_bytes"),
    )
    EXTRAS = (
        *(key for key, _ in TIMELINE_KEYS),
        "power_field_averaged",
        *AGREEMENT_KEYS,
        *PROVENANCE_KEYS,
        *IDLE_KEYS,
        *EDGE_KEYS,
        "energy_counter_went_back",
        "gpu_power_limit_w",  # the limit in force as the window opened (--power-limit sets it)
    )

    def __init__(self, device: str = "cuda", timeline=None, idle: IdleBaseline | None = None):
        super().__init__(device)
        self._nvml = nvml_dev.start()
        self.uuid = nvml_dev.cuda_uuid(device)
        self.handles = [nvml_dev.handle(self._nvml, self.uuid)]
        self.timeline = timeline
        self.idle = idle
        self.idle_w = (idle.get("nvml_w") or {}).get(self.uuid) if idle else None
        # version-1 baselines: sampled
        self.idle_source = idle.get("nvml_source", "nvml-power-integrated") if idle else "nvml-power-integrated"
        self.has_counter = nvml_dev.has_counter(self._nvml, self.handles)
        if not self.has_counter and timeline is None:
            raise RuntimeError(f"GPU {self.uuid} has no energy counter and no power timeline was started")
        self._start: list[int] = []
        self._edge: tuple[int | None, int | None] = (None, None)
        self._limit_w: float | None = None

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return nvml_dev.availability()

    def _edge_state(self) -> tuple[int | None, int | None]:
        """(temperature °C, SM clock MHz) of the GPU now: whether the window ran on a settled device."""
        gpu = self.handles[0]
        return nvml_dev.temperature_c(self._nvml, gpu), nvml_dev.sm_clock_mhz(self._nvml, gpu)

    def _read(self) -> list[int]:
        return nvml_dev.energy_mj(self._nvml, self.handles)

    def _begin(self) -> None:
        self._edge = self._edge_state()
        try:
            self._limit_w = nvml_dev.power_limit_mw(self._nvml, self.handles[0]) / 1000
        except self._nvml.NVMLError:
            self._limit_w = None
        self._start = self._read() if self.has_counter else []

    def _end(self) -> Reading:
        t1 = time.perf_counter()
        warnings: list[str] = []
        counter_j = None
        went_back = False
        if self.has_counter:
            # the counter only resets with the driver; a smaller value means it was reset mid-window
            end = self._read()
            counter_j = sum(e - s if e >= s else e for s, e in zip(self._start, end)) / 1000.0
            went_back = any(e < s for s, e in zip(self._start, end))
            if went_back:
                warnings.append("the energy counter went back (driver reloaded?): counted from zero")
        (temperature_0, clock_0), (temperature_1, clock_1) = self._edge, self._edge_state()
        edges = dict(zip(EDGE_KEYS, (temperature_0, temperature_1, clock_0, clock_1)))
        timeline = self._timeline_window(self.started_at(), t1, warnings)
        integrated_j = None if timeline is None else timeline.integrated_energy_j
        period = None if timeline is None else timeline.update_period_s
        if counter_j is not None:
            energy, source, samples = counter_j, "nvml-energy-counter", 2
            rate = 1.0 / period if period else None  # the counter's own update rate, when detected
        else:
            if timeline is None or integrated_j is None:
                raise RuntimeError("no energy counter and the power timeline does not cover the window")
            energy, source, samples = integrated_j, "nvml-power-integrated", timeline.samples
            rate = timeline.sample_rate_hz
        idle = self._above_idle(counter_j, integrated_j, warnings)
        field = None if timeline is None else timeline.power_field
        agreement = cross_check(counter_j, integrated_j, self.closed_window_s(), period, field, warnings)
        if timeline is not None and timeline.power_fallback_samples:
            warnings.append(
                f"{timeline.power_fallback_samples} of the window's power samples come from the averaged field "
                "(the instantaneous read failed)"
            )
        if counter_j is None and field == "average":
            warnings.append(
                "energy integrated from the averaged power field (a ~1 s moving average): it lags the load, "
                "so a window's edges are smeared by about half a second"
            )
        reading = Reading(
            {
                ENERGY: energy,
                ENERGY_COUNTER: counter_j,
                ENERGY_INTEGRATED: integrated_j,
                MEAN_POWER: None if timeline is None else timeline.mean_power_w,
            },
            extras={
                **{key: getattr(timeline, field_there, None) for key, field_there in self.TIMELINE_KEYS},
                "power_field_averaged": None if field is None else field != "instant",
                **agreement,
                **edges,
                "energy_counter_went_back": went_back,
                "gpu_power_limit_w": self._limit_w,
            },
        )
        return reading.merge(provenance(self, source, MEASURED, samples, warnings, rate)).merge(idle)

    def _above_idle(self, counter_j: float | None, integrated_j: float | None, warnings: list[str]) -> Reading:
        """Energy above idle from the window's figure of the source the idle power came from."""
        if self.idle_w is None:
            return Reading()
        energy = counter_j if self.idle_source == "nvml-energy-counter" else integrated_j
        if energy is None:
            warnings.append(f"no energy above idle: the idle power is from {self.idle_source}, not read in this window")
            return Reading()
        return above_idle(energy, self.idle_w, self.closed_window_s(), self.idle_source, warnings, self.idle)

    def _timeline_window(self, t0: float, t1: float, warnings: list[str]) -> TimelineWindow | None:
        """The power timeline's window [t0, t1] (None without a timeline, or when it failed: ``warnings`` say why)."""
        if self.timeline is None:
            return None
        if not self.timeline.alive:
            warnings.append("the power sampler process is not running: no power timeline for this window")
            return None
        try:
            data: TimelineWindow = self.timeline.window(t0, t1)
        except Exception as error:  # the counter's figure stands; only the timeline's is missing
            warnings.append(f"the power timeline failed for this window ({type(error).__name__}: {error})")
            return None
        if data.other_pids:
            warnings.append(
                f"other processes used the GPU during the window (pids {data.other_pids}): "
                "its energy includes their work"
            )
        if data.integrated_energy_j is None:
            warnings.append("the power timeline does not cover the whole window")
        return data

    def close(self) -> None:
        nvml_dev.stop(self._nvml)


class RaplEnergyMeter(Meter):
    """CPU package + DRAM energy from the RAPL counters, read by a polling thread while the window is
    open so that every counter wrap is undone (:class:`~petlprof.meters.devices.rapl.WrapTracker`).

    ``idle``: the sweep's idle baseline, or None.  ``poll_s``: seconds between reads (None: a
    quarter of the smallest counter's wrap period at :data:`RAPL_MAX_WATTS`, within
    [:data:`RAPL_MIN_POLL_S`, :data:`RAPL_MAX_POLL_S`]); 0 reads only at the window's edges."""

    name = "rapl"
    FIGURES = (ENERGY,)
    MORE_FIGURES = (ENERGY_WINDOW, ENERGY_ABOVE_IDLE, IDLE_POWER)
    EXTRAS = ("energy_domains", *PROVENANCE_KEYS, *IDLE_KEYS)

    def __init__(
        self,
        device: str = "cpu",
        root: Path = rapl.POWERCAP,
        idle: IdleBaseline | None = None,
        poll_s: float | None = None,
    ):
        super().__init__(device)
        self.domains = rapl.domains(root)
        self.idle = idle
        self.idle_w = idle.get("rapl_w") if idle else None
        self.tracker = rapl.WrapTracker(self.domains)
        if poll_s is None:
            poll_s = min(max(self.tracker.wrap_period_s(RAPL_MAX_WATTS) / 4, RAPL_MIN_POLL_S), RAPL_MAX_POLL_S)
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def available(cls, root: Path = rapl.POWERCAP) -> tuple[bool, str]:
        return rapl.availability(root)

    def poll(self) -> None:
        """Read the counters now (the polling thread does this every ``poll_s`` seconds)."""
        self.tracker.update()

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except OSError:  # read again at the next tick; the window's end read reports a lasting error
                continue

    def _begin(self) -> None:
        self.tracker.start()
        if self.poll_s:
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll_loop, name="petlprof-rapl-poll", daemon=True)
            self._thread.start()

    def _end(self) -> Reading:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.poll()
        energy = sum(self.tracker.total_uj) / 1e6
        wrap_s = self.tracker.wrap_period_s(RAPL_MAX_WATTS)
        warnings = []
        missed = self.tracker.max_gap_s > wrap_s
        if missed:
            warnings.append(
                f"RAPL counters were not read for {self.tracker.max_gap_s:.0f} s, longer than one counter wrap "
                f"({wrap_s:.0f} s at up to {RAPL_MAX_WATTS:g} W): whole wraps may be lost, so "
                f"{energy:.0f} J is a lower bound and the reading is low-confidence"
            )
        idle = above_idle(energy, self.idle_w, self.closed_window_s(), "rapl", warnings, self.idle)
        reading = Reading({ENERGY: energy}, extras={"energy_domains": rapl.names(self.domains)})
        reading.merge(provenance(self, "rapl", MEASURED, self.tracker.readings, warnings)).merge(idle)
        reading.extras["energy_low_confidence"] = reading.extras["energy_low_confidence"] or missed
        return reading


MAX_REPEATS = 50  # the most passes a short window is repeated for its energy (mitigation of a too-short window)
MAX_REPEAT_S = 30.0  # ... and the most seconds the repeated window may last
REPEAT_KEYS = ("energy_repeats", "energy_repeat_cap")


def repeats_needed(phase: Mapping[str, Any]) -> int:
    """How many passes of a window's work its energy figure needs to rest on enough counter updates (1: it has
    them, or repeating cannot help: an estimate, a source updating every ~1 ms, no window length); within
    :data:`MAX_REPEATS` and :data:`MAX_REPEAT_S` (the cap)."""
    window_s = phase.get(ENERGY_WINDOW.name)
    needed_s = needed_window_s(phase)
    if needed_s is None or not isinstance(window_s, (int, float)) or not 0 < window_s < needed_s:
        return 1
    return max(1, min(math.ceil(needed_s / window_s), MAX_REPEATS, math.floor(MAX_REPEAT_S / window_s)))


def energy_meters(meters: list[Meter]) -> list[Meter]:
    """The meters of ``meters`` that read the run's energy figure (``energy_j``)."""
    return [m for m in meters if ENERGY in m.FIGURES]


class WarmUp:
    """A phase's warm-up steps, calls or repeats (allocator warm-up, lazy initialisation): outside the phase's
    measured window, so their start-up costs never enter its figures, but timed and metered in a window of the
    phase's energy meters alone, so what they cost is known and a search can charge it (:meth:`figures`:
    ``warmup_time_s`` and ``warmup_energy_j``; the energy None without an energy meter or where one failed, and
    0 for a phase without warm-ups, which runs no window).  Memory is not read: the phase's peak stays its
    measured window's."""

    def __init__(self, meters: list[Meter], device: str, steps: int):
        self._window = Window(energy_meters(meters), device) if steps > 0 else None

    def __enter__(self) -> WarmUp:
        if self._window is not None:
            self._window.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._window is not None:
            self._window.__exit__(*exc)

    def figures(self) -> dict[str, float | None]:
        """``warmup_time_s`` (s, device-synchronised) and ``warmup_energy_j`` (J, by the phase's energy meter)."""
        if self._window is None:
            return {WARMUP_TIME: 0.0, WARMUP_ENERGY.name: 0.0}
        self._window.reading.take_warnings()  # a short window's doubts belong to no figure the phase reports
        return {WARMUP_TIME: self._window.time_s, WARMUP_ENERGY.name: self._window.reading.value(ENERGY)}


def lengthened(phase: Mapping[str, Any], meters: list[Meter], device: str, work: Callable[[], None]) -> dict[str, Any]:
    """The energy keys of ``phase`` re-measured over :func:`repeats_needed` passes of ``work`` (one pass of the
    phase's measured work, run again without scoring) in a window of the energy meters alone, as per-pass figures:
    a window graded short by its counter updates made long enough (:mod:`petlprof.results.grades`).  Empty where one
    pass is enough or cannot be helped.  The keys say how many passes (``energy_repeats``) and whether the cap
    stopped them short (``energy_repeat_cap``); time, latency and memory stay the first pass's."""
    repeats = repeats_needed(phase)
    metering = energy_meters(meters)
    if repeats <= 1 or not metering:
        return {}
    with Window(metering, device) as window:
        for _ in range(repeats):
            work()
    record = window.reading.record()
    window.reading.take_warnings()
    per_pass = {f.name: record[f.name] / repeats for f in PER_PASS if isinstance(record.get(f.name), (int, float))}
    needed = needed_window_s(phase) or 0.0
    return {**record, **per_pass, **dict(zip(REPEAT_KEYS, (repeats, repeats * phase[ENERGY_WINDOW.name] < needed)))}


PER_PASS = (ENERGY, ENERGY_COUNTER, ENERGY_INTEGRATED, ENERGY_ABOVE_IDLE)  # totals of a repeated window, per pass


def needed_window_s(phase: Mapping[str, Any]) -> float | None:
    """The window an NVML energy figure needs for an A on its updates (:data:`MIN_UPDATES_A` update periods);
    None for the other sources (RAPL's ~1 ms updates need no repeats, an estimate is no measurement)."""
    source = phase.get("energy_source")
    if source == NVML_COUNTER:
        period = phase.get("counter_update_period_s")
        period = period if isinstance(period, (int, float)) and 0 < period < 1 else ASSUMED_NVML_UPDATE_S
        return MIN_UPDATES_A * period
    if source == NVML_INTEGRATED:
        rate = phase.get("power_sample_rate_hz")
        return MIN_UPDATES_A / rate if isinstance(rate, (int, float)) and rate > 0 else None
    return None
