"""``petlprof estimate --quantize`` against real quantised steps, ``--attention``, fit verdicts with headroom,
a config's dtype never applied, and bad input (issue 27, items 4 and 5).

A real step here is the run's: the backbone loaded by :func:`petlprof.models.backbones.load_backbone` and quantised
by bitsandbytes on the CPU (:func:`petlprof.models.quantization.quantize_model`), the method applied, two training
steps of the run's recipe, the second one measured.  Its live tensor bytes are counted as the ``cpu-tensors``
meter counts them, inside bitsandbytes' operations that a CPU runs by their composite kernel too
(``gemm_4bit`` dequantises a layer's whole weight before its product: a temporary the meter and the
estimate's trace both count, :func:`petlprof.meters.tensors.runs_composite`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest
import torch

from petlprof.cli import main
from petlprof.estimate import gpus
from petlprof.estimate.command import _default_methods
from petlprof.estimate.core import Settings, estimate
from petlprof.estimate.model import resolve_backbone
from petlprof.estimate.trace import example_batch
from petlprof.meters.memory import static_breakdown
from petlprof.meters.tensors import _mode_class
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import SequenceClassifier
from petlprof.models.quantization import Quantization
from petlprof.registry import get_method
from petlprof.run.recipe import TrainRecipe
from petlprof.run.train import loss_fn

pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.usefixtures("one_thread")

GIB = 1024**3
# a Llama whose linear layers outweigh the rest (a run's --random-init needs MiniLM's vocabulary): the weight a
# 4-bit layer dequantises for each product is 4 MiB here, 5% of the step's peak
WIDE = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": 30522,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
}
NF4 = Quantization("nf4")
QLORA = Quantization("nf4", compute_dtype="bfloat16", double_quant=True)  # QLoRA's settings
FP4 = Quantization("fp4", double_quant=True)
INT8 = Quantization("int8")


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("wide") / "config.json"
    path.write_text(json.dumps(WIDE))
    return str(path)


@dataclass
class Measured:
    static: dict
    peak_train_bytes: int  # live tensor bytes at the step's worst moment, bitsandbytes' temporaries included
    peak_inference_bytes: int  # the same of an inference batch


def measure(spec: str, method: str, quantization: Quantization | None, settings: Settings) -> Measured:
    """A real step of ``method`` on ``spec`` (2 layers; a config file on random weights) quantised as a run does."""
    torch.manual_seed(0)
    method_spec = get_method(method)
    backbone = load_backbone(spec, num_layers=2, random_init=True, quantization=quantization, device="cpu")
    model = method_spec.build()(SequenceClassifier(backbone, 2), method_spec.make_config({}))
    inputs, labels = example_batch(settings.batch_size, settings.max_length, 100)
    recipe = TrainRecipe(lr=1e-3)
    optimizer, params = recipe.optimizer(model)
    model.train()

    def step():
        loss_fn(model(**inputs), labels).backward()
        recipe.clip(params)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # creates AdamW's state, as a run's warm-up does
    static = static_breakdown(model)
    resident = static["total_bytes"] - static["gradients_bytes"]
    with _mode_class()() as train:
        step()
    model.eval()
    with torch.no_grad(), _mode_class()() as inference:
        model(**inputs)
    return Measured(
        static, resident + train.peak_bytes, resident - static["optimizer_state_bytes"] + inference.peak_bytes
    )


CASES = [  # (backbone, quantization, method)
    ("tiny-bert", QLORA, "lora"),  # an encoder, QLoRA's settings
    ("tiny-gpt2", NF4, "lora"),  # GPT-2's Conv1D, stored transposed
    ("tiny-t5", NF4, "ia3"),  # T5 keeps its feed-forward output `wo` in float
    # a Llama whose float32 MLP weights (4 MiB; 2 MiB in bfloat16), dequantised for each product, show in the peaks
    ("wide", NF4, "lora"),
    ("wide", QLORA, "lora"),
    ("wide", FP4, "adapter"),
    ("wide", INT8, "lora"),  # the exact fallback on real tensors (a CPU's int8 path; LLM.int8() to infer)
]


@pytest.mark.parametrize(("backbone", "quantization", "method"), CASES)
def test_a_quantised_estimate_equals_a_real_quantised_step(wide, backbone, quantization, method):
    spec = wide if backbone == "wide" else backbone
    settings = Settings(batch_size=4, max_length=32, device="cpu", quantization=quantization)
    record = estimate(resolve_backbone(spec, num_layers=2), method, {}, settings)
    measured = measure(spec, method, quantization, settings)
    assert record["status"] == "ok", record["error"]
    memory, static = record["memory"], measured.static
    # the weights as stored (packed 4-bit or int8, the rest float) and the quantisation state: exact
    assert memory["weights_bytes"] == static["frozen_weights_bytes"] + static["trainable_weights_bytes"]
    assert memory["quantization_state_bytes"] == static["quantization_state_bytes"]
    assert memory["optimizer_bytes"] == static["optimizer_state_bytes"]
    # the peaks of live tensor bytes of a training step and an inference batch, dequantised temporaries included
    assert memory["peak_train_bytes"] == pytest.approx(measured.peak_train_bytes, rel=0.01)
    assert memory["peak_inference_bytes"] == pytest.approx(measured.peak_inference_bytes, rel=0.01)
    assert record["quantize"] == quantization.method and record["quantization"]["method"] == quantization.method
    assert record["quantization"]["state_bytes"] == static["quantization_state_bytes"]
    assert record["estimate_source"].startswith("real tensors" if quantization == INT8 else "meta-device trace")
    if quantization.four_bit:
        assert record["quantize_double"] is quantization.double_quant
        assert record["quantize_compute_dtype"] == quantization.compute_dtype


LAYOUTS = [  # (quantization, state bytes of one out x in layer): bitsandbytes 0.50's layout, per layer
    (NF4, lambda n: n // 64 * 4 + 16 * 4),  # float32 block maxima (64 values a block), the 16-entry code book
    # block maxima as uint8, their float32 maxima per 256, the 256-entry code book, a float32 offset, the 16 codes
    (QLORA, lambda n: n // 64 + -(-n // 64 // 256) * 4 + 256 * 4 + 4 + 16 * 4),
    (INT8, lambda n: 0),  # the row scales are counted once per row below
]


@pytest.mark.parametrize(("quantization", "state"), LAYOUTS)
def test_the_packed_layout_is_bitsandbytes(wide, quantization, state):
    """Per layer: 4-bit packs two weights a byte, int8 one, and the state is what bitsandbytes keeps."""
    settings = Settings(batch_size=1, max_length=8, device="cpu", quantization=quantization)
    record = estimate(resolve_backbone(wide, num_layers=2), "lora", {}, settings)
    h, f = WIDE["hidden_size"], WIDE["intermediate_size"]
    shapes = [(h, h)] * 4 + [(f, h)] * 2 + [(h, f)]  # q, k, v, o, gate, up, down
    layers = WIDE["num_hidden_layers"]
    weights = layers * sum(o * i for o, i in shapes)
    info = record["quantization"]
    assert info["quantized_layers"] == layers * len(shapes)
    assert info["packed_bytes"] == (weights // 2 if quantization.four_bit else weights)
    rows = 0 if quantization.four_bit else layers * sum(o for o, _ in shapes) * 4  # float32 SCB per output row
    assert info["state_bytes"] == layers * sum(state(o * i) for o, i in shapes) + rows


@pytest.mark.parametrize("quantization", [NF4, INT8])
def test_parameters_and_flops_are_the_unquantised_models(wide, quantization):
    """Parameters count weights, not packed bytes; the products are the same products (a 4-bit layer's of its
    dequantised weight, an int8 layer's of int8 operands)."""
    settings = Settings(batch_size=1, max_length=8, device="cpu")
    plain = estimate(resolve_backbone(wide, num_layers=2), "lora", {}, settings)
    packed = estimate(
        resolve_backbone(wide, num_layers=2), "lora", {}, dataclasses.replace(settings, quantization=quantization)
    )
    assert packed["total_params"] == plain["total_params"]
    assert packed["trainable_params"] == plain["trainable_params"]
    assert packed["flops"]["inference_batch"] == plain["flops"]["inference_batch"]
    h, f, layers = WIDE["hidden_size"], WIDE["intermediate_size"], WIDE["num_hidden_layers"]
    linear = layers * (4 * h * h + 3 * h * f)  # every linear layer of the blocks is quantised, nothing else
    stored = linear // 2 if quantization.four_bit else linear
    assert plain["memory"]["weights_bytes"] - packed["memory"]["weights_bytes"] == linear * 4 - stored


def test_the_lm_head_stays_in_float():
    settings = Settings(batch_size=2, max_length=8, objective="lm", target_length=4, quantization=QLORA)
    record = estimate(resolve_backbone("tiny-llama", num_layers=2), "lora", {}, settings)
    assert record["status"] == "ok", record["error"]
    assert record["quantization"]["kept_in_float"] == ["lm_head"]
    assert "lm" in record and record["quantization"]["quantized_layers"] == 14


# --- --attention -----------------------------------------------------------------------------------------

ATTENTION = Settings(batch_size=16, max_length=64, device="cpu")


def test_eager_attention_estimate_equals_a_real_eager_step():
    """With eager attention (``set_attn_implementation``, transformers' public switch) the real step keeps its
    scores; the estimate traces transformers' eager code the same way."""
    torch.manual_seed(0)
    method = get_method("lora")
    backbone = load_backbone("tiny-bert", num_layers=2)
    backbone.model.set_attn_implementation("eager")
    model = method.build()(SequenceClassifier(backbone, 2), method.make_config({}))
    inputs, labels = example_batch(ATTENTION.batch_size, ATTENTION.max_length, 100)
    recipe = TrainRecipe(lr=1e-3)
    optimizer, params = recipe.optimizer(model)
    model.train()

    def step():
        loss_fn(model(**inputs), labels).backward()
        recipe.clip(params)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    static = static_breakdown(model)
    mode = _mode_class()()
    with mode:
        step()
    settings = dataclasses.replace(ATTENTION, attention="eager")
    record = estimate(resolve_backbone("tiny-bert", num_layers=2), "lora", {}, settings)
    assert record["attention"] == {
        "asked": "eager",
        "implementation": "eager",
        "train_kernels": [],
        "inference_kernels": [],
    }
    expected = static["total_bytes"] - static["gradients_bytes"] + mode.peak_bytes
    assert record["memory"]["peak_train_bytes"] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize(("precision", "fused"), [("fp32", "efficient"), ("bf16", "flash")])
def test_eager_keeps_the_scores_probabilities_and_dropout_mask_that_sdpa_does_not(precision, fused):
    """On a GPU's rules: per layer and head, eager keeps the length x length probabilities (4 bytes at fp32, 2 at
    bf16), the dropped-out copy and a one-byte dropout mask for backward; the fused kernel none of them."""
    settings = dataclasses.replace(ATTENTION, device="cuda", precision=precision)
    resolved = resolve_backbone("tiny-bert", num_layers=2)
    by = {a: estimate(resolved, "lora", {}, dataclasses.replace(settings, attention=a)) for a in ("eager", "sdpa")}
    assert by["sdpa"]["attention"]["train_kernels"] == [fused] and by["eager"]["attention"]["train_kernels"] == []
    config = resolved.config
    elements = 2 * ATTENTION.batch_size * config.num_attention_heads * ATTENTION.max_length**2
    kept = 2 * (4 if precision == "fp32" else 2) + 1
    saved = by["eager"]["memory"]["peak_train_bytes"] - by["sdpa"]["memory"]["peak_train_bytes"]
    assert saved >= elements * kept
    if precision == "bf16":
        flash = estimate(resolved, "lora", {}, dataclasses.replace(settings, attention="flash"))
        assert flash["attention"]["train_kernels"] == ["flash"]
        assert flash["memory"]["peak_train_bytes"] == by["sdpa"]["memory"]["peak_train_bytes"]


# --- fit verdicts with headroom ----------------------------------------------------------------------------

FITS = [  # (peak bytes, device memory, fits?)
    (int(23.5 * GIB), 24 * GIB, False),  # the published miss: nominally under 24 GiB, not with context and slack
    (gpus.usable_bytes(24 * GIB), 24 * GIB, True),
    (gpus.usable_bytes(24 * GIB) + 1, 24 * GIB, False),
    (int(20.1 * GIB), 24 * GIB, False),
    (20 * GIB, 24 * GIB, True),
    (1, gpus.CUDA_CONTEXT_BYTES, False),  # the context alone fills it
]


@pytest.mark.parametrize(("peak", "memory", "expected"), FITS)
def test_a_fit_counts_the_cuda_context_and_the_allocators_slack(peak, memory, expected):
    assert gpus.usable_bytes(memory) == max(0, int((memory - 426 * 2**20) * 0.85))
    assert gpus.fits(peak, memory)["device_memory"] is expected
    assert gpus.fits(peak, memory)["rtx4090-24gb"] is (peak <= gpus.usable_bytes(24 * GIB))


def test_the_records_and_the_table_say_what_the_headroom_counts(tmp_path, capsys):
    args = ["estimate", "--backbone", "tiny-bert", "--methods", "lora", "--batch-size", "2", "--max-length", "8"]
    assert main([*args, "--device-memory", "24GiB", "--output", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "estimates.jsonl").read_text())
    headroom = record["headroom"]
    assert headroom["cuda_context_bytes"] == 426 * 2**20 and headroom["allocator_slack"] == 0.15
    assert "unsloth-zoo" in headroom["cuda_context_source"] and "GMLake" in headroom["allocator_slack_source"]
    out = capsys.readouterr().out
    assert "426 MiB CUDA context" in out and "15% slack" in out and "20 GiB of a 24 GiB card" in out
    assert record["attention"]["asked"] == "sdpa" and "sdpa/" in out  # the default, on the row


# --- a config's dtype ----------------------------------------------------------------------------------------


def test_a_configs_dtype_is_shown_and_never_applied(tmp_path, capsys):
    """A downloaded config.json saying ``torch_dtype: bfloat16`` builds as the bundled shapes do (float32; the
    run's --precision decides), and every row says what the config asked for."""
    plain = {**WIDE, "vocab_size": 1000}
    paths = {}
    for name, values in {"plain": plain, "bf16": {**plain, "torch_dtype": "bfloat16"}}.items():
        (tmp_path / name).mkdir()
        paths[name] = tmp_path / name / "config.json"
        paths[name].write_text(json.dumps(values))
    args = ["--methods", "lora", "--batch-size", "2", "--max-length", "8", "--output", str(tmp_path / "out")]
    assert main(["estimate", "--backbone", f"{paths['plain']},{paths['bf16']}", *args]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "estimates.jsonl").read_text().splitlines()]
    assert [r["config_dtype"] for r in records] == [None, "bfloat16"]
    assert {r["dtype"] for r in records} == {"float32"}
    assert records[0]["memory"] == records[1]["memory"]
    out = capsys.readouterr().out
    assert "the config asks for bfloat16; built float32 (--precision decides)" in out
    assert out.count("float32  ") >= 2  # the dtype column, on every row


