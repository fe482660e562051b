"""``petlprof plan`` (issue 38): each configuration judged against memory, energy and time budgets from the
estimate's own records, ranked, with the share of each budget left; bad budgets are one line and write nothing."""

from __future__ import annotations

import json

import pytest

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.estimate import gpus
from petlprof.estimate.plan import Budgets, Candidate, judge, plan_records, ranked
from petlprof.values import DURATION_UNITS, ENERGY_UNITS

GIB = 2**30


def record(method: str, peak_gib: float, time_s: float | None, energy_j: float | None, status: str = "ok") -> dict:
    """An estimate record as far as a plan reads it."""
    predicted = None if time_s is None else {"train_total": {"time_s": time_s, "energy_j": energy_j}}
    return {
        "backbone": "b",
        "method": method,
        "method_config": {"r": 8},
        "pareto_knob": "r" if method == "lora" else None,
        "status": status,
        "error": None if status == "ok" else "could not trace",
        "memory": {"peak_train_bytes": int(peak_gib * GIB)},
        "predicted": predicted,
    }


USABLE_24 = gpus.usable_bytes(24 * GIB)


B24 = Budgets(24 * GIB, None, None, None)


@pytest.mark.parametrize(
    "budgets, rec, fits, left, over",
    [
        (B24, record("lora", 10, 100, 1000), True, {"memory": 1 - 10 * GIB / USABLE_24}, []),
        (B24, record("full", 30, 100, 1000), False, {"memory": 1 - 30 * GIB / USABLE_24}, ["memory 30 GiB > 20 GiB"]),
        (Budgets(None, 2000.0, 50.0, None), record("lora", 10, 100, 1000), False, {"energy": 0.5, "time": -1.0},
         ["time 1.67 min > 50 s"]),
        (Budgets(None, 1000.0, None, None), record("lora", 10, 100, 1000), True, {"energy": 0.0}, []),  # at it: fits
        (Budgets(None, 999.0, 200.0, None), record("bitfit", 1, 100, 1000), False,
         {"energy": 1 - 1000 / 999, "time": 0.5}, ["energy 1e+03 J > 999 J"]),
        (Budgets(GIB, None, None, None), record("read", 0.25, None, None), True,  # memory alone needs no prediction
         {"memory": 1 - 0.25 * GIB / gpus.usable_bytes(GIB)}, []),
    ],
)  # fmt: skip
def test_each_configuration_is_judged_against_each_budget_it_has_a_figure_for(budgets, rec, fits, left, over):
    candidate = judge(rec, budgets)
    assert candidate.fits is fits and candidate.over == over
    assert candidate.left_share == pytest.approx(left)


def test_a_configuration_that_could_not_be_estimated_never_fits_and_says_why():
    candidate = judge(record("lst", 1, 1, 1, status="failed"), Budgets(GIB, None, None, None))
    assert not candidate.fits and candidate.error == "could not trace" and candidate.over == ["not estimated"]


def test_the_price_turns_predicted_kwh_into_a_cost():
    assert judge(record("lora", 1, 10, 7.2e6), Budgets(GIB, None, None, 0.25)).cost == pytest.approx(0.5)  # 2 kWh


def test_those_that_fit_come_first_least_energy_first_then_the_least_over_then_the_unestimated():
    budgets = Budgets(24 * GIB, 5000.0, None, None)
    candidates = [
        judge(rec, budgets)
        for rec in (
            record("full", 30, 100, 9000),  # over on memory and energy
            record("lst", 1, 1, 1, status="failed"),
            record("lora", 10, 100, 3000),
            record("bitfit", 8, 90, 3000),  # the same energy as lora, less time
            record("read", 5, 50, 1000),
            record("adapter", 10, 100, 5500),  # 10% over on energy only
        )
    ]
    assert [c.method for c in ranked(candidates)] == ["read", "bitfit", "lora", "adapter", "full", "lst"]


@pytest.mark.parametrize(
    "quantity, text, value",
    [
        (ENERGY_UNITS, "5kWh", 1.8e7),
        (ENERGY_UNITS, "900 kJ", 9e5),
        (ENERGY_UNITS, "1.5e3J", 1500.0),
        (ENERGY_UNITS, "2Wh", 7200.0),
        (DURATION_UNITS, "12h", 43200.0),
        (DURATION_UNITS, "90min", 5400.0),
        (DURATION_UNITS, "2d", 172800.0),
        (DURATION_UNITS, "30 s", 30.0),
    ],
)
def test_energy_and_time_budgets_read_with_their_units(quantity, text, value):
    assert quantity.parse(text, "--x") == pytest.approx(value)


def plan(tmp_path, *extra: str) -> list[str]:
    out = tmp_path / "out"
    base = ["plan", "--backbone", "tiny-bert", "--methods", "lora,full,read", "--batch-size", "8"]
    return [*base, "--output", str(out), *extra]


