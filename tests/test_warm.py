"""The warm worker (one import per sweep, a forked child per run) and the overhead each record carries.

A forked run must measure what a fresh interpreter measures: the same metrics and losses for the same
seed, the same runtime memory baseline (the child maps the library pages the warm worker had resident),
and the same failure handling (a run past its timeout is killed, the next run still forks).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from petlprof.cli import main
from petlprof.execution.child import FRESH_PROCESS, WARM_PROCESS, execute_in_subprocess, worker_env
from petlprof.execution.executors import LocalExecutor
from petlprof.execution.process import command
from petlprof.execution.warm import WarmWorker, _runs, close_kept, ctrl_c_after_imports, resident_file_pages
from petlprof.execution.worker import preload
from petlprof.meters import idle
from petlprof.results.records import add_overhead, measured_phases_s
from petlprof.run import kept
from petlprof.run.libraries import RUNTIME_LIBRARIES
from petlprof.sweep.spec import RunSpec

pytestmark = pytest.mark.slow  # starts processes or whole sweeps: the full suite, not the inner loop

# the inference phase's 10 repeats alone (its default 0.5 s per batch size is not what is tested here)
TINY = dict(backbone="tiny-bert", train_size=32, eval_size=16, batch_size=16, max_steps=3, warmup_steps=1)
TINY["inference_window_s"] = 0.05
# glibc's heap keeps freed chunks and raises its mmap threshold to the sizes freed, so identical runs'
# CPU peaks differ by up to 15% (measured on the offline default); a fixed threshold hands every tensor
# back when it is freed, and then identical runs agree within about 1% (tiny-bert) and the fork's own
# effect on a peak can be seen.  Both the warm worker and the fresh interpreters start with it.
EXACT_HEAP = {"MALLOC_MMAP_THRESHOLD_": "131072"}


@pytest.fixture(scope="module")
def warm():
    worker = WarmWorker({**worker_env(), **EXACT_HEAP})
    assert worker.broken is None, worker.broken
    yield worker
    worker.close()


# a driver as the ``petlprof`` command is one (opted in to forking its warm worker), in a process of its own: per
# method, a fresh interpreter's run, a run forked from a warm worker started as a fresh interpreter (the one a
# notebook's sweep gets) and one forked from a warm worker forked from the driver (the command's)
_THREE_WAYS = """
import json, os, sys
from petlprof.execution import warm
warm.fork_warm_workers_from_this_process()
from petlprof.execution.child import execute_in_subprocess, worker_env
from petlprof.sweep.spec import RunSpec
from petlprof.execution.worker import KEEPER, preload, run_job
# forked from this process after its imports
forked = warm.WarmWorker(worker_env(), fork_with=(preload, run_job, KEEPER))
assert isinstance(forked.proc, warm.ForkedWorker), forked.proc
spawned = warm.WarmWorker(worker_env())  # a fresh interpreter, started with this environment
assert not isinstance(spawned.proc, warm.ForkedWorker), spawned.proc
records = {}
for case, settings, methods in json.loads(sys.argv[1]):  # one case after another, from the same two workers
    records[case] = {}
    for method in methods:
        spec = RunSpec(method=method, seed=3, **settings)
        fresh = execute_in_subprocess(spec, timeout_s=600)
        saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("MALLOC_")}
        # each forked run has its warm worker's allocator, whatever the driver's environment says now
        runs = [execute_in_subprocess(spec, timeout_s=600, warm=w) for w in (spawned, forked)]
        records[case][method] = [fresh, *runs]
        os.environ.update(saved)
