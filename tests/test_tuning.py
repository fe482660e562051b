"""The learning-rate search (``--tune lr``, issue 37): its space, rungs and choice; its trials are real runs, one
record each in trials.jsonl, never results; it resumes like a sweep; the final runs carry what it cost."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import petlprof.run.execute
from petlprof.cli import main
from petlprof.execution.tune import TRIALS_FILE
from petlprof.report.markdown import write_report
from petlprof.report.records import load_records
from petlprof.sweep.config import build_options, expand, tried_points
from petlprof.sweep.options import tune_targets
from petlprof.sweep.spec import RunSpec
from petlprof.sweep.tuning import choose, lr_space, ranked, rungs, space_of, space_text, targets_of, trial_spec

TINY = ["--backbone", "tiny-bert", "--train-size", "48", "--eval-size", "16", "--batch-size", "8", "--val-size", "16"]
TINY += ["--inference-window-s", "0"]  # the inference phase's 10 repeats alone: it is not what these tests check
TRIALS_PER_SEARCH = 7  # 5 points: 5 pilots of 2 steps, the best 2 at the full 6 steps


@pytest.mark.parametrize(
    "default, points, expected",
    [
        (2e-3, 5, [2e-4, 6.32e-4, 2e-3, 6.32e-3, 2e-2]),
        (1e-3, 2, [1e-4, 1e-2]),
        (5e-5, 3, [5e-6, 5e-5, 5e-4]),
    ],
)
def test_the_space_is_log_spaced_around_the_default(default, points, expected):
    assert lr_space(default, points) == pytest.approx(expected)
    assert str(points) in space_text(default, points)


def test_a_space_of_one_point_is_no_search():
    with pytest.raises(ValueError, match="at least 2 points"):
        lr_space(1e-3, 1)


@pytest.mark.parametrize(
    "budget, points, expected",
    [
        (6, 5, [(2, 5), (6, 2)]),  # a third of the points go on, trained three times longer
        (63, 9, [(21, 9), (63, 3)]),  # the last rung keeps more than one point, at the full budget
        (10, 2, [(10, 2)]),  # two points: one rung at the full budget
        (1, 5, [(1, 5), (1, 2)]),  # a pilot is never shorter than one step
        (100, 27, [(12, 27), (34, 9), (100, 3)]),
    ],
)
def test_successive_halving_rungs(budget, points, expected):
    assert rungs(budget, points) == expected


def _lr(value: float) -> tuple:
    return (("lr", value),)


def _lr_r(lr: float, r: int) -> tuple:
    return (("lr", lr), ("lora.r", r))


@pytest.mark.parametrize(
    "scores, metric, default, best_first",
    [
        ({1e-3: 0.5, 1e-2: 0.7, 1e-4: 0.6}, "accuracy", 1e-3, [1e-2, 1e-4, 1e-3]),
        ({1e-3: 0.5, 1e-2: 0.5, 1e-4: 0.5}, "accuracy", 1e-3, [1e-3, 1e-4, 1e-2]),  # a tie: nearest the default
        ({1e-3: None, 1e-2: 0.1}, "accuracy", 1e-3, [1e-2, 1e-3]),  # a failed trial ranks last
        ({1e-3: 2.0, 1e-2: 1.0}, "eval_loss", 1e-3, [1e-2, 1e-3]),  # lower is better
    ],
)
def test_the_choice_ranks_by_the_validation_score(scores, metric, default, best_first):
    points = {_lr(lr): score for lr, score in scores.items()}
    assert ranked(points, metric, _lr(default)) == [_lr(lr) for lr in best_first]
    assert choose(points, metric, _lr(default)) == _lr(best_first[0])


def test_a_tie_between_points_of_two_targets_goes_to_the_one_nearest_both_defaults():
    scores = {_lr_r(1e-3, 32): 0.5, _lr_r(1e-2, 8): 0.5, _lr_r(1e-3, 8): 0.5, _lr_r(1e-3, 2): 0.4}
    assert ranked(scores, "accuracy", _lr_r(1e-3, 8)) == [
        _lr_r(1e-3, 8),  # the default itself
        _lr_r(1e-3, 32),  # log distance 1.39 (4x the rank)
        _lr_r(1e-2, 8),  # 2.30 (10x the learning rate)
        _lr_r(1e-3, 2),  # a lower score, whatever its distance
    ]


@pytest.mark.parametrize(
    "default, best_first",
    [
        (0, [0, 1, 4]),  # the default (0: "all layers") itself, then the rest, smaller first: no log of 0 taken
        (4, [4, 1, 0]),  # nearer 4 on the log scale, 0 infinitely far
    ],
)
def test_a_tie_on_a_grid_with_zero_ranks_without_a_log_of_zero(default, best_first):
    """A knob grid may hold 0 (normtune's ``last``: 1, 4, 0); a tie once divided by it (ZeroDivisionError)."""
    scores = {(("normtune.last", v),): 0.5 for v in (1, 4, 0)}
    assert ranked(scores, "accuracy", (("normtune.last", default),)) == [(("normtune.last", v),) for v in best_first]


def test_a_knobs_space_is_its_grid_and_with_lr_their_product():
    spec = RunSpec(method="lora", backbone="tiny-bert", lr=2e-3, tune=["lr", "lora.r"])
    assert targets_of(spec) == ["lr", "lora.r"]
    assert space_of(["lora.r"], spec, 5) == [(("lora.r", 2),), (("lora.r", 8),), (("lora.r", 32),)]
    assert len(space_of(["lr", "lora.r"], spec, 3)) == 9
    assert targets_of(RunSpec(method="read", backbone="tiny-bert", lr=1e-3, tune=["lora.r"])) == []  # lora's only
    trial = trial_spec(spec, _lr_r(2e-4, 32), 2, 0)
    assert (trial.lr, trial.method_config, trial.max_steps, trial.train_only) == (2e-4, {"r": 32}, 2, True)
    assert trial.run_key != trial_spec(spec, _lr_r(2e-4, 8), 2, 0).run_key


RUN = ["run", "--methods", "bitfit", *TINY, "--in-process"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tune", "lrate"], "unknown --tune target 'lrate': lr, or a method's Pareto knob as METHOD.KNOB"),
        (["--tune", "lora.alpha"], "unknown --tune target 'lora.alpha'"),  # a field without a declared grid
        (["--tune", "lora.r"], "--tune lora.r: lora is not among --methods bitfit"),
        (["--methods", "lora", "--tune", "lora.r", "--grid"], "--tune lora.r searches r itself; it cannot be given"),
        (["--methods", "lora", "--tune", "lora.r", "--method-config", "lora.r=4"], "with --method-config lora.r"),
        (["--tune", "lr", "--tune-points", "1"], "--tune-points must be an integer >= 2"),
        (["--tune", "lr", "--tune-points", "nan"], "--tune-points must be"),
        (["--tune", "lr", "--tune-points", str(10**30)], "--tune-points must be at most"),
        (["--tune-points", "5"], "--tune-points acts only with --tune"),
        (["--tune", "lr", "--val-size", "1000000"], "--val-size 1000000 leaves no training data"),
        (["--train-only"], "--train-only scores nothing but the validation checks"),
    ],
    ids=[
        "unknown target",
        "a knobless field",
        "not swept",
        "with --grid",
        "with its config",
        "one point",
        "nan",
        "10**30",
        "points without a search",
        "no training left",
        "train only",
    ],
)
def test_bad_tuning_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code = main([*RUN, *args, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err[-1500:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_search_runs_its_trials_as_runs_and_charges_them_to_the_final_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*RUN, "--methods", "bitfit,lora", "--tune", "lr", "--seeds", "0,1", "--output", str(out)]) == 0
    trials, results = _lines(out / TRIALS_FILE), _lines(out / "results.jsonl")
    assert len(trials) == 2 * TRIALS_PER_SEARCH and {t["kind"] for t in trials} == {"trial"}
    assert all(t["status"] == "ok" and t["metrics"] == {} and "eval" not in t for t in trials), "no eval split"
    assert all(len(t["train"]["budget"]["checks"]) == 1 for t in trials), "one validation check, at the end"
    assert sorted(t["spec"]["max_steps"] for t in trials) == [2] * 10 + [6] * 4
    assert len(results) == 4 and all("kind" not in r for r in results)
    for record in results:
        tuning = record["tuning"]
        mine = [t for t in trials if t["method"] == record["method"]]
        assert tuning["trials"] == TRIALS_PER_SEARCH and sorted(tuning["trial_keys"]) == sorted(
            t["run_key"] for t in mine
        )
        assert tuning["chosen"] in tuning["space"] and record["training"]["lr"] == tuning["chosen"]
        # the trials' warm-up steps are paid for too: metered apart from their windows, charged to the search
        warmups = [t["train"]["warmup_energy_j"] for t in mine]
        assert all(w > 0 for w in warmups) and tuning["warmup_energy_j"] == pytest.approx(sum(warmups))
        assert tuning["energy_j"] == pytest.approx(sum(t["train"]["energy_j"] for t in mine) + sum(warmups))
        assert tuning["warmup_time_s"] == pytest.approx(sum(t["train"]["warmup_time_s"] for t in mine))
        assert tuning["time_s"] == pytest.approx(sum(t["train"]["time_s"] + t["train"]["warmup_time_s"] for t in mine))
        last_rung = [t for t in mine if t["spec"]["max_steps"] == 6]
        best = max(t["train"]["budget"]["checks"][-1]["value"] for t in last_rung)
        assert tuning["validation_score"] == best
        assert record["training"]["lr_source"].startswith("searched on the validation split")
    err = capsys.readouterr().err
    assert "lr " in err and "chosen by 7 trial(s)" in err
    assert "bitfit on tiny-bert / tweets, seed 0 (trial: lr 0.0001, 2 steps)" in err, "a trial says what it tries"
    written = write_report(load_records(out / "results.jsonl"), out)
    text = (out / "report.md").read_text()
    assert "## Learning-rate search" in text and "search share of energy" in text
    assert f"warm-ups {results[0]['tuning']['warmup_energy_j']:,.1f} J of it" in text
    assert any(p.name == "pareto_accuracy_vs_energy_with_search.png" for p in written)


def test_a_knob_search_trains_each_grid_value_and_the_final_run_takes_the_chosen_one(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*RUN, "--methods", "lora", "--tune", "lora.r", "--output", str(out)]) == 0
    trials, results = _lines(out / TRIALS_FILE), _lines(out / "results.jsonl")
    assert sorted(t["method_config"]["r"] for t in trials) == [2, 8, 32]  # its grid, one rung at the full budget
    assert {t["training"]["lr"] for t in trials} == {2e-3}, "the learning rate stays the method's default"
    (record,) = results
    tuning = record["tuning"]
    assert tuning["target"] == ["lora.r"] and tuning["space"] == [{"lora.r": 2}, {"lora.r": 8}, {"lora.r": 32}]
    assert record["method_config"]["r"] == tuning["chosen"]["lora.r"]
    assert not record["training"]["lr_source"].startswith("searched")  # the rank was searched, not the lr
    best = max(t["train"]["budget"]["checks"][-1]["value"] for t in trials)
    assert tuning["validation_score"] == best
    assert f"lora.r {tuning['chosen']['lora.r']} chosen by 3 trial(s)" in capsys.readouterr().err
    write_report(load_records(out / "results.jsonl"), out)
    text = (out / "report.md").read_text()
    assert "| points tried" in text and "lora.r 2, lora.r 8, lora.r 32" in text


