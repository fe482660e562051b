"""What a sweep's runs will take, checked before the first run (issue 41): a note for a budget too few optimiser
steps to learn, the memory of a run's weights, gradients and AdamW state against what this machine can give (the
machine faked: ``MemAvailable`` and a CUDA device's total memory), and the sweep's time left from what each
remaining run is expected to cost.  Both objectives: a labelled CSV on tiny-bert, a prompt/completion JSONL on
tiny-llama."""

from __future__ import annotations

import json
import types

import pytest
import torch

import petlprof.sweep.resources as resources
from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.execution.sweep import CostKey, _sweep, expected_left_s
from petlprof.meters.memory import static_breakdown
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import trainable_model
from petlprof.models.quantization import Quantization
from petlprof.registry import get_method
from petlprof.results.figures import BREAKDOWN_QUANTIZATION_STATE, BREAKDOWN_TOTAL
from petlprof.sweep.config import build_options, expand, preflight, sweep_task
from petlprof.sweep.resources import MIN_LEARNING_STEPS, count_memory, optimiser_steps, trained_examples
from petlprof.sweep.spec import RunSpec

GIB = 2**30
ROWS = 50  # 40 training and 10 evaluation examples after the 80/20 split


def labelled_file(tmp_path, rows: int = ROWS) -> str:
    path = tmp_path / "reviews.csv"
    path.write_text("text,label\n" + "".join(f"review number {i},{i % 2}\n" for i in range(rows)))
    return str(path)


def lm_file(tmp_path, rows: int = ROWS) -> str:
    path = tmp_path / "sums.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"{i} plus 1?", "completion": str(i + 1)}) + "\n" for i in range(rows))
    )
    return str(path)


OBJECTIVES = {  # objective -> (backbone, the data file maker)
    "classification": ("tiny-bert", labelled_file),
    "lm": ("tiny-llama", lm_file),
}


def options(tmp_path, objective: str, **values):
    backbone, make = OBJECTIVES[objective]
    given = {"methods": ["lora"], "backbone": [backbone], "task": [make(tmp_path)], "max_length": 32, **values}
    return build_options({}, given)


# --- optimiser steps ----------------------------------------------------------------------------------------

STEPS = [  # (training examples, batch size, epochs, max steps) -> (optimiser steps, examples trained on)
    ((40, 32, 1, None), (2, 40)),
    ((40, 32, 4, None), (8, 160)),
    ((40, 8, 1, None), (5, 40)),
    ((40, 32, 1, 5), (5, 40 + 40 + 32)),  # 2 a epoch: two whole epochs, then one batch of 32
    ((40, 40, 3, 2), (2, 80)),
    ((0, 32, 1, None), (0, 0)),
]


@pytest.mark.parametrize(("budget", "expected"), STEPS)
def test_steps_and_examples_are_counted_as_the_run_trains(budget, expected):
    assert (optimiser_steps(*budget), trained_examples(*budget)) == expected


SHORT = [  # budget options -> the note's step count (None: no note)
    ({}, 2),  # the user's 40 training examples in one batch of 32 and one of 8
    ({"epochs": 4}, None),  # 8 steps: as many as the reference reports learned in
    ({"epochs": 3}, 6),
    ({"batch_size": 8}, 5),
    ({"batch_size": 4}, None),
    ({"max_steps": 5}, 5),
    ({"max_steps": 5, "max_train_time": 60.0}, "at most 5"),
]


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize(("budget", "steps"), SHORT, ids=[str(b) for b, _ in SHORT])
def test_a_budget_too_short_to_learn_is_noted_before_the_runs(tmp_path, objective, budget, steps):
    sweep = options(tmp_path, objective, **budget)
    notes = [note for note in preflight(sweep) if "optimiser step" in note]
    if steps is None:
        assert notes == []
        return
    task = sweep.task[0]
    assert notes[0].startswith(f"task '{task}': each training run makes {steps} optimiser step"), notes
    assert "40 training examples" in notes[0] and f"fewer than {MIN_LEARNING_STEPS}: too few to learn" in notes[0]
    assert notes[1].startswith(f"{MIN_LEARNING_STEPS} optimiser steps is the fewest the reference reports learned")
    assert len(notes) == 2


