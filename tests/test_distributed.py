"""Multi-rank (data-parallel) runs: the aggregation of hand-made per-rank records, the cause a failed
run's record names, the training loop on two real gloo ranks against one rank, and whole runs of two
CPU ranks through torchrun (``execute_in_subprocess`` with ``nproc=2``): a good one, one whose rank
raises mid-run and one whose rank is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from petlprof.errors import UsageError
from petlprof.execution import launch
from petlprof.execution.child import execute_in_subprocess
from petlprof.run import distributed
from petlprof.run.execute import execute
from petlprof.run.ranks import ONE_PROCESS, RankContext
from petlprof.sweep.spec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # slow: processes and sweeps

FIXTURES = Path(__file__).parent / "fixtures"
# 33 training examples in batches of 8: the fifth step's batch has one example, so rank 1 has none
# and joins the all-reduce with weight 0; 17 eval examples likewise leave rank 1 empty in the last batch
SMALL = dict(
    backbone="tiny-bert",
    train_size=33,
    eval_size=17,
    batch_size=8,
    max_steps=5,
    warmup_steps=1,
    inference_window_s=0.05,
)


def phase(**fields):
    base = {
        "time_s": 1.0,
        "steps": 4,
        "samples": 8,
        "latency_s": {"p50": 0.1},
        "energy_j": 10.0,
        "energy_kind": "measured",
        "energy_meter": "nvml",
        "energy_window_s": 1.0,
        "peak_memory_bytes": 100,
        "memory_kind": "measured",
        "warnings": [],
    }
    return {**base, **fields}


def rank(r, host="node-a", **fields):
    return {"rank": r, "host": host, "device": f"cuda:{r}", "train": phase(**fields), "eval": phase()}


AGGREGATION_CASES = [
    # (id, per-rank records, expected fields of the aggregated train phase)
    (
        "energy summed, peak max, slowest time and its latency, samples summed",
        [
            rank(0, energy_j=10.0, time_s=2.0, peak_memory_bytes=100, latency_s={"p50": 0.1}),
            rank(1, energy_j=12.0, time_s=3.0, peak_memory_bytes=150, latency_s={"p50": 0.3}),
        ],
        {
            "energy_j": 22.0,
            "time_s": 3.0,
            "peak_memory_bytes": 150,
            "samples": 16,
            "samples_per_s": 16 / 3.0,
            "latency_s": {"p50": 0.3},
            "latency_rank": 1,
            "steps": 4,
        },
    ),
    (
        "per-rank lists beside the totals",
        [rank(0, peak_memory_bytes=100, energy_j=1.0), rank(1, peak_memory_bytes=150, energy_j=2.0)],
        {
            "per_rank": {
                "rank": [0, 1],
                "host": ["node-a", "node-a"],
                "device": ["cuda:0", "cuda:1"],
                "time_s": [1.0, 1.0],
                "samples": [8, 8],
                "energy_j": [1.0, 2.0],
                "peak_memory_bytes": [100, 150],
            }
        },
    ),
    (
        "RAPL on one node counts once, from the longest window",
        [
            rank(0, energy_meter="rapl", energy_j=50.0, energy_window_s=2.0),
            rank(1, energy_meter="rapl", energy_j=52.0, energy_window_s=2.1),
        ],
        {"energy_j": 52.0},
    ),
    (
        "RAPL on two nodes: once per node, summed over nodes",
        [
            rank(0, "a", energy_meter="rapl", energy_j=50.0, energy_window_s=2.0),
            rank(1, "a", energy_meter="rapl", energy_j=49.0, energy_window_s=1.9),
            rank(2, "b", energy_meter="rapl", energy_j=30.0, energy_window_s=2.0),
            rank(3, "b", energy_meter="rapl", energy_j=31.0, energy_window_s=2.2),
        ],
        {"energy_j": 81.0},
    ),
    (
        "CodeCarbon in machine mode counts once per node; the GPU counters are summed",
        [
            rank(0, codecarbon_energy_j=5.0, codecarbon_tracking_mode="machine", energy_window_s=2.0),
            rank(1, codecarbon_energy_j=6.0, codecarbon_tracking_mode="machine", energy_window_s=1.0),
        ],
        {"codecarbon_energy_j": 5.0, "energy_j": 20.0},
    ),
    (
        "estimated if any rank estimated",
        [rank(0, energy_kind="measured"), rank(1, energy_kind="estimated")],
        {"energy_kind": "estimated"},
    ),
    (
        "a rank without an energy figure: no total, and a warning naming it",
        [rank(0, energy_j=10.0), rank(1, energy_j=None)],
        {"energy_j": None, "warnings": ["energy_j is missing on rank(s) 1: no figure over all ranks"]},
    ),
    (
        "warnings merged, each naming its ranks",
        [rank(0, warnings=["short window", "only on 0"]), rank(1, warnings=["short window"])],
        {"warnings": ["all ranks: short window", "rank 0: only on 0"]},
    ),
    (
        "the estimate's CPU core-seconds are summed like its CPU time",
        [
            rank(0, energy_kind="estimated", cpu_time_s=2.0, cpu_core_s=1.5),
            rank(1, energy_kind="estimated", cpu_time_s=3.0, cpu_core_s=2.5),
        ],
        {"cpu_time_s": 5.0, "cpu_core_s": 4.0},
    ),
    (
        "counter and integrated energy cross-checked on the totals; one rank's disagreement is the total's",
        [
            rank(
                0,
                energy_counter_j=10.0,
                energy_integrated_j=10.5,
                energy_integrated_vs_counter=1.05,
                energy_sources_disagree=False,
            ),
            rank(
                1,
                energy_counter_j=10.0,
                energy_integrated_j=13.5,
                energy_integrated_vs_counter=1.35,
                energy_sources_disagree=True,
            ),
        ],
        {"energy_integrated_vs_counter": 1.2, "energy_sources_disagree": True},
    ),
    (
        "the energy grade of the total is its worst rank's, with every rank's reasons once",
        [
            rank(0, energy_grade="A", energy_grade_reasons=[], energy_above_idle_grade="B"),
            rank(1, energy_grade="C", energy_grade_reasons=["C: few updates"], energy_above_idle_grade="C"),
            rank(2, energy_grade="B", energy_grade_reasons=["C: few updates", "B: warm"], energy_above_idle_grade=None),
        ],
        {"energy_grade": "C", "energy_grade_reasons": ["C: few updates", "B: warm"], "energy_above_idle_grade": "C"},
    ),
    (
        "a field that differs between ranks is left to the per-rank dicts",
        [rank(0, rss_baseline_bytes=1), rank(1, rss_baseline_bytes=2)],
        {"rss_baseline_bytes": "absent"},
    ),
]


@pytest.mark.parametrize("records, expected", [c[1:] for c in AGGREGATION_CASES], ids=[c[0] for c in AGGREGATION_CASES])
def test_aggregate_ranks(records, expected):
    out = distributed.aggregate_ranks(records)
    assert out["nodes"] == len({r["host"] for r in records})
    assert set(out) == {"nodes", "train", "eval"}
    for key, value in expected.items():
        if value == "absent":
            assert key not in out["train"]
        else:
            assert out["train"][key] == (pytest.approx(value) if isinstance(value, float) else value), key


def failed(error, status="failed", at=None):
    record = {
        "status": status,
        "error": error,
        "traceback": "Traceback ...",
        "failed_at": {"phase": "train", "step": 2},
    }
    return record if at is None else {**record, "failed_unix_s": at}


FAILURE_CASES = [
    # (id, records the ranks wrote, torchrun's exit codes, expected status, start of the error)
    (
        "a rank that raised, the other stopped by torchrun",
        {1: failed("RuntimeError: boom")},
        {0: {"exitcode": -15, "signal": "SIGTERM"}, 1: {"exitcode": 1, "signal": None}},
        "failed",
        "rank 1 of 2: RuntimeError: boom",
    ),
    (
        "a rank killed outright beats its peer's communication error",
        {0: failed("DistBackendError: Connection closed by peer")},
        {0: {"exitcode": 1, "signal": None}, 1: {"exitcode": -9, "signal": "SIGKILL"}},
        "oom",
        "rank 1 of 2 killed by SIGKILL (exit code -9); out of memory?",
    ),
    (
        "gloo's plain RuntimeError for a lost peer is not the cause",
        {
            0: failed(
                "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:15781", at=5.0
            ),
            1: failed("RuntimeError: injected", at=6.0),
        },
        {},
        "failed",
        "rank 1 of 2: RuntimeError: injected",
    ),
    (
        "two ranks raised: the first in time",
        {0: failed("ValueError: late", at=7.0), 1: failed("ValueError: early", at=6.5)},
        {},
        "failed",
        "rank 1 of 2: ValueError: early",
    ),
    (
        "every rank raised the same: the lowest rank's",
        {0: failed("UsageError: bad"), 1: failed("UsageError: bad")},
        {},
        "failed",
        "rank 0 of 2: UsageError: bad",
    ),
    (
        "an out-of-memory rank keeps its status",
        {1: failed("OutOfMemoryError: CUDA out of memory", "oom")},
        {0: {"exitcode": -15, "signal": "SIGTERM"}},
        "oom",
        "rank 1 of 2: OutOfMemoryError",
    ),
    (
        "only a communication error: it is the cause",
        {1: failed("DistNetworkError: timed out")},
        {0: {"exitcode": -15, "signal": "SIGTERM"}},
        "failed",
        "rank 1 of 2: DistNetworkError",
    ),
    (
        "a rank that exited without a record of its own",
        {},
        {1: {"exitcode": 3, "signal": None}},
        "failed",
        "rank 1 of 2 ended with exit code 3",
    ),
]


@pytest.mark.parametrize(
    "records, launched, status, error", [c[1:] for c in FAILURE_CASES], ids=[c[0] for c in FAILURE_CASES]
)
def test_the_failed_record_names_the_rank_and_cause(records, launched, status, error):
    fields = launch.failure(2, records, launched)
    assert fields["status"] == status and fields["error"].startswith(error)
    assert set(fields["distributed"]["failed_ranks"]) == {str(r) for r in {*records, *launched}}


def test_nothing_failed_gives_no_failure():
    assert launch.failure(2, {}, {}) is None


def test_several_ranks_cannot_run_in_process():
    with pytest.raises(UsageError, match="torchrun"):
        execute(RunSpec(method="bitfit", nproc=2))


# --- the training loop on two real gloo ranks ---------------------------------------------------

LOOP_METHODS = ["lora", "read"]  # PEFT-wrapped backbone; side-tuning with a frozen, no-autograd backbone
# batches of 7 split 4/3 between the ranks, so a loss not weighted by the rank's share shows; the fifth
# training batch (29 = 4 x 7 + 1) and the last eval batch (15 = 2 x 7 + 1) leave rank 1 empty
LOOP = dict(train_size=29, eval_size=15, batch_size=7, max_steps=5)


def _deterministic(method_name):
    """A tiny model with every dropout at p=0, so one rank and two ranks can be compared exactly."""
    from petlprof.models.backbones import load_backbone
    from petlprof.models.classifier import SequenceClassifier
    from petlprof.registry import get_method
    from petlprof.run.train import Batches
    from petlprof.tasks.labelled import load_task

    task = load_task("tweets", train_size=LOOP["train_size"], eval_size=LOOP["eval_size"])
    torch.manual_seed(0)
    backbone = load_backbone("tiny-bert", seed=0)
    method = get_method(method_name)
    model = method.build()(SequenceClassifier(backbone, task.num_labels), method.make_config({}))
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    make = lambda split: Batches.from_split(split, backbone.tokenizer, LOOP["batch_size"], 32, False)  # noqa: E731
    return model, make(task.train), make(task.eval), method.default_lr


ACCUMULATIONS = (1, 2)  # micro-batches per optimiser step: 2 accumulates on each rank and syncs once a step


def _loop(model, train_batches, eval_batches, lr, ranks=ONE_PROCESS, accumulation=1):
    from petlprof.run.recipe import TrainRecipe
    from petlprof.run.train import PhaseIO, Steps, evaluate, train

    steps = Steps(epochs=1, max_steps=LOOP["max_steps"], warmup_steps=1)
    recipe = TrainRecipe(lr=lr, accumulation=accumulation)
    trained = train(ranks.wrap(model, "cpu"), train_batches, recipe, steps, PhaseIO("cpu", [], "t"), ranks=ranks)
    scored, preds, golds = evaluate(model, eval_batches, PhaseIO("cpu", [], "e"), warmup_steps=1, ranks=ranks)
    params = {n: p.detach().numpy().tolist() for n, p in model.named_parameters() if p.requires_grad}
    return {"train": trained, "eval": scored, "preds": preds.tolist(), "golds": golds.tolist(), "params": params}


def _rank_main(rank, port, out_dir):
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    ranks = RankContext.from_env()
    distributed.init("cpu")
    try:
        for name in LOOP_METHODS:
            for accumulation in ACCUMULATIONS:
                result = _loop(*_deterministic(name), ranks=ranks, accumulation=accumulation)
                Path(out_dir, f"{name}-{accumulation}-{rank}.json").write_text(json.dumps(result))
    finally:
        distributed.destroy()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_loops(tmp_path_factory):
    out = tmp_path_factory.mktemp("loops")
    # forked, as a CPU run's ranks are from their launcher: this process has imported everything they need
    torch.multiprocessing.start_processes(_rank_main, args=(_free_port(), str(out)), nprocs=2, start_method="fork")
    return {
        (name, accumulation, r): json.loads((out / f"{name}-{accumulation}-{r}.json").read_text())
        for name in LOOP_METHODS
        for accumulation in ACCUMULATIONS
        for r in (0, 1)
    }


@pytest.mark.parametrize("accumulation", ACCUMULATIONS, ids=["one batch a step", "two micro-batches a step"])
@pytest.mark.parametrize("name", LOOP_METHODS)
def test_two_ranks_are_the_one_rank_optimisation(name, accumulation, two_rank_loops):
    """Same global batches, per-rank losses weighted by their share: the losses, trained weights and
    predictions equal one rank's up to float32 summation order (the ranks pad their halves of a batch
    to different lengths, and masked positions add exact zeros), well inside 1e-5.  With gradient accumulation too:
    each rank accumulates its halves of the micro-batches and the gradients are averaged once a step (no_sync on
    the others), which is one rank's accumulated step; and accumulating is not one batch a step (5 steps of 2
    micro-batches see other batches than 5 of one)."""
    one = _loop(*_deterministic(name), accumulation=accumulation)
    if accumulation > 1:
        plain = _loop(*_deterministic(name))
        assert one["train"]["final_loss"] != pytest.approx(plain["train"]["final_loss"], abs=1e-5)
    for r in (0, 1):
        two = two_rank_loops[(name, accumulation, r)]
        assert two["train"]["first_loss"] == pytest.approx(one["train"]["first_loss"], abs=1e-5)
        assert two["train"]["final_loss"] == pytest.approx(one["train"]["final_loss"], abs=1e-5)
        for key, value in one["params"].items():
            np.testing.assert_allclose(two["params"][key], value, atol=1e-5, err_msg=key)
        # the metrics see the whole split once, in its order, on every rank
        assert two["golds"] == one["golds"] and two["preds"] == one["preds"]
    counted = [two_rank_loops[(name, accumulation, r)]["eval"]["samples"] for r in (0, 1)]
    assert sum(counted) == one["eval"]["samples"] and counted[1] < counted[0]
    trained = [two_rank_loops[(name, accumulation, r)]["train"]["samples"] for r in (0, 1)]
    assert sum(trained) == one["train"]["samples"]


# --- whole runs through torchrun ------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_rank_run():
    return execute_in_subprocess(RunSpec(method="lora", nproc=2, **SMALL), timeout_s=600)


def test_a_two_rank_run_sums_energy_maxes_memory_and_takes_the_slowest_time(two_rank_run):
    record = two_rank_run
    assert record["status"] == "ok", record.get("error")
    info = record["distributed"]
    assert info["world_size"] == 2 and info["backend"] == "gloo" and [r["rank"] for r in info["ranks"]] == [0, 1]
    for name in ("train", "eval"):
        ranks = [r[name] for r in info["ranks"]]
        total = record[name]
        assert total["energy_j"] == pytest.approx(sum(p["energy_j"] for p in ranks))
        assert total["peak_memory_bytes"] == max(p["peak_memory_bytes"] for p in ranks)
        assert total["time_s"] == max(p["time_s"] for p in ranks)
        assert total["samples"] == sum(p["samples"] for p in ranks)
        assert total["per_rank"]["energy_j"] == [p["energy_j"] for p in ranks]
    assert (
        "rank 0 alone" in record["inference"]["measured_on"] and "rank 0 alone" in record["eval_merged"]["measured_on"]
    )


def test_a_two_rank_run_counts_the_eval_split_once_and_starts_from_the_same_loss(two_rank_run):
    """The first loss is the first global batch's mean loss; dropout (p=0.1) draws different masks for
    two halves of a batch than for the whole, which moves it by ~1e-3 here, while a wrongly weighted
    or half-counted loss would be off by 50% or more: hence 2%."""
    one = execute(RunSpec(method="lora", **SMALL))
    two = two_rank_run
    assert two["task_info"]["eval_samples"] == one["task_info"]["eval_samples"] == SMALL["eval_size"]
    assert two["eval"]["samples"] == one["eval"]["samples"] and two["train"]["samples"] == one["train"]["samples"]
    assert two["train"]["steps"] == one["train"]["steps"]
    assert two["train"]["first_loss"] == pytest.approx(one["train"]["first_loss"], rel=2e-2)
    assert set(two["metrics"]) == set(one["metrics"])


def _descendants(pid):
    """Every live process below ``pid`` (children of any of its threads)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = task.read_text().split()
        except OSError:  # the thread or process ended meanwhile
            continue
        for child in children:
            out += [int(child), *_descendants(int(child))]
    return out


