"""The training settings of real jobs (issue 39): half-precision weights, gradient checkpointing, gradient
accumulation and bitsandbytes' 8-bit AdamW, on both objectives and on full fine-tuning, LoRA and READ.

For each setting, the step a run takes (:class:`petlprof.run.train._Fit`, the run's own loop) is measured by the
``cpu-tensors`` meter and compared with ``petlprof estimate``'s trace of the same configuration: the static parts
exactly, the training peak within 5%.  Real in-process runs carry each setting into their records; the defaults
leave run keys alone; a setting a method or architecture cannot take is one line before any run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np
import pytest
import torch
from tqdm.auto import tqdm

from petlprof.cli import main
from petlprof.estimate.core import Settings, estimate
from petlprof.estimate.model import family, resolve_backbone
from petlprof.estimate.trace import example_batch, lm_batch
from petlprof.meters import Window
from petlprof.meters.memory import static_breakdown
from petlprof.meters.tensors import CpuTensorMeter
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import trainable_model
from petlprof.models.language_model import lm_loss
from petlprof.registry import get_method
from petlprof.results.records import OK
from petlprof.run.execute import execute
from petlprof.run.ranks import ONE_PROCESS
from petlprof.run.recipe import TrainRecipe, prepare_model
from petlprof.run.train import PhaseIO, _Fit, loss_fn
from petlprof.sweep.spec import RunSpec

pytestmark = pytest.mark.usefixtures("one_thread")

BATCH, LENGTH, TARGET = 4, 16, 8
# (id, the settings' fields as Settings and RunSpec name them)
SETTINGS = [
    ("bfloat16 weights", {"weights_dtype": "bfloat16"}),
    ("gradient checkpointing", {"gradient_checkpointing": True}),
    ("3 micro-batches a step", {"gradient_accumulation": 3}),
    ("8-bit AdamW", {"optimizer": "adamw8bit"}),
    ("paged 8-bit AdamW, bfloat16", {"optimizer": "paged_adamw8bit", "weights_dtype": "bfloat16"}),
]
OBJECTIVES = [("classification", "tiny-bert"), ("lm", "tiny-llama")]
METHODS = ["full", "lora", "read"]
CASES = [
    pytest.param(fields, objective, backbone, method, id=f"{name}-{objective}-{method}")
    for name, fields in SETTINGS
    for objective, backbone in OBJECTIVES
    for method in METHODS
    if not (fields.get("gradient_checkpointing") and get_method(method).side_tuning)  # refused: see below
]


class FixedBatches:
    """The estimate's full batch, as the run's batches give it to the training loop (one batch, any index)."""

    def __init__(self, objective: str, resolved):
        token = min(100, int(resolved.config.vocab_size) - 1)
        if objective == "lm":
            encoder_decoder = bool(getattr(resolved.config, "is_encoder_decoder", False))
            self.inputs, self.labels = lm_batch(BATCH, LENGTH, TARGET, token, encoder_decoder)
            self.loss = functools.partial(lm_loss, family=family(resolved))
        else:
            self.inputs, self.labels = example_batch(BATCH, LENGTH, token)
            self.loss = loss_fn

    def collate(self, idx, device):
        return dict(self.inputs), self.labels


def measured_step(backbone: str, method: str, objective: str, fields: dict) -> tuple[int, dict]:
    """(the cpu-tensors peak of one training step of the run's loop after a first one made the optimiser's
    state, the model's static breakdown) of ``method`` on ``backbone`` (2 layers) with the settings ``fields``."""
    torch.manual_seed(0)
    spec = get_method(method)
    built = load_backbone(backbone, num_layers=2, lm_head=objective == "lm")
    model = trainable_model(built, objective, 2, spec, spec.make_config({}))
    prepare_model(model, fields.get("weights_dtype", "float32"), fields.get("gradient_checkpointing", False))
    recipe = TrainRecipe(
        lr=1e-3, optimizer_kind=fields.get("optimizer", "adamw"), accumulation=fields.get("gradient_accumulation", 1)
    )
    batches = FixedBatches(objective, resolve_backbone(backbone, num_layers=2))
    fit = _Fit(model, batches, recipe, 10, PhaseIO("cpu", [], "test"), None, ONE_PROCESS)
    micro = [torch.arange(BATCH).numpy()] * recipe.accumulation
    bar = tqdm(disable=True)
    assert fit.step(micro, bar, measured=False)  # the optimiser's state exists from here on
    static = static_breakdown(model, recipe.optimizer_kind != "adamw")
    with Window([CpuTensorMeter("cpu", resident_bytes=static["total_bytes"] - static["gradients_bytes"])]) as window:
        assert fit.step(micro, bar, measured=True)
    assert all(math.isfinite(loss) for loss in fit.losses)
    return window.reading["peak_tensor_bytes"], static


def priced(backbone: str, method: str, objective: str, fields: dict) -> dict:
    """``petlprof estimate``'s record of the configuration :func:`measured_step` measures."""
    settings = Settings(batch_size=BATCH, max_length=LENGTH, device="cpu", objective=objective, **fields)
    if objective == "lm":
        settings = dataclasses.replace(settings, target_length=TARGET)
    record = estimate(resolve_backbone(backbone, num_layers=2), method, {}, settings)
    assert record["status"] == "ok", record["error"]
    return record


@pytest.mark.parametrize("fields, objective, backbone, method", CASES)
def test_the_estimate_prices_each_setting_as_the_run_executes_it(fields, objective, backbone, method):
    """The static parts exactly; the training peak within 5% of the measured one, on both objectives."""
    peak, static = measured_step(backbone, method, objective, fields)
    record = priced(backbone, method, objective, fields)
    assert {k: record[k] for k in fields} == fields  # the record names the settings it priced
    memory = record["memory"]
    assert memory["weights_bytes"] == static["frozen_weights_bytes"] + static["trainable_weights_bytes"]
    assert memory["gradients_bytes"] == static["gradients_bytes"]
    assert memory["optimizer_bytes"] == static["optimizer_state_bytes"]
    assert memory["peak_train_bytes"] == pytest.approx(peak, rel=0.05)
    dtype = fields.get("weights_dtype", "float32")
    assert record["dtype"] == dtype
    bytes_per = getattr(torch, dtype).itemsize
    assert memory["weights_bytes"] == bytes_per * record["total_params"]  # every weight in the dtype
    if fields.get("optimizer", "adamw") != "adamw" and method == "full":  # a byte per element and state, not 2-4
        assert memory["optimizer_bytes"] < 2 * bytes_per * record["trainable_params"]


def test_each_setting_changes_what_it_should_and_nothing_else():
    """Against the default step of full fine-tuning: half weights halve the weights; checkpointing lowers the
    peak and adds a forward pass of FLOPs; accumulation keeps the bytes and multiplies the FLOPs; 8-bit AdamW
    shrinks the optimiser's state to about a quarter."""
    resolved = resolve_backbone("tiny-bert", num_layers=2)
    base = Settings(batch_size=32, max_length=64, device="cpu")  # activations outweigh the weights' state

    def at(**fields):
        record = estimate(resolved, "full", {}, dataclasses.replace(base, **fields))
        assert record["status"] == "ok", record["error"]
        return record["memory"], record["flops"]["train_step"]

    (memory, flops), (half, half_flops) = at(), at(weights_dtype="bfloat16")
    assert half["weights_bytes"] * 2 == memory["weights_bytes"] and half_flops == flops
    checkpointed, checkpointed_flops = at(gradient_checkpointing=True)
    assert checkpointed["peak_train_bytes"] < memory["peak_train_bytes"] and checkpointed_flops > flops
    accumulated, accumulated_flops = at(gradient_accumulation=4)
    assert accumulated_flops == 4 * flops and accumulated["optimizer_bytes"] == memory["optimizer_bytes"]
    eight_bit, _ = at(optimizer="adamw8bit")
    assert 0.2 < eight_bit["optimizer_bytes"] / memory["optimizer_bytes"] < 0.3


SMALL = dict(train_size=12, eval_size=4, batch_size=4, max_steps=3, warmup_steps=1, inference_window_s=0.0)
LM_SMALL = dict(task="arith", max_new_tokens=4)
# one real run per setting and objective, the methods taken in turn (every method meets every setting in the
# measured steps above)
RUNS = [
    pytest.param(fields, objective, backbone, METHODS[i % 3], id=f"{name}-{objective}-{METHODS[i % 3]}")
    for i, ((name, fields), (objective, backbone)) in enumerate(
        (setting, objective) for setting in SETTINGS for objective in OBJECTIVES
    )
    if not (fields.get("gradient_checkpointing") and METHODS[i % 3] == "read")
]


@pytest.mark.parametrize("fields, objective, backbone, method", RUNS)
def test_a_run_with_each_setting_trains_and_its_record_says_so(fields, objective, backbone, method):
    extra = LM_SMALL if objective == "lm" else {}
    spec = RunSpec(method=method, backbone=backbone, **SMALL, **extra, **fields)
    default = RunSpec(method=method, backbone=backbone, **SMALL, **extra)
    assert spec.run_key != default.run_key  # a setting changed from its default is part of the key
    record = execute(spec)
    assert record["status"] == OK, record.get("error")
    assert {k: record["spec"][k] for k in fields} == fields
    training, train = record["training"], record["train"]
    accumulation = fields.get("gradient_accumulation", 1)
    assert train["steps"] == 3 - 1 and train["epochs_run"] == pytest.approx(3 * accumulation * 4 / 12, abs=1e-3)
    assert math.isfinite(train["first_loss"]) and math.isfinite(train["final_loss"])
    dtype = fields.get("weights_dtype", "float32")
    assert training["precision"].startswith(dtype)
    assert ("8-bit" in training["optimizer"]) == (fields.get("optimizer", "adamw") != "adamw")
    assert (f"{accumulation} micro-batches a step" in training["optimizer"]) == (accumulation > 1)
    assert record["memory_breakdown"]["frozen_weights_bytes"] + record["memory_breakdown"][
        "trainable_weights_bytes"
    ] == (getattr(torch, dtype).itemsize * record["total_params"])


def test_the_default_settings_leave_the_run_key_alone():
    assert RunSpec(method="read").run_key == "3eaec3a38967b4f0"
    spec = RunSpec(method="read", weights_dtype="float32", gradient_accumulation=1, optimizer="adamw")
    assert spec.run_key == "3eaec3a38967b4f0"


def albert_config(tmp_path) -> str:
    """A tiny ALBERT config (transformers gives ALBERT no gradient checkpointing)."""
    from transformers import AlbertConfig

    config = AlbertConfig(
        vocab_size=128,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    path = tmp_path / "albert" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config.to_dict()))
    return str(path)


