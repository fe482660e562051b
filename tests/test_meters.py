"""Meters against fakes of the hardware APIs: an autospec'd pynvml and a fake powercap tree.

Real hardware is exercised only in tests marked ``gpu``.
"""

from __future__ import annotations

import functools
import gc
import json
import time
import weakref
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from petlprof.errors import UsageError
from petlprof.meters import Window, energy_meter_for, meter_status
from petlprof.meters.cpu_power_model import EstimateEnergyMeter, cpu_power_per_core
from petlprof.meters.devices.rapl import domains as rapl_domains
from petlprof.meters.energy import NvmlEnergyMeter, RaplEnergyMeter
from petlprof.meters.idle import IDLE_ENV
from petlprof.meters.memory import CpuMemoryMeter, live_objects_unscanned, release_free_memory


def make_powercap(root, packages):
    """packages: {index: {"energy": uj, "max": uj, "subs": {name: (energy, max)}}}"""
    for index, pkg in packages.items():
        domain = root / f"intel-rapl:{index}"
        domain.mkdir(parents=True)
        (domain / "name").write_text(f"package-{index}\n")
        (domain / "energy_uj").write_text(str(pkg["energy"]))
        (domain / "max_energy_range_uj").write_text(str(pkg["max"]))
        for sub_index, (name, (energy, maximum)) in enumerate(pkg.get("subs", {}).items()):
            sub = root / f"intel-rapl:{index}:{sub_index}"
            sub.mkdir()
            (sub / "name").write_text(name + "\n")
            (sub / "energy_uj").write_text(str(energy))
            (sub / "max_energy_range_uj").write_text(str(maximum))
    return root


def set_energy(root, domain, value):
    # atomically, as sysfs reads are: write_text truncates first, and a polling thread that read the empty
    # file in between died on int("") (the 1.2 J CI saw, wraps lost after it)
    path = root / domain / "energy_uj"
    path.with_suffix(".tmp").write_text(str(value))
    path.with_suffix(".tmp").replace(path)


def test_rapl_counts_packages_and_dram_but_not_core(tmp_path):
    root = make_powercap(
        tmp_path / "powercap",
        {
            0: {"energy": 1_000_000, "max": 2**32, "subs": {"core": (500_000, 2**32), "dram": (100_000, 2**32)}},
            1: {"energy": 3_000_000, "max": 2**32},
        },
    )
    psys = tmp_path / "powercap" / "intel-rapl:2"  # client CPUs: psys contains the packages, never added
    psys.mkdir()
    (psys / "name").write_text("psys\n")
    (psys / "energy_uj").write_text("0")
    assert [d.name for d in rapl_domains(root)] == ["intel-rapl:0", "intel-rapl:0:1", "intel-rapl:1"]
    meter = RaplEnergyMeter(root=root)
    meter.begin()
    set_energy(root, "intel-rapl:0", 3_000_000)  # +2 J package 0
    set_energy(root, "intel-rapl:0:0", 1_500_000)  # core: inside the package figure, not added
    set_energy(root, "intel-rapl:0:1", 600_000)  # +0.5 J dram
    set_energy(root, "intel-rapl:1", 4_000_000)  # +1 J package 1
    reading = meter.end()
    assert reading["energy_j"] == pytest.approx(3.5)
    assert reading["energy_kind"] == "measured" and reading["energy_source"] == "rapl"
    assert reading["energy_domains"] == ["package-0", "dram", "package-1"]


def test_rapl_undoes_counter_wrap_around(tmp_path):
    root = make_powercap(tmp_path / "powercap", {0: {"energy": 999_000, "max": 1_000_000}})
    meter = RaplEnergyMeter(root=root)
    meter.begin()
    set_energy(root, "intel-rapl:0", 4_000)  # wrapped: 1_000 to the top, then 4_000
    assert meter.end()["energy_j"] == pytest.approx(0.005)


INTEL_RANGE_UJ = 262_143_328_850  # max_energy_range_uj of an Intel package: 262 kJ, 22 min at 200 W


@pytest.fixture
def clock(monkeypatch):
    """time.perf_counter under the test's control: ``clock[0]`` is now (s)."""
    now = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    return now


@pytest.mark.parametrize(
    "read_every_s, energy_kj, low_confidence",
    [
        (60, 360.0, False),  # the polling thread reads every minute: both wraps undone
        (300, 360.0, False),  # every 5 min, still < one wrap at 400 W (655 s)
        (None, 360.0 - INTEL_RANGE_UJ / 1e9, True),  # never read in between: a wrap is lost, and said so
    ],
)
def test_rapl_window_longer_than_a_counter_wrap(tmp_path, clock, read_every_s, energy_kj, low_confidence):
    """200 W for 30 min on a 262 kJ counter (360 kJ, the counter wraps once and lands past its start)."""
    root = make_powercap(tmp_path / "powercap", {0: {"energy": 5_000_000, "max": INTEL_RANGE_UJ}})
    meter = RaplEnergyMeter(root=root, poll_s=0)  # the test reads the counters as the thread would
    meter.begin()
    counter = 5_000_000
    for second in range(60, 1801, 60):
        clock[0] += 60
        counter = (counter + 200 * 60 * 1_000_000) % INTEL_RANGE_UJ
        set_energy(root, "intel-rapl:0", counter)
        if read_every_s and second % read_every_s == 0:
            meter.poll()
    reading = meter.end()
    assert reading["energy_j"] / 1e3 == pytest.approx(energy_kj)
    assert reading["energy_kind"] == "measured" and reading["energy_low_confidence"] is low_confidence
    assert any("wraps may be lost" in w for w in reading.warnings) is low_confidence


