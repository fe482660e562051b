"""A killed Ray sweep driver: SIGKILL, SIGTERM or Ctrl-C once the first of three runs is stored, then the
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

pytestmark = pytest.mark.slow  # Ray instances and whole sweeps


def ray_sweep_cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "petlprof.cli",
        "run",
        "--methods",
        "linear_probe",
        "--seeds",
        "0,1,2",
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
        *extra,
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
def test_a_killed_ray_driver_resumes_without_losing_or_repeating_a_run(tmp_path, sig):
    """Three runs, one at a time (2 CPUs per run on a 2-CPU instance); the driver is killed once the
    first is stored.  SIGTERM or Ctrl-C records the run in flight as ``cancelled`` and cancels its task;
    SIGKILL leaves no record for it; either way the resume runs exactly the runs not stored ``ok``."""
    out = tmp_path / "out"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    log = tmp_path / "sweep.log"  # the killed sweep's output, shown when an assertion below fails
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            ray_sweep_cmd(out), env=env, preexec_fn=interruptible, stdout=subprocess.DEVNULL, stderr=sink
        )
    deadline = time.time() + 240
    while time.time() < deadline and not any(r["status"] == "ok" for r in stored(out)):
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.2)
    assert any(r["status"] == "ok" for r in stored(out)), "no run finished in time"
    time.sleep(1.5)  # the driver submits the next run right after storing one; each run starts a fresh
    # interpreter (several seconds of imports), so runs 2 and 3 cannot both be done within this sleep
    proc.send_signal(sig)
    code = proc.wait(60)
    assert code == {signal.SIGKILL: -9, signal.SIGTERM: 143, signal.SIGINT: 130}[sig], log.read_text()[-3000:]
    first = stored(out)
    done = [r["run_key"] for r in first if r["status"] == "ok"]
    if sig != signal.SIGKILL:
        assert [r["status"] for r in first if r["status"] != "ok"] == ["cancelled"] * (len(first) - len(done))
        assert len(first) > len(done)  # the run in flight was recorded as cancelled
    deadline = time.time() + 60
    while time.time() < deadline and raylets(proc.pid):
        time.sleep(0.5)
    assert not raylets(proc.pid), "the killed driver left its Ray instance running"

    resumed = subprocess.run(ray_sweep_cmd(out), capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{len(done)} already in" in resumed.stderr
    ok = [r["run_key"] for r in stored(out) if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == 3 and set(done) <= set(ok)  # none lost, none repeated
    assert all(r["node"]["executor"] == "ray" for r in stored(out) if r["status"] == "ok")
