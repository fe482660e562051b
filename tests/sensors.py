"""Models of real GPU power sensors, for tests: a fake ``pynvml`` whose GPUs behave like the hardware.

What NVML's documentation and "Part-time Power Measurements: nvidia-smi's Lack of Attention"
(Yang et al.) describe, and what these fakes do:

* the total-energy counter (mJ) advances only at each update, every ``update_s`` (20-100 ms); the
  power fields update every ``power_update_s`` (by default the same);
* the instantaneous field read may fail transiently (``instant_fails_every``: every Nth update);
* the instantaneous power field reports, at each update, the mean power over only the last
  ``instant_fraction`` of the update period (about 25% on A100/H100): a load that is busy outside
  that slice is not seen (part-time sampling);
* ``nvmlDeviceGetPowerUsage`` is a moving average over ``average_s`` (1 s on Ampere and later),
  also refreshed at each update;
* the power fields may read ``field_offset_w`` more than the counter's rate (separate sensors), and
  carry up to ``noise_w`` of noise that changes at every update.

A :class:`Clock` replaces ``time.perf_counter``/``time.sleep`` so a test sets exact instants; a
load is a function of time (W, vectorised over numpy arrays): :func:`steady`, :func:`bursts`
(optionally phase-locked to the update period), :func:`step`; idle is a low steady load.
:class:`SampledTimeline` runs the power sampler's own code (:func:`petlprof.meters.power.sampler_info`,
``Samples``, ``window_figures``) on that clock, in-process, so a test can check every energy
path against :meth:`FakeGpu.true_energy_j`.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import numpy as np
import pynvml

from petlprof.meters.power import Samples, TimelineWindow, sampler_info, window_figures

STEP_S = 1e-4  # resolution of the true-energy integral


class Clock:
    """A perf_counter/sleep pair on simulated time."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    def install(self, monkeypatch) -> Clock:
        import time

        monkeypatch.setattr(time, "perf_counter", self.perf_counter)
        monkeypatch.setattr(time, "sleep", self.sleep)
        return self


def steady(watts: float):
    return lambda t: np.full_like(t, watts, dtype=float)


def bursts(high_w: float, low_w: float, period_s: float, duty: float, phase: float = 0.0):
    """``high_w`` during a fraction ``duty`` of every ``period_s``, starting ``phase`` periods before
    the period's end (phase 0: the burst ends exactly at each update), ``low_w`` otherwise."""

    def load(t):
        position = (np.asarray(t) / period_s + phase) % 1.0
        return np.where(position >= 1.0 - duty, high_w, low_w)

    return load


def step(before_w: float, after_w: float, at: float):
    """``before_w`` until time ``at``, ``after_w`` from then on (a job starting)."""
    return lambda t: np.where(np.asarray(t) < at, before_w, after_w)


