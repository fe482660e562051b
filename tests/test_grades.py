"""Energy grades (:mod:`petlprof.results.grades`) driven by sensor models: every grade has a case of a real meter's
window on a fake GPU, a fake RAPL tree or this machine's estimate that produces it, with the reason it gives; the
rule itself on records at their numeric edges; a report that leads with the sweep's worst grade."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from sensors import SampledTimeline, bursts, fake_world, steady
from test_meters import make_powercap, set_energy

from petlprof.meters.base import Window
from petlprof.meters.cpu_power_model import EstimateEnergyMeter
from petlprof.meters.energy import MAX_REPEATS, NvmlEnergyMeter, RaplEnergyMeter, lengthened, repeats_needed
from petlprof.meters.power import NvmlPowerSource
from petlprof.results.grades import Grade, above_idle_grade, energy_grade, graded, worst


@pytest.fixture
def world(monkeypatch):
    return fake_world(monkeypatch)


def gpu_window(clock, gpu, seconds: float, *, timeline: bool = True, idle=None) -> dict:
    """One window of the NVML meter over ``seconds`` of the fake GPU's load, as a phase records it."""
    sampled = SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock) if timeline else None
    with Window([NvmlEnergyMeter("cuda:0", timeline=sampled, idle=idle)], "cpu") as window:
        clock.sleep(seconds)
    return window.reading.record()


def letters(reasons) -> list[str]:
    return [reason.split(":")[0] for reason in reasons]


GPU_CASES = [
    # (id, the GPU's behaviour, window seconds, grade, a word of every reason)
    ("a counter read 100 times on a settled GPU", {"load": steady(300.0)}, 10.0, "A", []),
    ("30 counter updates", {"load": steady(300.0)}, 3.0, "B", ["30 updates"]),
    ("5 counter updates", {"load": steady(300.0)}, 0.5, "C", ["5 updates"]),
    (
        "a GPU warming 15 °C across the window",
        {"load": steady(300.0), "temperature": lambda t: 40.0 + (t - 1000.0) * 1.5},
        10.0,
        "B",
        ["+15 °C"],
    ),
    (
        "an SM clock throttled from 1980 to 1400 MHz",
        {"load": steady(300.0), "sm_clock": lambda t: 1980.0 if t < 1005.0 else 1400.0},
        10.0,
        "B",
        ["1980 to 1400 MHz"],
    ),
    (
        "bursts in step with the part-time power sampling: counter and integrated power disagree",
        {"load": bursts(400.0, 100.0, 0.1, 0.5, phase=0.0), "instant_fraction": 0.25},
        10.0,
        "B",
        ["disagree"],
    ),
    (
        "no counter: the instantaneous field integrated",
        {"load": steady(300.0), "counter": False},
        10.0,
        "B",
        ["no energy counter"],
    ),
    (
        "no counter and no instantaneous field: the 1 s moving average integrated",
        {"load": steady(300.0), "counter": False, "instant": False},
        10.0,
        "C",
        ["moving-average"],
    ),
]


@pytest.mark.parametrize(
    "gpu_spec, seconds, expected, words", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES]
)
def test_a_gpu_windows_grade_follows_its_sensors(world, gpu_spec, seconds, expected, words):
    clock, [gpu] = world(gpu_spec)
    phase = gpu_window(clock, gpu, seconds)
    assert phase["energy_grade"] == expected, phase["energy_grade_reasons"]
    reasons = phase["energy_grade_reasons"]
    assert worst(letters(reasons)) == (None if expected == "A" else expected)
    for word in words:
        assert any(word in reason for reason in reasons), reasons
    assert (phase["gpu_temperature_start_c"], phase["gpu_sm_clock_start_mhz"]) != (None, None)


def test_a_stuck_driver_whose_counter_never_moves_under_load_is_graded_c(world, monkeypatch):
    clock, [gpu] = world({"load": steady(300.0)})
    monkeypatch.setattr(gpu, "energy_mj", lambda: 123_456)
    phase = gpu_window(clock, gpu, 10.0)
    assert phase["energy_j"] == 0 and phase["energy_integrated_j"] == pytest.approx(3000.0, rel=0.02)
    assert phase["energy_grade"] == "C" and any("did not move" in r for r in phase["energy_grade_reasons"])


