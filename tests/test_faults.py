"""Faults really caused: a raising run, a memory cap, a timeout, SIGINT/SIGTERM/SIGKILL on a real
sweep process, torn lines, a held lock, an unwritable folder, a meter failing mid-run.

Sweeps here use the tiny-bert preset with a few steps, so each run is a few seconds of worker
start-up; the signal tests wait for the sweep to reach a run before signalling it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from petlprof.errors import UsageError
from petlprof.execution.child import execute_in_subprocess
from petlprof.meters import Window
from petlprof.meters.base import Meter, Provenance, Reading
from petlprof.results.figures import ENERGY, PEAK_MEMORY
from petlprof.results.store import LOCK_FILE, StoreLock, append_record, check_writable, finished_keys
from petlprof.run.execute import execute
from petlprof.sweep.spec import RunSpec
from petlprof.vocabulary import MEASURED

pytestmark = pytest.mark.slow  # starts processes or whole sweeps: the full suite, not the inner loop

TINY = ["--backbone", "tiny-bert", "--train-size", "32", "--eval-size", "16", "--batch-size", "16"]


def sweep_cmd(out, methods="read,lora,bitfit", *extra):
    return [sys.executable, "-m", "petlprof.cli", "run", "--methods", methods, *TINY, "--output", str(out), *extra]


def interruptible() -> None:
    """Run in a child before its exec: Ctrl-C's default action.  A test process started with SIGINT
    ignored (a background job of a non-interactive shell, ``nohup pytest &``) passes that on, and a
    Python started with SIGINT ignored never raises KeyboardInterrupt, so the Ctrl-C tests would
    test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def started(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/PID/stat``'s 22nd field), None once it is gone: with the pid, it
    names one process, never a later one given the same pid."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[tuple[int, str | None]]:
    """(pid, start time) of every process below ``pid``: the warm worker (a fresh interpreter, or the ``petlprof``
    command's own fork, whose command line is the command's) and each run it forked."""
    try:
        children = [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []
    return [item for child in children for item in [(child, started(child)), *descendants(child)]]


def first_run_recorded_and_next_started(out, proc, scratch) -> bool:
    """The warm worker lives for the whole sweep, so a worker process alone does not say a run is in
    flight: the next run's scratch folder does (it exists from the run's start to its record)."""
    try:
        return len(records(out)) >= 1 and bool(list(scratch.glob(f"petlprof-run-{proc.pid}-*")))
    except (OSError, json.JSONDecodeError):
        return False


def wait_for(predicate, timeout=180.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def test_a_raising_run_is_failed_with_type_message_traceback_and_where():
    spec = RunSpec(
        method="lora",
        backbone="tiny-bert",
        train_size=16,
        eval_size=16,
        batch_size=16,
        method_config={"target_modules": ["nope"]},
    )
    record = execute(spec)
    assert record["status"] == "failed" and "nope" in record["error"]
    assert record["error"].split(":")[0] in ("UsageError", "ValueError")
    assert "Traceback" in record["traceback"] and record["failed_at"]["phase"] == "setup"
    assert record["failed_at"]["rss_bytes"] > 0


def test_a_run_past_its_memory_cap_is_oom_with_its_figures():
    spec = RunSpec(method="full", backbone="tiny-bert", train_size=64, eval_size=16, batch_size=64, max_length=256)
    record = execute_in_subprocess(spec, max_memory_bytes=40 * 2**20)
    assert record["status"] == "oom", record.get("error")
    assert "allocate" in record["error"] or "MemoryError" in record["error"]
    assert record["failed_at"]["phase"] in ("setup", "train", "eval") and record["failed_at"]["peak_rss_bytes"] > 0


def test_a_run_past_its_timeout_is_killed_and_recorded():
    spec = RunSpec(method="read", backbone="tiny-bert", train_size=16, eval_size=16, batch_size=16)
    t0 = time.time()
    record = execute_in_subprocess(spec, timeout_s=1.0)
    assert record["status"] == "timeout" and "--timeout 1" in record["error"]
    assert time.time() - t0 < 30


@pytest.mark.parametrize("sig, to_group, code", [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)])
def test_signals_stop_the_run_in_flight_and_keep_the_store_valid(tmp_path, sig, to_group, code):
    out, scratch = tmp_path / "out", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}  # where the runs' scratch folders go
    proc = subprocess.Popen(
        sweep_cmd(out), stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=interruptible, env=env
    )
    err_lines: list[str] = []
    reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)
    reader.start()
    wait_for(lambda: first_run_recorded_and_next_started(out, proc, scratch))  # the second run is in flight
    time.sleep(0.5)  # into its work (a forked tiny run takes about 1.5 s, less on a quiet machine)
    if to_group:  # Ctrl-C in a terminal signals the whole foreground group: sweep and worker
        os.killpg(proc.pid, sig)
    else:  # a scheduler's SIGTERM reaches the sweep process only
        proc.send_signal(sig)
    proc.wait(timeout=60)
    reader.join(10)
    err = "".join(err_lines)
    assert proc.returncode == code, err[-2000:]
    assert "Resume with the same command" in err and "Traceback" not in err
    statuses = [r["status"] for r in records(out)]
    # the run in flight when the signal came is cancelled; the second may have finished within the 0.5 s on a quiet
    # machine, and then the third was the one in flight, or none was (the signal fell between two runs: CI once saw
    # ['ok', 'ok'] with the 1.5 s this waited before), and nothing is recorded for a run never started
    assert statuses in (["ok", "cancelled"], ["ok", "ok", "cancelled"], ["ok", "ok"]), statuses
    assert (out / LOCK_FILE).read_text() == ""  # released


