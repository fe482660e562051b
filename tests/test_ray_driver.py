"""A killed Ray sweep driver: SIGTERM and SIGKILL, each once one more run is stored, then the same command again —
nothing lost, nothing repeated, no Ray instance left behind.

One test, one sweep of three runs killed twice: each kill and resume starts a Ray instance, so the two signals in
turn cost three instances and five run starts.  Ctrl-C is handled as SIGTERM is (``petlprof.execution.sweep``: the
run in flight recorded ``cancelled``, exit 130 instead of 143); its KeyboardInterrupt inside Ray's wait is checked
on a shared instance (``test_executors.py``), and a local sweep's Ctrl-C end to end in ``test_faults.py``.  A third
kill round here cost a Ray instance and two run starts more: 20-25 s of one pytest worker, the suite's longest test.
SIGTERM is the one kept: ``ray.init`` replaces the driver's SIGTERM handler, and the sweep must put its own back.
A module of its own, each test handed out apart (tests/conftest.py), so that pytest -n runs it beside the other
executor tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_executors import TINY_CLI, _cmd, stored
from test_faults import interruptible

from petlprof.cli import main

pytestmark = pytest.mark.slow  # Ray instances and whole sweeps

SEEDS = 3
EXIT_CODES = {signal.SIGKILL: -9, signal.SIGTERM: 143}


def ray_sweep_args(out: Path) -> list[str]:
    """``petlprof run`` arguments of the sweep (without the command)."""
    return [
        "run",
        "--methods",
        "linear_probe",
        "--seeds",
        ",".join(str(seed) for seed in range(SEEDS)),
        *TINY_CLI,
        "--max-steps",
        "3",
        "--inference-window-s",  # the 10 repeats alone: the inference phase is not what is tested here
        "0.05",
        "--executor",
        "ray",
        "--cpus-per-run",
        "2",
        "--output",
        str(out),
    ]


def raylets(driver_pid: int) -> list[int]:
    """The raylets of the Ray instance that the process ``driver_pid`` started (its session is named
    after that pid), not those of another test's instance running beside it (pytest -n)."""
    session = f"_{driver_pid}/sockets/".encode()
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _cmd(p).startswith(b"/") and b"raylet" in _cmd(p).split(b"\0")[0] and session in _cmd(p)
    ]


def kill_the_driver_once_one_more_run_is_stored(out: Path, log: Path, sig: int) -> subprocess.Popen:
    """Start the sweep's driver (a process of its own), wait until it has stored one more run ``ok`` than the store
    held and submitted the next, then send it ``sig``; returns the ended process."""
    ok_before = sum(r["status"] == "ok" for r in stored(out))
    following = f"[{ok_before + 2}/{SEEDS}]"  # the progress line of the run after it (counted over the whole sweep)
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "petlprof.cli", *ray_sweep_args(out)],
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
            preexec_fn=interruptible,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    deadline = time.time() + 240
    while time.time() < deadline and sum(r["status"] == "ok" for r in stored(out)) == ok_before:
        assert proc.poll() is None, f"the sweep ended before it could be killed: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    assert sum(r["status"] == "ok" for r in stored(out)) == ok_before + 1, "no run finished in time"
    # the driver submits the next run right after storing one and then says so ("[K/N] ..."); the run's process is
    # forked from its Ray worker's warm worker or starts an interpreter, and loads the model: still in flight
    deadline = time.time() + 60
    while time.time() < deadline and following not in log.read_text():
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.1)
    assert following in log.read_text(), "the next run was not submitted in time"
    proc.send_signal(sig)
    proc.wait(60)
    return proc


def test_a_killed_ray_driver_resumes_without_losing_or_repeating_a_run(tmp_path, monkeypatch, capsys):
    """Three runs, one at a time (2 CPUs per run on a 2-CPU instance).  The driver is killed with SIGTERM once the
    first is stored, then the same command again with SIGKILL once the second is.  SIGTERM records the run in flight
    as ``cancelled`` and cancels its task; SIGKILL leaves no record for it (as for a run never started); each killed
    driver's Ray instance ends with it.  The last resume (in this process; its runs in processes of their own, as
    always) runs exactly the run not stored ``ok``."""
    out = tmp_path / "out"
    for number, sig in enumerate((signal.SIGTERM, signal.SIGKILL), start=1):
        log = tmp_path / f"sweep-{number}.log"  # the killed sweep's output, shown when an assertion below fails
        before = len(stored(out))
        proc = kill_the_driver_once_one_more_run_is_stored(out, log, sig)
        assert proc.returncode == EXIT_CODES[sig], log.read_text()[-3000:]
        added = [r["status"] for r in stored(out)[before:]]
        if sig == signal.SIGKILL:
            assert added == ["ok"], added
        else:  # the run in flight was recorded as cancelled
            assert added == ["ok", "cancelled"], (added, log.read_text()[-3000:])
        deadline = time.time() + 60
        while time.time() < deadline and raylets(proc.pid):
            time.sleep(0.5)
        assert not raylets(proc.pid), f"the killed driver left its Ray instance running: {log.read_text()[-3000:]}"
    done = [r["run_key"] for r in stored(out) if r["status"] == "ok"]
    assert len(done) == len(set(done)) == SEEDS - 1

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init sets its own in the process that starts Ray
    try:
        code = main(ray_sweep_args(out))
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert f"{len(done)} already in" in err, err[-3000:]
    ok = [r for r in stored(out) if r["status"] == "ok"]
    keys = [r["run_key"] for r in ok]
    assert len(keys) == len(set(keys)) == SEEDS and set(done) <= set(keys)  # none lost, none repeated
    assert all(r["node"]["executor"] == "ray" for r in ok)
    # the Ray instance petlprof starts runs its workers, and so the runs, at normal priority (Ray's default is 15)
    assert all(r["node"]["niceness"] == 0 and not any("nice" in w for w in r["warnings"]) for r in ok)