# --- the command -----------------------------------------------------------------------------------------


def test_quantize_is_a_sweep_axis_of_the_command(tmp_path, capsys):
    args = ["estimate", "--backbone", "tiny-llama", "--methods", "lora,ia3", "--batch-size", "2", "--max-length", "8"]
    flags = ["--quantize", "none,nf4", "--quantize-double", "--quantize-compute-dtype", "bfloat16"]
    assert main([*args, *flags, "--output", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "estimates.jsonl").read_text().splitlines()]
    assert [(r["method"], r["quantize"]) for r in records] == [
        ("lora", "none"),
        ("ia3", "none"),
        ("lora", "nf4"),
        ("ia3", "nf4"),
    ]
    by = {(r["method"], r["quantize"]): r for r in records}
    assert by[("lora", "nf4")]["quantize_double"] is True and by[("lora", "none")]["quantize_double"] is False
    assert by[("lora", "nf4")]["memory"]["quantization_state_bytes"] > 0
    assert "quantization_state_bytes" not in by[("lora", "none")]["memory"]
    assert "nf4 bfloat16+dq" in capsys.readouterr().out


def test_the_default_methods_leave_out_those_a_quantised_backbone_refuses():
    runs, left_out = _default_methods("classification", ["none", "nf4"])
    assert "full" in left_out and "lora" in runs and not set(runs) & set(left_out)
    assert _default_methods("classification", ["none"])[1] == []


ESTIMATE = ["estimate", "--backbone", "tiny-bert", "--methods", "lora", "--max-length", "8"]
BAD = [
    ([*ESTIMATE, "--device-memory", "40"], "--device-memory '40' has no unit"),
    (["estimate", "--backbone", "tiny-bert", "--methods", "full", "--quantize", "nf4"], "method 'full'"),
    ([*ESTIMATE, "--quantize", "int4"], "int4"),
    ([*ESTIMATE, "--quantize-double"], "--quantize-double acts only with a 4-bit --quantize"),
    ([*ESTIMATE, "--quantize", "nf4", "--quantize-compute-dtype", "float64"], "float64"),
    ([*ESTIMATE, "--attention", "flash"], "--attention flash on cuda needs --precision bf16 or fp16"),
    ([*ESTIMATE, "--attention", "xformers"], "xformers"),
    (["estimate", "--backbone", "tiny-t5", "--attention", "flash", "--precision", "bf16"], "no flash-attention"),
]


@pytest.mark.parametrize(("args", "says"), BAD)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    assert main([*args, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err
    assert not (tmp_path / "out").exists()