def test_sigkill_mid_sweep_then_resume_records_every_run_once(tmp_path, monkeypatch, capsys):
    """The killed sweep is a process of its own; the resume runs in this one (its runs in processes of their
    own, as always)."""
    from petlprof.cli import main

    out, scratch = tmp_path / "out", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}  # where the runs' scratch folders go
    # the inference phase's 10 repeats alone: no timing depends on a run's length here (it does in the test above)
    cmd = sweep_cmd(out, "read,lora,bitfit", "--inference-window-s", "0.05")
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    wait_for(lambda: first_run_recorded_and_next_started(out, proc, scratch))
    wait_for(lambda: len(descendants(proc.pid)) >= 2)  # the warm worker and the run it forked, in flight
    workers = descendants(proc.pid)
    proc.kill()
    proc.wait()
    wait_for(lambda: not any(started(pid) == start for pid, start in workers), timeout=30)  # no orphan
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == proc.pid  # left behind, as after a power cut
    assert list(scratch.glob(f"petlprof-run-{proc.pid}-*"))  # so is the run in flight's scratch folder ...
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    code = main(cmd[3:])  # the same command: `petlprof run ...`
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert not list(scratch.glob("petlprof-run-*"))  # ... which the next sweep removes
    assert "took over the lock" in err and "1 already in" in err
    ok = [r["run_key"] for r in records(out) if r["status"] == "ok"]
    assert len(ok) == 3 and len(set(ok)) == 3


def test_a_torn_last_line_is_ignored_and_not_glued_to_the_next_record(tmp_path):
    store = tmp_path / "results.jsonl"
    append_record(store, {"schema_version": 1, "run_key": "a", "status": "ok", "method": "read"})
    with open(store, "a") as fh:
        fh.write('{"schema_version": 1, "run_key": "b", "sta')  # the writer died mid-line
    assert finished_keys(store) == {"a"}
    append_record(store, {"schema_version": 1, "run_key": "c", "status": "ok", "method": "read"})
    assert finished_keys(store) == {"a", "c"}


def test_a_held_lock_refuses_a_second_sweep_and_a_dead_ones_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from pathlib import Path; from petlprof.results.store import StoreLock\n"
                f"with StoreLock(Path({str(tmp_path)!r})):\n    print('held', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=f"another petlprof run \\(pid {holder.pid} on"):
            StoreLock(tmp_path).__enter__()
    finally:
        holder.kill()
        holder.wait()
    with StoreLock(tmp_path) as lock:  # the kernel released the killed holder's lock
        assert lock.taken_over["pid"] == holder.pid
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_an_unwritable_output_folder_fails_before_any_run(tmp_path, capsys):
    from petlprof.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="is not writable"):
        check_writable(blocker / "out")
    code = main(["run", "--methods", "read", *TINY, "--output", str(blocker / "out")])
    assert code == 2 and "is not writable" in capsys.readouterr().err


class BrokenMeter(Meter):
    name = "broken"
    FIGURES = (ENERGY,)

    def _end(self):
        raise FileNotFoundError("/sys/class/powercap/intel-rapl:0/energy_uj vanished")


class GoodMeter(Meter):
    name = "good"
    FIGURES = (PEAK_MEMORY,)

    def _end(self):
        return Reading({PEAK_MEMORY: 123}, provenance={PEAK_MEMORY: Provenance(MEASURED, "fake")})


def test_a_meter_failing_mid_run_loses_only_its_own_figures():
    with Window([BrokenMeter(), GoodMeter()]) as window:
        pass
    assert window.reading["energy_j"] is None and window.reading["peak_memory_bytes"] == 123
    assert "broken failed: FileNotFoundError" in window.reading.errors[0]
    assert window.time_s is not None


def test_a_full_disk_mid_sweep_is_a_clear_error_and_the_record_is_printed(tmp_path, monkeypatch, capsys):
    import errno

    import petlprof.results.store
    import petlprof.run.execute
    from petlprof.cli import main

    def fake_execute(spec, **limits):
        return {"schema_version": 1, "run_key": spec.run_key, "status": "ok", "method": spec.method, "seed": 0}

    real_append, calls = petlprof.results.store.append_record, []

    def append_until_full(path, record):
        calls.append(record)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(path, record)

    monkeypatch.setattr(petlprof.run.execute, "execute", fake_execute)
    monkeypatch.setattr(petlprof.results.store, "append_record", append_until_full)
    code = main(["run", "--methods", "read,lora", *TINY, "--in-process", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and "No space left on device" in err and "Runs recorded before are intact" in err
    assert '"method": "lora"' in err  # the unsaved record is on the terminal
    assert [r["method"] for r in records(tmp_path / "out")] == ["read"]
    assert (tmp_path / "out" / LOCK_FILE).read_text() == ""
