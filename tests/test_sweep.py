"""Sweeps and budgets: grid expansion from sweep files and flags, stable run keys, resuming an
interrupted sweep without losing or repeating a run, and stopping runs at a target or a time limit.

Expansion is checked against a table of sweep files; the resume and budget tests run real (tiny)
runs in-process on the random-init 2-layer ``tiny-bert``, so they take seconds.
"""

from __future__ import annotations

import collections
import json

import pytest

import petlprof.run.execute
from petlprof.cli import main
from petlprof.registry import get_method
from petlprof.run.budget import MAX_TIME, TARGET, Budget
from petlprof.sweep.config import build_options, expand, load_config_file, parse_method_grids
from petlprof.sweep.spec import RunSpec

pytestmark = pytest.mark.slow  # starts processes or whole sweeps: the full suite, not the inner loop

TINY = ["--backbone", "tiny-bert", "--train-size", "32", "--eval-size", "16", "--batch-size", "16", "--in-process"]
TINY += ["--inference-window-s", "0"]  # the inference phase's 10 repeats alone: it is not what these tests check


def points(specs):
    """(method, its knob value or None, seed) per spec, in order."""
    out = []
    for spec in specs:
        knob = get_method(spec.method).pareto_knob
        out.append((spec.method, spec.method_config.get(knob) if knob else None, spec.seed))
    return out


EXPANSION_CASES = [
    # (id, sweep file, CLI values, expected (method, knob, seed) list)
    (
        "default grids, seeds innermost",
        'methods = ["bitfit", "lora"]\ngrid = true\nseeds = [0, 1]\n',
        {},
        [("bitfit", None, 0), ("bitfit", None, 1)]
        + [("lora", r, s) for r in get_method("lora").default_grid for s in (0, 1)],
    ),
    (
        "--grid from the command line",
        'methods = ["lora", "read"]\n',
        {"grid": True},
        [("lora", r, 0) for r in get_method("lora").default_grid]
        + [("read", h, 0) for h in get_method("read").default_grid],
    ),
    (
        "explicit grid overrides the default one",
        'methods = ["lora", "read"]\ngrid = true\n[method_grid.lora]\nr = [4, 16]\n',
        {},
        [("lora", 4, 0), ("lora", 16, 0)] + [("read", h, 0) for h in get_method("read").default_grid],
    ),
    ("no grid: one configuration per method", 'methods = ["lora"]\n', {}, [("lora", 8, 0)]),
    (
        "a knob fixed in method_config wins over the default grid",
        'methods = ["lora"]\ngrid = true\n[method_config.lora]\nr = 16\n',
        {},
        [("lora", 16, 0)],
    ),
    (
        "repeated grid values run once",
        'methods = ["lora"]\n[method_grid.lora]\nr = [4, 4, 8]\n',
        {},
        [("lora", 4, 0), ("lora", 8, 0)],
    ),
    (
        "backbones and tasks outermost",
        'methods = ["bitfit"]\nbackbone = ["tiny-bert", "minilm"]\n',
        {},
        [("bitfit", None, 0), ("bitfit", None, 0)],
    ),
]


@pytest.mark.parametrize("text, cli, expected", [c[1:] for c in EXPANSION_CASES], ids=[c[0] for c in EXPANSION_CASES])
def test_sweep_expansion(text, cli, expected, tmp_path):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(text)
    specs = expand(build_options(load_config_file(str(sweep)), cli), "cpu")
    assert points(specs) == expected
    assert len({s.run_key for s in specs}) == len(specs)