def test_an_interrupted_search_repeats_no_finished_trial_and_loses_none(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = [*RUN, "--tune", "lr", "--output", str(out)]
    real_execute, executed = petlprof.run.execute.execute, []

    def interrupted_on_the_fourth(spec, **kwargs):
        if len(executed) == 3:
            raise KeyboardInterrupt  # Ctrl-C while the fourth trial trains
        executed.append(spec.run_key)
        return real_execute(spec, **kwargs)

    monkeypatch.setattr(petlprof.run.execute, "execute", interrupted_on_the_fourth)
    assert main(args) == 130
    assert "Resume with the same command" in capsys.readouterr().err
    first = list(executed)

    def counted(spec, **kwargs):
        executed.append(spec.run_key)
        return real_execute(spec, **kwargs)

    monkeypatch.setattr(petlprof.run.execute, "execute", counted)
    assert main(args) == 0
    trials = _lines(out / TRIALS_FILE)
    ok = collections.Counter(t["run_key"] for t in trials if t["status"] == "ok")
    assert len(ok) == TRIALS_PER_SEARCH and set(ok.values()) == {1}, "every trial recorded ok exactly once"
    assert [t["status"] for t in trials].count("cancelled") == 1
    assert len(first) == 3 and not set(first) & set(executed[3:]), "no finished trial ran again"
    assert main(args) == 0 and "1 run(s) on cpu; 1 already in" in capsys.readouterr().err


def test_a_search_killed_with_sigkill_resumes_where_it_stopped(tmp_path, monkeypatch, capsys):
    """kill -9 of the sweep (its trials in processes of their own) after two trials are recorded; the same command
    then runs only the trials and runs not yet recorded."""
    out = tmp_path / "out"
    args = ["run", "--methods", "bitfit", *TINY, "--tune", "lr", "--output", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "petlprof.cli", *args], stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    while len(_lines(out / TRIALS_FILE)) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, 9)
    proc.wait()
    before = {t["run_key"] for t in _lines(out / TRIALS_FILE) if t["status"] == "ok"}
    assert 2 <= len(before) < TRIALS_PER_SEARCH, "killed mid-search"
    executed = []
    real_execute = petlprof.run.execute.execute

    def counted(spec, **kwargs):
        executed.append(spec.run_key)
        return real_execute(spec, **kwargs)

    monkeypatch.setattr(petlprof.run.execute, "execute", counted)
    assert main([*args, "--in-process"]) == 0, capsys.readouterr().err[-2000:]
    trials = _lines(out / TRIALS_FILE)
    ok = collections.Counter(t["run_key"] for t in trials if t["status"] == "ok")
    assert len(ok) == TRIALS_PER_SEARCH and set(ok.values()) == {1}
    assert not before & set(executed), "no trial recorded before the kill ran again"
    assert len(_lines(out / "results.jsonl")) == 1