# (arguments after `petlprof run`, words the one line must hold)
REFUSED = [
    (["--methods", "read", "--gradient-checkpointing"], "method 'read'"),
    (["--methods", "lst", "--gradient-checkpointing"], "never back-propagates through the backbone"),
    (["--methods", "lora", "--weights-dtype", "bfloat16", "--precision", "bf16"], "Give one of them"),
    (["--methods", "lora", "--weights-dtype", "bfloat16", "--quantize", "nf4"], "--quantize nf4"),
    (["--methods", "lora", "--weights-dtype", "float16"], "float16"),
    (["--methods", "lora", "--optimizer", "sgd"], "sgd"),
    (["--methods", "lora", "--gradient-accumulation", "0"], "--gradient-accumulation"),
    (["--methods", "lora", "--gradient-accumulation", "nan"], "--gradient-accumulation"),
    (["--methods", "lora", "--gradient-accumulation", "inf"], "--gradient-accumulation"),
    (["--methods", "lora", "--gradient-accumulation", "-1"], "--gradient-accumulation"),
    (["--methods", "lora", "--gradient-accumulation", "2.5"], "--gradient-accumulation"),
    (["--methods", "lora", "--gradient-accumulation", str(10**30)], "--gradient-accumulation"),
    (["--methods", "lora", "--gradient-accumulation", "1e308"], "--gradient-accumulation"),
    (["--methods", "lora", "--random-init", "--backbone", "{albert}", "--gradient-checkpointing"], "AlbertModel"),
]