def test_cartesian_product_of_several_fields_from_yaml(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("methods: [lora]\nmethod_grid:\n  lora:\n    r: [2, 8]\n    alpha: [4, 16, 32]\n")
    specs = expand(build_options(load_config_file(str(sweep)), {}), "cpu")
    assert sorted((s.method_config["r"], s.method_config["alpha"]) for s in specs) == sorted(
        (r, a) for r in (2, 8) for a in (4, 16, 32)
    )


def test_cli_method_grid_parsing_and_merge_with_the_file(tmp_path):
    assert parse_method_grids(["lora.r=2,8", "read.cell=[gru,lstm]", "lora.alpha=16"]) == {
        "lora": {"r": [2, 8], "alpha": [16]},
        "read": {"cell": ["gru", "lstm"]},
    }
    file_values = {"methods": ["lora"], "method_grid": {"lora": {"alpha": [4, 8]}}}
    options = build_options(file_values, {"method_grid": {"lora": {"r": [2]}}})
    assert options.method_grid == {"lora": {"alpha": [4, 8], "r": [2]}}


def test_grid_points_keep_the_run_keys_of_the_same_single_runs():
    """A grid point is the same run as asking for that configuration alone: a sweep resumes a store
    written by single runs and the other way round, whatever the grid's order."""
    grid = expand(build_options({}, {"methods": "lora", "grid": True, "seeds": "0,1"}), "cpu")
    for r in get_method("lora").default_grid:
        single = expand(
            build_options({}, {"methods": "lora", "method_config": {"lora": {"r": r}}, "seeds": "1"}), "cpu"
        )
        assert single[0].run_key in {s.run_key for s in grid}
    reordered = expand(
        build_options(
            {"method_grid": {"lora": {"r": list(reversed(get_method("lora").default_grid))}}},
            {"methods": "lora", "seeds": "0,1"},
        ),
        "cpu",
    )
    assert {s.run_key for s in reordered} == {s.run_key for s in grid}


def test_budget_fields_join_the_run_key_only_when_set():
    plain = RunSpec(method="read")
    identity = {k: v for k, v in plain.to_dict().items() if k not in petlprof.sweep.spec.BUDGET_FIELDS}
    unset = {k: None for k in petlprof.sweep.spec.BUDGET_FIELDS}  # as a record from before budgets reads
    assert plain.run_key == RunSpec(method="read", **unset).run_key
    assert json.dumps(identity)  # a key from before budgets existed is computed from the same fields
    keys = {
        plain.run_key,
        RunSpec(method="read", target_value=0.8, eval_every=10).run_key,
        RunSpec(method="read", target_value=0.9, eval_every=10).run_key,
        RunSpec(method="read", max_train_time_s=60).run_key,
    }
    assert len(keys) == 4


@pytest.mark.parametrize(
    "text, expected",
    [
        ('methods = ["lora"]\n[method_grid.lora]\nr = 8\n', "method_grid.lora.r must be a non-empty list"),
        ('methods = ["lora"]\n[method_grid.lora]\nr = []\n', "method_grid.lora.r must be a non-empty list"),
        ('methods = ["lora"]\n[method_grid.lora]\nrank = [4]\n', "unknown option of method 'lora' 'rank'"),
        ('methods = ["lora"]\n[method_grid.read]\nhidden_size = [4]\n', "unknown method in method_grid 'read'"),
        ('methods = ["lora"]\ngrid = "yes"\n', "option 'grid' must be bool"),
        ('methods = ["lora"]\ntarget_metric = "accuracy"\n', "--target-metric accuracy needs --target-value"),
        ('methods = ["lora"]\ntarget_value = 0.8\ntarget_metric = "acc"\n', "unknown target metric 'acc'"),
        ('methods = ["lora"]\nmax_train_time = -1\n', "--max-train-time must be a positive number"),
        ('methods = ["lora"]\ntarget_value = 0.8\neval_every = 0\n', "--eval-every must be an integer >= 1"),
        (
            'methods = ["lora"]\nbackbone = "tiny-bert"\n[method_grid.lora]\nr = [8, 128]\n',
            "lora r 128 is larger than the width 64 of backbone 'tiny-bert'",
        ),  # every grid point is checked up front
    ],
)
def test_bad_sweep_files_are_one_line_exit_2(text, expected, tmp_path, capsys):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(text)
    code = main(["run", "--config", str(sweep), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_interrupted_sweep_resumes_without_losing_or_repeating_a_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = ["run", "--methods", "lora", "--method-grid", "lora.r=2,4,8", *TINY, "--output", str(out)]
    real_execute, executed = petlprof.run.execute.execute, []

    def interrupted_on_the_second(spec, **kwargs):
        if len(executed) == 1:
            raise KeyboardInterrupt  # Ctrl-C while the second run trains
        executed.append(spec.run_key)
        return real_execute(spec, **kwargs)

    monkeypatch.setattr(petlprof.run.execute, "execute", interrupted_on_the_second)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "[2/3] lora r=4 on tiny-bert / tweets, seed 0" in err and "Resume with the same command" in err
    first = list(executed)

    def counted(spec, **kwargs):
        executed.append(spec.run_key)
        return real_execute(spec, **kwargs)

    monkeypatch.setattr(petlprof.run.execute, "execute", counted)
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "3 run(s) on cpu; 1 already in" in err and "[2/3] lora r=4 on tiny-bert / tweets, seed 0" in err
    assert "[3/3] lora r=8 on tiny-bert / tweets, seed 0" in err and "left)" in err
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    ok = collections.Counter(r["run_key"] for r in lines if r["status"] == "ok")
    assert len(ok) == 3 and set(ok.values()) == {1}, "every run recorded ok exactly once"
    assert collections.Counter(executed) == collections.Counter(ok), "no finished run was run again"
    assert [r["status"] for r in lines].count("cancelled") == 1 and len(first) == 1
    assert sorted(r["method_config"]["r"] for r in lines if r["status"] == "ok") == [2, 4, 8]
    assert main(args) == 0 and "3 run(s) on cpu; 3 already in" in capsys.readouterr().err


BUDGET_CASES = [
    # (id, metric, target, scores per check, eval_every, steps trained, expected stop step, reason)
    (
        "higher is better: stops at the first check at or past the target",
        "accuracy",
        0.7,
        [0.5, 0.7, 0.9],
        2,
        10,
        4,
        TARGET,
    ),
    ("lower is better (time_s as a stand-in)", "time_s", 3.0, [5.0, 4.0, 2.0], 3, 20, 9, TARGET),
    ("never reached: trains to the end", "accuracy", 0.99, [0.5] * 10, 1, 6, None, None),
]


@pytest.mark.parametrize(
    "metric, target, scores, every, steps, stop_at, reason",
    [c[1:] for c in BUDGET_CASES],
    ids=[c[0] for c in BUDGET_CASES],
)
def test_budget_stops_at_the_target(metric, target, scores, every, steps, stop_at, reason):
    values = iter(scores)
    budget = Budget(
        metric=metric,
        target_value=target,
        eval_every=every,
        score=lambda model: next(values),
        model=None,
        max_time_s=None,
        eval_size=50,
    )
    stopped = next((step for step in range(1, steps + 1) if budget(step)), None)
    assert stopped == stop_at and budget.stop_reason == reason
    summary = budget.summary({"time_s": 12.5, "energy_j": 40.0})
    assert summary["reached"] is (reason == TARGET)
    assert summary["time_to_target_s"] == (12.5 if reason else None)
    assert summary["energy_to_target_j"] == (40.0 if reason else None)
    assert [c["step"] for c in summary["checks"]] == list(range(every, (stop_at or steps) + 1, every))


def test_budget_max_time():
    budget = Budget(
        metric=None, target_value=None, eval_every=None, score=None, model=None, max_time_s=1e-9, eval_size=None
    )
    budget.start()
    assert budget(1) == MAX_TIME and budget.summary({})["reached"] is None


def test_a_run_stops_at_its_target(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--methods",
            "bitfit",
            *TINY,
            "--train-size",
            "96",
            "--epochs",
            "2",
            "--target-value",
            "0",
            "--eval-every",
            "3",
            "--target-eval-size",
            "8",
            "--output",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err[-2000:]
    (target,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    budget = target["train"]["budget"]
    assert budget["stop_reason"] == TARGET and budget["reached"] and budget["reached_at_step"] == 3
    assert budget["check_eval_size"] == 8 and budget["target_metric"] == "accuracy"
    assert budget["time_to_target_s"] == target["train"]["time_s"] and budget["check_time_s"] > 0
    assert target["train"]["steps"] == 3 - target["train"]["warmup_steps"]  # 12 steps planned


class FixedEnergy:
    """A stand-in energy meter: each window it is opened around reads ``joules`` (hardware fake)."""

    def __init__(self, joules: float):
        self.joules, self.opened, self.device = joules, 0, "cpu"

    def prepare(self) -> None:
        pass

    def begin(self) -> None:
        self.opened += 1

    def end(self) -> dict:
        return {"energy_j": self.joules}


CHECK_COST_CASES = [
    # (id, scores per check, eval_every, steps, phase time_s, phase energy_j, joules per check,
    #  expected checks, expected energy_to_target_without_checks_j)
    ("reached at the 3rd check", [0.1, 0.2, 0.9], 2, 10, 30.0, 100.0, 2.5, 3, 92.5),
    ("reached at the 1st check", [0.95], 1, 5, 4.0, 10.0, 4.0, 1, 6.0),
    ("checks cost more than the phase (two meters disagree): floored at 0", [0.99], 1, 2, 1.0, 1.0, 3.0, 1, 0.0),
    ("never reached: no cost to the target", [0.1] * 4, 1, 4, 8.0, 20.0, 1.0, 4, None),
]


@pytest.mark.parametrize(
    "scores, every, steps, time_s, energy_j, joules, checks, without",
    [c[1:] for c in CHECK_COST_CASES],
    ids=[c[0] for c in CHECK_COST_CASES],
)
def test_the_checks_own_cost_is_measured_and_taken_off(scores, every, steps, time_s, energy_j, joules, checks, without):
    values, meter = iter(scores), FixedEnergy(joules)
    budget = Budget(
        metric="accuracy",
        target_value=0.9,
        eval_every=every,
        score=lambda model: next(values),
        model=None,
        max_time_s=None,
        eval_size=8,
        check_meter=meter,
    )
    next((step for step in range(1, steps + 1) if budget(step)), None)
    summary = budget.summary({"time_s": time_s, "energy_j": energy_j})
    assert meter.opened == len(summary["checks"]) == checks
    assert summary["check_energy_j"] == pytest.approx(checks * joules)
    assert summary["energy_to_target_without_checks_j"] == (pytest.approx(without) if without is not None else None)
    if without is None:
        assert summary["time_to_target_without_checks_s"] is None
    else:
        expected = max(time_s - summary["check_time_s"], 0.0)
        assert summary["time_to_target_without_checks_s"] == pytest.approx(expected)


def test_without_a_check_meter_the_checks_energy_is_unknown_not_zero():
    budget = Budget(
        metric="accuracy", target_value=0.5, eval_every=1, score=lambda m: 1.0, model=None, max_time_s=None, eval_size=4
    )
    assert budget(1) == TARGET
    summary = budget.summary({"time_s": 2.0, "energy_j": 5.0})
    assert summary["check_energy_j"] is None and summary["energy_to_target_without_checks_j"] is None
    assert summary["time_to_target_without_checks_s"] is not None


@pytest.mark.parametrize("preset, config", [("tiny-bert", {}), ("tiny-t5", {}), ("tiny-gpt2", {})])
def test_a_side_tuned_check_slice_runs_its_backbone_once_and_scores_the_same(preset, config):
    """Kept states give exactly the scores of full forward passes, check after check, while the
    side network changes between checks; the backbone runs at the first check only."""
    import torch

    from petlprof.models.backbones import load_backbone
    from petlprof.models.classifier import SequenceClassifier
    from petlprof.run.budget import SliceScorer
    from petlprof.run.train import Batches
    from petlprof.tasks.labelled import load_task

    torch.manual_seed(0)
    backbone = load_backbone(preset)
    task = load_task("tweets3", train_size=8, eval_size=24)
    model = get_method("read").build()(
        SequenceClassifier(backbone, task.num_labels), get_method("read").make_config(config)
    )
    enc = backbone.tokenizer(task.eval.texts, truncation=True, max_length=32)
    rows = [{k: enc[k][i] for k in ("input_ids", "attention_mask")} for i in range(len(task.eval.texts))]
    batches = Batches(rows, torch.tensor(task.eval.labels), 8, backbone.tokenizer)
    metric = task.primary_metric
    plain, kept = (SliceScorer(task, batches, metric, "cpu", reuse_states=r) for r in (False, True))
    calls, states = [], model.backbone_states
    model.backbone_states = lambda *a, **k: calls.append(1) or states(*a, **k)
    head = [p for n, p in model.named_parameters() if p.requires_grad]
    seen = set()
    for check in range(4):
        value = plain(model)
        assert kept(model) == value
        seen.add(value)
        with torch.no_grad():
            for p in head:
                p.add_(torch.randn_like(p) * (check + 1))
    assert len(calls) == 3 * 4 + 3  # plain: 3 batches x 3 calls per check; kept: 3 batches once
    assert len(seen) > 1  # the side network's changes do reach the scores


def test_a_run_with_cached_states_reports_its_checks_cost(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["run", "--methods", "read", *TINY, "--cache-hidden-states", "--target-value", "1.0"]
    code = main([*args, "--eval-every", "1", "--target-eval-size", "8", "--output", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    budget = record["train"]["budget"]
    assert budget["check_states_reused"] is True and len(budget["checks"]) == record["train"]["steps"]
    assert budget["check_energy_j"] > 0 and budget["energy_to_target_without_checks_j"] is None  # 1.0 not reached