class FakeGpu:
    """One GPU: a load, and the counter and power fields that report it as a real one would."""

    def __init__(
        self,
        uuid: str,
        load,
        *,
        update_s: float = 0.1,
        power_update_s: float | None = None,
        instant_fails_every: int = 0,
        noise_w: float = 0.0,
        instant_fraction: float = 0.25,
        average_s: float = 1.0,
        field_offset_w: float = 0.0,
        counter: bool = True,
        instant: bool = True,
        processes: tuple[tuple[int, int], ...] = (),
        temperature=None,
        sm_clock=None,
        power_limit_w: float = 700.0,
        power_limit_range_w: tuple[float, float] = (200.0, 700.0),
        may_set_power_limit: bool = True,
        clock: Clock,
    ):
        self.uuid, self.load, self.clock = uuid, load, clock
        self.update_s, self.instant_fraction, self.average_s = update_s, instant_fraction, average_s
        self.power_update_s = power_update_s or update_s
        self.instant_fails_every, self.noise_w = instant_fails_every, noise_w
        self.field_offset_w, self.counter, self.instant = field_offset_w, counter, instant
        self.processes = processes
        self.temperature = temperature or (lambda t: 45.0)  # °C as a function of time
        self.sm_clock = sm_clock or (lambda t: 1980.0)  # MHz as a function of time
        self.power_limit_mw, self.default_limit_mw = int(power_limit_w * 1000), int(power_limit_w * 1000)
        self.power_limit_range_mw = tuple(int(w * 1000) for w in power_limit_range_w)
        self.may_set_power_limit = may_set_power_limit
        self._origin = clock.now
        self._cache = (clock.now, 0.0)  # (t, energy from the origin to t)

    def true_energy_j(self, t0: float, t1: float) -> float:
        return self._energy_to(t1) - self._energy_to(t0)

    def _energy_to(self, t: float) -> float:
        start, energy = self._cache if self._cache[0] <= t else (self._origin, 0.0)
        energy += self._integral(start, t)
        self._cache = (t, energy)
        return energy

    def _integral(self, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        steps = max(int(math.ceil((b - a) / STEP_S)), 1)
        grid = a + (np.arange(steps) + 0.5) * (b - a) / steps  # midpoints
        return float(np.sum(self.load(grid)) * (b - a) / steps)

    def _last_update(self, period_s: float) -> float:
        return math.floor(self.clock.now / period_s + 1e-9) * period_s

    def _mean_w(self, span_s: float) -> float:
        end = self._last_update(self.power_update_s)
        jitter = ((round(end / self.power_update_s) * 7919) % 11 - 5) / 5 * self.noise_w  # a new value each update
        return self._integral(end - span_s, end) / span_s + self.field_offset_w + jitter

    def energy_mj(self) -> int:
        if not self.counter:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._energy_to(self._last_update(self.update_s)) * 1000)

    def instant_mw(self) -> int | None:
        update = math.floor(self.clock.now / self.power_update_s + 1e-9)
        if not self.instant or (self.instant_fails_every and update % self.instant_fails_every == 0):
            return None
        return int(self._mean_w(self.instant_fraction * self.power_update_s) * 1000)

    def average_mw(self) -> int:
        return int(self._mean_w(self.average_s) * 1000)


class FakeNvml:
    """Stands in for the ``pynvml`` module (install with ``monkeypatch.setitem(sys.modules, "pynvml", ...)``)."""

    NVMLError = pynvml.NVMLError
    NVML_FI_DEV_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT

    def __init__(self, gpus: list[FakeGpu]):
        self.gpus = gpus
        self.sessions = 0
        self.calls: list[tuple] = []  # the calls that change a GPU's settings, in order

    def nvmlInit(self):
        self.sessions += 1

    def nvmlShutdown(self):
        self.sessions -= 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, gpu):
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu):
        return "NVIDIA H100 80GB HBM3 (sensor model)"

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu):
        return gpu.energy_mj()

    def nvmlDeviceGetFieldValues(self, gpu, fields):
        value = gpu.instant_mw()
        code = 0 if value is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
        return [SimpleNamespace(nvmlReturn=code, value=SimpleNamespace(uiVal=value or 0))]

    def nvmlDeviceGetPowerUsage(self, gpu):
        return gpu.average_mw()

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM

    def nvmlDeviceGetTemperature(self, gpu, sensor):
        return int(gpu.temperature(gpu.clock.now))

    def nvmlDeviceGetClockInfo(self, gpu, clock):
        return int(gpu.sm_clock(gpu.clock.now))

    def nvmlDeviceGetPowerManagementLimit(self, gpu):
        return gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu):
        return gpu.default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, gpu):
        return list(gpu.power_limit_range_mw)

    def nvmlDeviceSetPowerManagementLimit(self, gpu, limit_mw):
        self.calls.append(("set_power_limit", gpu.uuid, int(limit_mw)))
        if not gpu.may_set_power_limit:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        low, high = gpu.power_limit_range_mw
        if not low <= limit_mw <= high:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = int(limit_mw)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]