@pytest.mark.parametrize("args, words", REFUSED, ids=[" ".join(a[2:]) for a, _ in REFUSED])
@pytest.mark.parametrize("command", ["run", "estimate"])
def test_a_setting_that_cannot_apply_is_one_line_before_any_run(command, args, words, tmp_path, capsys):
    args = [a.format(albert=albert_config(tmp_path)) if "{albert}" in a else a for a in args]
    if command == "estimate":
        args = [a for a in args if a != "--random-init"]
    sizes = ["--train-size", "8", "--eval-size", "4"] if command == "run" else []
    code = main([command, *args, "--output", str(tmp_path / "out"), *sizes])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "results.jsonl").exists()


class RowBatches:
    """Eight fixed rows of token ids and labels, a micro-batch being any of their indices."""

    def __init__(self, vocabulary: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, vocabulary, (8, LENGTH), generator=generator)
        self.labels = torch.tensor([0, 1] * 4)
        self.loss = loss_fn

    def collate(self, idx, device):
        idx = torch.as_tensor(idx)
        return {"input_ids": self.ids[idx], "attention_mask": torch.ones_like(self.ids[idx])}, self.labels[idx]


@dataclasses.dataclass(frozen=True)
class NormKeeping(TrainRecipe):
    """The run's recipe, keeping each step's gradient norm before clipping."""

    norms: list = dataclasses.field(default_factory=list)

    def clip(self, params) -> float:
        self.norms.append(super().clip(params))
        return self.norms[-1]


