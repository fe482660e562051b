"""A killed Ray sweep driver: SIGKILL, SIGTERM or Ctrl-C once the first of two runs is stored, then the
same command again — nothing lost, nothing repeated, no Ray instance left behind.

A module of its own so that pytest -n (``--dist loadscope``) can run these three minute-long tests beside
the other executor tests instead of after them.
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


def ray_sweep_args(out: Path) -> list[str]:
    """``petlprof run`` arguments of the sweep (without the command)."""
    return [
        "run",
        "--methods",
        "linear_probe",
        "--seeds",
        "0,1",
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


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_a_killed_ray_driver_resumes_without_losing_or_repeating_a_run(tmp_path, monkeypatch, capsys, sig):
    """Two runs, one at a time (2 CPUs per run on a 2-CPU instance); the driver is killed once the
    first is stored.  SIGTERM or Ctrl-C records the run in flight as ``cancelled`` and cancels its task;
    SIGKILL leaves no record for it (as for a run never started); either way the resume runs exactly the
    run not stored ``ok``.  The killed driver is a process of its own; the resume runs in this one (its
    runs in processes of their own, as always)."""
    out = tmp_path / "out"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    log = tmp_path / "sweep.log"  # the killed sweep's output, shown when an assertion below fails
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "petlprof.cli", *ray_sweep_args(out)],
            env=env,
            preexec_fn=interruptible,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    deadline = time.time() + 240
    while time.time() < deadline and not any(r["status"] == "ok" for r in stored(out)):
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.2)
    assert any(r["status"] == "ok" for r in stored(out)), "no run finished in time"
    # the driver submits the next run right after storing one and then says so ("[2/2] ..."); each run starts a fresh
    # interpreter (several seconds of imports), so run 2 is still in flight when the signal comes
    deadline = time.time() + 60
    while time.time() < deadline and "[2/2]" not in log.read_text():
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.1)
    assert "[2/2]" in log.read_text(), "the second run was not submitted in time"
    proc.send_signal(sig)
    code = proc.wait(60)
    assert code == {signal.SIGKILL: -9, signal.SIGTERM: 143, signal.SIGINT: 130}[sig], log.read_text()[-3000:]
    first = stored(out)
    done = [r["run_key"] for r in first if r["status"] == "ok"]
    if sig != signal.SIGKILL:
        statuses = [r["status"] for r in first]
        assert [s for s in statuses if s != "ok"] == ["cancelled"] * (len(first) - len(done)), statuses
        assert len(first) > len(done), log.read_text()[-3000:]  # the run in flight was recorded as cancelled
    deadline = time.time() + 60
    while time.time() < deadline and raylets(proc.pid):
        time.sleep(0.5)
    assert not raylets(proc.pid), f"the killed driver left its Ray instance running: {log.read_text()[-3000:]}"

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init sets its own in the process that starts Ray
    try:
        code = main(ray_sweep_args(out))
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert f"{len(done)} already in" in err, err[-3000:]
    ok = [r["run_key"] for r in stored(out) if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == 2 and set(done) <= set(ok)  # none lost, none repeated
    assert all(r["node"]["executor"] == "ray" for r in stored(out) if r["status"] == "ok")
    # the Ray instance petlprof starts runs its workers, and so the runs, at normal priority (Ray's default is 15)
    ok = [r for r in stored(out) if r["status"] == "ok"]
    assert all(r["node"]["niceness"] == 0 and not any("nice" in w for w in r["warnings"]) for r in ok)
