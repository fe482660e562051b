"""Whether a sweep starts its warm worker before its checks: only where its runs will fork on this CPU and
no other sweep holds the output folder (a probe of the store's lock that takes nothing)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from petlprof.execution import sweep as driver
from petlprof.results.store import LOCK_FILE, StoreLock, lock_held
from petlprof.sweep.config import build_options


def test_the_lock_probe_sees_a_holder_and_takes_nothing(tmp_path):
    assert not lock_held(tmp_path / "no-such-folder")
    assert not lock_held(tmp_path)  # no lock file yet
    with StoreLock(tmp_path):
        assert lock_held(tmp_path)
    assert (tmp_path / LOCK_FILE).exists() and not lock_held(tmp_path)  # released: the file stays, emptied
    with StoreLock(tmp_path):  # the probe left nothing held
        pass


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.mark.parametrize(
    "content, held",
    [
        (lambda: {"pid": os.getpid(), "host": socket.gethostname()}, True),
        (lambda: {"pid": _dead_pid(), "host": socket.gethostname()}, False),  # a sweep killed -9 left its name
        (lambda: {"pid": 1234, "host": "another-host"}, True),  # cannot be checked from here: assumed held
        (lambda: {"pid": 10**30, "host": socket.gethostname()}, True),  # no pid can be that: left alone
        (lambda: {"pid": "123", "host": socket.gethostname()}, False),
        (lambda: {"pid": True, "host": socket.gethostname()}, False),
        (lambda: {"pid": 0, "host": socket.gethostname()}, False),
        (lambda: {"pid": -1, "host": socket.gethostname()}, False),
        (lambda: "NaN", False),
        (lambda: [1, 2], False),
        (lambda: "", False),
    ],
)
def test_the_lock_probe_reads_the_holder_the_lock_file_names(tmp_path, content, held):
    value = content()
    (tmp_path / LOCK_FILE).write_text(json.dumps(value) if value != "" else "")
    assert lock_held(tmp_path) is held


def test_a_lock_file_of_bytes_petlprof_did_not_write_is_nobodys(tmp_path):
    (tmp_path / LOCK_FILE).write_bytes(b"\xff\xfe\x00garbage")
    assert not lock_held(tmp_path)


@pytest.mark.parametrize(
    "values, nvidia, held, expected",
    [
        ({"device": "cpu"}, False, False, True),
        ({"device": "auto"}, False, False, True),
        ({"device": "auto"}, True, False, False),  # auto on a machine with NVIDIA's driver: likely CUDA
        ({"device": "cpu"}, True, False, True),
        ({"device": "cuda"}, False, False, False),
        ({"device": "cpu", "nproc_per_run": 2}, False, False, False),  # ranks start under torchrun
        ({"device": "cpu"}, False, True, False),  # another sweep holds the folder: it will be refused
    ],
)
def test_a_sweep_prestarts_its_worker_only_for_cpu_runs_it_will_fork(
    tmp_path, monkeypatch, values, nvidia, held, expected
):
    version = tmp_path / "version"
    if nvidia:
        version.write_text("NVRM version")
    monkeypatch.setattr(driver, "NVIDIA_DRIVER", version)
    options = build_options({}, {"methods": "bitfit", **values})
    out = tmp_path / "out"
    out.mkdir()
    if held:
        with StoreLock(out):
            assert driver.cpu_sweep_likely(options, out) is expected
    else:
        assert driver.cpu_sweep_likely(options, out) is expected