def test_the_warm_up_steps_are_counted_among_the_steps_and_the_reason_given_once(tmp_path):
    tasks = [labelled_file(tmp_path), str(tmp_path / "other.csv")]
    (tmp_path / "other.csv").write_text((tmp_path / "reviews.csv").read_text())
    sweep = build_options({}, {"methods": "lora", "backbone": "tiny-bert", "task": tasks, "warmup_steps": 2})
    notes = [note for note in preflight(sweep) if "optimiser step" in note]
    assert [note.split(":")[0] for note in notes[:2]] == [f"task '{task}'" for task in tasks]
    assert (
        "(40 training examples in batches of --batch-size 32: 2 per epoch, x --epochs 1; the 1 warm-up step "
        in (notes[0])
    )  # two steps: the run's train() leaves one measured step, so one warm-up step, which trains
    assert sum("is the fewest the reference reports learned in" in note for note in notes) == 1


def test_a_zero_shot_sweep_trains_nothing_and_is_not_noted(tmp_path):
    assert not [n for n in preflight(options(tmp_path, "lm", methods=["zero_shot"])) if "optimiser step" in n]


# --- memory -------------------------------------------------------------------------------------------------

COUNTED = [  # (objective, method, quantize)
    ("classification", "full", "none"),
    ("classification", "lora", "none"),
    ("classification", "read", "none"),
    ("classification", "prompt_tuning", "none"),
    ("lm", "full", "none"),
    ("lm", "lora", "none"),
    ("lm", "linear_probe", "none"),  # the LM head untied and trained
    ("lm", "adapter", "none"),
    ("lm", "lora", "nf4"),
    ("lm", "lora", "int8"),
    ("classification", "bitfit", "nf4"),
]


@pytest.mark.parametrize(("objective", "method", "quantize"), COUNTED)
def test_the_count_is_the_static_memory_of_the_model_a_run_trains(objective, method, quantize):
    """The meta-device count equals what the record's memory breakdown counts on the model a run builds (on the
    CPU), less a quantised backbone's quantisation state, which the count leaves out."""
    if quantize != "none":
        pytest.importorskip("bitsandbytes")
    backbone_name, _ = OBJECTIVES[objective]
    num_labels = 0 if objective == "lm" else 2
    spec = get_method(method)
    quantization = None if quantize == "none" else Quantization(quantize)
    torch.manual_seed(0)
    backbone = load_backbone(backbone_name, lm_head=objective == "lm", quantization=quantization, device="cpu")
    model = trainable_model(backbone, objective, num_labels, spec, spec.make_config({}))
    breakdown = static_breakdown(model)  # what the run's record holds as its memory_breakdown
    counted = count_memory(backbone_name, None, quantize, objective, num_labels, method, "{}")
    assert counted.bytes == breakdown[BREAKDOWN_TOTAL] - breakdown.get(BREAKDOWN_QUANTIZATION_STATE, 0)
    params = list(model.parameters())
    assert counted.trainable == sum(p.numel() for p in params if p.requires_grad)
    if quantize == "none":
        assert counted.params == sum(p.numel() for p in params)


def counted(sweep, method: str = "lora") -> int:
    backbone, task = sweep.backbone[0], sweep_task(sweep, sweep.task[0])
    return count_memory(backbone, None, "none", task.objective, task.num_labels, method, "{}").bytes


@pytest.fixture
def machine(monkeypatch):
    """This machine's memory, faked: ``MemAvailable`` (bytes, None: unreadable) and the CUDA devices torch sees
    (their total memory in bytes)."""
    state = types.SimpleNamespace(available=64 * GIB, gpus=[])

    def properties(index):
        return types.SimpleNamespace(total_memory=state.gpus[index], name=f"Fake GPU {index}")

    monkeypatch.setattr(resources, "available_memory_bytes", lambda: state.available)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(state.gpus))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(state.gpus))
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    return state