print(json.dumps(records))
"""


# (backbone, task, methods): random weights (nothing kept: one method, as every run builds its own; READ's side
# network is compared in the other two cases), the pretrained offline default (its backbone kept by the warm worker:
# read before the first method's run, taken by the second's), and a user's folder on the LM objective (kept with
# its LM head)
_CASES = {
    "random tiny-bert": ("tiny-bert", "tweets", ("bitfit",)),
    "pretrained minilm": ("minilm", "tweets", ("full", "read")),
    "a folder's LM": (None, "arith", ("lora", "read")),
}


# a run forked from the driver finds the driver's own modules imported before its baseline; a fresh LM run imports
# some of them after it (4.2-4.5 MiB on the tiny Llama's 74 MiB train peak, measured with nothing kept), so its RSS
# peak is that much lower: a fixed amount, a rounding error on a real backbone's peak
DRIVER_MODULES_BYTES = 8 * 2**20
# identical fresh runs of the tiny Llama's LoRA differ by up to 2.3 MiB in their RSS train peak (73.6-75.8 MiB
# measured in four fresh runs): 2% of its 74 MiB is within that noise, which the exact cpu-tensors peaks are not
RSS_NOISE_BYTES = 2.5 * 2**20


def _settings(backbone: str, task: str) -> dict:
    settings = {**TINY, "backbone": backbone, "task": task, "extra_meters": ["cpu-tensors"]}
    if backbone == "minilm":
        settings["num_layers"] = 2  # its first 2 layers: kept by that key, and a third of the time
    if task == "arith":
        settings.update(max_new_tokens=4, max_length=32)
    return settings


@pytest.fixture(scope="module")
def three_ways(lm_folder) -> dict:
    """Every case's records (case -> method -> [fresh, spawned, forked]), from one driver: its two warm workers serve
    the cases one after another.  A driver per case cost two more interpreters (the driver and its spawned worker,
    about 5 s of CPU each) for each case, and gained nothing: the module's tests run on one pytest worker."""
    cases = [
        [case, _settings(backbone or lm_folder, task), methods] for case, (backbone, task, methods) in _CASES.items()
    ]
    done = subprocess.run(
        [sys.executable, "-c", _THREE_WAYS, json.dumps(cases)],
        capture_output=True,
        text=True,
        env={**os.environ, **EXACT_HEAP},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", list(_CASES))
def test_a_forked_run_measures_what_a_fresh_interpreter_measures(case, three_ways):
    """From either kind of warm worker: the same metrics and losses, each phase's peak within 2% of the fresh run's
    (the child maps again the library pages its worker had resident: without that, the runtime baseline is about
    35% lower and those pages count in the run's peak as they page in again), the ``cpu-tensors`` peaks equal.  The
    baseline of a run forked from the driver also holds the driver's own few modules (about 9% more on tiny-bert):
    above a fresh run's, never below.  Where the warm worker kept the backbone (pretrained weights), the first run
    is charged its reading and the second takes it: the same figures as a fresh process's reading of its own."""
    for i, (method, (fresh, spawned, forked)) in enumerate(three_ways[case].items()):
        _same_as_fresh(case, i, method, fresh, spawned, forked)


def _same_as_fresh(case: str, i: int, method: str, fresh: dict, spawned: dict, forked: dict) -> None:
    what = (case, method)
    assert fresh["process"] == FRESH_PROCESS and spawned["process"] == forked["process"] == WARM_PROCESS
    assert fresh["load"]["backbone_from"] == kept.READ_HERE
    for run, slack in ((spawned, RSS_NOISE_BYTES), (forked, RSS_NOISE_BYTES + DRIVER_MODULES_BYTES)):
        assert run["status"] == fresh["status"] == "ok", (what, run.get("error"))
        assert run["metrics"] == fresh["metrics"], what  # exactly: same seed, same arithmetic
        # two fresh runs of MiniLM's full fine-tuning differed by 3e-8 in their loss (0.72124408 against 0.72124410):
        # the BLAS's sums depend on where its buffers lie in memory; exact on the tiny runs, 1e-6 apart here at most
        assert run["train"]["final_loss"] == pytest.approx(fresh["train"]["final_loss"], rel=1e-6, abs=0), what
        assert run["trainable_params"] == fresh["trainable_params"], what
        for phase in ("train", "eval"):  # each phase's peak above its baseline: the 2%
            peaks = [r[phase]["peak_memory_bytes"] for r in (fresh, run)]
            assert abs(peaks[1] - peaks[0]) <= 0.02 * peaks[0] + slack, (what, phase, peaks)
            tensors = [r[phase]["peak_tensor_bytes"] for r in (fresh, run)]
            assert tensors[1] == tensors[0], (what, phase, tensors)
        assert run["env"]["allocator"] == fresh["env"]["allocator"] == "MALLOC_MMAP_THRESHOLD_=131072"
        if _CASES[case][0] == "tiny-bert":
            assert run["load"]["backbone_from"] == kept.READ_HERE  # random weights: each run builds its own
        else:  # read by the warm worker for the first run, kept for the second
            assert run["load"]["backbone_from"] == (kept.READ_FOR_THIS_RUN, kept.KEPT)[i], (what, run["load"])
    baselines = [r["train"]["rss_baseline_bytes"] for r in (fresh, spawned, forked)]
    assert abs(baselines[1] - baselines[0]) < 0.05 * baselines[0], (what, baselines)
    assert 0.95 * baselines[0] < baselines[2] < 1.25 * baselines[0], (what, baselines)


KEPT_RUN = {**TINY, "backbone": "minilm", "num_layers": 2}  # pretrained: its runs are forked from a holder


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def test_a_run_forked_by_a_holder_ends_its_stderr_when_it_ends(warm, tmp_path):
    """The holder is forked while the driver's stderr pipe of the run it reads for is open: it must close its copy,
    or the driver reads that pipe until the holder ends (5 s on every holder's first run, then its timeout)."""
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "record.json"
    spec_path.write_text(json.dumps({"spec": RunSpec(method="bitfit", seed=0, **KEPT_RUN).to_dict()}))
    child = warm.start(spec_path, out_path, worker_env())
    assert child.wait(timeout=600) == 0
    done = threading.Thread(target=child.stderr.read, daemon=True)  # to the end of the stream
    done.start()
    done.join(30)
    assert not done.is_alive(), "the run's stderr stayed open after it ended"
    assert json.loads(out_path.read_text())["load"]["backbone_from"] == kept.READ_FOR_THIS_RUN


def test_a_holder_killed_from_outside_leaves_its_backbones_runs_to_read_their_own(warm):
    first = execute_in_subprocess(RunSpec(method="bitfit", seed=1, **KEPT_RUN), timeout_s=600, warm=warm)
    assert first["status"] == "ok" and first["process"] == WARM_PROCESS
    (holder,) = _children(warm.proc.pid)
    os.kill(holder, signal.SIGKILL)
    again = execute_in_subprocess(RunSpec(method="bitfit", seed=2, **KEPT_RUN), timeout_s=600, warm=warm)
    assert again["status"] == "ok" and again["process"] == WARM_PROCESS and warm.broken is None
    assert again["load"]["backbone_from"].startswith(kept.READ_HERE) and "holder process ended" in str(again["load"])


def test_the_warm_worker_forks_again_after_a_run_it_had_to_kill(warm):
    # the default inference window: a forked run must not be able to finish within the 0.5 s timeout
    spec = RunSpec(method="read", seed=0, **{**TINY, "max_steps": None, "train_size": 64, "inference_window_s": None})
    killed = execute_in_subprocess(spec, timeout_s=0.5, warm=warm)
    assert killed["status"] == "timeout" and "--timeout 0.5" in killed["error"]
    assert killed["overhead_s"] == killed["process_wall_time_s"] > 0.5  # nothing measured: all of it overhead
    again = execute_in_subprocess(RunSpec(method="bitfit", seed=0, **TINY), timeout_s=600, warm=warm)
    assert again["status"] == "ok" and again["process"] == WARM_PROCESS and warm.broken is None


def test_a_prestarted_worker_serves_the_runs_and_only_the_first_is_charged_its_wait(monkeypatch):
    """``petlprof run`` starts the warm worker before checking its input, so the imports overlap the
    checks; the first run's overhead then holds what was left to wait for (before the idle baseline, read
    once the imports are done), and no later run's does."""
    close_kept()  # none kept by an earlier test: this one starts its own
    executor = LocalExecutor(timeout_s=600)
    executor.prestart()
    worker = executor.warm_worker
    assert worker is not None and worker.start_s is None  # importing, and nobody has waited for it yet
    idle_read_after_imports = []
    monkeypatch.setattr(
        idle, "prepare_sweep_idle", lambda *_: idle_read_after_imports.append(worker.start_s is not None)
    )
    try:
        executor.prepare_idle("cpu", "auto")  # idle power is not read beside the imports: they are done
        assert idle_read_after_imports == [True] and worker.broken is None
        specs = [RunSpec(method="bitfit", seed=seed, **TINY) for seed in (0, 1)]
        (_, first), (_, second) = executor.results(specs)
    finally:
        executor.close()
    assert first["process"] == second["process"] == WARM_PROCESS and worker.broken is None
    assert first["warm_worker_start_s"] == worker.start_s >= 0 and "warm_worker_start_s" not in second
    assert first["overhead_s"] >= worker.start_s  # the wait is part of the first run's overhead
    assert worker.proc.poll() is None  # kept for the next sweep of this process
    close_kept()
    assert worker.proc.returncode == 0  # used: it ended at the end of its stream


def test_a_later_sweep_of_the_process_forks_from_the_kept_worker_with_its_own_directory_and_environment(
    tmp_path, monkeypatch
):
    """A second sweep in one process (a notebook's second ``run_sweep``) takes the first sweep's warm worker,
    ready, and charges its first run no wait; its runs see the driver's working directory and environment of
    their own moment.  A sweep whose workers would start with other settings gets a worker of its own."""
    close_kept()
    specs = [RunSpec(method="bitfit", seed=0, **TINY)]
    first = LocalExecutor(timeout_s=600)
    try:
        first.prestart()
        ((_, one),) = first.results(specs)
        kept = first.warm_worker
    finally:
        first.close()
    monkeypatch.chdir(tmp_path)  # a relative task file: resolved in the driver's directory of now
    (tmp_path / "d.csv").write_text("text,label\n" + "".join(f"row {i} of words,{i % 2}\n" for i in range(40)))
    monkeypatch.setenv("PETLPROF_TEST_MARK", "seen")  # read by no import: a variable of the run's own moment
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")
    second = LocalExecutor(timeout_s=600)
    try:
        second.prestart()  # the mark is part of the environment a new worker would start with: not the kept one
        assert second.warm_worker is not kept and second.warm_worker.start_s is None and kept.proc.poll() is not None
    finally:
        second.close()
    close_kept()
    monkeypatch.delenv("PETLPROF_TEST_MARK")
    third = LocalExecutor(timeout_s=600)
    try:
        third.prestart()
        assert third.warm_worker is not kept  # a new one
        ((_, two),) = third.results([RunSpec(method="bitfit", seed=0, **{**TINY, "task": "d.csv"})])
        again = third.warm_worker
    finally:
        third.close()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "d.csv").rename(tmp_path / "elsewhere" / "e.csv")
    monkeypatch.chdir(tmp_path / "elsewhere")  # after the worker started: its runs still resolve e.csv here
    fourth = LocalExecutor(timeout_s=600)
    try:
        fourth.prestart()
        assert fourth.warm_worker is again and again.start_s == 0.0  # adopted, ready: no wait to charge
        (_, three), (_, four) = fourth.results([*specs, RunSpec(method="bitfit", seed=0, **{**TINY, "task": "e.csv"})])
    finally:
        fourth.close()
    close_kept()
    records = (one, two, three, four)
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    assert three["process"] == WARM_PROCESS and three["warm_worker_start_s"] == 0.0
    assert (two["task"], four["task"]) == ("d.csv", "e.csv")  # each found in the driver's directory of its moment
    assert three["metrics"] == one["metrics"]  # the same run, forked from another worker


