"""The phases' warm-up steps are timed (``warmup_time_s``) and metered for energy apart from the phases' windows
(``warmup_energy_j``), so a sweep's overhead line tells the warm-ups, which the measurement needs, from the harness's
own cost (issue 39: a run's overhead on smollm2 is mostly warm-ups), and a search charges what its trials' warm-ups
cost (issue 37)."""

from __future__ import annotations

import pytest

from petlprof.meters.base import Meter, Reading
from petlprof.meters.energy import WarmUp
from petlprof.report.records import overhead_line
from petlprof.results.figures import ENERGY, PEAK_MEMORY
from petlprof.results.records import add_overhead, warmup_energy_j, warmup_time_s
from petlprof.results.result import PhaseResult, RunResult, energy_kinds
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
    phases = [record[phase] for phase in ("train", "eval", "eval_merged") if phase in record]
    assert len(phases) == 3 and all(p["warmup_steps"] == 2 and p["warmup_time_s"] > 0 for p in phases)
    for name in windows:
        batches = [v for k, v in record[name].items() if k.startswith("batch_")]
        assert batches and all(b["warmup_time_s"] > 0 for b in batches)
        phases += batches
    # each window's warm-ups metered apart by the run's energy meter, never inside the window's own energy_j
    assert all(p["warmup_energy_j"] > 0 and p["energy_j"] > 0 for p in phases), [p["warmup_energy_j"] for p in phases]
    total, joules = warmup_time_s(record), warmup_energy_j(record)
    assert joules == pytest.approx(sum(p["warmup_energy_j"] for p in phases))
    add_overhead(record, 1000.0)  # a process that took 1000 s: the warm-ups are part of its overhead
    assert 0 < total < record["overhead_s"]
    result = RunResult.from_json(record)
    assert result.warmup_time_s == pytest.approx(total) and result.warmup_energy_j == pytest.approx(joules)
    line = overhead_line([result])
    rest = record["overhead_s"] - total
    kind = record["train"]["energy_kind"]  # measured (RAPL) or estimated (the CPU model): the line says which
    assert kind in ("measured", "estimated")
    assert f"of it {total:,.1f} s" in line and f"(timed; {joules:,.1f} J by the runs' energy meter, {kind})" in line
    assert f"the rest {rest:,.1f} s" in line and f"median {rest:.1f} s a run" in line


def test_records_written_before_warm_ups_were_timed_keep_the_old_line():
    old = {"status": "ok", "overhead_s": 3.0, "process_wall_time_s": 10.0, "train": {"time_s": 5.0}, "eval": {}}
    result = RunResult.from_json(old)
    assert result.warmup_time_s is None
    assert overhead_line([result]).endswith("writing the record")
    new = {**old, "overhead_s": 4.0, "train": {"time_s": 5.0, "warmup_time_s": 1.5}, "eval": {"warmup_time_s": 0.5}}
    line = overhead_line([result, RunResult.from_json(new)])  # a sweep of both: the split over the timed one
    assert "of it (over the 1 runs whose warm-ups were timed) 2.0 s (20%)" in line and "the rest 2.0 s (20%)" in line
    assert "(timed)" in line and " J " not in line, "timed before their energy was metered: no energy claimed"
    assert RunResult.from_json(new).warmup_energy_j is None


def test_a_two_rank_phase_keeps_the_slower_ranks_warm_ups_and_sums_their_energy():
    from petlprof.run.distributed import _aggregate_phase

    ranks = [
        {"time_s": 1.0, "warmup_time_s": 0.5, "warmup_energy_j": 2.0, "energy_meter": "estimate", "warnings": []},
        {"time_s": 2.0, "warmup_time_s": 0.7, "warmup_energy_j": 3.0, "energy_meter": "estimate", "warnings": []},
    ]
    phase = _aggregate_phase(ranks, [0, 1], ["host", "host"], ["cpu", "cpu"])
    assert phase["warmup_time_s"] == 0.7 and phase["warmup_energy_j"] == 5.0
    node_wide = [{**r, "energy_meter": "rapl"} for r in ranks]  # one node's counter, read by both ranks: once
    assert _aggregate_phase(node_wide, [0, 1], ["host", "host"], ["cpu", "cpu"])["warmup_energy_j"] in (2.0, 3.0)


class _Counting(Meter):
    """A fake energy meter: 1 J for every window it is begun in, its begins counted."""

    name = "fake-energy"
    FIGURES = (ENERGY,)

    def __init__(self) -> None:
        super().__init__()
        self.begun = 0

    def _begin(self) -> None:
        self.begun += 1

    def _end(self) -> Reading:
        return Reading({ENERGY: 1.0})


class _Peak(Meter):
    """A fake memory meter that must never be begun by a warm-up."""

    name = "fake-memory"
    FIGURES = (PEAK_MEMORY,)

    def _begin(self) -> None:
        raise AssertionError("a warm-up window reset the phase's memory peak")


@pytest.mark.parametrize("steps, energy", [(2, 1.0), (0, 0.0)])
def test_a_warm_up_is_metered_by_the_energy_meters_alone(steps, energy):
    counting = _Counting()
    with WarmUp([_Peak(), counting], "cpu", steps) as warming:
        pass
    figures = warming.figures()
    assert figures["warmup_energy_j"] == energy and counting.begun == (steps > 0)
    assert figures["warmup_time_s"] >= 0 and (steps > 0 or figures["warmup_time_s"] == 0)


def test_without_an_energy_meter_a_warm_up_is_timed_and_its_energy_unknown():
    with WarmUp([_Peak()], "cpu", 2) as warming:
        pass
    assert warming.figures()["warmup_energy_j"] is None and warming.figures()["warmup_time_s"] >= 0


@pytest.mark.parametrize(
    "values, total",
    [
        ([1.5, 2, 0.0], 3.5),
        ([], 0.0),  # no part: nothing spent
        ([1.0, None], None),  # a part not recorded
        ([1.0, float("nan")], None),
        ([1.0, float("inf")], None),
        ([1e308, 1e308], None),  # finite parts whose sum is not
        ([10**30, 1.0], 1e30),
        ([1.0, "2.0"], None),  # a numeric string is not a number a meter wrote
        ([True, 1.0], None),
    ],
)
def test_a_total_with_a_part_unknown_is_unknown(values, total):
    """Warm-up energy summed over windows and trials (records, the search, the overhead line): every part or none."""
    from petlprof.values import known_total

    assert known_total(values) == total


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (["measured", "measured"], "measured"),
        (["measured", "estimated", None], "estimated/measured"),  # sorted, a phase without a kind left out
        ([None, ""], None),  # no phase says: unknown, never an empty string
        ([], None),
    ],
)
def test_energy_kinds_join_the_kinds_the_phases_name(kinds, expected):
    phases = [PhaseResult({"energy_kind": k}) if k is not None else None for k in kinds]
    assert energy_kinds(phases) == expected