LIMITS = [  # (device, ranks, MemAvailable, GPUs, --max-memory) -> (limit bytes, what the line says) or None
    ("cpu", 1, 8 * GIB, [], None, (8 * GIB, "this machine can give a run (8.0 GiB: MemAvailable in /proc/meminfo)")),
    ("auto", 1, 8 * GIB, [], None, (8 * GIB, "MemAvailable")),
    ("cpu", 2, 8 * GIB, [], None, (4 * GIB, "each of a run's 2 rank processes (4.0 GiB: MemAvailable")),
    ("cpu", 1, 8 * GIB, [], 2 * GIB, (2 * GIB, "--max-memory gives a run (2.0 GiB)")),
    ("cpu", 1, 8 * GIB, [], 16 * GIB, (8 * GIB, "MemAvailable")),
    ("cpu", 1, None, [], None, None),  # no /proc/meminfo: nothing to check against
    ("auto", 1, 8 * GIB, [24 * GIB], None, (24 * GIB, "cuda:0 (Fake GPU 0) has (24.0 GiB, its total memory")),
    ("cuda:1", 1, 8 * GIB, [80 * GIB, 40 * GIB], None, (40 * GIB, "cuda:1 (Fake GPU 1) has")),
    ("cuda", 2, 8 * GIB, [80 * GIB, 40 * GIB], None, (40 * GIB, "cuda:1 (Fake GPU 1)")),  # the smallest rank's
    ("cuda", 1, 8 * GIB, [80 * GIB], 10 * GIB, (10 * GIB, "--max-memory")),
    ("cuda:3", 1, 8 * GIB, [80 * GIB], None, None),  # a GPU torch does not see: the device check refuses it
    ("cuda", 1, 8 * GIB, [], None, None),
]


