"""The phases' warm-up steps are timed (``warmup_time_s``), so a sweep's overhead line tells the warm-ups, which the
measurement needs, from the harness's own cost (issue 39: a run's overhead on smollm2 is mostly warm-ups)."""

from __future__ import annotations

import pytest

from petlprof.report.records import overhead_line
from petlprof.results.records import add_overhead, warmup_time_s
from petlprof.results.result import RunResult
from petlprof.run.execute import execute
from petlprof.sweep.spec import RunSpec

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(train_size=16, eval_size=12, batch_size=4, max_steps=4, warmup_steps=2, inference_window_s=0.0)


@pytest.mark.parametrize(
    "fields, windows",
    [
        (dict(method="lora", backbone="tiny-bert"), ("inference",)),
        (
            dict(method="lora", backbone="tiny-llama", task="arith", max_new_tokens=2),
            ("generation", "generation_merged"),
        ),
    ],
    ids=["classification", "lm"],
)
def test_every_phase_times_its_warm_ups_and_the_overhead_line_splits_them_off(fields, windows):
    record = execute(RunSpec(**SMALL, **fields))
    assert record["status"] == "ok", record.get("error")
    for phase in ("train", "eval"):
        assert record[phase]["warmup_steps"] == 2 and record[phase]["warmup_time_s"] > 0
    for name in windows:
        batches = [v for k, v in record[name].items() if k.startswith("batch_")]
        assert batches and all(b["warmup_time_s"] > 0 for b in batches)
    total = warmup_time_s(record)
    add_overhead(record, 1000.0)  # a process that took 1000 s: the warm-ups are part of its overhead
    assert 0 < total < record["overhead_s"]
    result = RunResult.from_json(record)
    assert result.warmup_time_s == pytest.approx(total)
    line = overhead_line([result])
    rest = record["overhead_s"] - total
    assert (
        f"of it {total:,.1f} s" in line and f"the rest {rest:,.1f} s" in line and f"median {rest:.1f} s a run" in line
    )


def test_records_written_before_warm_ups_were_timed_keep_the_old_line():
    old = {"status": "ok", "overhead_s": 3.0, "process_wall_time_s": 10.0, "train": {"time_s": 5.0}, "eval": {}}
    result = RunResult.from_json(old)
    assert result.warmup_time_s is None
    assert overhead_line([result]).endswith("writing the record")
    new = {**old, "overhead_s": 4.0, "train": {"time_s": 5.0, "warmup_time_s": 1.5}, "eval": {"warmup_time_s": 0.5}}
    line = overhead_line([result, RunResult.from_json(new)])  # a sweep of both: the split over the timed one
    assert "of it (over the 1 runs whose warm-ups were timed) 2.0 s (20%)" in line and "the rest 2.0 s (20%)" in line


def test_a_two_rank_phase_keeps_the_slower_ranks_warm_ups():
    from petlprof.run.distributed import _aggregate_phase

    ranks = [
        {"time_s": 1.0, "warmup_time_s": 0.5, "warnings": []},
        {"time_s": 2.0, "warmup_time_s": 0.7, "warnings": []},
    ]
    assert _aggregate_phase(ranks, [0, 1], ["host", "host"], ["cpu", "cpu"])["warmup_time_s"] == 0.7