def test_a_counter_that_went_back_mid_window_is_graded_c(world, monkeypatch):
    """A driver reload (or a counter wrap) mid-window: the meter counts from zero, and the grade says so."""
    clock, [gpu] = world({"load": steady(300.0)})
    energy = gpu.energy_mj
    monkeypatch.setattr(gpu, "energy_mj", lambda: energy() - (10**9 if clock.now > 1005.0 else 0))
    phase = gpu_window(clock, gpu, 10.0, timeline=False)
    assert phase["energy_counter_went_back"] is True
    assert phase["energy_grade"] == "C" and any("went back" in r for r in phase["energy_grade_reasons"])


IDLE = {"nvml_source": "nvml-energy-counter", "seconds": 2.0, "notes": []}


@pytest.mark.parametrize(
    "idle_w, age_s, spread, expected, word",
    [
        (100.0, 10.0, 0.01, "A", None),
        (350.0, 10.0, 0.01, "C", "negative"),  # idle above the load: the baseline does not hold
        (100.0, 7200.0, 0.01, "B", "min old"),
        (100.0, 10.0, 0.3, "B", "halves differed by 30%"),
    ],
)
def test_energy_above_idle_is_graded_by_its_baseline(world, idle_w, age_s, spread, expected, word):
    clock, [gpu] = world({"load": steady(300.0)})
    # the baseline's age is wall-clock time (the fake clock drives perf_counter and sleep only)
    idle = {**IDLE, "nvml_w": {gpu.uuid: idle_w}, "measured_at": time.time() - age_s, "spread": spread}
    phase = gpu_window(clock, gpu, 10.0, idle=idle)
    assert phase["energy_grade"] == "A"
    assert phase["energy_above_idle_grade"] == expected
    assert phase["idle_baseline_age_s"] == pytest.approx(age_s, abs=5.0) and phase["idle_power_spread"] == spread
    if word:
        assert word in " ".join(above_idle_grade(phase, Grade("A")).reasons)


def test_rapl_is_an_a_and_a_missed_wrap_a_c(tmp_path, monkeypatch):
    root = make_powercap(tmp_path / "powercap", {0: {"energy": 0, "max": 2**32}})
    meter = RaplEnergyMeter(root=root, poll_s=0)
    with Window([meter]) as window:
        time.sleep(0.06)  # 60 of RAPL's ~1 ms updates
        set_energy(root, "intel-rapl:0", 5_000_000)
    phase = window.reading.record()
    assert phase["energy_source"] == "rapl" and phase["energy_grade"] == "A", phase["energy_grade_reasons"]
    # a window whose reads were further apart than a wrap: flagged low-confidence by the meter, a C here
    missed = {**phase, "energy_low_confidence": True, "energy_window_s": 600.0}
    assert energy_grade(missed).letter == "C"


def test_the_labelled_estimate_on_this_machine_is_the_lowest_grade_and_says_why():
    with Window([EstimateEnergyMeter("cpu")]) as window:
        sum(i * i for i in range(10**5))
    phase = window.reading.record()
    assert phase["energy_kind"] == "estimated"
    assert phase["energy_grade"] == "D"
    assert phase["energy_grade_reasons"] == ["D: estimated by the estimate meter, a model of power, not a measurement"]


def test_a_window_without_an_energy_figure_has_no_grade():
    from petlprof.meters.memory import CpuMemoryMeter

    with Window([CpuMemoryMeter()]) as window:
        pass
    assert "energy_grade" not in window.reading.record()
    assert graded({"energy_j": None}) == {
        "energy_grade": None,
        "energy_grade_reasons": None,
        "energy_above_idle_grade": None,
    }


MEASURED_COUNTER = {
    "energy_j": 100.0,
    "energy_kind": "measured",
    "energy_source": "nvml-energy-counter",
    "counter_update_period_s": 0.1,
    "energy_window_s": 10.0,
    "gpu_temperature_start_c": 40,
    "gpu_temperature_end_c": 41,
    "gpu_sm_clock_start_mhz": 1980,
    "gpu_sm_clock_end_mhz": 1980,
}