@pytest.mark.parametrize(("device", "ranks", "available", "gpus", "max_memory", "expected"), LIMITS)
def test_the_memory_a_run_can_have_here(machine, device, ranks, available, gpus, max_memory, expected):
    machine.available, machine.gpus = available, gpus
    limit = resources.memory_limit(device, ranks, max_memory)
    if expected is None:
        assert limit is None
        return
    assert limit is not None and limit[0] == expected[0] and expected[1] in limit[1], limit


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_run_whose_weights_gradients_and_optimiser_state_exceed_the_machine_is_refused_up_front(
    tmp_path, capsys, machine, objective, device
):
    sweep = options(tmp_path, objective, methods=["full", "lora"], device=device)
    full, lora = counted(sweep, "full"), counted(sweep, "lora")
    limit = (full + lora) // 2  # between the two: full fine-tuning does not fit, LoRA does
    machine.available, machine.gpus = (limit, []) if device == "cpu" else (64 * GIB, [limit])
    with pytest.raises(UsageError) as refused:
        preflight(sweep)
    line = str(refused.value)
    backbone, task = sweep.backbone[0], sweep.task[0]
    assert line.startswith("1 configuration needs more memory than ") and "\n" not in line
    assert f"full on {backbone} / {task} needs {full / GIB:.1f} GiB" in line and "lora on" not in line
    assert f"({limit / GIB:.1f} GiB" in line
    assert "weights, buffers, gradients and AdamW state alone" in line and "run anyway with --skip-memory-check" in line
    out = tmp_path / "out"
    argv = ["run", "--methods", "full,lora", "--backbone", backbone, "--task", task, "--max-length", "32"]
    assert main([*argv, "--device", device, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "full on" in err[0] and not out.exists()
    machine.available, machine.gpus = (lora - 1, []) if device == "cpu" else (64 * GIB, [lora - 1])
    with pytest.raises(UsageError, match=r"^2 configurations need more memory"):
        preflight(sweep)


def test_skip_memory_check_runs_anyway_and_is_not_part_of_the_run_key(tmp_path, machine):
    machine.available = 1  # one byte: every configuration is over it
    sweep = options(tmp_path, "classification")
    with pytest.raises(UsageError):
        preflight(sweep)
    anyway = options(tmp_path, "classification", skip_memory_check=True)
    preflight(anyway)  # no refusal
    assert "skip_memory_check" not in RunSpec.__dataclass_fields__
    assert [s.run_key for s in expand(anyway, "cpu")] == [s.run_key for s in expand(sweep, "cpu")]


def test_a_cluster_sweep_is_not_checked_against_this_machine(tmp_path, machine):
    machine.available = 1
    preflight(options(tmp_path, "classification"), meters_here=False)  # the nodes' memory is not this machine's


# --- the time left ------------------------------------------------------------------------------------------


def key(configuration: str, method: str = "lora", backbone: str = "minilm", work: int = 100) -> CostKey:
    return CostKey(configuration, method, backbone, work)


LEFT = [  # (remaining, finished with their wall times in s) -> expected seconds left
    ([key("a")], [], None),  # nothing finished yet: no figure
    ([key("a"), key("a")], [(key("a"), 10.0), (key("a"), 20.0)], 30.0),  # its configuration's mean, 15 s, twice
    ([key("b")], [(key("a"), 10.0), (key("a"), 30.0)], 20.0),  # another LoRA config on the backbone: their mean
    ([key("b", backbone="t5")], [(key("a"), 10.0)], 10.0),  # nothing alike, the same work: the mean of all
    ([key("c", method="full", work=300)], [(key("a", work=100), 10.0), (key("z", "read", work=200), 50.0)], 60.0),
    # mean 30 s over a mean of 150 examples; this run trains on 300: 60 s
    (
        [key("a"), key("b"), key("r", "read", work=50)],
        [(key("a"), 12.0), (key("b"), 8.0), (key("z", "full"), 40.0)],
        12.0 + 8.0 + 20.0 * 50 / 100,  # its own configurations, then the mean of all scaled by work
    ),
    ([key("q", "lora", "t5", work=0)], [(key("z", "zero_shot", work=0), 4.0)], 4.0),  # no work to scale by: the mean
    ([key("q", "lora", "t5", work=80)], [(key("z", "zero_shot", work=0), 4.0), (key("a", work=80), 6.0)], 10.0),
    # mean 5 s over a mean of 40 examples; 80 here: 10 s
]


@pytest.mark.parametrize(("remaining", "finished", "expected"), LEFT)
def test_the_time_left_sums_what_each_remaining_run_is_expected_to_cost(remaining, finished, expected):
    assert expected_left_s(remaining, finished) == expected


def test_a_run_s_configuration_is_its_run_key_less_the_seed():
    def work(spec):
        return spec.train_size

    first, second = RunSpec(method="lora", seed=0), RunSpec(method="lora", seed=1)
    assert CostKey.of(first, work) == CostKey.of(second, work)
    assert CostKey.of(RunSpec(method="lora", epochs=2), work) != CostKey.of(first, work)
    assert CostKey.of(RunSpec(method="lora", train_size=300), work).work == 300


class FakeExecutor:
    """An executor whose runs take the wall times given (each record's ``process_wall_time_s``), instantly; the
    first carries the warm worker's start (``warm_worker_start_s``), as the first run forked from it does."""

    name, in_flight = "fake", []

    def __init__(self, walls: list[float], warm_start_s: float):
        self.walls, self.warm_start_s = walls, warm_start_s

    def results(self, specs, on_start=None):
        for index, (spec, wall_s) in enumerate(zip(specs, self.walls)):
            on_start(spec)
            warm = {"warm_worker_start_s": self.warm_start_s} if index == 0 else {}
            yield spec, {"status": "ok", "method": spec.method, "process_wall_time_s": wall_s, **warm}


def test_the_progress_line_shows_the_time_left_each_remaining_run_is_expected_to_take(tmp_path, capsys):
    specs = [
        RunSpec(method="lora", seed=0, backbone="tiny-bert"),
        RunSpec(method="lora", seed=1, backbone="tiny-bert"),
        RunSpec(method="bitfit", seed=0, backbone="tiny-bert", train_size=500),
        RunSpec(method="lora", seed=2, backbone="tiny-bert"),
    ]
    tally = types.SimpleNamespace(ran=0, failed=0)
    walls = [160.0, 140.0, 30.0, 0.0]  # the first run's 160 s hold the warm worker's 60 s start: 100 s its own
    _sweep(specs, tmp_path / "results.jsonl", FakeExecutor(walls, 60.0), tally, work=lambda spec: spec.train_size)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert "left" not in lines[0]  # nothing finished yet
    # lora's configuration at its one run's 100 s, twice; bitfit, the mean of all (100 s) scaled by its 500 training
    # examples to their 2000: 25 s (the average of the finished runs, 100 s a run, said 5m00s)
    assert lines[1].endswith("about 3m45s left)")
    assert lines[2].endswith("about 2m30s left)")  # lora at the mean of 100 and 140 s; bitfit 120 s / 4
    assert lines[3].endswith("about 2m00s left)")  # lora's configuration again