def test_rapl_polling_thread_reads_while_the_window_is_open(tmp_path):
    root = make_powercap(tmp_path / "powercap", {0: {"energy": 0, "max": 1_000_000}})
    meter = RaplEnergyMeter(root=root, poll_s=0.01)
    meter.begin()
    for value in (600_000, 100_000, 700_000, 200_000):  # wraps twice: 0.6 + 0.5 + 0.6 + 0.5 = 2.2 J
        set_energy(root, "intel-rapl:0", value)
        reads = meter.tracker.readings  # counted after the write: the second read from here began after it
        deadline = time.monotonic() + 30
        while meter.tracker.readings < reads + 2 and time.monotonic() < deadline:  # a read after the write
            time.sleep(0.005)
    reading = meter.end()
    assert reading["energy_j"] == pytest.approx(2.2) and reading["energy_samples"] >= 9
    assert RaplEnergyMeter(root=root).poll_s == 1.0  # a 1 J counter: polled as often as allowed


def test_rapl_unreadable_files_say_why(tmp_path):
    root = make_powercap(tmp_path / "powercap", {0: {"energy": 1, "max": 10}})
    real_read = Path.read_text

    def root_only(path, *args, **kwargs):  # as on current kernels: names readable, counters root-only
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, *args, **kwargs)

    with mock.patch("pathlib.Path.read_text", autospec=True, side_effect=root_only):
        ok, why = RaplEnergyMeter.available(root)
    assert not ok and "not readable" in why and "root-only" in why
    assert RaplEnergyMeter.available(tmp_path / "missing") == (False, f"no RAPL domains under {tmp_path / 'missing'}")


@pytest.fixture
def fake_nvml(monkeypatch):
    import pynvml

    import petlprof.meters.devices.nvml as nvml_dev

    fake = mock.create_autospec(pynvml, instance=False)
    fake.NVMLError = pynvml.NVMLError
    handles = {0: "h0", 1: "h1", 2: "h2"}
    by_uuid = {"GPU-aaa": "h0", "GPU-bbb": "h1", "GPU-ccc": "h2"}
    energy = {"h0": 10_000, "h1": 50_000, "h2": 7_000}
    fake.nvmlDeviceGetCount.return_value = len(handles)
    fake.nvmlDeviceGetHandleByIndex.side_effect = handles.__getitem__
    fake.nvmlDeviceGetHandleByUUID.side_effect = by_uuid.__getitem__
    fake.nvmlDeviceGetUUID.side_effect = {h: u for u, h in by_uuid.items()}.__getitem__
    fake.nvmlDeviceGetTotalEnergyConsumption.side_effect = energy.__getitem__
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # torch's view of the devices: CUDA index -> UUID (CUDA orders fastest first, NVML by PCI bus)
    cuda_uuids = {"cuda:0": "bbb", "cuda:1": "aaa"}
    monkeypatch.setattr(nvml_dev, "cuda_uuid", lambda device: nvml_dev.nvml_uuid(cuda_uuids[device]))
    return fake, energy


@pytest.mark.parametrize("device, expected_j", [("cuda:0", 3.0), ("cuda:1", 2.0)])
def test_nvml_counter_measures_only_the_runs_gpu(fake_nvml, device, expected_j):
    fake, energy = fake_nvml
    meter = NvmlEnergyMeter(device)
    meter.begin()
    energy.update(h0=energy["h0"] + 2_000, h1=energy["h1"] + 3_000, h2=energy["h2"] + 500)
    reading = meter.end()
    assert reading["energy_j"] == pytest.approx(expected_j)
    assert reading["energy_kind"] == "measured" and reading["energy_source"] == "nvml-energy-counter"
    assert reading["energy_low_confidence"] is True  # a short window, said in the record and in words
    assert any("low-confidence" in w for w in reading.warnings)
    assert reading["energy_integrated_j"] is None and reading["energy_meter"] == "nvml"


@pytest.mark.parametrize(
    "visible, expected",
    [
        (None, ["h0", "h1", "h2"]),
        ("1", ["h1"]),
        ("0,2", ["h0", "h2"]),
        ("GPU-aaa", ["h0"]),
        ("aaa", ["h0"]),
        ("GPU-bb,c", ["h1", "h2"]),  # unique prefixes, as CUDA accepts them
        ("MIG-ccc", "MIG instance"),  # NVML has no energy or power per MIG instance: refused, said why
        ("GPU-", "matches 3 GPUs"),
        ("GPU-ddd", "matches no GPU"),
    ],
)
def test_visible_gpus_follow_cuda_visible_devices(fake_nvml, monkeypatch, visible, expected):
    from petlprof.meters.devices.nvml import visible_handles

    fake, _ = fake_nvml
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if isinstance(expected, str):
        with pytest.raises((RuntimeError, LookupError), match=expected):
            visible_handles(fake)
        assert expected in NvmlEnergyMeter.available()[1]
    else:
        assert visible_handles(fake) == expected