def fake_world(monkeypatch):
    """``make(gpu_kwargs, ...)`` -> (clock, gpus): fake GPUs installed as ``pynvml`` on a simulated clock, CUDA
    device N = GPU N (the body of the tests' ``world`` fixture)."""
    # petlprof's NVML access: replaced where it asks torch for a device's UUID
    import sys

    import petlprof.meters.devices.nvml as nvml_dev

    clock = Clock().install(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def make(*specs: dict):
        gpus = [FakeGpu(f"GPU-{i:04d}-aaaa", clock=clock, **spec) for i, spec in enumerate(specs)]
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))
        monkeypatch.setattr(nvml_dev, "cuda_uuid", lambda device: gpus[int(device.partition(":")[2] or 0)].uuid)
        return clock, gpus

    return make


class SampledTimeline:
    """The power sampler's code on the test's clock: what :class:`~petlprof.meters.power.PowerTimeline`
    would record for a window, sampled at the period the sampler itself chooses."""

    alive = True

    def __init__(self, source, clock: Clock):
        self.source, self.clock = source, clock
        source.open()
        self.info = sampler_info(source)

    def stop(self) -> None:
        self.alive = False

    def window(self, t0: float, t1: float) -> TimelineWindow:
        period, now = self.info.period_s, self.clock.now
        samples = Samples()
        for t in np.arange(t0 - period, t1 + period, period):
            self.clock.now = t
            samples.take(self.source)
        self.clock.now = now
        return window_figures(self.info, samples.select(t0, t1), t0, t1)


class SteadyPowerSource:
    """Stands in for NVML in the power sampler's process: a constant power that changes every 20 ms; with
    ``hang_after_s``, its reads hang from then on (a stuck driver).  Defined here, not in the tests that use
    it: the sampler process (``spawn``) imports the module that defines its source, and this one imports no
    torch (a test module's import cost 1.3 s of CPU at each start)."""

    power_field = "instant"

    def __init__(self, hang_after_s: float | None = None):
        self.hang_after_s = hang_after_s

    def open(self) -> None:
        self.t0 = time.perf_counter()

    def read_power_w(self) -> list[float]:
        elapsed = time.perf_counter() - self.t0
        if self.hang_after_s is not None and elapsed > self.hang_after_s:
            time.sleep(3600)
        return [100.0 + (int(elapsed / 0.02) % 2)]

    def read_energy_mj(self) -> None:
        return None

    def read_processes(self) -> tuple[int, list[int]]:
        return 0, []

    def close(self) -> None:
        pass


def install_fake_zeus(monkeypatch) -> list:
    """A ``zeus.monitor.ZeusMonitor`` installed as the ``zeus`` package (version 0.16.0 as petlprof reads it): every
    window reads 300 W per GPU, CPU packages of 40 and 30 W and 5 W of DRAM, for 2 s.  Returns the monitors made."""
    import sys
    import types

    import petlprof.meters.zeus as zeus_meter

    made = []

    class ZeusMonitor:
        def __init__(self, gpu_indices=None, cpu_indices=None):
            self.gpu_indices, self.cpu_indices = gpu_indices, cpu_indices
            self.open: dict[str, bool] = {}
            made.append(self)

        def begin_window(self, key, sync_execution=True):
            self.open[key] = sync_execution

        def end_window(self, key, sync_execution=True):
            assert self.open.pop(key) is False  # petlprof's Window synchronises the device itself
            gpus = {i: 300.0 * 2 for i in self.gpu_indices or []}
            cpus = None if self.cpu_indices == [] else {0: 40.0 * 2, 1: 30.0 * 2}
            dram = None if self.cpu_indices == [] else {0: 5.0 * 2}
            return types.SimpleNamespace(time=2.0, gpu_energy=gpus, cpu_energy=cpus, dram_energy=dram)

    package, monitor = types.ModuleType("zeus"), types.ModuleType("zeus.monitor")
    monitor.ZeusMonitor = ZeusMonitor  # type: ignore[attr-defined]
    package.monitor = monitor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "zeus", package)
    monkeypatch.setitem(sys.modules, "zeus.monitor", monitor)
    monkeypatch.setattr(zeus_meter, "_zeus_version", lambda: "0.16.0")
    return made
