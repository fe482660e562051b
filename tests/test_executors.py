"""Executors: the same sweep on this machine and on a local Ray instance (2 CPUs, no GPU).

The Ray tests start a real Ray instance; runs are tiny-bert with a few steps.  A run's figures do
not depend on where it ran: with the same thread count (Ray sets OMP_NUM_THREADS to the CPUs a task
asks for; the local runs are given the same), the records agree exactly apart from timings, energy
and node fields.  The fault tests kill real processes: the Ray worker under a run (its run dies
with it and the record says the task was lost); tests/test_ray_driver.py kills the sweep driver itself
(the resume then skips exactly the runs recorded).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from test_plugins import ENTRY_POINT, REFERENCE, check_plugin_record, example_pythonpath
from test_plugins import SMALL as PLUGIN_RUN

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.execution.executors import LocalExecutor
from petlprof.sweep.config import build_options, resolve_device
from petlprof.sweep.spec import RunSpec

# slow: processes, Ray instances and sweeps (pytest -n runs a module's tests in one worker: --dist loadscope)
pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="the ray executor's tests need Ray: pip install 'petlprof[ray]'")

# the inference phase's 10 repeats alone (its default 0.5 s per batch size is not what is tested here)
TINY = dict(backbone="tiny-bert", train_size=32, eval_size=16, batch_size=16, warmup_steps=1, inference_window_s=0.05)
TINY_CLI = ["--backbone", "tiny-bert", "--train-size", "32", "--eval-size", "16", "--batch-size", "16"]


BAD_OPTIONS = [
    ({"executor": "slurm"}, "unknown executor 'slurm'"),
    ({"address": "auto"}, "--address applies to --executor ray"),
    ({"retries": 1}, "--retries applies to --executor ray"),
    ({"cpus_per_run": 4}, "--cpus-per-run applies to --executor ray"),
    ({"executor": "ray", "retries": -1}, "--retries must be an integer >= 0, got -1"),
    ({"executor": "ray", "cpus_per_run": 0}, "--cpus-per-run must be a positive number of CPUs, got 0"),
    ({"executor": "ray", "in_process": True}, "cannot be combined with --executor ray"),
    ({"nproc_per_run": 0}, "--nproc-per-run must be an integer >= 1, got 0"),
    ({"nproc_per_run": 2, "in_process": True}, "cannot be combined with --in-process"),
    ({"nproc_per_run": 2, "cache_hidden_states": True, "methods": ["read"]}, "cannot be used with --nproc-per-run 2"),
]


@pytest.mark.parametrize("values, message", BAD_OPTIONS, ids=[m for _, m in BAD_OPTIONS])
def test_bad_executor_options_are_named(values, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_options({}, {"methods": ["bitfit"], **values})


@pytest.mark.parametrize(
    "device, nproc, gpus, expected",
    [
        ("auto", 1, 0.0, "cpu"),
        ("auto", 1, 4.0, "cuda"),
        ("cuda", 2, 8.0, "cuda"),
        ("cuda:0", 1, 1.0, "cuda"),
        ("cuda", 1, 0.0, "the Ray cluster has no GPU"),
        ("cuda:1", 2, 8.0, "names one GPU"),
        ("cuda:3", 1, 8.0, "a Ray task sees only the GPUs Ray gives it"),
    ],
)
def test_device_is_checked_against_the_cluster_not_the_driver(device, nproc, gpus, expected):
    if expected in ("cpu", "cuda"):
        assert resolve_device(device, nproc, cluster_gpus=gpus) == expected
    else:
        with pytest.raises(UsageError, match=expected):
            resolve_device(device, nproc, cluster_gpus=gpus)


def test_ray_options_without_ray_installed_say_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    from petlprof.execution.executors import make_executor

    with pytest.raises(UsageError, match=r"pip install 'petlprof\[ray\]'"):
        make_executor("ray")


@pytest.mark.parametrize("problem", ["data", "lock", "device"])
def test_bad_input_fails_before_any_executor_starts(tmp_path, monkeypatch, capsys, problem):
    """A bad data path or a held output folder costs no Ray start-up (seconds on a cluster), and a
    bad device leaves no output folder behind."""
    from petlprof.execution import executors
    from petlprof.results.store import StoreLock

    made = []
    monkeypatch.setattr(executors, "make_executor", lambda *a, **k: made.append(a) or pytest.fail("executor made"))
    out = tmp_path / "out"
    args = ["run", "--methods", "linear_probe", *TINY_CLI, "--output", str(out)]
    if problem == "data":
        args += ["--executor", "ray", "--data-dir", str(tmp_path / "no-such-folder")]
    if problem == "device":
        args += ["--device", "cuda:7"]
    if problem == "lock":
        out.mkdir()
        holder = StoreLock(out).__enter__()
        args += ["--executor", "ray"]
    try:
        assert main(args) == 2
    finally:
        if problem == "lock":
            holder.__exit__(None, None, None)
    error = capsys.readouterr().err
    assert made == [] and error.startswith("petlprof: error:"), error
    assert {"data": "no-such-folder", "lock": "another petlprof run", "device": "cuda:7"}[problem] in error
    assert out.exists() == (problem == "lock")


def stored(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _cmd(entry: Path) -> bytes:
    try:
        return (entry / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """One Ray instance for the tests below (the driver tests above start their own): 2 CPUs, no
    GPU, as on the CI machine; its workers have the plug-in example installed, as a cluster's nodes would (they
    start with the environment ray.init sees), for the plug-in's Ray test, which an instance of its own cost about
    7 s of CPU more."""
    from petlprof.execution.executors import RAY_ENV

    for key, value in RAY_ENV.items():  # as petlprof starts its own: workers at normal priority, no usage report
        os.environ.setdefault(key, value)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(example_pythonpath(tmp_path_factory.mktemp("site"))))
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def comparable(record: dict) -> dict:
    """What a run computed, without where it ran and how long it took."""
    keep = (
        "run_key",
        "status",
        "error",
        "method",
        "method_config",
        "seed",
        "spec",
        "metrics",
        "trainable_params",
        "total_params",
        "task_info",
        "memory_breakdown",
        "training",
        "primary_metric",
    )
    out = {k: record.get(k) for k in keep}
    for phase in ("train", "eval"):
        out[phase] = {
            k: record[phase].get(k)
            for k in ("steps", "samples", "warmup_steps", "first_loss", "final_loss", "epochs_run")
        }
    return out


def test_ray_records_are_the_local_records_apart_from_timings_and_node(local_ray, monkeypatch):
    from petlprof.execution.child import WARM_PROCESS
    from petlprof.execution.executors import RayExecutor

    specs = [RunSpec(method="bitfit", seed=0, max_steps=3, **TINY), RunSpec(method="lora", seed=1, max_steps=3, **TINY)]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray gives a task of 1 CPU
    local = dict((s.run_key, r) for s, r in LocalExecutor().results(specs))
    executor = RayExecutor(cpus_per_run=1)
    started = []
    remote = dict((s.run_key, r) for s, r in executor.results(specs, on_start=started.append))
    executor.close()  # not the owner: the module's instance stays up
    assert ray.is_initialized()
    assert started == specs and set(remote) == set(local) == {s.run_key for s in specs}
    for key in local:
        assert local[key]["status"] == "ok", local[key]["error"]
        assert comparable(remote[key]) == comparable(local[key])
        assert local[key]["node"]["executor"] == "local"
        node = remote[key]["node"]
        assert node["executor"] == "ray" and node["node_id"] == ray.get_runtime_context().get_node_id()
        assert node["cpus"] == 1 and node["gpu_ids"] == [] and node["omp_num_threads_per_rank"] == "1"
        assert node["niceness"] == 0  # RAY_ENV: the run at normal priority, not at Ray's default nice 15
        assert remote[key]["process"] == WARM_PROCESS  # forked from its Ray worker's warm worker
        assert remote[key]["train"]["energy_j"] > 0 and remote[key]["train"]["peak_memory_bytes"] > 0


def test_a_ray_worker_imports_once_and_forks_its_later_runs(local_ray, monkeypatch):
    """Three tasks in one Ray worker process (the task body called here, in this process, so that no scheduling
    choice of Ray's decides which worker takes which): the first starts the warm worker, waits for its imports and
    carries the wait; the others fork from the one it kept, at once.  (Through Ray, the records test above and the
    killed-worker and driver tests run their tasks the same way; the forked-run figures are test_warm.py's.)"""
    from petlprof.execution import warm
    from petlprof.execution.child import WARM_PROCESS
    from petlprof.execution.executors import _ray_task
    from petlprof.meters.idle import IDLE_ENV

    monkeypatch.setenv(IDLE_ENV, "")  # the task sets it in its process (this one): restored after the test
    warm.close_kept()  # this process's own kept worker (an earlier test's sweep) is not the Ray worker's
    specs = [RunSpec(method="bitfit", seed=seed, max_steps=2, **TINY) for seed in range(3)]
    try:
        records = [_ray_task(spec.to_dict(), None, None, 2.0) for spec in specs]
        kept = list(warm._kept)
    finally:
        warm.close_kept()
    assert [r["status"] for r in records] == ["ok"] * 3, [r.get("error") for r in records]
    assert [r["process"] for r in records] == [WARM_PROCESS] * 3
    assert records[0]["warm_worker_start_s"] > 0  # waited for the imports: charged to the first run
    assert records[0]["overhead_s"] > records[0]["warm_worker_start_s"]
    assert ["warm_worker_start_s" in r for r in records[1:]] == [False, False]  # forked at once
    assert len(kept) == 1 and kept[0].broken is None  # kept for the next task
    assert all(r["node"]["cpus"] == 2 and r["node"]["executor"] == "ray" for r in records)


def test_a_plugin_runs_as_ray_tasks_by_name_and_by_reference(local_ray):
    """The plug-in example by entry point and by ``module:ATTR`` (on two ranks): the driver does not resolve methods,
    the Ray workers do, from what is installed on their node."""
    from petlprof.execution.executors import RayExecutor

    specs = [RunSpec(method=ENTRY_POINT, **PLUGIN_RUN), RunSpec(method=REFERENCE, nproc=2, **PLUGIN_RUN)]
    executor = RayExecutor(cpus_per_run=1)
    records = {spec.method: record for spec, record in executor.results(specs)}
    executor.close()
    for given, record in records.items():
        check_plugin_record(record, given)
        assert record["node"]["executor"] == "ray"
    assert records[REFERENCE]["distributed"]["world_size"] == 2


def test_a_two_rank_run_is_one_ray_task_with_the_cpus_of_both_ranks(local_ray):
    from petlprof.execution.executors import RayExecutor

    spec = RunSpec(method="bitfit", seed=0, max_steps=3, nproc=2, **TINY)
    [(_, record)] = list(RayExecutor(cpus_per_run=1).results([spec]))
    assert record["status"] == "ok", record.get("error")
    assert record["distributed"]["world_size"] == 2 and record["node"]["cpus"] == 2
    assert record["node"]["omp_num_threads_per_rank"] == "1"  # 2 CPUs over 2 ranks, not 2 threads each
    ranks = record["distributed"]["ranks"]
    assert len(ranks) == 2 and record["train"]["energy_j"] == pytest.approx(sum(r["train"]["energy_j"] for r in ranks))


def test_a_run_no_live_node_can_take_is_failed_not_waited_for(local_ray, monkeypatch):
    """The state a lost GPU node leaves: a CUDA run's task pending on a cluster with no GPU left.
    After the grace period the driver cancels it and records why, instead of waiting forever."""
    import petlprof.execution.executors as executors

    monkeypatch.setattr(executors, "DRIVER_GRACE_S", 0.5)
    executor = executors.RayExecutor()
    spec = RunSpec(method="bitfit", seed=0, max_steps=3, **{**TINY, "device": "cuda"})
    executor._submit(spec)  # past check_fits, as when the node is lost after the sweep began
    assert executor.in_flight == [spec] and not list(executor._stranded())  # first seen: grace starts
    time.sleep(1.0)
    [(stranded, record)] = list(executor._stranded())
    assert stranded is spec and record["status"] == "failed" and executor.in_flight == []
    assert "no live node of the Ray cluster has the 1 CPU(s) and 1 GPU(s)" in record["error"]
    assert record["node"]["lost"] is True


@pytest.mark.parametrize(
    "behaviour, timeout_s, status, message",
    [
        (
            "hang",
            0.5,
            "timeout",
            "the Ray task did not return within 1 s ((retries + 1) x (--timeout 0.5 s + 0.5 s)) "
            "and was cancelled by the driver",
        ),
        # no --timeout: the driver's limit (checked on time) must not race a Ray worker's start
        ("raise", None, "failed", "the Ray task raised on its node: ValueError: the run's code broke on the node"),
    ],
    ids=["hung task", "task raises"],
)
def test_a_task_that_hangs_or_raises_becomes_a_record_naming_why(
    local_ray, monkeypatch, behaviour, timeout_s, status, message
):
    """A task its node did not stop (hung, or its node lost without Ray noticing) is cancelled once
    past the driver's limit; an exception in the task's own code is a failed record, not a crash of
    the sweep.  (The task body is swapped for one that misbehaves: the run code has its own tests.)"""
    import petlprof.execution.executors as executors

    def misbehave(*args):  # defined here so Ray ships it by value: the workers cannot import tests/
        if behaviour == "hang":
            time.sleep(600)
        raise ValueError("the run's code broke on the node")

    monkeypatch.setattr(executors, "DRIVER_GRACE_S", 0.5)
    executor = executors.RayExecutor(timeout_s=timeout_s)
    executor._task = local_ray.remote(misbehave)
    spec = RunSpec(method="bitfit", seed=0, max_steps=3, **TINY)
    t0 = time.monotonic()
    [(done, record)] = list(executor.results([spec]))
    assert done is spec and record["status"] == status and message in record["error"], record["error"]
    assert record["run_key"] == spec.run_key and executor.in_flight == []
    # a hung task at the limit (1 s), not at the next 5 s check; never after the hung task's 600 s
    elapsed = time.monotonic() - t0
    assert elapsed < (executors.CHECK_S if behaviour == "hang" else 60), elapsed


class Stop(BaseException):
    """What the sweep's SIGTERM handler raises (a BaseException, as ``petlprof.execution.sweep.Terminated``)."""


def _raise_stop(signum, frame):
    raise Stop()


def _ctrl_c_in(seconds: float) -> threading.Timer:
    """Ctrl-C (SIGINT to this process, Python's own handler: KeyboardInterrupt) in ``seconds``."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def _alarm_in(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, seconds)


# (the signal, the handler it runs, how it is sent in 0.5 s, what the handler raises): the sweep's SIGTERM handler's
# exception, and Ctrl-C's KeyboardInterrupt (the Ray driver's kill test sends SIGTERM and SIGKILL to a real driver;
# Ctrl-C shares SIGTERM's handling there, and here it is raised inside Ray's own wait)
SIGNALS = {
    "a handler's exception (SIGTERM)": (signal.SIGALRM, _raise_stop, _alarm_in, Stop),
    "Ctrl-C": (signal.SIGINT, signal.default_int_handler, _ctrl_c_in, KeyboardInterrupt),
}


@pytest.mark.parametrize("how", list(SIGNALS))
def test_a_signal_stops_a_driver_waiting_on_a_task_within_a_poll(local_ray, how):
    """Ray's wait raises a signal handler's exception only when it returns: the driver waits in slices of
    POLL_S, so a SIGTERM or Ctrl-C ends the sweep within one, not at the end of a 5 s wait."""
    import petlprof.execution.executors as executors

    def hang(*args):  # defined here so Ray ships it by value: the workers cannot import tests/
        time.sleep(600)

    signum, handler, send, raised = SIGNALS[how]
    executor = executors.RayExecutor()
    executor._task = local_ray.remote(hang)
    executor._submit(RunSpec(method="bitfit", seed=0, max_steps=3, **TINY))
    previous = signal.signal(signum, handler)
    t0 = time.monotonic()
    sender = send(0.5)
    try:
        with pytest.raises(raised):
            executor._wait()
        waited = time.monotonic() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if sender is not None:  # never a Ctrl-C after the block, where pytest itself would take it
            sender.cancel()
            sender.join()
        signal.signal(signum, previous)
        executor.cancel()
    assert 0.5 <= waited < 3.0, waited  # 0.5 s and at most one POLL_S; with one 5 s wait, 5 s


def run_processes() -> dict[int, int]:
    """pid -> parent pid of every ``petlprof.execution.worker`` process on this machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"petlprof.execution.worker" not in (entry / "cmdline").read_bytes():
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        found[int(entry.name)] = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    return found


def ray_worker_of(pid: int, processes: dict[int, int]) -> int | None:
    """The Ray worker whose task the run's process ``pid`` executes, None if ``pid`` is no run's process:
    a fresh interpreter's parent, or for a child forked from a warm worker (``--serve``, whose command
    line the child shares) the warm worker's parent."""
    parent = processes[pid]
    if parent in processes:  # forked from the Ray worker's warm worker
        parent = processes[parent]
    elif b"--serve" in _cmd(Path(f"/proc/{pid}")):  # the warm worker itself, idle or not
        return None
    if b"ray::" not in _cmd(Path(f"/proc/{parent}")):
        return None
    raylet = next((int(line.split()[1]) for line in _status(parent) if line.startswith("PPid:")), 0)
    own_instance = f"_{os.getpid()}/sockets/".encode()  # the Ray instance this test process started
    return parent if own_instance in _cmd(Path(f"/proc/{raylet}")) else None


def _status(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return []


def kill_ray_worker_under_the_run(killed: list, timeout=120.0) -> None:
    """Once a run's process has started, SIGKILL the Ray worker executing the task (not an idle Ray
    worker that keeps the warm worker of an earlier task)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        processes = run_processes()
        for pid in processes:
            if (worker := ray_worker_of(pid, processes)) is None:
                continue
            time.sleep(1.0)  # let the run get going
            os.kill(worker, signal.SIGKILL)
            killed.append((worker, pid, time.time()))
            return
        time.sleep(0.2)


@pytest.mark.parametrize("retries, expected", [(0, "failed"), (1, "ok")])
def test_a_ray_worker_killed_mid_run_is_a_failed_record_or_one_retry(local_ray, retries, expected):
    from petlprof.execution.executors import RayExecutor

    # long enough to be killed mid-run (a second after its process appears): a run forked from a warm worker that
    # an earlier test left in an idle Ray worker starts at once, and 30 steps ended before a kill 2 s in
    spec = RunSpec(method="bitfit", seed=0, max_steps=400 if retries == 0 else 200, **TINY)
    killed: list = []
    killer = threading.Thread(target=kill_ray_worker_under_the_run, args=(killed,), daemon=True)
    killer.start()
    executor = RayExecutor(retries=retries)
    t0 = time.monotonic()
    [(_, record)] = list(executor.results([spec]))
    killer.join(5)
    assert killed, "no run process under a Ray worker was seen"
    assert record["status"] == expected, record.get("error")
    if expected == "failed":
        assert "the Ray task was lost" in record["error"] and "Worker" in record["error"], record["error"]
        assert record["node"] == {**record["node"], "executor": "ray", "lost": True}
        assert time.monotonic() - t0 < 120  # the driver did not wait for the 400 steps
    else:  # the retry started after the kill and finished
        assert record["node"]["executor"] == "ray" and record["train"]["steps"] > 0
        assert record["node"]["task_started_unix"] > killed[0][2]
    worker, run, _ = killed[0]
    time.sleep(1.0)
    assert not Path(f"/proc/{run}").exists() or b"Z" in Path(f"/proc/{run}/stat").read_bytes().split()[2]
    # the run's process died with its Ray worker (PR_SET_PDEATHSIG)


def test_local_executor_is_what_petlprof_run_uses_by_default(tmp_path):
    out = tmp_path / "out"
    args = ["run", "--methods", "bitfit", *TINY_CLI, "--max-steps", "2", "--output", str(out), "--in-process"]
    assert main([*args, "--inference-window-s", "0.05"]) == 0  # the inference phase is not what is tested here
    [record] = stored(out)
    assert record["status"] == "ok" and record["node"]["executor"] == "local"


def test_a_run_below_normal_priority_says_so():
    """A cluster started without RAY_worker_niceness=0 runs tasks at nice 15: the Ray task's record says what that
    does to its figures; a run at normal priority gets no such warning.  (The Ray task builds its node fields with
    this function: the Ray records above carry ``niceness`` only through it.)"""
    from petlprof.execution.executors import RAY_ENV, ray_node_fields

    assert RAY_ENV["RAY_worker_niceness"] == "0"
    low: dict = {"warnings": ["earlier"]}
    node = ray_node_fields(low, 15, cpus=1)
    assert node["executor"] == "ray" and node["niceness"] == 15 and node["cpus"] == 1
    assert low["warnings"][0] == "earlier" and len(low["warnings"]) == 2
    assert "nice 15" in low["warnings"][1] and "RAY_worker_niceness=0" in low["warnings"][1]
    assert "time and energy" in low["warnings"][1]
    normal: dict = {"warnings": []}
    assert ray_node_fields(normal, 0)["niceness"] == 0 and normal["warnings"] == []