def test_nvml_counter_reset_mid_window_counts_from_zero(fake_nvml):
    fake, energy = fake_nvml
    meter = NvmlEnergyMeter("cuda:1")
    meter.begin()
    energy.update(h0=1_500)
    reading = meter.end()
    assert reading["energy_j"] == pytest.approx(1.5)
    assert any("went back" in w for w in reading.warnings)


def test_nvml_energy_above_idle_uses_the_gpus_own_baseline(fake_nvml):
    fake, energy = fake_nvml
    idle = {"nvml_w": {"GPU-bbb": 50.0, "GPU-aaa": 1000.0}, "nvml_source": "nvml-energy-counter"}
    meter = NvmlEnergyMeter("cuda:0", idle=idle)  # GPU-bbb
    meter.begin()
    energy.update(h1=energy["h1"] + 30_000)
    reading = meter.end()
    assert reading["idle_power_w"] == 50.0
    assert reading["energy_above_idle_j"] == pytest.approx(30.0 - 50.0 * meter.window_s)


@pytest.mark.parametrize(
    "counter, power, ok, words",
    [
        (True, True, True, "total-energy counter + power timeline"),
        (False, True, True, "power timeline only (no energy counter)"),
        (False, False, False, "not supported"),
    ],
)
def test_nvml_availability_says_what_it_can_read(fake_nvml, counter, power, ok, words):
    fake, _ = fake_nvml
    if not counter:
        fake.nvmlDeviceGetTotalEnergyConsumption.side_effect = fake.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
    if not power:
        fake.nvmlDeviceGetPowerUsage.side_effect = fake.NVMLError(3)
    available, why = NvmlEnergyMeter.available()
    assert available is ok and words in why


def test_nvml_without_counter_or_timeline_is_an_error_when_asked_for(fake_nvml):
    fake, _ = fake_nvml
    fake.nvmlDeviceGetTotalEnergyConsumption.side_effect = fake.NVMLError(3)
    fake.nvmlDeviceGetPowerUsage.side_effect = fake.NVMLError(3)
    with pytest.raises(UsageError, match="energy meter 'nvml' was asked for but is not usable here"):
        energy_meter_for("cuda", "nvml")


def test_auto_falls_back_to_a_labelled_estimate(monkeypatch):
    monkeypatch.setattr(RaplEnergyMeter, "available", classmethod(lambda cls, root=None: (False, "no RAPL")))
    meter = energy_meter_for("cpu")
    assert isinstance(meter, EstimateEnergyMeter)


def test_estimate_follows_its_stated_model():
    meter = EstimateEnergyMeter("cpu")
    meter.begin()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn CPU time
        np.sqrt(np.arange(10_000.0))
    reading = meter.end()
    assert reading["energy_kind"] == "estimated" and "CPU time" in reading["energy_model"]
    assert reading["cpu_model"] in reading["energy_model"]  # the CPU is named wherever the model is
    assert reading["cpu_time_s"] >= 0.3
    cpu_part = reading["cpu_time_s"] * reading["cpu_watts_per_core"]
    assert cpu_part <= reading["energy_j"] <= cpu_part + 0.375 * 64 * meter.window_s  # + DRAM, < 64 GiB


@pytest.mark.parametrize(
    "model_name, cores, entry, watts_per_core, extra",
    [
        ("AMD EPYC 7763 64-Core Processor", 64, "amd epyc 7763", 280 / 64, ""),
        ("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", 40, "intel xeon platinum 8380", 270 / 40, ""),
        ("Intel(R) Xeon(R) Platinum 8380H CPU @ 2.90GHz", 28, "intel xeon platinum 8380h", 250 / 28, ""),  # longest
        ("AMD EPYC", 2, None, 10.0, ""),  # a virtual CPU without a model number: the fallback
        ("AMD EPYC 7763 64-Core Processor", 2, "amd epyc 7763", 280 / 64, ""),  # VM slice: cores from the name
        ("Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz", 1, None, 10.0, ""),  # VM slice, 240 W / 1 core: implausible
        # a VM's 16 cores of a 40-core chip: 270 / 16 = 16.9 W looked plausible and was taken before
        ("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", 16, None, 10.0, "flags\t: fpu vme hypervisor\n"),
        ("AMD EPYC 7763 64-Core Processor", 8, "amd epyc 7763", 280 / 64, "flags\t: fpu hypervisor\n"),  # named
        (None, None, None, 10.0, ""),  # no /proc/cpuinfo model name
    ],
)
def test_estimate_power_per_core_from_the_cpu_table(tmp_path, model_name, cores, entry, watts_per_core, extra):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\n" + (f"model name\t: {model_name}\ncpu cores\t: {cores}\n" if model_name else "") + extra
    )
    cpu = cpu_power_per_core(str(cpuinfo))
    assert cpu.table_entry == entry and cpu.watts_per_core == pytest.approx(watts_per_core)
    assert cpu.cpu_model == (model_name or "unknown CPU")