def test_a_run_handed_to_a_worker_still_importing_waits_for_it_and_runs_once(tmp_path):
    """Its "ready" must not be read as the fork's answer (the run would fall back to a fresh interpreter
    while the worker, which got the request too, forked it as well)."""
    worker = WarmWorker(worker_env(), wait=False)
    try:
        record = execute_in_subprocess(RunSpec(method="bitfit", seed=0, **TINY), timeout_s=600, warm=worker)
    finally:
        worker.close()
    assert record["status"] == "ok" and record["process"] == WARM_PROCESS and worker.broken is None
    assert worker.start_s is not None and worker.proc.returncode == 0


def test_a_prestarted_worker_nobody_waited_for_is_killed_not_awaited(tmp_path, monkeypatch):
    executor = LocalExecutor()
    executor.prestart()
    worker = executor.warm_worker
    executor.close()  # a sweep whose checks failed: no seconds spent waiting for imports nobody will use
    assert worker is not None and worker.proc.returncode == -signal.SIGKILL and executor.warm_worker is None
    # and through the command: an input error after the worker started leaves no worker behind
    data = tmp_path / "one.csv"
    data.write_text("text,label\nhello,1\n")
    args = ["run", "--methods", "bitfit", "--task", str(data), "--text-column", "nosuch", "--output", str(tmp_path)]
    started = []
    prestart = LocalExecutor.prestart

    def recording_prestart(self, fork=False):
        prestart(self, fork)
        started.append(self.warm_worker)

    monkeypatch.setattr(LocalExecutor, "prestart", recording_prestart)
    before = _our_workers()  # the module's own warm worker may be one
    assert main(args) == 2
    assert len(started) == 1 and started[0].proc.returncode == -signal.SIGKILL  # started before the checks, killed
    assert _our_workers() <= before


