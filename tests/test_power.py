"""The GPU power timeline: sampled in a separate process, from a fake power source standing in for
NVML, and the NVML energy meter that combines it with the energy counter.

The fake's power is a known function of time whose readings change every ``UPDATE_S`` seconds, as
a driver's do, so the detected update period, the sampling rate and the integrated energy can all
be checked against exact figures.
"""

from __future__ import annotations

import math
import os
import threading
import time
from unittest import mock

import pytest
from sensors import SteadyPowerSource

from petlprof.meters.power import PowerTimeline, integrate_j, sampling_period

UPDATE_S = 0.02


class FakePowerSource:
    """Power ``watts`` per GPU, held constant within each ``UPDATE_S`` update period; an energy
    counter that advances at each update (or none); compute processes as given."""

    def __init__(
        self,
        watts: list[float],
        counter: bool = True,
        field: str = "instant",
        processes: tuple[int, list[int]] = (0, []),
    ):
        self.watts, self.counter, self.field, self.processes = watts, counter, field, processes
        self.power_field = field

    def open(self) -> None:
        self.t0 = time.perf_counter()

    def _updates(self) -> int:
        return math.floor((time.perf_counter() - self.t0) / UPDATE_S)

    def read_power_w(self) -> list[float]:
        wobble = 0.001 * (self._updates() % 2)  # the reading changes at every update
        return [w + wobble for w in self.watts]

    def read_energy_mj(self) -> list[int] | None:
        if not self.counter:
            return None
        return [int(self._updates() * UPDATE_S * w * 1000) for w in self.watts]

    def read_processes(self) -> tuple[int, list[int]]:
        return self.processes

    def close(self) -> None:
        pass


@pytest.mark.parametrize("update_s, period_s", [(None, 0.01), (0.002, 0.005), (0.02, 0.01), (0.1, 0.05), (1.0, 0.05)])
def test_sampling_period_follows_the_update_period(update_s, period_s):
    assert sampling_period(update_s) == pytest.approx(period_s)


@pytest.mark.parametrize(
    "times, powers, t0, t1, expected",
    [
        ([0.0, 1.0, 2.0], [[10.0], [10.0], [10.0]], 0.0, 2.0, 20.0),  # constant
        ([0.0, 2.0], [[0.0], [20.0]], 0.0, 2.0, 20.0),  # ramp
        ([0.0, 2.0], [[0.0], [20.0]], 0.5, 1.5, 10.0),  # edges interpolated
        ([0.0, 1.0], [[10.0, 5.0], [10.0, 5.0]], 0.0, 1.0, 15.0),  # two GPUs summed
        ([0.0], [[10.0]], 0.0, 1.0, None),  # one sample: no figure
    ],
)
def test_integrate_power(times, powers, t0, t1, expected):
    result = integrate_j(times, powers, t0, t1)
    assert result == (None if expected is None else pytest.approx(expected))


@pytest.fixture
def timeline_of():
    started = []

    def start(source):
        timeline = PowerTimeline(source).start()
        started.append(timeline)
        return timeline

    yield start
    for timeline in started:
        timeline.stop()


@pytest.mark.parametrize("counter", [True, False])
def test_sampler_runs_in_its_own_process_and_integrates_power(timeline_of, counter):
    threads = threading.active_count()
    timeline = timeline_of(FakePowerSource([150.0, 50.0], counter=counter))
    assert timeline._proc.pid != os.getpid() and timeline.alive
    assert threading.active_count() == threads  # not a thread of this process
    assert timeline.info.counter is counter
    assert timeline.info.power_update_period_s == pytest.approx(UPDATE_S, rel=0.25)
    assert timeline.info.update_period_s == (pytest.approx(UPDATE_S, rel=0.25) if counter else None)
    assert timeline.info.period_s == pytest.approx(UPDATE_S / 2, rel=0.25)
    t0 = time.perf_counter()
    time.sleep(0.6)
    data = timeline.window(t0, time.perf_counter())
    assert data.integrated_energy_j == pytest.approx(200.0 * 0.6, rel=0.05)
    assert data.mean_power_per_gpu_w == pytest.approx([150.0, 50.0], rel=0.01)
    assert data.power_field == "instant"
    assert data.sample_rate_hz >= 50  # ~100 Hz asked for; a loaded shared CPU may lose some


def test_sampler_reports_other_processes_and_own_memory(timeline_of):
    timeline = timeline_of(FakePowerSource([100.0], field="average", processes=(3 * 2**30, [4242])))
    t0 = time.perf_counter()
    time.sleep(0.3)
    data = timeline.window(t0, time.perf_counter())
    assert data.other_pids == [4242] and data.own_peak_bytes == 3 * 2**30
    assert data.power_field == "average"


def test_sampler_stops_when_collected():
    timeline = PowerTimeline(FakePowerSource([10.0])).start()
    proc = timeline._proc
    del timeline
    proc.join(10)
    assert not proc.is_alive()


