"""A run whose training loss stops being a finite number is recorded ``diverged`` and never scored.

Real in-process runs on the tiny-bert preset are driven to divergence by a huge learning rate (the
first AdamW step moves every weight by about the learning rate, so the next forward pass overflows);
each case says at which step it must stop, inside the warm-up or inside the measured window.  Before
divergence was detected, lr=1e30 runs were recorded ``ok`` with the majority rate as accuracy (0.75
here) and lr=1e308 ones ``failed`` with "value cannot be converted to type float without overflow".  The
records then go through the store, the DataFrame API, the frontier, the configuration tables, the
plots and report.md next to a finished run of the same backbone and task.  A finished run whose
predictions are all one class carries a warning; the ``petlprof_bench`` fixture fails a method that
diverges.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from petlprof.api import frontier, load_results
from petlprof.report import summary_table, write_report
from petlprof.report.table import configuration_tables
from petlprof.results.records import DIVERGED, OK, SCHEMA_VERSION
from petlprof.results.store import append_record, finished_keys
from petlprof.run.execute import execute
from petlprof.run.pipeline import prediction_warnings
from petlprof.sweep.spec import RunSpec

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(backbone="tiny-bert", train_size=32, eval_size=16, batch_size=8, epochs=2, inference_window_s=0.0)

# (id, spec fields, the step (1-based) whose loss is not finite, whether it falls in the warm-up)
DIVERGING = [
    ("lora, divergence inside the warm-up", dict(method="lora", lr=1e30, warmup_steps=2), 2, True),
    ("full, divergence inside the measured window", dict(method="full", lr=1e30, warmup_steps=0), 2, False),
    ("bitfit, divergence at the first measured step", dict(method="bitfit", lr=1e308, warmup_steps=1), 2, False),
]


@pytest.fixture(scope="module")
def runs():
    """The records of every diverging case, by id, and of one finished run (lora at its default lr)."""
    diverged = {case: execute(RunSpec(**SMALL, **fields)) for case, fields, _, _ in DIVERGING}
    finished = execute(RunSpec(method="lora", warmup_steps=1, **SMALL))
    assert finished["status"] == OK, finished.get("error")
    return diverged, finished


@pytest.mark.parametrize("case, fields, step, in_warmup", DIVERGING, ids=[c[0] for c in DIVERGING])
def test_a_diverged_run_is_recorded_as_such(runs, case, fields, step, in_warmup):
    record = runs[0][case]
    assert record["status"] == DIVERGED, record.get("error")
    assert record["schema_version"] == SCHEMA_VERSION
    where = record["diverged_at"]
    assert where["step"] == step
    assert not math.isfinite(float(where["loss"])) or not math.isfinite(float(where["grad_norm"]))
    assert where["last_finite_loss"] is not None and math.isfinite(where["last_finite_loss"])
    assert f"training diverged at step {step}" in record["error"]
    for unscored in ("metrics", "eval", "inference", "eval_merged"):
        assert unscored not in record, f"a diverged run carries '{unscored}'"
    train = record["train"]  # what it cost until it diverged
    assert train["diverged_at"] == where
    assert train["epochs_run"] == pytest.approx((step - 1) / 4, abs=1e-3)  # 4 steps per epoch, step not applied
    assert train["steps"] == max(step - 1 - fields["warmup_steps"], 0)
    assert (train["time_s"] is None) == in_warmup  # a divergence in the warm-up opens no window
    json.loads(json.dumps(record))  # strict JSON: no NaN or Infinity written


def test_diverged_runs_stay_out_of_frontiers_tables_and_plots_and_show_as_failures(runs, tmp_path):
    diverged, finished = runs
    store = tmp_path / "results.jsonl"
    for record in [finished, *diverged.values()]:
        append_record(store, record)
    # final like a finished run: a resumed sweep does not repeat it
    assert finished_keys(store) == {finished["run_key"], *(r["run_key"] for r in diverged.values())}

    frame = load_results(store)
    assert sorted(frame["status"]) == sorted([OK] + [DIVERGED] * len(diverged))
    steps = frame.set_index("status").loc[DIVERGED, "diverged_at_step"]
    assert sorted(steps) == sorted(float(step) for _, _, step, _ in DIVERGING)
    assert frame.loc[frame["status"] == DIVERGED, "quality"].isna().all()
    configs = frontier(frame, x="energy_j")
    assert list(configs["config_key"]) == list(frame.loc[frame["status"] == OK, "config_key"])

    records = [finished, *diverged.values()]
    [(_, _, table)] = configuration_tables(records)
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]  # the runs, then the majority class
    assert len(rows) == 2 and "lora" in rows[0] and "majority class" in rows[1]  # the finished one alone

    paths = write_report(records, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    plotted = [line for line in report.splitlines() if "finished run(s) in" in line]
    assert plotted and all(line.startswith("1 finished run(s) in 1 configuration(s)") for line in plotted)
    failed = report.split("## Failed runs", 1)[1].split("\n## ", 1)[0]
    assert failed.count("status `diverged`") == len(diverged)
    for record in diverged.values():
        assert f"training diverged at step {record['diverged_at']['step']}" in failed
    assert "diverged" in summary_table(records)
    assert any(p.suffix == ".png" for p in paths)


# (id, predictions, regression task, warned)
ONE_CLASS = [
    ("every prediction one class", [1, 1, 1, 1], False, True),
    ("two classes", [1, 0, 1, 1], False, False),
    ("one example says nothing", [1], False, False),
    ("a regression task has no classes", [0.5, 0.5, 0.5], True, False),
]


@pytest.mark.parametrize("case, preds, regression, warned", ONE_CLASS, ids=[c[0] for c in ONE_CLASS])
def test_a_one_class_model_is_warned_about(case, preds, regression, warned):
    task = SimpleNamespace(
        is_regression=regression,
        label_names=["negative", "positive"],
        primary_metric="accuracy",
        objective="classification",
    )
    warnings = prediction_warnings(np.array(preds, dtype=np.float32), task)
    assert bool(warnings) == warned
    if warned:
        assert "class 'positive' (1)" in warnings[0] and f"{len(preds)} evaluation predictions" in warnings[0]


def test_the_one_class_warning_reaches_the_report_and_the_frame(runs, tmp_path):
    finished = {**runs[1], "warnings": ["every one of the 16 evaluation predictions is class 'negative' (0): ..."]}
    append_record(tmp_path / "results.jsonl", finished)
    write_report([finished], tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "## Warnings on results" in report
    assert "every one of the 16 evaluation predictions is class 'negative'" in report
    assert load_results(tmp_path)["warnings"].iloc[0].startswith("every one of the 16")


def test_the_bench_fixture_fails_a_diverging_method():
    from petlprof.bench.plugin import PetlprofBench

    bench = PetlprofBench(baseline=None, update=False, request=None)
    with pytest.raises(pytest.fail.Exception, match="lora diverged at training step 2"):
        bench.check_ratio("lora", "full", rounds=2, batch_size=2, seq_len=8, lr=1e308)