def _our_workers() -> set[str]:
    """The pids of this process's children that run petlprof.execution.worker."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            status, cmdline = (proc / "status").read_text(), (proc / "cmdline").read_bytes()
        except (OSError, NotADirectoryError):  # not a process, or it ended meanwhile
            continue
        if f"\nPPid:\t{os.getpid()}\n" in status and b"petlprof.execution.worker" in cmdline:
            found.add(proc.name)
    return found


def test_a_worker_imports_what_a_run_imports_and_freezes_it_out_of_the_collectors_scans():
    """:func:`petlprof.execution.worker.preload`, in fresh workers and the warm worker alike: each of a run's five
    garbage collections took 0.25 s of CPU walking the imported libraries' objects."""
    gc.unfreeze()  # tests/conftest.py froze what collection imported
    try:
        preload()
        assert gc.get_freeze_count() > 100_000 and all(name in sys.modules for name in RUNTIME_LIBRARIES)
    finally:
        gc.freeze()


def test_a_cuda_or_several_rank_run_never_forks_from_the_warm_worker():
    from petlprof.execution.child import _start

    class Refuses:
        broken = None

        def start(self, *_):
            raise AssertionError("forked")

    for spec in (RunSpec(method="bitfit", device="cuda", **TINY), RunSpec(method="bitfit", nproc=2, **TINY)):
        proc, process = _start(spec, "spec-path", "out-path", Refuses())
        proc.kill()
        proc.wait()
        assert process == FRESH_PROCESS