@pytest.mark.parametrize("given", [["lora.r", "lr"], ["lr", "lora.r", "lr"], ["lr", "lora.r"]])
def test_the_targets_are_one_search_whatever_their_order_or_repeats(given):
    assert tune_targets(given) == ["lr", "lora.r"]
    keys = set()
    for tune in (given, ["lr", "lora.r"]):
        options = build_options({}, {"methods": "lora", "backbone": "tiny-bert", "tune": ",".join(tune)})
        keys |= {spec.run_key for spec in expand(options, "cpu")}
    assert len(keys) == 1  # the same runs: a resume with the targets in another order repeats nothing


def test_a_searched_knob_value_the_backbone_cannot_take_is_refused_before_any_trial(tmp_path, lm_folder, capsys):
    """The preflight checks every value a search will try, as it checks --grid's: a LoRA rank wider than the model."""
    # shutil, transformers: only this test builds a model folder
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    narrow = tmp_path / "narrow"
    shutil.copytree(lm_folder, narrow)
    config = LlamaConfig.from_pretrained(narrow)
    config.update({"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1})
    LlamaForCausalLM(config).save_pretrained(narrow)
    assert tried_points(build_options({}, {"methods": "lora", "tune": "lora.r"}), "lora") == [
        {"r": 2},
        {"r": 8},
        {"r": 32},
    ]
    out = tmp_path / "out"
    args = ["run", "--methods", "lora", "--backbone", str(narrow), "--task", "arith", "--tune", "lora.r"]
    assert main([*args, "--train-size", "16", "--eval-size", "8", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "lora r 32 is larger than the width 16" in err and "Traceback" not in err
    assert not (out / TRIALS_FILE).exists()