def _workers():
    """(pid, environment) of every live petlprof worker below this process: launchers and ranks."""
    out = []
    for pid in _descendants(os.getpid()):
        try:
            if b"petlprof.execution.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append((pid, Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")))
        except OSError:  # ended meanwhile
            continue
    return out


def _rank_pid(rank):
    """A rank's pid: a fresh rank's environment names it; a forked rank's keeps its launcher's, so it is the
    launcher's child in the order torch elastic starts them (rank 0 first)."""
    workers = _workers()
    fresh = next((pid for pid, environ in workers if f"RANK={rank}".encode() in environ), None)
    if fresh is not None:
        return fresh
    launchers = [pid for pid, _ in workers if b"--nproc" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    forked = sorted(pid for launcher in launchers for pid in _descendants(launcher) if pid in dict(workers))
    return forked[rank] if len(forked) > rank else None


def test_a_rank_raising_mid_run_fails_the_run_with_its_cause(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES / "rank_fault"))
    monkeypatch.setenv("PETLPROF_FAULT_RANK", "1")
    monkeypatch.setenv("PETLPROF_FAULT_STEP", "3")
    record = execute_in_subprocess(RunSpec(method="lora", nproc=2, **SMALL), timeout_s=600)
    assert record["status"] == "failed"
    assert record["error"] == "rank 1 of 2: RuntimeError: injected fault on rank 1"
    assert record["failed_at"]["phase"] == "train" and record["failed_at"]["step"] == 2
    assert "1" in record["distributed"]["failed_ranks"]
    assert _workers() == []


def test_a_rank_killed_mid_run_fails_the_run_and_nothing_hangs(capfd):
    spec = RunSpec(method="lora", nproc=2, **{**SMALL, "max_steps": 100_000, "train_size": 64})
    result = {}
    runner = threading.Thread(target=lambda: result.update(execute_in_subprocess(spec, timeout_s=600)))
    runner.start()
    seen, deadline = "", time.time() + 300
    while "lora s0 train" not in seen and time.time() < deadline:  # rank 0 trains: both ranks are in the group
        time.sleep(0.5)
        seen += capfd.readouterr().err
    victim = _rank_pid(1)
    assert victim is not None, "rank 1 not found"
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    runner.join(120)
    assert not runner.is_alive(), "the run did not return after a rank was killed"
    assert time.time() - killed_at < 60
    assert result["status"] == "oom" and result["error"].startswith("rank 1 of 2 killed by SIGKILL")
    assert _workers() == []
