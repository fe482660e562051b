"""Meters against fakes of the hardware APIs: an autospec'd pynvml and a fake powercap tree.

Real hardware is exercised only in tests marked ``gpu``.
"""

from __future__ import annotations

import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from petlprof.errors import UsageError
from petlprof.meters import Window, energy_meter_for, meter_status
from petlprof.meters.energy import EstimateEnergyMeter, NvmlEnergyMeter, RaplEnergyMeter, rapl_domains
from petlprof.meters.memory import CpuMemoryMeter


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
    (root / domain / "energy_uj").write_text(str(value))


def test_rapl_counts_packages_and_dram_but_not_core(tmp_path):
    root = make_powercap(tmp_path / "powercap", {
        0: {"energy": 1_000_000, "max": 2**32, "subs": {"core": (500_000, 2**32), "dram": (100_000, 2**32)}},
        1: {"energy": 3_000_000, "max": 2**32},
    })
    psys = tmp_path / "powercap" / "intel-rapl:2"  # client CPUs: psys contains the packages, never added
    psys.mkdir()
    (psys / "name").write_text("psys\n")
    (psys / "energy_uj").write_text("0")
    assert [d.name for d in rapl_domains(root)] == ["intel-rapl:0", "intel-rapl:0:1", "intel-rapl:1"]
    meter = RaplEnergyMeter(root=root)
    meter.begin()
    set_energy(root, "intel-rapl:0", 3_000_000)      # +2 J package 0
    set_energy(root, "intel-rapl:0:0", 1_500_000)    # core: inside the package figure, not added
    set_energy(root, "intel-rapl:0:1", 600_000)      # +0.5 J dram
    set_energy(root, "intel-rapl:1", 4_000_000)      # +1 J package 1
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

    import petlprof.meters.energy as energy_module

    fake = mock.create_autospec(pynvml, instance=False)
    fake.NVMLError = pynvml.NVMLError
    handles = {0: "h0", 1: "h1", 2: "h2"}
    by_uuid = {"GPU-aaa": "h0", "GPU-bbb": "h1", "MIG-ccc": "h2"}
    energy = {"h0": 10_000, "h1": 50_000, "h2": 7_000}
    fake.nvmlDeviceGetCount.return_value = len(handles)
    fake.nvmlDeviceGetHandleByIndex.side_effect = handles.__getitem__
    fake.nvmlDeviceGetHandleByUUID.side_effect = by_uuid.__getitem__
    fake.nvmlDeviceGetTotalEnergyConsumption.side_effect = energy.__getitem__
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # torch's view of the devices: CUDA index -> UUID (CUDA orders fastest first, NVML by PCI bus)
    cuda_uuids = {"cuda:0": "bbb", "cuda:1": "aaa"}
    monkeypatch.setattr(energy_module, "cuda_uuid", lambda device: energy_module._nvml_uuid(cuda_uuids[device]))
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
    assert reading["energy_warnings"] and "low-confidence" in reading["energy_warnings"][0]  # a short window


@pytest.mark.parametrize("visible, expected", [
    (None, ["h0", "h1", "h2"]), ("1", ["h1"]), ("0,2", ["h0", "h2"]), ("GPU-aaa", ["h0"]), ("MIG-ccc", ["h2"]),
    ("aaa", ["h0"]),
])
def test_visible_gpus_follow_cuda_visible_devices(fake_nvml, monkeypatch, visible, expected):
    from petlprof.meters.energy import visible_gpu_handles

    fake, _ = fake_nvml
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu_handles(fake) == expected


def test_nvml_counter_reset_mid_window_counts_from_zero(fake_nvml):
    fake, energy = fake_nvml
    meter = NvmlEnergyMeter("cuda:1")
    meter.begin()
    energy.update(h0=1_500)
    assert meter.end()["energy_j"] == pytest.approx(1.5)


def test_nvml_without_counter_is_unavailable_with_a_reason(fake_nvml):
    fake, _ = fake_nvml
    fake.nvmlDeviceGetTotalEnergyConsumption.side_effect = fake.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
    ok, why = NvmlEnergyMeter.available()
    assert not ok and "not supported" in why.lower()
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
    assert reading["cpu_time_s"] >= 0.3
    cpu_part = reading["cpu_time_s"] * 10.0
    assert cpu_part <= reading["energy_j"] <= cpu_part + 0.375 * 64 * meter.window_s  # + DRAM, < 64 GiB


def test_cpu_memory_meter_sees_an_allocation_and_not_the_past():
    big = np.ones(400 * 2**20 // 8)  # 400 MiB alive when the meter is made, freed before the window:
    meter = CpuMemoryMeter("cpu")    # it must count neither as peak nor as baseline
    del big
    with Window([meter]) as window:
        block = np.ones(200 * 2**20 // 8)
        block[::4096] = 2.0  # touch every page
        del block
    reading = window.reading
    assert reading["memory_source"] == "rss-hwm"
    assert 190 * 2**20 <= reading["peak_memory_bytes"] <= 300 * 2**20


def test_meter_status_lists_every_meter_with_a_reason():
    rows = {name: (ok, why) for name, ok, why, _ in meter_status()}
    assert set(rows) == {"timer", "nvml", "rapl", "estimate", "cuda-allocator", "cpu-rss"}
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
