"""Every method on every tiny preset: what trains, what does not, that it learns, saves and merges.

Each case checks, on a fixed batch: the trainable-parameter count matches a formula written here
from the method's definition (never read back from the model); the loss goes down over a few
optimiser steps; exactly the intended parameters receive gradients (none of the backbone's for
side-tuning methods); the trained parameters, loaded into a freshly built model, reproduce the
logits; and where the method merges, the merged model gives the unmerged logits.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from petlprof.errors import UsageError
from petlprof.models.backbones import BACKBONES, load_backbone
from petlprof.models.classifier import SequenceClassifier
from petlprof.registry import builtin_method_names, get_method

PRESETS = [name for name in BACKBONES if name.startswith("tiny-")]
# every built-in classification method must have a formula below (LM-only ones: tests/test_lm_methods.py)
METHODS = [name for name in builtin_method_names() if "classification" in get_method(name).objectives]
# beyond each method's defaults: the other adapter placement, prefix reparametrisation, other prompt init
VARIANTS = [
    ("adapter", "tiny-t5", {"placement": "pfeiffer", "reduction_factor": 8}),
    ("adapter", "tiny-llama", {"placement": "pfeiffer", "activation": "gelu"}),
    ("prefix_tuning", "tiny-gpt2", {"projection_size": 16}),
    ("prompt_tuning", "tiny-bert", {"init": "vocab", "num_virtual_tokens": 5}),
    ("prompt_tuning", "tiny-t5", {"init": "random"}),
    ("lora", "tiny-llama", {"r": 2}),
]
CASES = [(m, p, {}) for m in METHODS for p in PRESETS] + VARIANTS
TEXTS = ["what a wonderful day", "this is terrible and I hate it", "love it", "worst thing ever made"]
LABELS = torch.tensor([1, 0, 1, 0])
NUM_LABELS = 2


pytestmark = pytest.mark.usefixtures("one_thread")


def build(preset: str, method: str, **config):
    torch.manual_seed(0)
    backbone = load_backbone(preset)
    classifier = SequenceClassifier(backbone, NUM_LABELS)
    spec = get_method(method)
    settings = spec.make_config(config)
    model = spec.build()(classifier, settings)
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    return backbone, model, batch, settings


def logits(model, batch):
    return model(batch["input_ids"], batch["attention_mask"])


def head_params(width: int) -> int:
    return width * NUM_LABELS + NUM_LABELS


def lora_params(cfg, width: int, r: int) -> int:
    """r x (in + out) per adapted projection (PEFT's default targets: the attention q and v)."""
    if cfg.model_type == "gpt2":  # the fused qkv projection c_attn
        return cfg.n_layer * r * (width + 3 * width)
    if cfg.model_type == "llama":
        kv = cfg.num_key_value_heads * (width // cfg.num_attention_heads)
        return cfg.num_hidden_layers * r * ((width + width) + (width + kv))
    if cfg.model_type == "t5":  # q and v of self-attention (enc+dec) and cross-attention (dec)
        inner = cfg.num_heads * cfg.d_kv
        return (2 * cfg.num_layers + 2 * 2 * cfg.num_decoder_layers) * r * (width + inner)
    return cfg.num_hidden_layers * 2 * r * (width + width)  # bert: query and value


def ia3_params(cfg, width: int) -> int:
    """One scale per output unit of each key and value projection, one per input unit of the FFN's output layer."""
    if cfg.model_type == "gpt2":  # c_attn fuses q, k and v, so all three are rescaled
        return cfg.n_layer * (3 * width + (cfg.n_inner or 4 * width))
    if cfg.model_type == "llama":
        kv = cfg.num_key_value_heads * (width // cfg.num_attention_heads)
        return cfg.num_hidden_layers * (2 * kv + cfg.intermediate_size)
    if cfg.model_type == "t5":  # decoder layers rescale self- and cross-attention keys and values
        inner = cfg.num_heads * cfg.d_kv
        return cfg.num_layers * (2 * inner + cfg.d_ff) + cfg.num_decoder_layers * (4 * inner + cfg.d_ff)
    return cfg.num_hidden_layers * (2 * width + cfg.intermediate_size)  # bert


def prefix_params(cfg, width: int, n: int, projection: int | None) -> int:
    """A key and a value vector per virtual token per attention layer (T5: the decoder's self-attention)."""
    if cfg.model_type == "llama":
        kv_width = cfg.num_key_value_heads * (width // cfg.num_attention_heads)
    else:
        kv_width = width
    layers = cfg.num_hidden_layers if cfg.model_type != "t5" else cfg.num_decoder_layers
    out = layers * 2 * kv_width
    if projection is None:
        return n * out
    return n * kv_width + (kv_width * projection + projection) + (projection * out + out)  # embedding -> MLP


def adapter_params(backbone, config) -> int:
    """Per adapter: down (d -> d/rf) and up (d/rf -> d) with biases; Houlsby 2 per layer, Pfeiffer 1."""
    width = backbone.hidden_size
    m = width // config.reduction_factor
    per_layer = 2 if config.placement == "houlsby" else 1
    cfg = backbone.config
    layers = cfg.num_layers + cfg.num_decoder_layers if cfg.model_type == "t5" else backbone.num_layers
    return layers * per_layer * (2 * width * m + m + width)


def read_params(backbone, config) -> int:
    """LayerNorm, joiner, GRU, zero-init output; T5 adds an encoder side network and the context projection."""
    width, h = backbone.hidden_size, config.hidden_size
    side = 2 * width + (width * h + h) + 3 * (h * h + h) * 2 + (h * width + width)
    return 2 * side + width * h if backbone.family == "encoder-decoder" else side


def lst_params(backbone, config) -> int:
    """Per stack of depth L with side width s = d / r: L+1 ladders, L gates, L side layers with the backbone
    block's shape at width s (its head and key/value-head counts kept, FFN d_ff / r, its norm, bias terms
    and gated or plain FFN; cross-attention in the T5 decoder stack), a final norm and, except for the T5
    encoder stack, the upsampler."""
    cfg = backbone.config
    width = backbone.hidden_size
    s = width // config.reduction_factor
    heads = cfg.num_attention_heads
    kv = (getattr(cfg, "num_key_value_heads", None) or heads) * (s // heads)
    ffn = (
        getattr(cfg, "d_ff", None)
        or getattr(cfg, "intermediate_size", None)
        or getattr(cfg, "n_inner", None)
        or 4 * width
    ) // config.reduction_factor
    bias = int(cfg.model_type in ("bert", "gpt2"))
    norm = s if cfg.model_type in ("t5", "llama") else 2 * s  # RMSNorm: a weight; LayerNorm: weight and bias
    gated = cfg.model_type == "llama"
    # query, key (no bias: softmax ignores it), value, out
    attention = (s * s + bias * s) + s * kv + (s * kv + bias * kv) + (s * s + bias * s)
    feed_forward = (1 + gated) * (s * ffn + bias * ffn) + (ffn * s + bias * s)
    layer = 2 * norm + attention + feed_forward

    def stack(depth: int, cross: bool, up: bool) -> int:
        cross_params = depth * (norm + attention) if cross else 0
        return (
            (depth + 1) * (width * s + s)
            + depth
            + depth * layer
            + cross_params
            + norm
            + (s * width + width if up else 0)
        )

    if cfg.model_type == "t5":
        return stack(cfg.num_layers, False, False) + stack(cfg.num_decoder_layers, True, True)
    return stack(backbone.num_layers, False, True)


def expected_trainable(method: str, backbone, config) -> int:
    model, width, cfg = backbone.model, backbone.hidden_size, backbone.config
    head = head_params(width)
    formulas = {
        "full": lambda: sum(p.numel() for p in model.parameters()),
        "linear_probe": lambda: 0,
        "bitfit": lambda: sum(p.numel() for n, p in model.named_parameters() if n.endswith(".bias")),
        "lora": lambda: lora_params(cfg, width, config.r),
        "ia3": lambda: ia3_params(cfg, width),
        "prompt_tuning": lambda: config.num_virtual_tokens * width,
        "prefix_tuning": lambda: prefix_params(cfg, width, config.num_virtual_tokens, config.projection_size),
        "adapter": lambda: adapter_params(backbone, config),
        "read": lambda: read_params(backbone, config),
        "lst": lambda: lst_params(backbone, config),
    }
    assert method in formulas, f"write the trainable-parameter formula of method '{method}' in this test"
    return formulas[method]() + head


def train_steps(model, batch, method: str) -> list[float]:
    # a smaller step for every weight, and for prompt embeddings, which in the random tiny LLaMA are
    # RMS-normalised from std 0.02, so a 3e-3 step moves them by 15% and the loss jumps; more steps instead
    lr, steps = {"full": (1e-3, 10), "prompt_tuning": (1e-3, 20)}.get(method, (3e-3, 10))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.eval()  # no dropout: the loss on a fixed batch must fall step after step
    losses, trainable = [], {n for n, p in model.named_parameters() if p.requires_grad}
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(logits(model, batch), LABELS)
        loss.backward()
        if step == 0:  # every trainable parameter is in the graph (zero-initialised paths get zeros)
            with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
            assert with_grad == trainable, sorted(with_grad ^ trainable)[:5]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("method, preset, config", CASES, ids=[f"{m}-{p}-{c or 'default'}" for m, p, c in CASES])
def test_method_trains_saves_and_merges(method, preset, config):
    backbone, model, batch, settings = build(preset, method, **config)
    spec = get_method(method)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in trainable.values()) == expected_trainable(method, backbone, settings)
    if method == "full":
        assert len(trainable) == len(list(model.parameters()))
    else:
        assert len(trainable) < len(list(model.parameters())), f"{method} left nothing frozen"
    if spec.side_tuning:
        assert not any(p.requires_grad for p in backbone.model.parameters())

    losses = train_steps(model, batch, method)
    assert losses[-1] < losses[0] - 0.05, f"{method} on {preset} did not learn: {losses}"
    if spec.side_tuning or method != "full":
        assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)

    with torch.no_grad():
        trained = logits(model, batch)
    saved = {n: p.detach().clone() for n, p in trainable.items()}
    _, fresh, _, _ = build(preset, method, **config)
    fresh.eval()
    with torch.no_grad():
        assert not torch.allclose(logits(fresh, batch), trained, atol=1e-4), "training changed nothing"
        missing, unexpected = fresh.load_state_dict(saved, strict=False)
        assert not unexpected and set(missing).isdisjoint(saved)
        torch.testing.assert_close(logits(fresh, batch), trained, rtol=0, atol=1e-6)

    if spec.merge is not None:
        merged = spec.build_merge()(model)
        with torch.no_grad():
            torch.testing.assert_close(logits(merged, batch), trained, rtol=1e-4, atol=1e-5)
        assert not any("lora_" in n or "ia3_" in n for n, _ in merged.named_parameters()), "PEFT layers left over"


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("method", ["prompt_tuning", "prefix_tuning", "adapter", "ia3"])
def test_padding_does_not_change_a_rows_logits(preset, method):
    """Virtual tokens must not shift what is pooled: a row alone and a row padded next to a longer one agree."""
    backbone, model, _, _ = build(preset, method)
    model.eval()
    alone = backbone.tokenizer(TEXTS[2:3], return_tensors="pt")
    padded = backbone.tokenizer(TEXTS[1:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(logits(model, padded)[1:], logits(model, alone), rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("method", ["adapter", "ia3"])
def test_starts_as_the_backbone(preset, method):
    """Zero-initialised adapter up-projections and unit IA3 scales reproduce the plain classifier at step 0."""
    backbone, model, batch, _ = build(preset, method)
    torch.manual_seed(0)
    plain = SequenceClassifier(load_backbone(preset), NUM_LABELS)
    plain.head.load_state_dict(model.head.state_dict())
    model.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=1e-6)


def test_every_method_states_knob_grid_and_lr_source():
    for name in METHODS:
        spec = get_method(name)
        assert spec.lr_source and spec.default_lr > 0, name
        if spec.pareto_knob is not None:
            assert 3 <= len(spec.default_grid) <= 4, name
            assert spec.pareto_knob in {f.name for f in dataclasses.fields(spec.config_cls)}, name
            for overrides in spec.grid_configs():
                spec.make_config(overrides)  # every grid value is a valid config


@pytest.mark.parametrize(
    "method, bad, message",
    [
        ("adapter", {"reduction_factor": 0}, "reduction_factor must be a positive integer, got 0"),
        ("adapter", {"placement": "parallel"}, "placement 'parallel' is not one of houlsby, pfeiffer"),
        ("adapter", {"activation": "sigmoid"}, "activation 'sigmoid' is not one of"),
        ("prompt_tuning", {"num_virtual_tokens": 0}, "num_virtual_tokens must be a positive integer, got 0"),
        ("prompt_tuning", {"init": "labels"}, "init 'labels' is not one of text, vocab, random"),
        ("prompt_tuning", {"init_text": " "}, "init_text must be a non-empty string"),
        ("prefix_tuning", {"num_virtual_tokens": -1}, "num_virtual_tokens must be a positive integer, got -1"),
        ("prefix_tuning", {"projection_size": 0}, "projection_size must be a positive integer, got 0"),
        ("ia3", {"target_modules": "k"}, "target_modules must be a list of module names, got 'k'"),
        ("ia3", {"target_modules": ["k"]}, "must be given together"),
    ],
)
def test_config_rejects_bad_values(method, bad, message):
    with pytest.raises(UsageError, match=message):
        get_method(method).make_config(bad)


def test_adapter_reduction_beyond_the_width_is_a_usage_error():
    with pytest.raises(UsageError, match="reduction_factor 128 leaves no bottleneck .* width 64; use at most 64"):
        build("tiny-bert", "adapter", reduction_factor=128)


def test_unknown_method_option_names_the_choices():
    with pytest.raises(UsageError, match="did you mean 'r'"):
        get_method("lora").make_config({"rr": 4})