@pytest.fixture
def nvml_one_gpu(monkeypatch):
    """An autospec'd pynvml with one GPU whose counter reads what ``energy_mj`` says."""
    import pynvml

    import petlprof.meters.devices.nvml as nvml_dev

    fake = mock.create_autospec(pynvml, instance=False)
    fake.NVMLError = pynvml.NVMLError
    energy_mj = {"value": 1_000_000}
    fake.nvmlDeviceGetHandleByUUID.return_value = "h0"
    fake.nvmlDeviceGetCount.return_value = 1
    fake.nvmlDeviceGetHandleByIndex.return_value = "h0"
    fake.nvmlDeviceGetUUID.return_value = "GPU-aaa"
    fake.nvmlDeviceGetTotalEnergyConsumption.side_effect = lambda handle: energy_mj["value"]
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    monkeypatch.setattr(nvml_dev, "cuda_uuid", lambda device: "GPU-aaa")
    return fake, energy_mj


def test_nvml_meter_records_counter_and_integrated_energy_for_the_same_window(nvml_one_gpu, timeline_of):
    from petlprof.meters.energy import NvmlEnergyMeter

    _, energy_mj = nvml_one_gpu
    meter = NvmlEnergyMeter("cuda:0", timeline=timeline_of(FakePowerSource([100.0], processes=(2**20, [77]))))
    meter.begin()
    time.sleep(0.5)
    energy_mj["value"] += 49_000  # the counter saw 49 J
    reading = meter.end()
    assert reading["energy_j"] == pytest.approx(49.0) and reading["energy_source"] == "nvml-energy-counter"
    assert reading["energy_counter_j"] == pytest.approx(49.0)
    assert reading["energy_integrated_j"] == pytest.approx(100.0 * meter.window_s, rel=0.05)
    assert reading["power_field"] == "instant" and reading["power_samples"] >= 20
    assert reading["nvml_peak_process_memory_bytes"] == 2**20
    assert reading["energy_low_confidence"] is True
    assert any("pids [77]" in w for w in reading.warnings)


def test_nvml_meter_without_counter_uses_integrated_power(nvml_one_gpu, timeline_of):
    from petlprof.meters.energy import NvmlEnergyMeter

    fake, _ = nvml_one_gpu
    fake.nvmlDeviceGetTotalEnergyConsumption.side_effect = fake.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(RuntimeError, match="no energy counter and no power timeline"):
        NvmlEnergyMeter("cuda:0")
    meter = NvmlEnergyMeter("cuda:0", timeline=timeline_of(FakePowerSource([80.0], counter=False)))
    meter.begin()
    time.sleep(0.4)
    reading = meter.end()
    assert reading["energy_source"] == "nvml-power-integrated" and reading["energy_counter_j"] is None
    assert reading["energy_j"] == pytest.approx(80.0 * meter.window_s, rel=0.05)
    assert reading["energy_samples"] == reading["power_samples"] >= 15
    assert reading["energy_kind"] == "measured"


def test_a_hanging_sampler_times_out_and_the_counter_reading_stands(nvml_one_gpu, timeline_of, monkeypatch):
    import petlprof.meters.power as power
    from petlprof.meters.energy import NvmlEnergyMeter

    monkeypatch.setattr(power, "WINDOW_TIMEOUT_S", 1.0)
    _, energy_mj = nvml_one_gpu
    timeline = timeline_of(SteadyPowerSource(hang_after_s=1.0))  # started: its detection is over
    meter = NvmlEnergyMeter("cuda:0", timeline=timeline)
    meter.begin()
    time.sleep(1.5)  # the sampler is now stuck in a read
    energy_mj["value"] += 12_000
    t0 = time.perf_counter()
    reading = meter.end()
    assert time.perf_counter() - t0 < 10  # not forever
    assert reading["energy_j"] == pytest.approx(12.0) and reading["energy_integrated_j"] is None
    assert any("did not answer within 1 s" in w for w in reading.warnings)
    assert not timeline.alive


@pytest.mark.gpu
def test_real_power_timeline_samples_the_gpu():
    import torch

    from petlprof.meters import energy_meter_for, start_power_timeline

    timeline = start_power_timeline("cuda")
    try:
        meter = energy_meter_for("cuda", "nvml", timeline)
        meter.begin()
        x = torch.randn(8192, 8192, device="cuda")
        t_end = time.time() + 6.0
        while time.time() < t_end:
            x = (x @ x) / 8192
        torch.cuda.synchronize()
        reading = meter.end()
    finally:
        timeline.stop()
    print(
        {
            k: reading.get(k)
            for k in (
                "energy_counter_j",
                "energy_integrated_j",
                "power_field",
                "power_samples",
                "power_sample_rate_hz",
                "counter_update_period_s",
                "energy_window_s",
            )
        }
    )
    assert reading["energy_integrated_j"] is not None and reading["energy_integrated_j"] > 0
    assert reading["power_sample_rate_hz"] > 5
    assert reading["energy_low_confidence"] is False
