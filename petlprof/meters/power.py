"""A GPU power timeline sampled in a separate process, and the energy it integrates to.

The sampler runs in its own interpreter (``multiprocessing`` *spawn* context), never as a thread
of the training process: it cannot steal the training loop's GIL, and a stall in the loop cannot
stretch its sampling period.  At start it watches the NVML energy counter and the power reading
together for up to :data:`DETECT_S` seconds and takes the median time between changes of each as
its update period (the two differ on some GPUs); it then samples power at half the power reading's
period, clipped to [:data:`MIN_PERIOD_S`, :data:`MAX_PERIOD_S`] (100 Hz or faster where the driver
updates every 20 ms or faster).  Power is read from the instantaneous field
``NVML_FI_DEV_POWER_INSTANT`` where the driver has it, else from ``nvmlDeviceGetPowerUsage`` (on
Ampere and later a 1 s average); which one was used is part of every reading, and a window in
which a failed instantaneous read fell back to the averaged field says so (``instant+average``
and the number of such samples).  Every :data:`PROCESS_EVERY` samples it
also lists the compute processes on each GPU: the peak device memory of the run's own process
(a cross-check of the CUDA allocator) and any other process using the same GPU.

Timestamps are ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux, shared by all processes), so a
window opened in the training process selects its samples exactly.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from petlprof.meters.devices import nvml as nvml_dev

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

DETECT_S = 1.0
MIN_PERIOD_S = 0.005
MAX_PERIOD_S = 0.05
FALLBACK_PERIOD_S = 0.01
PROCESS_EVERY = 10
START_TIMEOUT_S = 60.0
WINDOW_TIMEOUT_S = 30.0  # a window's samples come back in milliseconds; a stuck NVML call must not hang the run


class NvmlPowerSource:
    """Reads power, the energy counter and compute processes of GPUs named by UUID (in the child)."""

    def __init__(self, uuids: list[str], own_pid: int):
        self.uuids = list(uuids)
        self.own_pid = own_pid
        self.power_field = "average"
        self.fell_back = False

    def open(self) -> None:
        self._nvml = nvml_dev.start()
        self._handles = [nvml_dev.handle(self._nvml, u) for u in self.uuids]
        try:
            values = [nvml_dev.instant_power_mw(self._nvml, h) for h in self._handles]
            self.power_field = "instant" if all(v is not None for v in values) else "average"
        except self._nvml.NVMLError:
            self.power_field = "average"

    def read_power_w(self) -> list[float]:
        if self.power_field == "instant":  # a transient failed field read falls back to the average field
            values = [nvml_dev.instant_power_mw(self._nvml, h) for h in self._handles]
            self.fell_back = any(v is None for v in values)  # and the window says so
            return [
                v / 1000.0 if v is not None else nvml_dev.average_power_mw(self._nvml, h) / 1000.0
                for v, h in zip(values, self._handles)
            ]
        return [nvml_dev.average_power_mw(self._nvml, h) / 1000.0 for h in self._handles]

    def read_energy_mj(self) -> list[int] | None:
        try:
            return nvml_dev.energy_mj(self._nvml, self._handles)
        except self._nvml.NVMLError:
            return None

    def read_processes(self) -> tuple[int | None, list[int]]:
        """(device bytes of the run's process summed over the GPUs, pids of other processes).

        In a container with its own PID namespace NVML reports host pids and the run's process
        cannot be told apart: its bytes are then None, and all pids count as others only when
        there is more than one process on a GPU."""
        own, others = None, set()
        for handle in self._handles:
            procs = nvml_dev.compute_processes(self._nvml, handle)
            pids = {pid for pid, _ in procs}
            if self.own_pid in pids:
                own = (own or 0) + sum(used for pid, used in procs if pid == self.own_pid)
                others |= pids - {self.own_pid}
            elif len(pids) > 1:
                others |= pids
        return own, sorted(others)

    def close(self) -> None:
        nvml_dev.stop(self._nvml)


def detect_update_periods(reads: dict[str, Any], detect_s: float = DETECT_S) -> dict[str, float | None]:
    """For each ``name: read`` the median seconds between changes of ``read()``, all watched together
    for up to ``detect_s``; None for one that never changed three times."""
    last = {name: read() for name, read in reads.items()}
    changes: dict[str, list[float]] = {name: [] for name in reads}
    deadline = time.perf_counter() + detect_s
    while time.perf_counter() < deadline and min(len(c) for c in changes.values()) < 12:
        for name, read in reads.items():
            value = read()
            if value != last[name]:
                changes[name].append(time.perf_counter())
                last[name] = value
        time.sleep(0.0005)
    gaps = {name: np.diff(times) for name, times in changes.items()}
    return {name: float(statistics.median(g)) if len(g) >= 2 else None for name, g in gaps.items()}


def sampling_period(update_period_s: float | None) -> float:
    if update_period_s is None:
        return FALLBACK_PERIOD_S
    return float(min(max(update_period_s / 2, MIN_PERIOD_S), MAX_PERIOD_S))


@dataclass(frozen=True)
class SamplerInfo:
    """What the sampler found at start (:func:`sampler_info`), sent once to the training process."""

    power_field: str  # instant or average: the field sampled
    update_period_s: float | None  # the energy counter's own update period (None: no counter, or it never changed)
    power_update_period_s: float | None  # the power field's (they differ on some GPUs)
    period_s: float  # the sampling period, from the power field's
    counter: bool  # the GPUs have an energy counter


@dataclass(frozen=True)
class WindowSamples:
    """The samples of one window (:meth:`Samples.select`), sent from the sampler to the training process."""

    times: list[float]
    powers: list[list[float]]  # per sample, W per GPU
    own_peak_bytes: int | None  # the run's process's peak device memory in the window (None: not listed)
    other_pids: list[int]  # other processes on the same GPUs
    fallback_samples: int  # samples whose instantaneous read fell back to the averaged field


@dataclass(frozen=True)
class TimelineWindow:
    """A window of the power timeline (:func:`window_figures`): integrated energy, mean power and provenance."""

    integrated_energy_j: float | None  # None when the samples do not cover the window
    mean_power_w: float | None  # summed over the GPUs (None without samples)
    mean_power_per_gpu_w: list[float] | None
    samples: int  # inside the window
    sample_rate_hz: float | None
    power_field: str  # the field sampled, ``+average`` where a failed instantaneous read fell back
    power_fallback_samples: int
    update_period_s: float | None  # the energy counter's (:class:`SamplerInfo`)
    power_update_period_s: float | None
    own_peak_bytes: int | None
    other_pids: list[int]


def sampler_info(source) -> SamplerInfo:
    """The sampler's first step: the energy counter's and the power field's own update periods
    (they differ on some GPUs), and a sampling period from the power field's, the one sampled."""
    reads = {"power": source.read_power_w}
    if source.read_energy_mj() is not None:
        reads["counter"] = source.read_energy_mj
    periods = detect_update_periods(reads)
    return SamplerInfo(
        power_field=source.power_field,
        update_period_s=periods.get("counter"),
        power_update_period_s=periods["power"],
        period_s=sampling_period(periods["power"]),
        counter="counter" in reads,
    )


class Samples:
    """The sampler's record: power samples with their times, process lists, and the times of samples
    whose instantaneous read failed and fell back to the averaged field."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.powers: list[list[float]] = []
        self.procs: list[tuple] = []
        self.fallbacks: list[float] = []

    def take(self, source, processes: bool = False) -> None:
        self.powers.append(source.read_power_w())
        self.times.append(time.perf_counter())
        if getattr(source, "fell_back", False):
            self.fallbacks.append(self.times[-1])
        if processes:
            self.procs.append((self.times[-1], *source.read_processes()))

    def select(self, t0: float, t1: float) -> WindowSamples:
        """The samples of [t0, t1] plus one on each side, so the edges can be interpolated."""
        t = np.asarray(self.times)
        lo = max(int(np.searchsorted(t, t0)) - 1, 0)
        hi = int(np.searchsorted(t, t1, side="right")) + 1
        inside = [p for p in self.procs if t0 <= p[0] <= t1]
        return WindowSamples(
            times=self.times[lo:hi],
            powers=self.powers[lo:hi],
            own_peak_bytes=max((p[1] for p in inside if p[1] is not None), default=None),
            other_pids=sorted({pid for p in inside for pid in p[2]}),
            fallback_samples=sum(1 for f in self.fallbacks if t0 <= f <= t1),
        )


def _sampler_main(source, conn) -> None:
    """Child process: detect the update period, then sample until told to stop."""
    source.open()
    try:
        info = sampler_info(source)
        period = info.period_s
        conn.send(info)
        samples = Samples()
        next_t = time.perf_counter()
        while True:
            now = time.perf_counter()
            if now >= next_t:
                samples.take(source, processes=len(samples.times) % PROCESS_EVERY == 0)
                next_t += period
                if next_t < now:  # fell behind (a stalled machine): do not burst to catch up
                    next_t = now + period
                continue
            if conn.poll(next_t - now):
                try:
                    command = conn.recv()
                except EOFError:  # the training process is gone
                    return
                if command[0] == "stop":
                    return
                t0, t1 = command[1], command[2]
                if not samples.times or samples.times[-1] < t1:  # close the window with a reading taken
                    samples.take(source)  # now, so a sampler the OS delayed still covers it
                conn.send(samples.select(t0, t1))
    finally:
        source.close()


def integrate_j(times: list[float], powers_w: list[list[float]], t0: float, t1: float) -> float | None:
    """Energy (J) over [t0, t1]: trapezoid rule on the power summed over the GPUs, interpolated at
    the window's edges; None with fewer than two samples."""
    if len(times) < 2:
        return None
    t = np.asarray(times)
    p = np.asarray(powers_w, dtype=float).sum(axis=1)
    grid = np.concatenate([[t0], t[(t > t0) & (t < t1)], [t1]])
    # numpy < 2 has only trapz; the checker reads numpy 2's stubs, where trapz is gone
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # type: ignore[attr-defined]
    return float(trapezoid(np.interp(grid, t, p), grid))


def window_figures(info: SamplerInfo, data: WindowSamples, t0: float, t1: float) -> TimelineWindow:
    """Integrated energy and provenance of [t0, t1] from the samples :meth:`Samples.select` picked."""
    times = data.times
    inside = sum(1 for t in times if t0 <= t <= t1)
    per_gpu = np.asarray(data.powers, dtype=float).reshape(len(times), -1).mean(axis=0)
    covered = len(times) >= 2 and times[0] <= t0 + info.period_s and times[-1] >= t1 - info.period_s
    return TimelineWindow(
        integrated_energy_j=integrate_j(times, data.powers, t0, t1) if covered else None,
        mean_power_w=float(per_gpu.sum()) if times else None,
        mean_power_per_gpu_w=per_gpu.tolist() if times else None,
        samples=inside,
        sample_rate_hz=inside / (t1 - t0) if t1 > t0 else None,
        power_field=info.power_field + ("+average" if data.fallback_samples else ""),
        power_fallback_samples=data.fallback_samples,
        update_period_s=info.update_period_s,
        power_update_period_s=info.power_update_period_s,
        own_peak_bytes=data.own_peak_bytes,
        other_pids=data.other_pids,
    )


class PowerTimeline:
    """Handle on the sampler process: ``start()``, ``window(t0, t1)``, ``stop()``."""

    def __init__(self, source) -> None:
        self.source = source
        self.info: SamplerInfo | None = None  # set by start()
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None

    def start(self) -> PowerTimeline:
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_sampler_main, args=(self.source, child), daemon=True, name="petlprof-power-sampler")
        self._conn, self._proc = conn, proc
        proc.start()
        child.close()
        self._finalizer = weakref.finalize(self, _stop_process, proc, conn)
        if not conn.poll(START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"the power sampler process did not start within {START_TIMEOUT_S:g} s")
        try:
            self.info = conn.recv()
        except EOFError:
            proc.join(5)
            code = proc.exitcode
            self.stop()
            raise RuntimeError(f"the power sampler process died at start (exit code {code})") from None
        return self

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def window(self, t0: float, t1: float) -> TimelineWindow:
        """Integrated energy and provenance of [t0, t1] (perf_counter seconds)."""
        conn, info = self._conn, self.info
        if not self.alive or conn is None or info is None:
            raise RuntimeError("the power sampler process is not running")
        conn.send(("window", t0, t1))
        if not conn.poll(WINDOW_TIMEOUT_S):
            self.stop()  # a sampler that hangs now would hang every later window too
            raise RuntimeError(f"the power sampler process did not answer within {WINDOW_TIMEOUT_S:g} s")
        return window_figures(info, conn.recv(), t0, t1)

    def stop(self) -> None:
        if self._proc is not None:
            self._finalizer()
            self._proc = None


def _stop_process(proc, conn) -> None:
    """Ask the sampler to stop; kill it if it does not within 5 s."""
    try:
        if proc.is_alive():
            conn.send(("stop",))
    except (BrokenPipeError, OSError):
        pass
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    conn.close()