@pytest.mark.parametrize(
    "change, expected",
    [
        ({}, "A"),
        ({"energy_j": math.nan}, None),
        ({"energy_j": math.inf}, None),
        ({"energy_j": "100"}, None),  # a numeric string is not a figure
        ({"energy_j": 1e308}, "A"),
        ({"energy_j": 10**30}, "A"),
        ({"energy_window_s": math.nan}, "B"),  # the window's length not known
        ({"energy_window_s": 10**400}, "B"),  # past a float's range: not known either
        ({"energy_window_s": "10"}, "B"),
        ({"energy_window_s": 1e308}, "A"),
        ({"counter_update_period_s": 0.0}, "A"),  # not detected: 100 ms assumed, 100 updates
        ({"counter_update_period_s": math.inf}, "A"),
        ({"counter_update_period_s": 1.0}, "C"),  # 10 s / 1 s = 10 updates: a B; 9.9 s would be a C
        ({"gpu_temperature_end_c": math.nan}, "B"),
        ({"gpu_temperature_end_c": 10**30}, "B"),
        ({"gpu_sm_clock_start_mhz": 0}, "A"),  # a clock of 0 says nothing: not a change
        ({"energy_kind": None}, "D"),
        ({"energy_kind": "estimated"}, "D"),
        ({"contended": True, "others_cpu_cores": 1.5}, "B"),
    ],
)
def test_the_rule_at_the_edges_of_its_numbers(change, expected):
    phase = {**MEASURED_COUNTER, **change}
    if change == {"counter_update_period_s": 1.0}:
        phase["energy_window_s"] = 9.9
    grade = energy_grade(phase)
    assert (grade.letter if grade else None) == expected, grade


def test_a_grade_is_one_of_a_to_d_and_worst_skips_what_is_not_one():
    with pytest.raises(ValueError, match="not one of A, B, C, D"):
        Grade("E")
    assert worst(["A", None, "C", "x", "B"]) == "C"
    assert worst([None, float("nan")]) is None


def test_the_report_leads_with_the_sweeps_worst_grade_and_shows_it_beside_the_energy(tmp_path):
    """The stored offline-default study was metered by the estimate: every window a D, said first."""
    from petlprof.report.frame import runs_frame
    from petlprof.report.markdown import render_report
    from petlprof.report.records import load_records

    folder = Path(__file__).resolve().parents[1] / "reports" / "minilm-tweets-default"
    records = load_records([folder])
    text = render_report(records, runs_frame(records), [])
    sections = text.split("\n## ")
    assert sections[1].startswith("Bottom line") and sections[2].startswith("How far to trust the energy figures")
    assert "Worst energy grade in this sweep: **D**" in sections[2] and "a model of power" in sections[2]
    assert "| energy grade |" in text
    assert runs_frame(records)["energy_grade"].tolist() == ["D"] * len(records)


def test_a_window_too_short_for_its_counter_is_repeated_until_it_holds_enough_updates(world):
    """0.3 s of work is 3 counter updates (a C); 17 passes make 5.1 s, 51 updates (an A), per-pass figures."""
    clock, [gpu] = world({"load": steady(300.0)})
    meters = [NvmlEnergyMeter("cuda:0", timeline=SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock))]
    with Window(meters, "cpu") as window:
        clock.sleep(0.3)
    phase = window.reading.record()
    assert phase["energy_grade"] == "C"
    assert repeats_needed(phase) == 17
    again = lengthened(phase, meters, "cpu", lambda: clock.sleep(0.3))
    assert again["energy_repeats"] == 17 and again["energy_repeat_cap"] is False
    assert again["energy_window_s"] == pytest.approx(5.1)
    assert again["energy_j"] == pytest.approx(90.0, rel=0.03)  # 300 W x 0.3 s, one pass
    assert again["energy_grade"] == "A", again["energy_grade_reasons"]


def test_repeats_stop_at_the_cap_and_say_so(world):
    clock, [gpu] = world({"load": steady(300.0)})
    meters = [NvmlEnergyMeter("cuda:0", timeline=SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock))]
    with Window(meters, "cpu") as window:
        clock.sleep(0.01)
    again = lengthened(window.reading.record(), meters, "cpu", lambda: clock.sleep(0.01))
    assert again["energy_repeats"] == MAX_REPEATS and again["energy_repeat_cap"] is True
    assert again["energy_grade"] == "C"  # 0.5 s: still 5 updates, and the record says the cap stopped it