@pytest.mark.parametrize("siblings, cpu_s, core_s", [(4, 8.0, 4.0), (2, 4.0, 4.0), (4, 3.0, 3.0)])
def test_estimate_counts_hyper_threads_of_one_core_once(tmp_path, monkeypatch, clock, siblings, cpu_s, core_s):
    """4 logical CPUs, 2 cores x 2 hyper-threads: 8 CPU-seconds in a 2 s window are 2 cores busy, not 4."""
    import os

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: AMD EPYC\ncpu cores\t: 2\n" + f"siblings\t: {siblings}\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(siblings)))
    cpu_time = [100.0]
    monkeypatch.setattr(time, "process_time", lambda: cpu_time[0])
    meter = EstimateEnergyMeter("cpu", cpuinfo=str(cpuinfo))
    meter.begin()
    clock[0] += 2.0
    cpu_time[0] += cpu_s
    reading = meter.end()
    assert reading["cpu_time_s"] == cpu_s and reading["cpu_core_s"] == core_s
    assert core_s * 10.0 <= reading["energy_j"] <= core_s * 10.0 + 0.375 * 64 * 2.0  # + DRAM, < 64 GiB
    assert ("hyper-threads share a core" in reading["energy_model"]) is (siblings == 4)


class _Cycle:
    """An object that frees only through the garbage collector (it refers to itself)."""

    def __init__(self):
        self.me = self


def _unscanned(obj) -> bool:
    """Whether ``obj`` is frozen: in none of the generations the collector scans."""
    return not any(o is obj for generation in range(3) for o in gc.get_objects(generation))


@pytest.mark.parametrize("frozen_before", [False, True], ids=["nothing frozen before", "a caller froze objects"])
@pytest.mark.parametrize("freeze", [None, "the run's imports"], ids=["a run in process", "an estimate"])
def test_an_in_process_run_scans_only_its_own_objects_and_its_garbage_is_still_freed(frozen_before, freeze):
    """live_objects_unscanned: objects alive at the start leave the collector's scans; a cycle made in the block is
    still collected by the phase's collection (release_free_memory); afterwards the freeze is undone, unless a
    caller had frozen objects before (this suite's conftest does; its freeze is kept either way).  Asked of the
    objects themselves: the frozen count also falls when a frozen object dies (CI once saw it one lower than
    before a freeze that had added one).  An estimate freezes them with the run's imports
    (``import_runtime_libraries(freeze=True)``), with the same undoing after."""
    from petlprof.run.libraries import import_runtime_libraries

    how = None if freeze is None else functools.partial(import_runtime_libraries, freeze=True)
    saved = gc.get_freeze_count()
    gc.unfreeze()
    callers = _Cycle()
    if frozen_before:
        gc.freeze()
    try:
        old = _Cycle()
        assert _unscanned(callers) is frozen_before and not _unscanned(old)
        with live_objects_unscanned(how):
            assert _unscanned(old)  # alive at the start: left out of the scans
            young = weakref.ref(_Cycle())
            release_free_memory()
            assert young() is None, "a run's own cyclic garbage is collected"
        assert _unscanned(callers) is frozen_before  # a caller's freeze is kept
        assert _unscanned(old) is frozen_before  # the block's own undone (kept whole where a caller's was there)
        if not frozen_before:
            assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        if saved:
            gc.freeze()