def test_two_micro_batches_make_the_step_of_their_union():
    """Accumulation is a bigger batch split up: one step over micro-batches of 4 and 4 rows has the gradient of
    one step over the 8 rows at once and leaves the weights where it does (equal-length rows; tiny-llama has
    no dropout)."""
    vocabulary = int(resolve_backbone("tiny-llama").config.vocab_size)
    norms, trained = [], []
    for micro in ([np.arange(8)], [np.arange(4), np.arange(4, 8)]):
        torch.manual_seed(0)
        spec = get_method("full")
        backbone = load_backbone("tiny-llama", num_layers=2)
        model = trainable_model(backbone, "classification", 2, spec, spec.make_config({}))
        recipe = NormKeeping(lr=1e-2, accumulation=len(micro))
        fit = _Fit(model, RowBatches(vocabulary), recipe, 10, PhaseIO("cpu", [], "test"), None, ONE_PROCESS)
        assert fit.step(micro, tqdm(disable=True), measured=True)
        assert fit.samples == 8
        norms.append(recipe.norms[-1])
        trained.append({name: p.detach().clone() for name, p in model.named_parameters()})
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, atol=1e-5, rtol=1e-4, msg=name)


def test_an_accumulated_step_repeats_the_micro_batch_kernels_and_runs_the_optimiser_once():
    from petlprof.estimate.trace import _accumulated

    first, later, optimiser = [(1, 10)] * 3, [(2, 20)] * 4, [(0, 5)] * 2
    costs = [*first, *later, *optimiser]
    assert _accumulated(costs, [3, 7], 1) == tuple(costs)
    assert _accumulated(costs, [3, 7], 2) == tuple(costs)
    assert _accumulated(costs, [3, 7], 5) == (*first, *later * 4, *optimiser)