def test_a_plan_ranks_what_the_estimate_predicts_and_keeps_it(tmp_path, capsys):
    args = plan(tmp_path, "--train-size", "64", "--epochs", "2", "--max-energy", "30J", "--device-memory", "1GiB")
    assert main([*args, "--price-per-kwh", "0.3"]) == 0
    out = capsys.readouterr().out
    estimates = {
        r["method"]: r for r in map(json.loads, (tmp_path / "out" / "estimates.jsonl").read_text().splitlines())
    }
    candidates = plan_records(tmp_path / "out")
    assert sorted(c["method"] for c in candidates) == ["full", "lora", "read"]
    for candidate in candidates:
        total = estimates[candidate["method"]]["predicted"]["train_total"]
        assert total["optimiser_steps"] == 16  # 2 epochs of 64 examples in batches of 8
        assert candidate["train_energy_j"] == total["energy_j"] and candidate["train_time_s"] == total["time_s"]
        assert candidate["peak_train_bytes"] == estimates[candidate["method"]]["memory"]["peak_train_bytes"]
        assert candidate["fits"] is (candidate["train_energy_j"] <= 30 and candidate["left_share"]["memory"] >= 0)
        assert candidate["cost"] == pytest.approx(candidate["train_energy_j"] / 3.6e6 * 0.3)
        assert candidate["kind"] == "predicted" and candidate["budgets"]["max_energy_j"] == 30.0
    fitting = [c for c in candidates if c["fits"]]
    assert candidates[: len(fitting)] == fitting  # those that fit first
    assert [c["train_energy_j"] for c in fitting] == sorted(c["train_energy_j"] for c in fitting)
    assert f"{len(fitting)} of 3 configuration(s) predicted to fit" in out
    assert "budgets: memory: the training peak against" in out and "uncalibrated" in out


BAD_BUDGETS = [
    ([], "needs a budget to judge against: --device-memory, --max-energy or --max-time"),
    (["--max-energy", "5"], "--max-energy '5' has no unit"),
    (["--max-energy", "nankWh"], "is not a positive energy"),
    (["--max-energy", "0J"], "is not a positive energy"),
    (["--max-energy", "1e30kWh"], "is more than 1 GWh"),
    (["--max-energy", f"{10**30}J"], "is more than 1 GWh"),
    (["--max-energy", "5kW"], "unknown unit 'kW' (J, kJ, Wh or kWh)"),
    (["--max-time", "10parsec"], "unknown unit 'parsec' (s, min, h or d)"),
    (["--max-time", "infh"], "is not a positive duration"),
    (["--max-time", "1e308d"], "is more than 10 years"),
    (["--device-memory", "24", "--max-time", "1h"], "--device-memory '24' has no unit"),
    (["--max-time", "1h", "--price-per-kwh", "nan"], "--price-per-kwh must be a positive price per kWh"),
    (["--max-time", "1h", "--price-per-kwh", "-1"], "--price-per-kwh must be a positive price per kWh"),
    (["--max-time", "1h", "--price-per-kwh", str(10**30)], "--price-per-kwh must be at most 1000000"),
    (["--device-memory", "100MiB"], "--device-memory 100MiB leaves no memory for a step once the CUDA context"),
    (["--max-time", "1h", "--price-per-kwh", "0.3EUR"], "got '0.3EUR'"),
    (["--max-time", "1h", "--train-size", "all"], "give --train-size a number of examples (an estimate has no data"),
    (["--max-time", "1h", "--epochs", "0"], "--epochs must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("extra, words", BAD_BUDGETS)
def test_a_bad_budget_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, extra, words):
    assert main(plan(tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "out").exists()


def test_energy_and_time_budgets_on_a_device_without_a_model_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PETLPROF_PROFILE_DIR", str(tmp_path / "no-profiles"))
    assert main(plan(tmp_path, "--device", "cpu", "--max-energy", "1kWh")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-energy: a time or energy budget needs them predicted" in err
    assert "petlprof calibrate" in err and not (tmp_path / "out").exists()
    assert main(plan(tmp_path, "--device", "cpu", "--device-memory", "1GiB")) == 0  # memory alone: no prediction needed
    candidates = plan_records(tmp_path / "out")
    assert all(c["train_energy_j"] is None and "memory" in c["left_share"] for c in candidates)


def test_a_candidate_names_its_configuration_by_the_estimates_knob_label():
    candidate = judge(record("lora", 0.25, 10, 10), Budgets(GIB, None, None, None))
    assert isinstance(candidate, Candidate) and candidate.config == "r=8"  # the estimate table's label, not re-derived
    assert candidate.left_share["memory"] == pytest.approx(1 - 0.25 * GIB / gpus.usable_bytes(GIB))


def test_the_budget_kinds_refuse_text_that_is_no_quantity():
    with pytest.raises(UsageError, match="not a positive energy"):
        ENERGY_UNITS.parse(True, "--max-energy")


def test_a_run_of_max_steps_needs_no_training_size(tmp_path, capsys):
    assert main(plan(tmp_path, "--train-size", "all", "--max-steps", "5", "--max-time", "1h")) == 0
    assert "--max-steps 5 = 5 optimiser steps" in capsys.readouterr().out
    assert all(c["train_time_s"] > 0 for c in plan_records(tmp_path / "out"))


def test_a_budget_with_no_figure_to_judge_never_fits():
    unpriced = judge(record("lora", 0.25, None, None), Budgets(GIB, 1000.0, None, None))
    assert not unpriced.fits and unpriced.over == ["energy not predicted"] and set(unpriced.left_share) == {"memory"}


def test_a_configuration_extended_from_shallow_steps_is_not_predicted():
    """The int8 path (:mod:`petlprof.estimate.fallback`) extends the counts of depth-1 and depth-2 steps; their
    seconds are not the whole model's, so it keeps no prediction (a plan then says so)."""
    from petlprof.estimate.fallback import extrapolated_figures
    from petlprof.estimate.model import resolve_backbone

    def trace(resolved, *args, **kwargs):
        layers = resolved.config.num_hidden_layers
        return {"flops": {"train_step": 10 * layers}, "predicted": {"train_step_s": 0.1 * layers}}

    figures = extrapolated_figures(resolve_backbone("opt-125m", None), None, None, None, "int8", trace)
    assert figures["flops"]["train_step"] == 120 and "predicted" not in figures  # 12 layers' counts, no seconds