def test_cpu_memory_meter_sees_an_allocation_and_not_the_past():
    big = np.ones(400 * 2**20 // 8)  # 400 MiB alive when the meter is made, freed before the window:
    meter = CpuMemoryMeter("cpu")  # it must count neither as peak nor as baseline
    del big
    with Window([meter]) as window:
        block = np.ones(200 * 2**20 // 8)
        block[::4096] = 2.0  # touch every page
        del block
    reading = window.reading
    assert reading["memory_source"] == "rss-hwm"
    assert 190 * 2**20 <= reading["peak_memory_bytes"] <= 300 * 2**20


def test_window_time_excludes_the_meters_own_start_and_stop(clock):
    """Meters start in order and stop in reverse, so the first (an extra meter such as CodeCarbon, whose
    start and stop take seconds) brackets the others; the window's time_s is the work alone."""
    from petlprof.meters.base import Meter, Reading

    class SlowEdges(Meter):
        def _begin(self):
            clock[0] += 3.0

        EXTRAS = ("slow_window_s",)

        def _end(self):
            clock[0] += 2.0
            return Reading(extras={"slow_window_s": self.window_s})

    class Plain(Meter):
        EXTRAS = ("plain_window_s",)

        def _end(self):
            return Reading(extras={"plain_window_s": self.window_s})

    with Window([SlowEdges(), Plain()]) as window:
        clock[0] += 10.0
    assert window.time_s == 10.0 and window.reading["plain_window_s"] == 10.0
    assert window.reading["slow_window_s"] == 10.0  # its own start and stop are outside its window too


def test_meter_status_lists_every_meter_with_a_reason():
    rows = {name: (ok, why) for name, ok, why, _ in meter_status()}
    assert set(rows) == {
        "timer",
        "contention",
        "nvml",
        "rapl",
        "estimate",
        "cuda-allocator",
        "cpu-rss",
        "codecarbon",
        "cpu-tensors",
        "zeus",
    }
    assert rows["estimate"][0] and all(why for _, why in rows.values())


@pytest.mark.gpu
def test_real_nvml_counter_advances_under_load():
    import torch

    meter = energy_meter_for("cuda", "nvml")
    meter.begin()
    x = torch.randn(8192, 8192, device="cuda")
    t_end = time.time() + 2.0
    while time.time() < t_end:
        x = x @ x
        x = x / x.norm()
    reading = meter.end()
    assert reading["energy_kind"] == "measured" and reading["energy_j"] > 0


def test_rapl_unreadable_at_read_time_says_why(tmp_path):
    root = make_powercap(tmp_path / "powercap", {0: {"energy": 1, "max": 10}})
    meter = RaplEnergyMeter(root=root)
    real_read = Path.read_text

    def root_only(path, *args, **kwargs):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, *args, **kwargs)

    with mock.patch("pathlib.Path.read_text", autospec=True, side_effect=root_only):
        with Window([meter]) as window:
            pass
    assert window.reading["energy_j"] is None
    error = window.reading.errors[0]
    assert "energy_uj is not readable" in error and "root-only" in error


def test_rapl_reading_carries_provenance_and_energy_above_idle(tmp_path):
    root = make_powercap(tmp_path / "powercap", {0: {"energy": 0, "max": 2**32, "subs": {"dram": (0, 2**32)}}})
    meter = RaplEnergyMeter(root=root, idle={"rapl_w": 2.0})
    meter.begin()
    set_energy(root, "intel-rapl:0", 30_000_000)
    set_energy(root, "intel-rapl:0:0", 5_000_000)
    reading = meter.end()
    assert reading["energy_j"] == pytest.approx(35.0)
    assert reading["energy_above_idle_j"] == pytest.approx(35.0 - 2.0 * meter.window_s)
    assert {k: reading[k] for k in ("energy_meter", "energy_samples", "energy_low_confidence")} == {
        "energy_meter": "rapl",
        "energy_samples": 2,
        "energy_low_confidence": True,
    }
    assert reading["energy_window_s"] == meter.window_s


def test_idle_baseline_is_skipped_with_a_reason_when_nothing_can_be_read(monkeypatch):
    from petlprof.meters.devices import rapl
    from petlprof.meters.idle import prepare_sweep_idle, sweep_idle

    monkeypatch.setattr(rapl, "availability", lambda root=None: (False, "no RAPL here"))
    monkeypatch.delenv(IDLE_ENV, raising=False)
    assert "no RAPL here" in prepare_sweep_idle("cpu", "auto")
    idle = sweep_idle()
    assert idle is not None and idle["notes"] == ["no CPU idle power: no RAPL here"] and "rapl_w" not in idle
    assert idle["seconds"] == 0  # nothing was read
    assert "estimate" in prepare_sweep_idle("cpu", "estimate") and sweep_idle() is None


def test_extra_meters_are_checked_by_name():
    from petlprof.meters import extra_meters_for

    with pytest.raises(UsageError, match="codecarbn"):
        extra_meters_for(["codecarbn"], "cpu")


def test_codecarbon_meter_gives_emissions_and_its_energy_breakdown():
    from petlprof.meters import extra_meters_for

    [meter] = extra_meters_for(["codecarbon"], "cpu", country_code="fra")
    with Window([meter, EstimateEnergyMeter("cpu")]) as window:  # alongside another energy meter
        deadline = time.process_time() + 0.2
        while time.process_time() < deadline:
            np.sqrt(np.arange(10_000.0))
    reading = window.reading
    assert reading["co2eq_g"] > 0 and reading["co2eq_country"] == "FRA" and reading["co2eq_kind"] == "estimated"
    parts = sum(reading[f"codecarbon_{p}_energy_j"] for p in ("cpu", "gpu", "ram"))
    assert reading["codecarbon_energy_j"] == pytest.approx(parts, rel=1e-6)
    assert reading["energy_source"] == "estimate"  # codecarbon never replaces the energy meter's figure


def test_cpu_tensor_meter_counts_live_tensors_not_the_past():
    import torch

    from petlprof.meters.tensors import CpuTensorMeter

    before = torch.ones(20_000_000)  # 80 MB created and freed before the window: never counted
    del before
    layer = torch.nn.Linear(500, 500)
    meter = CpuTensorMeter("cpu", resident_bytes=1234)
    with Window([meter]) as window:
        block = torch.ones(2_500_000)  # 10 MB, freed before the backward pass
        del block
        layer(torch.randn(64, 500)).square().sum().backward()
    reading = window.reading
    assert reading["tensor_peak_new_bytes"] == 10_000_000
    assert reading["peak_tensor_bytes"] == 1234 + 10_000_000
    with Window([CpuTensorMeter("cpu")]) as window:  # backward alone: gradients and activations are seen
        layer.weight.grad = None
        layer(torch.randn(64, 500)).square().sum().backward()
    assert window.reading["tensor_peak_new_bytes"] >= 500 * 500 * 4


@pytest.mark.parametrize("keep", ["detach", "slice", "inference_mode", "none"])
def test_cpu_tensor_meter_counts_a_storage_until_its_last_view_is_freed(keep):
    import contextlib

    import torch

    from petlprof.meters.tensors import CpuTensorMeter

    size = 2_500_000  # 10 MB
    with Window([CpuTensorMeter("cpu")]) as window:
        with torch.inference_mode() if keep == "inference_mode" else contextlib.nullcontext():
            block = torch.ones(size)
            view = block.detach() if keep == "detach" else None if keep == "none" else block[:10]
            del block  # alive through `view`, except for "none"
            second = torch.ones(size)
            del second, view
    held = 2 if keep != "none" else 1
    assert window.reading["tensor_peak_new_bytes"] == held * size * 4


def test_static_breakdown_counts_weights_gradients_and_adamw_state():
    import torch

    from petlprof.meters.memory import static_breakdown

    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 100), torch.nn.BatchNorm1d(100))
    model[1].weight = model[0].weight  # tied: counted once
    model[0].weight.requires_grad_(False)
    figures = static_breakdown(model)
    trainable = (100 + 100 + 100) * 4  # linear bias, batch-norm weight and bias
    assert figures["frozen_weights_bytes"] == 100 * 8 * 4
    assert figures["trainable_weights_bytes"] == figures["gradients_bytes"] == trainable
    assert figures["optimizer_state_bytes"] == 2 * trainable + 4 * 3
    assert figures["buffers_bytes"] == (100 + 100) * 4 + 8  # running mean/var + num_batches_tracked
    assert figures["total_bytes"] == sum(v for k, v in figures.items() if k != "total_bytes")


