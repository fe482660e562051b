"""What the harness costs around the runs it measures: the overhead share of a small sweep.

A run's ``overhead_s`` is its process's wall time minus its measured phases (training, evaluation,
inference, merged evaluation): process start, imports, loading the model and data, warm-up steps and
writing the record.  The same small sweep runs twice on the local executor, each run in a process of its
own: forked from the warm worker (the default), and BitFit's run again from a fresh interpreter (the executor
without its warm worker; one run, as a fresh run's overhead is its imports, the same for every method: a
fresh sweep of all three made this check, which runs alone on the machine, 34 s long instead of 21 s).
Checked against the stored baseline, as ratios measured side by side in this one test:

- ``sweep/overhead_share``: the warm sweep's overhead over its runs' wall time, the warm worker's own
  start (carried by the first run) included (may not grow);
- ``sweep/warm_over_fresh_overhead``: BitFit's overhead, warm over fresh (may not grow: a change that made
  each forked run import its libraries again would take it from about 0.2 to about 1).

The same warm sweep, run alone on the machine, has no window flagged as contended (skipped, with the
reason, when something else already keeps the machine busy before the sweep starts).
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

from petlprof.execution.child import FRESH_PROCESS, WARM_PROCESS
from petlprof.execution.executors import LocalExecutor
from petlprof.meters import Window
from petlprof.meters.contention import CONTENDED_SHARE, ContentionMeter
from petlprof.results.figures import TIME
from petlprof.results.records import measured_phases_s
from petlprof.sweep.spec import RunSpec

SWEEP = dict(backbone="minilm", num_layers=2, train_size=64, eval_size=64, max_steps=4, inference_window_s=0.2)
METHODS = ("read", "lora", "bitfit")
FRESH = "bitfit"  # not the warm sweep's first run, which carries the warm worker's start


def sweep(warm: bool, methods: tuple[str, ...] = METHODS) -> list[dict]:
    executor = LocalExecutor(warm=warm, timeout_s=600)
    try:
        return [record for _, record in executor.results([RunSpec(method=m, **SWEEP) for m in methods])]
    finally:
        executor.close()


def windows(record: dict) -> list[dict]:
    inference = record.get("inference") or {}
    return [record["train"], record["eval"], *(v for k, v in inference.items() if k.startswith("batch_"))]


def test_the_harness_overhead_of_a_small_sweep(petlprof_bench, record_property):
    with Window([ContentionMeter()]) as quiet:
        time.sleep(1.0)
    busy_before = quiet.reading["contended"]
    fresh, warm = sweep(warm=False, methods=(FRESH,)), sweep(warm=True)
    assert all(r["status"] == "ok" for r in fresh + warm), [r.get("error") for r in fresh + warm]
    assert {r["process"] for r in fresh} == {FRESH_PROCESS} and {r["process"] for r in warm} == {WARM_PROCESS}
    same = next(r for r in warm if r["method"] == FRESH)
    assert same["metrics"] == fresh[0]["metrics"]  # the same results, for less
    share = sum(r["overhead_s"] for r in warm) / sum(r["process_wall_time_s"] for r in warm)
    print(f"\n{'method':<8}{'process':>8}{'wall s':>9}{'phases s':>10}{'overhead s':>12}")
    for record in fresh + warm:
        kind = "warm" if record["process"] == WARM_PROCESS else "fresh"
        print(
            f"{record['method']:<8}{kind:>8}{record['process_wall_time_s']:>9.2f}"
            f"{measured_phases_s(record):>10.2f}{record['overhead_s']:>12.2f}"
        )
    warm_median = statistics.median(r["overhead_s"] for r in warm)
    print(
        f"overhead (measured: wall time outside the measured phases): warm median {warm_median:.2f} s a run, "
        f"{share:.1%} of the warm runs' wall time; {FRESH} fresh {fresh[0]['overhead_s']:.2f} s, warm "
        f"{same['overhead_s']:.2f} s"
    )
    record_property("warm sweep overhead share", share)
    petlprof_bench.check_value("sweep/overhead_share", share, rtol=0.25)  # a share: it cannot pass 1
    petlprof_bench.check_value("sweep/warm_over_fresh_overhead", same["overhead_s"] / fresh[0]["overhead_s"], rtol=0.75)
    with Window([ContentionMeter()]) as after:
        time.sleep(1.0)
    if busy_before or after.reading["contended"]:  # another process, or the hypervisor's other guests (steal)
        pytest.skip("the machine was busy around the sweep: the uncontended case cannot be shown here")
    # each CPU's tick counter may be a tick off over a window: a short window (eval's one batch, 0.1 s) can read
    # 0.2 core of others from rounding alone, so a flag counts here only past that bound
    tick_s, cpus = 1 / os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    flagged = [
        (r["method"], w.get("others_cpu_cores"), w.get(TIME.name))
        for r in warm
        for w in windows(r)
        if w.get("contended") and w["others_cpu_cores"] - cpus * tick_s / w[TIME.name] > CONTENDED_SHARE * cpus
    ]
    assert not flagged, f"windows flagged contended on a quiet machine (method, others' cores, window s): {flagged}"
