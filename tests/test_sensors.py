"""Every energy path against GPUs that behave like real sensors (:mod:`sensors`): the recorded figures
and flags are checked against the true energy of a scripted load, on a simulated clock."""

from __future__ import annotations

import sys

import pytest
from sensors import Clock, FakeGpu, FakeNvml, SampledTimeline, bursts, steady, step

import petlprof.meters.devices.nvml as nvml_dev
from petlprof.meters.energy import NvmlEnergyMeter
from petlprof.meters.idle import measure_idle
from petlprof.meters.power import NvmlPowerSource


@pytest.fixture
def world(monkeypatch):
    """``world(gpu_kwargs, ...)`` -> (clock, gpus): fake GPUs as pynvml, CUDA device N = GPU N."""
    clock = Clock().install(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def make(*specs: dict):
        gpus = [FakeGpu(f"GPU-{i:04d}-aaaa", clock=clock, **spec) for i, spec in enumerate(specs)]
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))
        monkeypatch.setattr(nvml_dev, "cuda_uuid", lambda device: gpus[int(device.partition(":")[2] or 0)].uuid)
        return clock, gpus

    return make


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
    assert any("energy above idle is negative" in w for w in reading["energy_warnings"]) is flagged


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
        assert any(words in w for w in reading["energy_warnings"]) and reading["energy_kind"] == "estimated"


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
    assert any("misses part of the load" in w for w in reading["energy_warnings"]) is bool(disagree)
    assert reading["power_field_averaged"] is averaged
    assert any("moving average" in w for w in reading["energy_warnings"]) is (averaged and source == "integrated")
    assert reading["energy_low_confidence"] is low_confidence
    if disagree:  # the part-time field's view is recorded beside the counter's, never instead of it
        assert reading["energy_integrated_j"] == pytest.approx(400.0 * window_s, rel=0.02)
        assert reading["energy_integrated_vs_counter"] == pytest.approx(400.0 / 175.0, rel=0.02)


def test_power_field_sampled_at_its_own_update_period_not_the_counters(world):
    """Counter every 100 ms, power field every 20 ms: sampling at half the counter's period (50 ms) would
    skip three field updates in five."""
    clock, [gpu] = world({"load": steady(250.0), "update_s": 0.1, "power_update_s": 0.02, "noise_w": 1.0})
    timeline = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    assert timeline.info["update_period_s"] == pytest.approx(0.1, rel=0.05)
    assert timeline.info["power_update_period_s"] == pytest.approx(0.02, rel=0.05)
    assert timeline.info["period_s"] == pytest.approx(0.01, rel=0.05)
    reading = metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline), WINDOW_S)
    assert reading["counter_update_period_s"] == pytest.approx(0.1, rel=0.05)
    assert reading["power_update_period_s"] == pytest.approx(0.02, rel=0.05)
    assert reading["power_sample_rate_hz"] == pytest.approx(100.0, rel=0.02)


def test_failed_instant_reads_are_counted_and_the_field_says_it_was_mixed(world):
    clock, [gpu] = world({"load": steady(250.0), "instant_fails_every": 7})
    timeline = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock)
    assert timeline.info["power_field"] == "instant"
    reading = metered(clock, NvmlEnergyMeter("cuda:0", timeline=timeline), WINDOW_S)
    assert reading["power_field"] == "instant+average" and reading["power_field_averaged"] is True
    expected = reading["power_samples"] / 7  # one update in seven, all its samples
    assert reading["power_fallback_samples"] == pytest.approx(expected, rel=0.2)
    assert any("come from the averaged field" in w for w in reading["energy_warnings"])


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