def test_step_timer_on_cpu_keeps_only_the_steps_asked_for():
    from petlprof.meters.latency import StepTimer

    timer = StepTimer("cpu")
    for step, pause in enumerate([0.05, 0.01, 0.02]):
        timer.start()
        time.sleep(pause)
        timer.stop(keep=step > 0)  # the first is warm-up
    latencies = timer.latencies_s()
    assert timer.source == "perf-counter" and len(latencies) == 2
    assert 0.01 <= latencies[0] < 0.05 and 0.02 <= latencies[1] < 0.05


@pytest.mark.parametrize("device, current, timed", [("cuda:1", 0, 1), ("cuda:0", 1, 0), ("cuda", 1, 1)])
def test_cuda_step_timer_records_on_the_runs_gpu_not_the_current_one(monkeypatch, device, current, timed):
    """CUDA events record on a stream; without one, on the *current* GPU's, which a one-rank run on
    cuda:N never changed from 0 (the fake torch.cuda below follows that rule)."""
    import types

    import torch

    def current_stream(device=None):
        index = current if device is None else torch.device(device).index
        return types.SimpleNamespace(device=current if index is None else index)

    class Event:
        def __init__(self, enable_timing=False):
            self.stream = None

        def record(self, stream=None):
            self.stream = stream or current_stream()

        def elapsed_time(self, end):
            assert self.stream.device == end.stream.device
            return 2.0 if self.stream.device == timed else 0.0  # only the run's GPU did the work

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    from petlprof.meters.latency import StepTimer

    timer = StepTimer(device)
    for _ in range(3):
        timer.start()
        timer.stop()
    assert timer.latencies_s() == [0.002] * 3


def test_a_run_records_inference_latency_breakdown_and_provenance():
    from petlprof.run.execute import execute
    from petlprof.run.inference import MIN_REPEATS
    from petlprof.sweep.spec import RunSpec

    spec = RunSpec(
        method="bitfit",
        num_layers=1,
        train_size=48,
        eval_size=24,
        batch_size=8,
        max_steps=4,
        max_length=16,
        extra_meters=["cpu-tensors"],
        inference_window_s=0.2,
    )
    record = execute(spec)
    assert record["status"] == "ok", record.get("error")
    inference = record["inference"]
    assert set(inference) >= {"batch_1", "batch_8"} and inference["target_window_s"] == 0.2
    one = inference["batch_1"]
    assert one["repeats"] >= MIN_REPEATS and one["time_s"] >= 0.2 and one["latency_s"]["p50"] > 0
    assert inference["batch_8"]["latency_per_sample_s"]["p50"] == pytest.approx(
        inference["batch_8"]["latency_s"]["p50"] / 8
    )
    assert one["energy_per_sample_j"] == pytest.approx(one["energy_j"] / one["repeats"])
    breakdown = record["memory_breakdown"]
    assert breakdown["trainable_weights_bytes"] == 4 * record["trainable_params"]
    for phase in ("train", "eval"):
        assert record[phase]["latency_source"] == "perf-counter"
        assert record[phase]["energy_meter"] in ("rapl", "estimate") and record[phase]["energy_window_s"] > 0
        assert record[phase]["peak_tensor_bytes"] >= breakdown["frozen_weights_bytes"]
    assert record["train"]["tensor_resident_bytes"] == breakdown["total_bytes"] - breakdown["gradients_bytes"]
    assert "RunSpec" not in json.dumps(record, default=str)  # the record is plain JSON