@pytest.mark.parametrize(
    "phase",
    [
        {"energy_source": "estimate", "energy_window_s": 0.01},  # no repeat makes an estimate a measurement
        {"energy_source": "rapl", "energy_window_s": 0.2},  # 200 of RAPL's updates already
        {"energy_source": "nvml-energy-counter", "energy_window_s": 6.0, "counter_update_period_s": 0.1},  # enough
        {"energy_source": "nvml-energy-counter", "energy_window_s": 0.0},
        {"energy_source": "nvml-energy-counter", "energy_window_s": math.nan},
        {"energy_source": "nvml-energy-counter"},
    ],
)
def test_windows_that_repeats_cannot_help_are_left_alone(phase):
    assert repeats_needed(phase) == 1
    assert lengthened(phase, [], "cpu", lambda: None) == {}


def test_a_short_evaluation_is_repeated_for_its_energy_and_scored_once(world, monkeypatch):
    """Through the evaluation of a tiny model: each forward pass takes 0.15 s of the fake clock, the one measured batch
    after the warm-up 0.15 s (a C); it runs again for energy alone, and the predictions are the first pass's."""
    import torch

    from petlprof.models.backbones import load_backbone
    from petlprof.models.classifier import SequenceClassifier
    from petlprof.run.train import Batches, PhaseIO, evaluate
    from petlprof.tasks.labelled import load_task

    clock, [gpu] = world({"load": steady(300.0)})
    task = load_task("tweets", train_size=8, eval_size=16)
    backbone = load_backbone("tiny-bert", seed=0)
    model = SequenceClassifier(backbone, task.num_labels)
    calls = []

    def slow(module, args, kwargs, output):
        calls.append(1)
        clock.sleep(0.15)

    model.register_forward_hook(slow, with_kwargs=True)
    batches = Batches.from_split(task.eval, backbone.tokenizer, 8, 32, False)
    meters = [NvmlEnergyMeter("cuda:0", timeline=SampledTimeline(NvmlPowerSource([gpu.uuid], 1), clock))]
    with torch.no_grad():
        phase, preds, golds = evaluate(model, batches, PhaseIO("cpu", meters, "e"), warmup_steps=1)
    assert len(preds) == len(golds) == 16
    assert phase["energy_repeats"] == 34  # 5 s of 0.15 s passes
    assert len(calls) == 2 + 34  # one scored pass (warm-up included), then the measured batch again
    assert phase["energy_grade"] == "A" and phase["energy_j"] == pytest.approx(45.0, rel=0.03)  # 300 W x 0.15 s
    assert phase["time_s"] == pytest.approx(0.15)  # time stays the scored pass's


def test_the_generation_table_shows_each_windows_grade_beside_its_energy():
    from petlprof.report.frame import runs_frame
    from petlprof.report.markdown import render_report
    from petlprof.report.records import load_records

    folder = Path(__file__).resolve().parents[1] / "reports" / "smollm2-arith"
    records = load_records([folder])
    runs = runs_frame(records)
    assert set(runs["generation.batch_1.energy_grade"].dropna()) == {"D"}
    text = render_report(records, runs, [])
    assert "| energy per response (J, estimated) | energy grade | time to first token" in text


def test_energy_above_idle_shows_its_own_grade_in_the_latency_table():
    """Runs measured by RAPL with an idle baseline that did not hold: energy an A, energy above idle a C."""
    import json

    from petlprof.report.frame import runs_frame
    from petlprof.report.markdown import render_report

    stored = Path(__file__).resolve().parents[1] / "reports" / "minilm-tweets-default" / "results.jsonl"
    records = [json.loads(line) for line in stored.read_text().splitlines() if line.strip()]
    for record in records:
        record["train"].update(
            energy_kind="measured",
            energy_source="rapl",
            energy_window_s=60.0,
            contended=False,
            energy_above_idle_j=-5.0,
            energy_above_idle_low_confidence=True,
        )
    runs = runs_frame(records)
    assert set(runs["energy_grade"]) == {"A"} and set(runs["energy_above_idle_grade"]) == {"C"}
    text = render_report(records, runs, [])
    assert "| train energy above idle (J) | grade |" in text
    assert "| A |" in text and "| C |" in text