@pytest.mark.parametrize(
    "examples, batch, epochs, max_steps, accumulation, steps, trained",
    [
        (32, 4, 1, None, 1, 8, 32),
        (32, 4, 1, None, 3, 3, 32),  # 8 batches, 3 a step: the last step has 2
        (32, 4, 2, None, 4, 4, 64),
        (32, 4, 1, 5, 3, 5, 60),  # 15 batches: an epoch of 8, then 7 of the next
        (30, 4, 1, None, 2, 4, 30),  # 8 batches, the last of 2 rows
    ],
)
def test_the_sweep_counts_a_runs_optimiser_steps_and_examples_as_the_run_does(
    examples, batch, epochs, max_steps, accumulation, steps, trained
):
    from petlprof.run.train import Steps
    from petlprof.sweep.resources import optimiser_steps, trained_examples

    assert optimiser_steps(examples, batch, epochs, max_steps, accumulation) == steps
    assert Steps(epochs=epochs, max_steps=max_steps).total(math.ceil(examples / batch), accumulation) == steps
    assert trained_examples(examples, batch, epochs, max_steps, accumulation) == trained


def test_the_short_budget_note_counts_accumulated_steps(tmp_path, capsys):
    args = ["run", "--methods", "lora", "--backbone", "tiny-bert", "--train-size", "32", "--batch-size", "4"]
    args += ["--gradient-accumulation", "4", "--eval-size", "4", "--inference-window-s", "0", "--in-process"]
    assert main([*args, "--output", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "each training run makes 2 optimiser steps" in err and "--gradient-accumulation 4 batches a step" in err
    (record,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert record["train"]["epochs_run"] == 1.0 and record["train"]["steps"] == 1  # 2 steps, 1 of them warm-up


def test_an_epoch_of_batches_that_accumulation_does_not_divide_ends_with_a_short_step():
    """8 batches, 3 a step: steps of 3, 3 and 2, every batch of the epoch once and none of the next."""
    from petlprof.run.train import Rows, Steps, step_order

    steps = Steps(epochs=1)
    assert steps.total(8, 3) == 3 and steps.micro_batches(8, 3) == 8
    order = list(step_order(Rows(range(8), 1), steps.micro_batches(8, 3), 0, 3))
    assert [len(step) for step in order] == [3, 3, 2]
    assert sorted(int(b[0]) for step in order for b in step) == list(range(8))
    assert Steps(max_steps=2).micro_batches(8, 3) == 6 and Steps(max_steps=2).total(8, 3) == 2


def test_every_kind_of_batches_cuts_and_orders_its_rows_alike():
    """A classification split's batches, an LM split's and an estimate's rows (counted without tokens) of the same
    size: as many batches an epoch, the last one short, and the same rows in each batch for every seed, so an
    estimate prices the batches a run trains on."""
    import torch

    from petlprof.models.families import DECODER
    from petlprof.run.lm_batches import LMBatches
    from petlprof.run.train import Batches, Rows, Steps, step_order

    kinds = {
        "classification": Batches([{}] * 10, torch.zeros(10), 3, None),
        "lm": LMBatches([{}] * 10, ["a reference"] * 10, 3, None, DECODER, 0, 1),
        "estimate": Rows(range(10), 3),
    }
    assert {name: len(kind) for name, kind in kinds.items()} == dict.fromkeys(kinds, 4)
    for seed in (None, 0, 7):
        orders = {name: [b.tolist() for b in kind.batch_indices(seed)] for name, kind in kinds.items()}
        assert orders["lm"] == orders["estimate"] == orders["classification"], seed
        assert [len(b) for b in orders["estimate"]] == [3, 3, 3, 1]
        assert sorted(i for b in orders["estimate"] for i in b) == list(range(10))
    micro = Steps(epochs=2).micro_batches(4, 1)
    steps = {name: [[b.tolist() for b in step] for step in step_order(kind, micro, 3)] for name, kind in kinds.items()}
    assert steps["lm"] == steps["estimate"] == steps["classification"] and len(steps["estimate"]) == 8
