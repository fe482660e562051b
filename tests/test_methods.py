"""Every method on every tiny preset: what trains, what does not, and that it learns.

Each case checks, on a fixed batch: the loss goes down over a few optimiser steps; exactly the
intended parameters receive gradients (none of the backbone's for READ); and the
trainable-parameter count matches a formula written here from the method's definition.
"""

from __future__ import annotations

import pytest
import torch

from petlprof.backbones import BACKBONES, load_backbone
from petlprof.modeling import SequenceClassifier
from petlprof.registry import get_method

PRESETS = [name for name in BACKBONES if name.startswith("tiny-")]

METHODS = ["full", "bitfit", "lora", "read"]
TEXTS = ["what a wonderful day", "this is terrible and I hate it", "love it", "worst thing ever made"]
LABELS = torch.tensor([1, 0, 1, 0])
NUM_LABELS = 2


def build(preset: str, method: str, num_layers: int | None = None, **config):
    torch.manual_seed(0)
    backbone = load_backbone(preset, num_layers=num_layers)
    classifier = SequenceClassifier(backbone, NUM_LABELS)
    spec = get_method(method)
    model = spec.build()(classifier, spec.make_config(config))
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    return backbone, model, batch


def head_params(width: int) -> int:
    return width * NUM_LABELS + NUM_LABELS


def expected_trainable(method: str, backbone) -> int:
    model, width = backbone.model, backbone.hidden_size
    if method == "full":
        return sum(p.numel() for p in model.parameters()) + head_params(width)
    if method == "bitfit":
        return sum(p.numel() for n, p in model.named_parameters() if n.endswith(".bias")) + head_params(width)
    if method == "lora":  # r x (in + out) per adapted projection, rank 8
        r, cfg = 8, model.config
        if cfg.model_type == "gpt2":
            return cfg.n_layer * r * (width + 3 * width) + head_params(width)
        if cfg.model_type == "llama":
            kv = cfg.num_key_value_heads * (width // cfg.num_attention_heads)
            return cfg.num_hidden_layers * r * ((width + width) + (width + kv)) + head_params(width)
        if cfg.model_type == "t5":  # q and v of self-attention (enc+dec) and cross-attention (dec)
            inner = cfg.num_heads * cfg.d_kv
            adapted = 2 * cfg.num_layers + 2 * 2 * cfg.num_decoder_layers
            return adapted * r * (width + inner) + head_params(width)
        # bert: query and value in every layer
        return cfg.num_hidden_layers * 2 * r * (width + width) + head_params(width)
    if method == "read":  # LayerNorm, joiner, GRU, zero-init output; T5 adds an encoder side + context
        h = 128
        side = 2 * width + (width * h + h) + 3 * (h * h + h) * 2 + (h * width + width)
        if backbone.family == "encoder-decoder":
            return 2 * side + width * h + head_params(width)
        return side + head_params(width)
    raise AssertionError(method)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("method", METHODS)
def test_method_trains_only_what_it_should(preset, method):
    backbone, model, batch = build(preset, method)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected_trainable(method, backbone)

    lr = 1e-3 if method == "full" else 3e-3
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.eval()  # no dropout: the loss on a fixed batch must fall step after step
    losses = []
    for step in range(10):
        loss = torch.nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), LABELS)
        loss.backward()
        if step == 0:  # every trainable parameter is in the graph (zero-initialised paths get zeros)
            with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
            assert with_grad == trainable, sorted(with_grad ^ trainable)[:5]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, f"{method} on {preset} did not learn: {losses}"

    backbone_params = {n for n, _ in model.named_parameters()} - trainable
    if method == "full":
        assert not backbone_params
    elif method == "read":
        assert not any(p.requires_grad for p in backbone.model.parameters())
    else:
        assert backbone_params, f"{method} left nothing frozen"


@pytest.mark.parametrize("preset", PRESETS)
def test_read_runs_the_backbone_without_autograd_in_eval_mode(preset):
    backbone, model, batch = build(preset, "read")
    seen = []
    hook = model.classifier.backbone.register_forward_pre_hook(
        lambda module, args: seen.append((torch.is_grad_enabled(), module.training)))
    model.train()
    model(batch["input_ids"], batch["attention_mask"]).sum().backward()
    hook.remove()
    assert seen == [(False, False)], "the frozen backbone must run once, under no_grad, in eval mode"
    assert all(p.grad is None for p in backbone.model.parameters())


@pytest.mark.parametrize("preset", PRESETS)
def test_read_starts_as_the_backbone(preset):
    """The zero-initialised output projection makes step 0 reproduce the backbone + head exactly."""
    backbone, model, batch = build(preset, "read")
    model.eval()
    with torch.no_grad():
        plain = model.classifier(batch["input_ids"], batch["attention_mask"])
        read = model(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(read, plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("aggregation", ["last", "mean"])
@pytest.mark.parametrize("init_state", ["zeros", "embedding"])
def test_read_variants_run_and_learn(cell, aggregation, init_state):
    _, model, batch = build("tiny-bert", "read", cell=cell, aggregation=aggregation, init_state=init_state)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(6):
        loss = torch.nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), LABELS)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_read_parameters_do_not_grow_with_depth():
    counts = {n: sum(p.numel() for p in build("tiny-bert", "read", num_layers=n)[1].parameters() if p.requires_grad)
              for n in (2, 4, 8)}
    assert len(set(counts.values())) == 1, counts


@pytest.mark.parametrize("bad, message", [
    ({"cell": "transformer"}, "cell 'transformer' is not one of rnn, gru, lstm"),
    ({"hidden_size": 0}, "hidden_size must be a positive integer, got 0"),
    ({"aggregation": "max"}, "aggregation 'max'"),
])
def test_read_config_rejects_bad_values(bad, message):
    from petlprof.errors import UsageError

    with pytest.raises(UsageError, match=message):
        get_method("read").make_config(bad)


def test_unknown_method_option_names_the_choices():
    from petlprof.errors import UsageError

    with pytest.raises(UsageError, match="did you mean 'r'"):
        get_method("lora").make_config({"rr": 4})
