"""Every energy path against GPUs that behave like real sensors (:mod:`sensors`): the recorded figures
and flags are checked against the true energy of a scripted load, on a simulated clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from sensors import SampledTimeline, bursts, fake_world, install_fake_zeus, steady, step

from petlprof.meters import ENERGY_METERS, EXTRA_METERS, MEMORY_METERS
from petlprof.meters.carbon import CodecarbonMeter
from petlprof.meters.contention import ContentionMeter
from petlprof.meters.cpu_power_model import EstimateEnergyMeter
from petlprof.meters.energy import NvmlEnergyMeter, RaplEnergyMeter
from petlprof.meters.idle import measure_idle
from petlprof.meters.memory import CpuMemoryMeter, CudaMemoryMeter
from petlprof.meters.power import NvmlPowerSource
from petlprof.meters.tensors import CpuTensorMeter
from petlprof.meters.zeus import ZeusEnergyMeter


@pytest.fixture
def world(monkeypatch):
    """``world(gpu_kwargs, ...)`` -> (clock, gpus): fake GPUs as pynvml, CUDA device N = GPU N."""
    return fake_world(monkeypatch)


def metered(clock, meter, seconds: float) -> dict:
    meter.begin()
    clock.sleep(seconds)
    return meter.end()


def test_idle_power_comes_from_the_counter_the_window_energy_comes_from(world):
    """The power field reads 8 W over the counter (separate sensors): an idle baseline taken from the
    field made a window at idle come out 8 W x t *below* idle, silently."""
    clock, [gpu] = world({"load": steady(60.0), "field_offset_w": 8.0})
    idle = measure_idle("cuda:0", seconds=2.0)
    assert idle["nvml_source"] == "nvml-energy-counter"
    assert idle["nvml_w"][gpu.uuid] == pytest.approx(60.0, rel=1e-3)
    timeline = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    reading = metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline, idle=idle), 10.0)
    assert reading["idle_power_source"] == "nvml-energy-counter"
    assert reading["energy_above_idle_j"] == pytest.approx(0.0, abs=60.0 * gpu.update_s)  # one counter update
    assert reading["energy_integrated_j"] == pytest.approx(680.0, rel=0.01)  # the field's own view, recorded


@pytest.mark.parametrize(
    "idle, source, above_j, flagged",
    [
        ({"nvml_w": {"GPU-0000-aaaa": 40.0}, "nvml_source": "nvml-energy-counter"}, "counter", 200.0, False),
        ({"nvml_w": {"GPU-0000-aaaa": 100.0}, "nvml_source": "nvml-energy-counter"}, "counter", -400.0, True),
        ({"nvml_w": {"GPU-0000-aaaa": 40.0}}, "integrated", 200.0, False),  # a baseline without its source: sampled
    ],
)
def test_energy_above_idle_names_its_source_and_flags_a_negative_figure(world, idle, source, above_j, flagged):
    clock, [gpu] = world({"load": steady(60.0)})
    timeline = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    reading = metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline, idle=idle), 10.0)
    assert reading["idle_power_source"] == f"nvml-{'energy-counter' if source == 'counter' else 'power-integrated'}"
    assert reading["energy_above_idle_j"] == pytest.approx(above_j, abs=6.0)
    assert reading["energy_above_idle_low_confidence"] is flagged
    assert any("energy above idle is negative" in w for w in reading.warnings) is flagged


@pytest.mark.parametrize(
    "visible, meter, words",
    [
        ("GPU-0001", "nvml", "NVML total-energy counter + power timeline on 1 GPU(s)"),  # a prefix CUDA accepts
        ("0001-aaaa", "nvml", "on 1 GPU(s)"),
        ("GPU-000", "estimate", "matches 2 GPUs"),  # ambiguous: refused, never guessed
        ("MIG-4a1b2c3d-0000-1111-2222-333344445555", "estimate", "MIG instance"),
    ],
)
def test_abbreviated_gpu_uuids_are_resolved_and_mig_is_refused_with_a_reason(world, monkeypatch, visible, meter, words):
    from petlprof.meters import energy_meter_for

    clock, gpus = world({"load": steady(100.0)}, {"load": steady(200.0)})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert words in NvmlEnergyMeter.available()[1]
    chosen = energy_meter_for("cuda:1" if meter == "nvml" else "cuda", "auto")
    assert chosen.name == meter
    reading = metered(clock, chosen, 10.0)
    if meter == "nvml":
        assert reading["energy_j"] == pytest.approx(2000.0, abs=200.0 * gpus[1].update_s)
    else:  # the estimate says why the GPU was not measured
        assert any(words in w for w in reading.warnings) and reading["energy_kind"] == "estimated"


WINDOW_S = 10.0
LOCKED = bursts(400.0, 100.0, period_s=0.1, duty=0.25)  # busy exactly while the instant field looks: mean 175 W


@pytest.mark.parametrize(
    "gpu, window_s, source, max_error, disagree, averaged, low_confidence",
    [
        ({"load": steady(300.0)}, WINDOW_S, "counter", 0.01, False, False, False),
        ({"load": steady(40.0)}, WINDOW_S, "counter", 0.01, False, False, False),  # idle
        ({"load": LOCKED}, WINDOW_S, "counter", 0.01, True, False, False),  # the field sees 400 W throughout
        ({"load": bursts(400.0, 100.0, period_s=0.37, duty=0.5)}, WINDOW_S, "counter", 0.01, False, False, False),
        ({"load": steady(300.0), "instant": False}, WINDOW_S, "counter", 0.01, False, True, False),
        ({"load": LOCKED, "instant": False}, WINDOW_S, "counter", 0.01, False, True, False),  # a 1 s mean sees all
        ({"load": steady(300.0)}, 1.0, "counter", 0.10, False, False, True),  # short: 1 update = 10%
        ({"load": steady(300.0), "counter": False}, WINDOW_S, "integrated", 0.01, None, False, False),
        (
            {"load": step(50.0, 300.0, at=1001.5), "counter": False, "instant": False},
            8.0,
            "integrated",
            0.06,
            None,
            True,
            False,
        ),
    ],
    ids=[
        "steady",
        "idle",
        "phase-locked-bursts",
        "unlocked-bursts",
        "steady-averaged-field",
        "locked-bursts-averaged-field",
        "short-window",
        "no-counter",
        "no-counter-averaged-field-load-step",
    ],
)
def test_every_energy_path_against_the_true_energy(
    world, gpu, window_s, source, max_error, disagree, averaged, low_confidence
):
    clock, [fake] = world(gpu)
    timeline = SampledTimeline(NvmlPowerSource([fake.uuid], 1), clock)  # detects the period: ~1.2 s pass
    clock.now = max(clock.now, 1001.5)
    t0 = clock.now
    reading = metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline), window_s)
    true_j = fake.true_energy_j(t0, clock.now)
    assert reading["energy_source"] == f"nvml-{'energy-counter' if source == 'counter' else 'power-integrated'}"
    assert abs(reading["energy_j"] - true_j) <= max_error * true_j, (reading["energy_j"], true_j)
    assert reading["energy_sources_disagree"] is disagree
    assert any("misses part of the load" in w for w in reading.warnings) is bool(disagree)
    assert reading["power_field_averaged"] is averaged
    assert any("moving average" in w for w in reading.warnings) is (averaged and source == "integrated")
    assert reading["energy_low_confidence"] is low_confidence
    if disagree:  # the part-time field's view is recorded beside the counter's, never instead of it
        assert reading["energy_integrated_j"] == pytest.approx(400.0 * window_s, rel=0.02)
        assert reading["energy_integrated_vs_counter"] == pytest.approx(400.0 / 175.0, rel=0.02)


def test_power_field_sampled_at_its_own_update_period_not_the_counters(world):
    """Counter every 100 ms, power field every 20 ms: sampling at half the counter's period (50 ms) would
    skip three field updates in five."""
    clock, [gpu] = world({"load": steady(250.0), "update_s": 0.1, "power_update_s": 0.02, "noise_w": 1.0})
    timeline = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    assert timeline.info.update_period_s == pytest.approx(0.1, rel=0.05)
    assert timeline.info.power_update_period_s == pytest.approx(0.02, rel=0.05)
    assert timeline.info.period_s == pytest.approx(0.01, rel=0.05)
    reading = metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline), WINDOW_S)
    assert reading["counter_update_period_s"] == pytest.approx(0.1, rel=0.05)
    assert reading["power_update_period_s"] == pytest.approx(0.02, rel=0.05)
    assert reading["power_sample_rate_hz"] == pytest.approx(100.0, rel=0.02)


def test_failed_instant_reads_are_counted_and_the_field_says_it_was_mixed(world):
    clock, [gpu] = world({"load": steady(250.0), "instant_fails_every": 7})
    timeline = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    assert timeline.info.power_field == "instant"
    reading = metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline), WINDOW_S)
    assert reading["power_field"] == "instant+average" and reading["power_field_averaged"] is True
    expected = reading["power_samples"] / 7  # one update in seven, all its samples
    assert reading["power_fallback_samples"] == pytest.approx(expected, rel=0.2)
    assert any("come from the averaged field" in w for w in reading.warnings)


def test_meters_check_on_a_gpu_reads_the_sensors_it_is_given(world, monkeypatch):
    """The GPU part of `petlprof meters --check` against the sensor model (no GPU here): the load is
    simulated time passing on a GPU drawing 200 W, the sampler is the in-process one."""
    import petlprof.meters as meters
    import petlprof.meters.base as base
    import petlprof.meters.check_gpu as check_gpu

    clock, [gpu] = world({"load": steady(200.0), "noise_w": 0.5})
    monkeypatch.setattr(base, "synchronize", lambda device: None)
    monkeypatch.setattr(check_gpu, "gpu_work", lambda seconds, duty=1.0, period_s=0.1: clock.sleep(seconds))
    monkeypatch.setattr(
        meters, "start_power_timeline", lambda device: SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    )
    checks = {c.name: c for c in check_gpu.nvml_checks()}
    assert set(checks) == {
        "counter update period",
        "power field",
        "counter vs integrated, steady",
        "counter vs integrated, bursty",
        "sampling rate",
        "short-window spread",
        "idle power",
    }
    assert checks["counter update period"].value == pytest.approx(0.1, rel=0.05)
    assert checks["power field"].value == "instant" and checks["power field"].verdict == "pass"
    assert checks["counter vs integrated, steady"].value == pytest.approx(1.0, abs=0.02)
    assert checks["counter vs integrated, steady"].verdict == "pass"
    assert checks["idle power"].value == pytest.approx(200.0, rel=0.01) and checks["idle power"].verdict == "pass"
    assert checks["sampling rate"].verdict == "pass"
    assert all(c.verdict in ("pass", "warn", "fail") and c.detail for c in checks.values())


# Every meter class reads exactly what it declares: one configuration each in which it writes every key it
# may (the idle baseline, the power timeline, the memory snapshot), on fakes of its hardware.


def _nvml(request, tmp_path, monkeypatch):
    clock, [gpu] = request.getfixturevalue("world")({"load": steady(60.0)})
    idle = measure_idle("cuda:0", seconds=2.0)
    timeline = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    return metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline, idle=idle), 10.0)


def _rapl(request, tmp_path, monkeypatch):
    root = tmp_path / "intel-rapl:0"
    root.mkdir()
    (root / "name").write_text("package-0\n")
    (root / "energy_uj").write_text("0")
    (root / "max_energy_range_uj").write_text(str(2**32))
    meter = RaplEnergyMeter(root=tmp_path, idle={"rapl_w": 2.0}, poll_s=0)
    meter.begin()
    (root / "energy_uj").write_text("3000000")
    return meter.end()


def _cuda_allocator(request, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 200)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kwargs: None)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: Path(path).write_bytes(b""))
    meter = CudaMemoryMeter("cuda:0", snapshot_path=str(tmp_path / "snapshot.pickle"))
    meter.prepare()
    meter.begin()
    return meter.end()


def _contention(request, tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 1000 0 0 0 0 0 0\ncpu0 100 0 100 1000 0 0 0 0 0 0\n")
    meter = ContentionMeter(stat=stat, own=lambda: 0.0, loadavg=lambda: (0.5, 0.5, 0.5))
    meter.begin()
    return meter.end()


def _zeus(request, tmp_path, monkeypatch):
    install_fake_zeus(monkeypatch)
    return _run(ZeusEnergyMeter("cpu"))


def _run(meter):
    meter.prepare()
    meter.begin()
    return meter.end()


READINGS = {  # meter class -> its reading in a configuration that writes every key it declares
    NvmlEnergyMeter: _nvml,
    RaplEnergyMeter: _rapl,
    EstimateEnergyMeter: lambda *_: _run(EstimateEnergyMeter("cpu")),
    CpuMemoryMeter: lambda *_: _run(CpuMemoryMeter("cpu")),
    CudaMemoryMeter: _cuda_allocator,
    CodecarbonMeter: lambda *_: _run(CodecarbonMeter("cpu")),
    CpuTensorMeter: lambda *_: _run(CpuTensorMeter("cpu", resident_bytes=1)),
    ContentionMeter: _contention,
    ZeusEnergyMeter: _zeus,
}


def test_the_table_covers_every_meter_a_run_can_use():
    meters = {cls for kind in (ENERGY_METERS, MEMORY_METERS, EXTRA_METERS) for _, cls in kind.items()}
    assert set(READINGS) == {*meters, ContentionMeter}


@pytest.mark.parametrize("cls", list(READINGS), ids=[cls.name for cls in READINGS])
def test_every_meter_reads_exactly_the_keys_it_declares(cls, request, tmp_path, monkeypatch):
    if cls is CodecarbonMeter and not cls.available()[0]:
        pytest.skip(cls.available()[1])
    reading = READINGS[cls](request, tmp_path, monkeypatch)
    declared = {key for figure in cls.FIGURES for key in figure.reading_keys} | set(cls.OWN)
    assert declared <= set(reading.record())  # its figures, their provenance and its own figures, always
    assert set(reading.record()) == cls.declared_keys()  # and here every key it may write
    assert dict(reading) == reading.record()
    failed = cls.invalid_reading(cls.__new__(cls), RuntimeError("gone"))
    assert failed.record() == dict.fromkeys(declared) and failed.errors == [
        f"{cls.name} failed: RuntimeError: gone; its figures are missing"
    ]
