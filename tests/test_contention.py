"""The contention meter: other processes' CPU time over a window, from the kernel's counters.

The fake ``/proc/stat`` below counts in clock ticks, as the kernel does, and the run's own CPU time
moves with it; the real test keeps one core busy with another process while a run is measured.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from petlprof.meters import Window
from petlprof.meters.contention import CONTENDED_SHARE, ContentionMeter, system_busy_s
from petlprof.run.execute import execute
from petlprof.sweep.spec import RunSpec

TICK = 1 / os.sysconf("SC_CLK_TCK")


def write_stat(path, busy_ticks: int, steal_ticks: int = 0, cpus: int = 2) -> None:
    """A /proc/stat whose 'cpu' line has ``busy_ticks`` of user time and ``steal_ticks`` of steal."""
    line = f"cpu  {busy_ticks} 0 0 1000000 0 0 0 {steal_ticks} 0 0"
    per_cpu = [f"cpu{i} 0 0 0 500000 0 0 0 0 0 0" for i in range(cpus)]
    path.write_text("\n".join([line, *per_cpu, "intr 0", "ctxt 0"]) + "\n")


@pytest.mark.parametrize(
    "others_ticks, steal_ticks, own_s, window_s, cpus, contended",
    [
        (0, 0, 10.0, 10.0, 2, False),  # the run alone, one core busy
        (1000, 0, 10.0, 10.0, 2, True),  # another process kept a core busy: 1.0 core of 2
        (190, 0, 5.0, 10.0, 2, False),  # 0.19 core of 2: under a tenth of the machine
        (210, 0, 5.0, 10.0, 2, True),  # 0.21 core of 2: over
        (0, 500, 10.0, 10.0, 2, True),  # the hypervisor gave 0.5 core to other guests (steal)
        (500, 0, 10.0, 10.0, 16, False),  # 0.5 core of 16 is a thirty-second of the machine
        (0, 0, 10.0 + 3 * TICK, 10.0, 2, False),  # own time read finer than the ticks: never negative
    ],
)
def test_others_cpu_time_is_the_systems_minus_the_runs(
    tmp_path, monkeypatch, others_ticks, steal_ticks, own_s, window_s, cpus, contended
):
    stat = tmp_path / "stat"
    own = [100.0]
    clock = [0.0]
    monkeypatch.setattr("petlprof.meters.base.time.perf_counter", lambda: clock[0])
    meter = ContentionMeter(stat=stat, own=lambda: own[0], loadavg=lambda: (1.5, 1.0, 0.5))
    write_stat(stat, 5000, cpus=cpus)
    meter.begin()
    own[0] += own_s
    clock[0] += window_s
    write_stat(stat, 5000 + round(min(own_s, window_s) / TICK) + others_ticks, steal_ticks, cpus=cpus)
    reading = meter.end()
    expected = max(0.0, (others_ticks + steal_ticks) * TICK + min(own_s, window_s) - own_s) / window_s
    assert reading["others_cpu_cores"] == pytest.approx(expected, abs=1e-9)
    assert reading["contended"] is contended and reading["load_avg_1m"] == 1.5
    assert bool(reading.warnings) is contended
    assert f"over {cpus} CPUs" in reading["contention_source"] and "measured" in reading["contention_source"]


def test_a_machine_without_proc_stat_leaves_the_figures_missing_with_the_reason(tmp_path):
    meter = ContentionMeter(stat=tmp_path / "missing")
    with Window([meter]) as window:
        pass
    assert window.reading["others_cpu_cores"] is None and window.reading["contended"] is None
    assert "contention failed" in window.reading.errors[0]


def test_the_real_counters_read_this_machine():
    busy, cpus = system_busy_s()
    assert busy > 0 and cpus == len([c for c in open("/proc/stat") if c[:3] == "cpu" and c[3:4].isdigit()])


@pytest.mark.slow
def test_a_run_beside_a_process_that_keeps_a_core_busy_has_its_windows_flagged(one_thread):
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        record = execute(RunSpec(method="bitfit", backbone="tiny-bert", train_size=32, eval_size=16, max_steps=3))
    finally:
        hog.kill()
        hog.wait()
    assert record["status"] == "ok", record.get("error")
    windows = [record["train"], record["eval"], *(v for k, v in record["inference"].items() if k.startswith("batch_"))]
    for window in windows:  # the hog alone is a whole core: far above a tenth of the machine, whatever else runs
        assert window["contended"] is True and window["others_cpu_cores"] > CONTENDED_SHARE * os.cpu_count()
        assert any(w.startswith("contended:") for w in window["warnings"])
