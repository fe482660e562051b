"""``petlprof plan --verify``: each configuration's pilot gives measured / predicted ratios, the plan is corrected by
them and judged again; a pilot that failed keeps the prediction and says why; a plan priced for a GPU is not
verified on a machine without one; and the whole command on the offline backbone."""

from __future__ import annotations

import json
import math

import pytest

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.estimate import calibrate as cal
from petlprof.estimate import profiles as prof
from petlprof.estimate.plan import Budgets, judge
from petlprof.pilot import corrected, pilot_device, pilot_ratios
from petlprof.results.result import RunResult

MIB = 2**20


def pilot_record(step_s=0.2, energy_j=12.0, steps=6, peak=300 * MIB, predicted=None, status="ok") -> RunResult:
    train = {"latency_s": {"p50": step_s}, "energy_j": energy_j, "steps": steps, "peak_memory_bytes": peak}
    guess = {"step_time_s": 0.1, "energy_j": 1.0, "peak_memory_bytes": 200 * MIB} if predicted is None else predicted
    return RunResult.from_json(
        {"status": status, "error": None if status == "ok" else "boom", "train": train, "predicted": {"train": guess}}
    )


@pytest.mark.parametrize(
    "device, expected",
    [
        ("cpu", {"time": 2.0, "energy": 2.0, "memory": None}),  # 12 J / 6 steps = 2 J a step; RSS not comparable
        ("cuda", {"time": 2.0, "energy": 2.0, "memory": 1.5}),  # the allocator's peak against the predicted one
    ],
)
def test_a_pilot_gives_measured_over_predicted_per_step(device, expected):
    ratios, why = pilot_ratios(pilot_record(), device)
    assert why is None
    assert ratios == pytest.approx(expected)


@pytest.mark.parametrize(
    "record, why",
    [
        (pilot_record(status="failed"), "the pilot run failed: boom"),
        (pilot_record(predicted="none"), "recorded no prediction"),
    ],
)
def test_a_pilot_without_ratios_says_why(record, why):
    ratios, reason = pilot_ratios(record, "cpu")
    assert set(ratios.values()) == {None} and why in reason


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, None])
def test_a_prediction_of_nothing_gives_no_ratio(bad):
    record = pilot_record(predicted={"step_time_s": bad, "energy_j": 1.0, "peak_memory_bytes": None})
    ratios, _ = pilot_ratios(record, "cuda")
    assert ratios["time"] is None and ratios["energy"] == pytest.approx(2.0) and ratios["memory"] is None


def test_the_corrected_plan_scales_each_prediction_and_judges_it_again():
    estimate = {
        "backbone": "b", "method": "lora", "method_config": {"r": 8}, "pareto_knob": "r", "status": "ok",
        "memory": {"peak_train_bytes": 1000 * MIB}, "predicted": {"train_total": {"time_s": 40.0, "energy_j": 500.0}},
    }  # fmt: skip
    budgets = Budgets(None, 800.0, 60.0, None)
    assert judge(estimate, budgets).fits  # 40 s and 500 J: within 60 s and 800 J
    fixed = corrected(estimate, {"time": 2.0, "energy": 1.2, "memory": None})
    candidate = judge(fixed, budgets)
    assert (candidate.train_time_s, candidate.train_energy_j) == (80.0, 600.0)
    assert candidate.peak_train_bytes == 1000 * MIB  # no memory ratio: the peak stays the prediction
    assert not candidate.fits and candidate.over == ["time 1.33 min > 1 min"]
    assert estimate["predicted"]["train_total"]["time_s"] == 40.0  # the plan's own record is left as it was


def test_a_plan_priced_for_a_gpu_is_not_verified_on_a_machine_without_one(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = type("Args", (), {"device": "auto"})()
    with pytest.raises(UsageError, match="no CUDA device.*--device cpu"):
        pilot_device(args)


def test_plan_verify_runs_a_pilot_and_writes_the_corrected_plan(tmp_path, monkeypatch, capsys):
    """The offline backbone, READ, two measured steps: the ratios are numbers and the corrected figures are the
    predicted ones times them."""
    monkeypatch.setenv(prof.PROFILE_ENV, str(tmp_path / "profiles"))
    monkeypatch.setattr(cal, "OPTIMIZER_SIZES", (256, 2**12, 2**16))  # the optimiser timed on fewer, smaller tensors
    monkeypatch.setattr(cal, "OPTIMIZER_ELEMENTS", 2**16)
    monkeypatch.setattr(cal, "FLUSH_MAX_BYTES", 2**20)
    prof.save_profile(cal.calibrate("cpu", seconds=0.05), "cpu")
    out = tmp_path / "plan"
    args = ["plan", "--backbone", "minilm", "--methods", "read", "--device", "cpu", "--max-time", "1h"]
    code = main([*args, "--train-size", "64", "--verify", "--verify-steps", "2", "--output", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    planned = json.loads((out / "plan.jsonl").read_text().splitlines()[0])
    verified = json.loads((out / "plan_verified.jsonl").read_text().splitlines()[0])
    ratios = verified["pilot"]["ratios"]
    assert ratios["time"] > 0 and ratios["energy"] > 0 and ratios["memory"] is None, verified["pilot"]
    assert verified["train_time_s"] == pytest.approx(planned["train_time_s"] * ratios["time"])
    assert verified["train_energy_j"] == pytest.approx(planned["train_energy_j"] * ratios["energy"])
    assert "measured / predicted per step" in printed and "train_time_corrected" in printed
    assert (out / "pilots" / "1-read" / "results.jsonl").is_file()


@pytest.mark.parametrize("steps", ["0", "-3", "nan", "2.5", str(10**30), "many"])
def test_a_bad_pilot_length_is_one_line_and_exit_2(tmp_path, capsys, steps):
    args = ["plan", "--backbone", "minilm", "--methods", "read", "--device", "cpu", "--device-memory", "8GiB"]
    assert main([*args, f"--verify-steps={steps}", "--verify", "--output", str(tmp_path / "plan")]) == 2
    err = capsys.readouterr().err
    assert "--verify-steps must be" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "plan").exists()