def test_a_child_maps_the_library_pages_its_warm_worker_had_resident():
    ranges = resident_file_pages()
    assert ranges and all(length > 0 and address % 4096 == 0 for address, length in ranges)
    assert _runs([1, 1, 0, 1, 0, 0, 1], 4096, 4096) == [(4096, 8192), (4096 * 4, 4096), (4096 * 7, 4096)]
    assert _runs([], 0, 4096) == []


@pytest.mark.parametrize(
    "record, phases_s",
    [
        ({"train": {"time_s": 2.0}, "eval": {"time_s": 1.0}}, 3.0),
        (
            {
                "train": {"time_s": 2.0},
                "eval": {"time_s": 1.0},
                "eval_merged": {"time_s": 0.5},
                "inference": {"target_window_s": 9.0, "batch_1": {"time_s": 0.25}, "batch_32": {"time_s": 0.25}},
            },
            4.0,
        ),
        ({"status": "failed"}, 0.0),  # a failed run: all of its time is overhead
        ({"train": {"time_s": None}, "eval": {"time_s": "1"}, "inference": None}, 0.0),  # odd values: ignored
    ],
)
def test_overhead_is_the_process_wall_time_beyond_the_measured_phases(record, phases_s):
    assert measured_phases_s(record) == phases_s
    assert add_overhead(record, 10.0)["overhead_s"] == 10.0 - phases_s
    assert add_overhead(dict(record), phases_s / 2)["overhead_s"] == 0.0  # clock skew never goes negative


def test_ctrl_c_while_a_worker_is_still_importing_prints_no_traceback(tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"spec": RunSpec(method="bitfit", **TINY).to_dict()}))
    proc = subprocess.Popen(
        command(str(spec_path), str(tmp_path / "out.json")), stderr=subprocess.PIPE, text=True, env=worker_env()
    )
    time.sleep(0.3)  # python has started; petlprof, torch and transformers are still importing
    proc.send_signal(signal.SIGINT)  # Ctrl-C: ignored until the imports are done ...
    time.sleep(0.3)
    proc.terminate()  # ... and the sweep stops the process itself, as petlprof.execution.child._stop does
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]


