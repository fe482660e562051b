"""``--quantize``: frozen backbones in bitsandbytes' 8- and 4-bit layers, on CPU.

Every method that declares it runs on a quantised backbone trains on one (the loss falls on a fixed batch,
with ``tests/test_methods.py``'s loop, and only its own parameters get gradients); the layers quantised are
those ``from_pretrained`` quantises, byte for byte, with the LM head and T5's ``wo`` kept in float and the
weights still the float ones within the quantisation's error; the memory breakdown counts the packed
weights and their quantisation state to the byte; a run's record says how it was quantised; unquantised
runs keep their keys; and what cannot run quantised is refused before any run, in one line.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest
import torch
from test_methods import TEXTS, train_steps

from petlprof.cli import main
from petlprof.meters.memory import static_breakdown
from petlprof.method_api import MethodConfig, MethodSpec, MethodSpecError
from petlprof.models.architecture import name_patterns
from petlprof.models.backbones import load_backbone, minilm_path
from petlprof.models.classifier import make_task_model
from petlprof.models.quantization import QUANTIZE_CHOICES, Quantization
from petlprof.registry import builtin_method_names, get_method
from petlprof.results.records import OK
from petlprof.run.execute import execute
from petlprof.sweep.config import build_options, expand
from petlprof.sweep.spec import RunSpec
from petlprof.vocabulary import ZERO_SHOT

bnb = pytest.importorskip("bitsandbytes")  # the `quantize` extra, which the dev extra (CI) installs
pytestmark = pytest.mark.usefixtures("one_thread")

QLORA = Quantization("nf4", double_quant=True)
# every built-in classification method that says it runs on a quantised backbone, each on another preset and type
DECLARED = [m for m in builtin_method_names() if "nf4" in get_method(m).quantize and m != ZERO_SHOT]
PLACES = [("tiny-llama", QLORA), ("tiny-gpt2", Quantization("fp4")), ("tiny-bert", Quantization("int8"))]
TRAIN = [(m, *PLACES[i % len(PLACES)]) for i, m in enumerate(DECLARED)] + [
    ("lora", "tiny-llama", QLORA),  # QLoRA and int8 LoRA on a decoder ...
    ("lora", "tiny-llama", Quantization("int8")),
    ("lora", "tiny-bert", QLORA),  # ... and on an encoder
    ("lora", "tiny-bert", Quantization("int8")),
    ("lora", "tiny-t5", Quantization("nf4", compute_dtype="bfloat16")),
    ("bitfit", "tiny-gpt2", QLORA),  # biases inside 4-bit layers train (Linear4bit keeps its bias a float parameter)
    ("bitfit", "tiny-bert", Quantization("int8")),
]


def quantized_classifier(preset: str, settings: Quantization, method: str):
    torch.manual_seed(0)
    backbone = load_backbone(preset, quantization=settings)
    spec = get_method(method)
    model = spec.build()(make_task_model(backbone, "classification", 2), spec.make_config({}))
    return backbone, model


def bnb_layers(model) -> list:
    return [m for m in model.modules() if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))]


@pytest.mark.parametrize("method, preset, settings", TRAIN, ids=[f"{m}-{p}-{s.method}" for m, p, s in TRAIN])
def test_a_method_that_keeps_the_backbone_frozen_trains_on_a_quantised_one(method, preset, settings):
    backbone, model = quantized_classifier(preset, settings, method)
    layers = bnb_layers(model)
    stored = torch.uint8 if settings.four_bit else torch.int8
    assert layers and all(layer.weight.dtype == stored and not layer.weight.requires_grad for layer in layers)
    assert backbone.quantization["quantized_layers"] == len(layers)
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    losses = train_steps(model, batch, method)  # asserts every trainable parameter, and only those, gets a gradient
    assert losses[-1] < losses[0] - 0.05, f"{method} on a {settings.method} {preset} did not learn: {losses}"


def test_training_after_an_evaluation_still_reaches_every_adapter():
    """bitsandbytes repacks 4-bit layers for inference at an eval-mode pass without gradients on AVX512-BF16
    CPUs, after which they pass no gradient back; petlprof keeps one layout, so training goes on learning."""
    backbone, model = quantized_classifier("tiny-llama", QLORA, "lora")
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        model(batch["input_ids"], batch["attention_mask"])
    model.train()
    model(batch["input_ids"], batch["attention_mask"]).sum().backward()
    lora = {n: p.grad for n, p in model.named_parameters() if "lora_B" in n}
    assert lora and all(grad is not None and grad.abs().sum() > 0 for grad in lora.values())


# (preset, LM head, the linear layers left in float: as from_pretrained leaves them)
KEPT = [
    ("tiny-llama", True, ["lm_head"]),
    ("tiny-gpt2", True, ["lm_head"]),
    (
        "tiny-t5",
        True,
        ["decoder.block.*.layer.*.DenseReluDense.wo", "encoder.block.*.layer.*.DenseReluDense.wo", "lm_head"],
    ),
    ("tiny-bert", False, []),
]


@pytest.mark.parametrize("preset, lm_head, kept", KEPT, ids=[k[0] for k in KEPT])
@pytest.mark.parametrize("settings, error", [(Quantization("nf4"), 0.14), (Quantization("int8"), 0.01)])
def test_linear_layers_but_the_kept_ones_hold_the_float_weights_quantised(preset, lm_head, kept, settings, error):
    """Each quantised layer dequantises to the float layer it replaced (GPT-2's Conv1D transposed) within the
    quantisation's error relative to the weights' largest value (NF4: half its widest gap, (1 - 0.723) / 2 of a
    block's largest; int8: half a step of 1/127 of a row's largest); the kept ones are the float layers themselves."""
    from transformers.integrations.bitsandbytes import dequantize_bnb_weight

    torch.manual_seed(0)
    float_model = load_backbone(preset, lm_head=lm_head).model
    torch.manual_seed(0)
    backbone = load_backbone(preset, lm_head=lm_head, quantization=settings)
    assert backbone.quantization["kept_in_float"] == kept
    for name, layer in backbone.model.named_modules():
        if not isinstance(layer, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            continue
        source = float_model.get_submodule(name)
        expected = source.weight.T if type(source).__name__ == "Conv1D" else source.weight
        weight = dequantize_bnb_weight(layer.weight, getattr(layer, "state", None)).float()
        assert (weight - expected).abs().max() <= error * expected.abs().max(), name
    kept_linears = [n for n, m in backbone.model.named_modules() if name_patterns([n])[0] in kept]
    assert name_patterns(kept_linears) == kept and all(
        type(backbone.model.get_submodule(n)) is torch.nn.Linear for n in kept_linears
    )


@pytest.mark.parametrize(
    "settings", [Quantization("nf4", double_quant=True), Quantization("int8")], ids=["nf4", "int8"]
)
def test_the_same_bytes_as_from_pretrained_with_a_bitsandbytes_config(settings):
    """petlprof quantises after building; transformers while loading a checkpoint: the same layers, bytes and scales."""
    from transformers import AutoConfig, AutoModel

    ours = load_backbone("minilm", num_layers=1, quantization=settings).model
    config = AutoConfig.from_pretrained(minilm_path(), num_hidden_layers=1)
    theirs = AutoModel.from_pretrained(minilm_path(), config=config, quantization_config=settings.bnb_config())
    compared = 0
    for name, layer in ours.named_modules():
        if isinstance(layer, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            other = theirs.get_submodule(name)
            assert type(other) is type(layer) and torch.equal(layer.weight.data, other.weight.data), name
            if settings.four_bit:
                mine, yours = layer.weight.quant_state, other.weight.quant_state
                assert torch.equal(mine.absmax, yours.absmax) and torch.equal(mine.state2.absmax, yours.state2.absmax)
            else:
                assert torch.equal(layer.weight.SCB, other.weight.SCB)
            torch.testing.assert_close(layer.bias, other.bias, rtol=0, atol=0)
            compared += 1
    assert compared == 6  # query, key, value, attention output, intermediate, output (the pooler is dropped)


def _tensors(holder) -> list[torch.Tensor]:
    """Every tensor a quantisation-state object holds, found by walking its attributes (not petlprof's list)."""
    found = []
    for value in vars(holder).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif type(value).__name__ in ("QuantState", "MatmulLtState"):
            found += _tensors(value)
    return found


def _packed_formula(layer, settings: Quantization) -> tuple[int, int]:
    """(weight bytes, state bytes) of one layer from its shape: 4-bit packs two weights a byte with a float32
    absmax per 64 (double: a uint8 one, plus a float32 per 256 of those, a 256-entry code and an offset) and a
    16-entry code; int8 is one byte a weight and a float32 scale a row."""
    n, rows = layer.in_features * layer.out_features, layer.out_features
    if not settings.four_bit:
        return n, 4 * rows
    blocks = -(-n // 64)
    state = 16 * 4 + (blocks + 4 * -(-blocks // 256) + 256 * 4 + 4 if settings.double_quant else 4 * blocks)
    return -(-n // 2), state


BREAKDOWN = [("tiny-llama", QLORA), ("tiny-gpt2", Quantization("fp4")), ("tiny-bert", Quantization("int8"))]


@pytest.mark.parametrize("preset, settings", BREAKDOWN, ids=[s.method for _, s in BREAKDOWN])
def test_the_memory_breakdown_counts_packed_weights_and_their_state_exactly(preset, settings):
    backbone, model = quantized_classifier(preset, settings, "lora")
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    layers = bnb_layers(model)
    weights, state = (sum(figures) for figures in zip(*(_packed_formula(layer, settings) for layer in layers)))
    assert backbone.quantization["packed_bytes"] == weights and backbone.quantization["state_bytes"] == state
    for moment in ("built", "after a forward pass"):  # an 8-bit layer moves its scales to its matmul state
        tensors = {t.untyped_storage()._cdata: t for t in [*model.parameters(), *model.buffers()]}
        for layer in layers:
            holders = [layer.weight.quant_state] if settings.four_bit else [layer.weight, layer.state]
            tensors.update((t.untyped_storage()._cdata, t) for h in holders for t in _tensors(h))
        figures = static_breakdown(model)
        held = figures["frozen_weights_bytes"] + figures["trainable_weights_bytes"] + figures["buffers_bytes"]
        assert held + figures["quantization_state_bytes"] == sum(t.nbytes for t in tensors.values()), moment
        assert figures["quantization_state_bytes"] == state, moment
        model(batch["input_ids"], batch["attention_mask"])


def test_a_qlora_run_records_its_quantisation():
    """An LM run end to end (QLoRA's use: the backbone's own LM head, generation on the 4-bit model)."""
    spec = RunSpec(
        method="lora",
        backbone="tiny-llama",
        quantize="nf4",
        quantize_double=True,
        task="arith",
        train_size=8,
        eval_size=4,
        batch_size=4,
        max_steps=2,
        max_new_tokens=4,
        warmup_steps=0,
        inference_window_s=0.0,
    )
    record = execute(spec)
    assert record["status"] == OK, record.get("traceback")
    quantization = record["training"]["quantization"]
    assert {k: quantization[k] for k in ("method", "compute_dtype", "double_quant", "blocksize")} == {
        "method": "nf4",
        "compute_dtype": "float32",
        "double_quant": True,
        "blocksize": 64,
    }
    projections = ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", *(f"self_attn.{p}_proj" for p in "koqv")]
    assert quantization["quantized_modules"] == [f"model.layers.*.{p}" for p in projections]
    assert quantization["kept_in_float"] == ["lm_head"] and quantization["quantized_layers"] == 14
    assert record["memory_breakdown"]["quantization_state_bytes"] == quantization["state_bytes"]
    assert record["spec"]["quantize"] == "nf4" and record["generation"]["batch_1"]["tokens_per_s"] > 0
    # parameters count as weights, not as packed bytes (two 4-bit weights a byte): the unquantised model's count
    lora = get_method("lora")
    plain = lora.build()(make_task_model(load_backbone("tiny-llama", lm_head=True), "lm", 0), lora.make_config({}))
    assert record["total_params"] == sum(p.numel() for p in plain.parameters())


def test_unquantised_runs_keep_their_keys_and_only_4_bit_runs_carry_4_bit_settings():
    assert RunSpec(method="read").run_key == "3eaec3a38967b4f0"
    assert RunSpec(method="read", quantize="none").run_key == "3eaec3a38967b4f0"
    plain = expand(build_options({}, {"methods": ["lora"]}), "cpu")
    values = {"methods": ["lora"], "quantize": "none,int8,nf4", "quantize_compute_dtype": "bfloat16"}
    swept = expand(build_options({}, {**values, "quantize_double": True}), "cpu")
    assert [s.quantize for s in swept] == ["none", "int8", "nf4"]
    assert swept[0].run_key == plain[0].run_key and len({s.run_key for s in swept}) == 3
    assert [(s.quantize_compute_dtype, s.quantize_double) for s in swept] == [
        ("float32", False),
        ("float32", False),
        ("bfloat16", True),
    ]
    generative = expand(
        build_options({}, {"methods": ["lora"], "backbone": ["tiny-llama"], "task": ["arith"], "quantize": "none,nf4"}),
        "cpu",
    )
    assert sorted(s.quantize for s in generative if s.method == ZERO_SHOT) == ["nf4", "none"]  # a baseline per backbone


REFUSED = [
    (
        ["--methods", "full", "--quantize", "nf4"],
        "method 'full' (all backbone weights + task head) cannot run on a --quantize nf4",
    ),
    (["--methods", "lora,full", "--quantize", "none,int8"], "method 'full'"),
    (
        ["--methods", "lora", "--quantize", "nf3"],
        "unknown quantization 'nf3'; did you mean 'nf4'? Valid choices: fp4, int8, nf4, none.",
    ),
    (["--methods", "lora", "--quantize", ""], "no quantization given"),
    (["--methods", "lora", "--quantize-double"], "--quantize-double acts only with a 4-bit --quantize (nf4 or fp4)"),
    (
        ["--methods", "lora", "--quantize", "int8", "--quantize-compute-dtype", "bfloat16"],
        "--quantize-compute-dtype acts only",
    ),
    (
        ["--methods", "lora", "--quantize", "nf4", "--quantize-compute-dtype", "bf16"],
        "Valid choices: bfloat16, float16, float32.",
    ),
]


@pytest.mark.parametrize("argv, words", REFUSED, ids=[" ".join(a[1:]) for a, _ in REFUSED])
def test_what_cannot_run_quantised_is_one_line_exit_2_before_any_run(argv, words, tmp_path, capsys):
    code = main(["run", *argv, "--backbone", "tiny-bert", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_without_bitsandbytes_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else find_spec(name, *a)
    )
    code = main(["run", "--methods", "lora", "--quantize", "nf4", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert (
        code == 2
        and "--quantize nf4 needs bitsandbytes, which is not installed: pip install 'petlprof[quantize]'" in err
    )


@dataclass
class NoOptions(MethodConfig):
    """No options."""


@pytest.mark.parametrize("quantize", [(), ("nf8",), "nf4", None], ids=repr)
def test_a_method_runs_unquantised_unless_it_declares_otherwise(quantize):
    spec = dict(name="plug", description="a plug-in", config_cls=NoOptions, apply="x:y", default_lr=1e-3, lr_source="t")
    assert MethodSpec(**spec).quantize == ("none",)  # a plug-in that says nothing is refused on a quantised backbone
    assert MethodSpec(**spec, quantize=QUANTIZE_CHOICES).quantize == QUANTIZE_CHOICES
    with pytest.raises(MethodSpecError, match="quantize must be a non-empty tuple of 'none', 'int8', 'nf4', 'fp4'"):
        MethodSpec(**spec, quantize=quantize)