@pytest.mark.gpu
def test_cuda_events_timer_and_memory_snapshot(tmp_path):
    import torch

    from petlprof.meters import memory_meter_for
    from petlprof.meters.latency import StepTimer

    timer = StepTimer("cuda")
    path = tmp_path / "snap.pickle"
    x = torch.randn(4096, 4096, device="cuda")
    with Window([memory_meter_for("cuda", snapshot_path=str(path))], "cuda") as window:
        for _ in range(3):
            timer.start()
            y = x @ x
            timer.stop()
    assert timer.source == "cuda-events" and all(t > 0 for t in timer.latencies_s())
    assert path.stat().st_size > 0 and window.reading["memory_snapshot_file"] == str(path)
    assert window.reading["peak_memory_bytes"] >= y.numel() * 4


@pytest.mark.parametrize(
    "values, message",
    [
        ({"meters": "codecarbon,bogus"}, "bogus"),
        ({"meters": "codecarbon", "country_code": "FR"}, "alpha-3"),
        ({"country_code": "FRA"}, "add --meters codecarbon"),
        ({"inference_window_s": -1}, "--inference-window-s"),
        ({"memory_snapshot": "yes"}, "memory_snapshot"),
    ],
)
def test_measurement_options_are_validated(values, message):
    from petlprof.sweep.config import build_options

    with pytest.raises(UsageError, match=message):
        build_options({}, {"methods": "bitfit", **values})


def test_measurement_options_reach_the_runs_without_changing_their_identity():
    from petlprof.sweep.config import build_options, expand

    plain = expand(build_options({}, {"methods": "bitfit"}), "cpu")[0]
    measured = expand(
        build_options(
            {},
            {"methods": "bitfit", "meters": "codecarbon,cpu-tensors", "country_code": "DEU", "inference_window_s": 1.5},
        ),
        "cpu",
    )[0]
    assert measured.extra_meters == ["codecarbon", "cpu-tensors"] and measured.country_code == "DEU"
    assert measured.inference_window_s == 1.5 and measured.run_key == plain.run_key


def test_memory_snapshot_needs_cuda():
    from petlprof.sweep.config import resolve_device

    with pytest.raises(UsageError, match="--memory-snapshot records the CUDA allocator; the runs are on cpu"):
        resolve_device("cpu", memory_snapshot=True)
    with pytest.raises(UsageError, match="--memory-snapshot records the CUDA allocator"):
        resolve_device("auto", cluster_gpus=0, memory_snapshot=True)
    assert resolve_device("auto", cluster_gpus=2, memory_snapshot=True) == "cuda"


def test_petlprof_meters_shows_each_meter_and_why(capsys):
    from petlprof.cli import main

    assert main(["meters"]) == 0
    out = capsys.readouterr().out
    for name, ok, why, _ in meter_status():
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert ("unavailable" in line) is (not ok) and why in out


def test_petlprof_meters_check_json_on_this_machine(capsys):
    """Every meter listed; those that work here checked, one verdict per check with its reason; the
    memory checks pass; energy that can only be estimated is a warning that says why."""
    from petlprof.cli import main

    code = main(["meters", "--check", "--json"])
    result = json.loads(capsys.readouterr().out)
    reports = {r["meter"]: r for r in result["meters"]}
    assert set(reports) == {name for name, *_ in meter_status()}
    for report in result["meters"]:
        assert set(report) == {"meter", "available", "detail", "checks"}
        assert bool(report["checks"]) is report["available"]
        for check in report["checks"]:
            assert set(check) == {"name", "value", "unit", "verdict", "detail"} and check["detail"]
            assert check["verdict"] in ("pass", "warn", "fail")
    for name in ("cpu-rss", "cpu-tensors"):
        assert [c["verdict"] for c in reports[name]["checks"]] == ["pass"], reports[name]
    busy = next(c for c in reports["contention"]["checks"] if c["name"] == "one busy process")
    assert busy["verdict"] != "fail" and busy["value"] >= 0.5, busy  # flagged, about a core or more
    source = next(c for c in reports["estimate"]["checks"] if c["name"] == "energy source")
    if not reports["rapl"]["available"]:
        assert source["verdict"] == "warn" and reports["rapl"]["detail"] in source["detail"]
        assert "not a measurement" in source["detail"]
    assert code == (1 if any(c["verdict"] == "fail" for r in result["meters"] for c in r["checks"]) else 0)


def test_petlprof_meters_json_needs_check(capsys):
    from petlprof.cli import main

    assert main(["meters", "--json"]) == 2
    assert "--json prints the results of --check; add --check" in capsys.readouterr().err