def _ignored_and_blocked() -> None:
    """A test runner's worker may start us with Ctrl-C ignored and blocked: the command must undo both."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


@pytest.mark.parametrize("blocked", [False, True], ids=["as from a shell", "started with Ctrl-C blocked"])
def test_ctrl_c_while_the_command_imports_for_its_warm_worker_is_one_line(tmp_path, blocked):
    """The command imports the runtime before its checks (to fork its warm worker from itself): Ctrl-C then is one
    line and exit code 130, with nothing written.  Started with Ctrl-C blocked (an inherited signal mask), the
    command held it until its run had ended (twice in CI, where the test runner's worker had it blocked)."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "petlprof.cli", "run", "--methods", "bitfit", "--output", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignored_and_blocked if blocked else lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(1.0)  # past the command's own start, inside the runtime's imports (about 5 s here)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip() == "petlprof: interrupted (Ctrl-C); every run recorded before it is kept", err[-2000:]
    assert not out.exists()


def test_the_command_says_what_a_config_answers_before_it_imports_for_its_warm_worker(tmp_path):
    """The ``petlprof`` command forks its warm worker once it has imported the runtime (peft among it), after the
    checks a backbone's config answers: a ``--num-layers`` past the backbone's is refused without that import."""
    out = tmp_path / "out"
    args = ["run", "--methods", "lora", "--num-layers", "99", "--output", str(out)]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "petlprof.cli", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--num-layers 99 exceeds the 6 pretrained layers of backbone 'minilm'" in done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" in imported and "peft" not in imported and not out.exists()


def test_the_checks_before_the_commands_fork_load_no_tokenizer():
    """A tiny preset's config is built with its tokenizer's vocabulary: the checks the command makes before it forks
    its warm worker leave the presets to the preflight after the fork, so no run inherits a loaded tokenizer."""
    from petlprof.models import backbones
    from petlprof.sweep.config import check_backbone_shapes
    from petlprof.sweep.options import RunOptions

    options = RunOptions(methods=["lora"], backbone=["tiny-bert", "tiny-llama"], max_length=16)
    backbones.shared_tokenizer.cache_clear()
    check_backbone_shapes(options, presets=False)
    assert backbones.shared_tokenizer.cache_info().currsize == 0
    check_backbone_shapes(options)  # the preflight's, after the fork: the presets checked too
    assert backbones.shared_tokenizer.cache_info().currsize > 0


def test_ctrl_c_during_the_runtimes_imports_is_raised_when_they_end_even_past_a_bare_except():
    """A library's optional import inside a bare ``except:`` swallowed the KeyboardInterrupt of a Ctrl-C that
    arrived there, and the command ran its sweep; held until the imports end, it always stops the command."""
    previous = signal.getsignal(signal.SIGINT)
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_after_imports():
            try:  # what such a library does around its own optional import
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here
            except:  # noqa: E722 - the swallowing under test
                pass
            reached_the_end = True
    assert reached_the_end and signal.getsignal(signal.SIGINT) is previous
    with ctrl_c_after_imports():  # no Ctrl-C: nothing raised
        pass


_THREADS_END = """
import threading, time
from petlprof.execution.warm import _threads, _threads_ended
base = _threads()
ending = threading.Thread(target=time.sleep, args=(0.3,))  # a pool shut down without waiting: still ending
ending.start()
assert threading.active_count() == 2 and _threads() > base
ended = _threads_ended(base, 10.0)
stop = threading.Event()
stuck = threading.Thread(target=stop.wait)  # a thread that stays: the holder must not fork over it
stuck.start()
started = time.monotonic()
print(ended, _threads_ended(base, 0.2), time.monotonic() - started >= 0.2)
stop.set()
"""


def test_a_holder_waits_for_the_threads_its_reading_leaves_ending():
    """transformers loads weights on a thread pool it shuts down without waiting: a holder that checked its threads
    at once refused to keep the backbone when they had not ended yet (seen in the suite under load); it waits for
    them, and still refuses a thread that stays.  In a process of its own: a pytest worker has threads of its own."""
    done = subprocess.run([sys.executable, "-c", _THREADS_END], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False", "True"]