@pytest.mark.parametrize("device, current", [("cuda:1", "cuda:1"), ("cuda", None), ("cpu", None)])
def test_a_one_rank_run_on_cuda_n_makes_gpu_n_current(monkeypatch, device, current):
    """So work and CUDA events that name no device land on the run's GPU, not on GPU 0."""
    import torch

    import petlprof.run.pipeline as pipeline
    from petlprof.run.ranks import OneProcess
    from petlprof.sweep.spec import RunSpec

    made_current = []

    class Loaded(Exception):
        pass

    def stop_at_load(spec, shown=True):
        raise Loaded

    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    monkeypatch.setattr(pipeline, "_load", stop_at_load)
    with pytest.raises(Loaded):
        pipeline.prepare(RunSpec(method="bitfit", device=device), OneProcess(), progress=None)
    assert made_current == ([current] if current else [])


def test_meters_check_of_rapl_reads_a_counter_that_moves(tmp_path):
    """The RAPL part of `petlprof meters --check` on a powercap tree whose package counter a thread
    advances every millisecond at 50 W (RAPL updates about every 1 ms)."""
    import threading

    from petlprof.meters.check import rapl_checks

    root = make_powercap(tmp_path / "powercap", {0: {"energy": 0, "max": 2**40}})
    stop = threading.Event()

    def draw_50_w():
        t0, counter, scratch = time.perf_counter(), root / "intel-rapl:0" / "energy_uj", tmp_path / "energy_uj"
        while not stop.wait(0.001):
            scratch.write_text(str(int((time.perf_counter() - t0) * 50 * 1e6)))
            scratch.replace(counter)  # atomic, as a sysfs read is

    writer = threading.Thread(target=draw_50_w, daemon=True)
    writer.start()
    try:
        checks = {c.name: c for c in rapl_checks(root)}
    finally:
        stop.set()
        writer.join()
    assert set(checks) == {"counter update period", "short-window spread", "idle power"}
    assert checks["counter update period"].verdict == "pass" and checks["counter update period"].value < 0.1
    assert checks["idle power"].value == pytest.approx(50.0, rel=0.1) and checks["idle power"].verdict == "pass"
    assert checks["short-window spread"].verdict in ("pass", "warn")  # a loaded 2-core machine may jitter


def _meter_writing(reading, figures=(), extras=()):
    from petlprof.meters.base import Meter

    class Writer(Meter):
        name = "writer"
        FIGURES = figures
        EXTRAS = extras

        def _end(self):
            return reading()

    return Writer()


def test_a_meter_writing_an_undeclared_key_fails_loudly():
    """A misspelled or undeclared key is a bug in the meter: the window lets the error through instead of
    recording the meter as failed, whatever the key (a misspelled figure, a declared figure the meter does
    not declare, a figure's key spelled as a plain string, a plain dict)."""
    from petlprof.meters.base import Provenance, Reading, UndeclaredKey
    from petlprof.results.figures import ENERGY, ENERGY_COUNTER, PEAK_MEMORY

    cases = [
        (lambda: Reading(extras={"energy_jj": 1.0}), "energy_jj"),  # misspelled: not among its EXTRAS
        (lambda: Reading({PEAK_MEMORY: 1}), "peak_memory_bytes"),  # a figure it does not declare
        (lambda: Reading(extras={"energy_j": 1.0}), "declared key 'energy_j'"),  # a figure's key as a string
        (lambda: {"energy_j": 1.0}, "not a Reading"),
    ]
    for reading, named in cases:
        with pytest.raises(UndeclaredKey, match=named):
            with Window([_meter_writing(reading, figures=(ENERGY,), extras=("energy_domains",))]):
                pass
    with pytest.raises(UndeclaredKey, match="energy_kind"):  # declaring a figure's key as its own
        _meter_writing(Reading, extras=("energy_kind",))
    with pytest.raises(ValueError, match="declares no kind key"):  # provenance a figure does not declare
        Reading(provenance={ENERGY_COUNTER: Provenance("measured")})


def test_a_window_merges_typed_readings_and_keeps_each_meters_warnings_in_order():
    from petlprof.meters.base import Meter, Provenance, Reading, phase_warnings
    from petlprof.results.figures import ENERGY, PEAK_MEMORY
    from petlprof.vocabulary import MEASURED

    class Energy(Meter):
        name = "e"
        FIGURES = (ENERGY,)

        def _end(self):
            return Reading({ENERGY: 2.0}, provenance={ENERGY: Provenance(MEASURED, "fake")}, warnings=["e said"])

    class Broken(Meter):
        name = "broken"
        FIGURES = (PEAK_MEMORY,)

        def _begin(self):
            raise OSError("no")

    with Window([Energy(), Broken()]) as window:
        pass
    assert window.reading.record() == {
        "energy_j": 2.0,
        "energy_kind": "measured",
        "energy_source": "fake",
        "peak_memory_bytes": None,
        "memory_kind": None,
        "memory_source": None,
        # a window with an energy figure is graded (petlprof.results.grades): a source petlprof does not know
        "energy_grade": "B",
        "energy_grade_reasons": ["B: source 'fake': petlprof does not know how often it updates"],
        "energy_above_idle_grade": None,
    }
    assert window.reading.value(ENERGY) == 2.0 and window.reading.provenance[ENERGY].source == "fake"
    assert phase_warnings(window.reading) == ["broken failed: OSError: no; its figures are missing", "e said"]
    assert window.reading.warnings == []  # taken once, for the phase
