"""Ladder Side-Tuning on every architecture family, through the same checks as READ where they apply.

LST has one side layer per backbone layer, so its trainable parameters grow with depth — linearly,
which is checked instead of READ's constancy.  Step 0 reproduces the backbone (zero-initialised
upsampler), the backbone never gets a gradient or an autograd graph, the gates start balanced,
and the reduction factor shrinks the side network.  As published, the side network is the backbone's
configuration with its widths divided by the reduction factor (head count kept) and, by default, starts
from the backbone's pruned weights: its step-0 output then follows the backbone's own.
"""

from __future__ import annotations

import pytest
import torch

from petlprof.errors import UsageError
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import SequenceClassifier
from petlprof.registry import get_method

TEXTS = ["what a wonderful day", "this is terrible and I hate it", "love it", "worst thing ever made"]
LABELS = torch.tensor([1, 0, 1, 0])
PRESETS = ["tiny-bert", "tiny-gpt2", "tiny-llama", "tiny-t5"]


def build(preset: str, num_layers: int | None = None, **config):
    torch.manual_seed(0)
    backbone = load_backbone(preset, num_layers=num_layers)
    classifier = SequenceClassifier(backbone, 2)
    spec = get_method("lst")
    model = spec.build()(classifier, spec.make_config(config))
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    return classifier, model, {k: batch[k] for k in ("input_ids", "attention_mask")}


pytestmark = pytest.mark.usefixtures("one_thread")


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def step(model, inputs, optimizer=None):
    model.train()
    loss = torch.nn.functional.cross_entropy(model(**inputs), LABELS)
    loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item()


@pytest.mark.parametrize("preset", PRESETS)
def test_trainable_parameters_grow_linearly_with_depth(preset):
    counts = {n: trainable(build(preset, num_layers=n)[1]) for n in (2, 4, 8)}
    assert counts[2] < counts[4] < counts[8]
    assert counts[8] - counts[4] == 2 * (counts[4] - counts[2]), counts  # the same side layer per backbone layer


@pytest.mark.parametrize("preset", PRESETS)
def test_step0_output_is_the_backbones_and_gates_start_balanced(preset):
    classifier, model, inputs = build(preset)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**inputs), classifier(**inputs))
    for ladder in (model.side, getattr(model, "encoder_side", None)):
        if ladder is not None:
            gates = torch.sigmoid(ladder.gate_logits / ladder.temperature)
            assert torch.equal(gates, torch.full_like(gates, 0.5))


@pytest.mark.parametrize("init", ["pruned", "random"])
@pytest.mark.parametrize("preset", PRESETS)
def test_backbone_gets_no_gradient_and_no_graph_and_the_side_learns(preset, init):
    classifier, model, inputs = build(preset, init=init)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = [step(model, inputs, optimizer) for _ in range(4)]
    seen: list[bool] = []
    handles = [
        m.register_forward_hook(
            lambda _m, _a, out: seen.extend(
                t.requires_grad for t in (out if isinstance(out, tuple) else (out,)) if torch.is_tensor(t)
            )
        )
        for m in classifier.backbone.modules()
    ]
    step(model, inputs)
    for handle in handles:
        handle.remove()
    assert seen and not any(seen), "a frozen layer's output is part of the autograd graph"
    assert all(p.grad is None and not p.requires_grad for p in classifier.backbone.parameters())
    side = [p for name, p in model.named_parameters() if p.requires_grad and not name.startswith("classifier.")]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in side)
    assert losses[-1] < losses[0]
    assert not classifier.backbone.training


def test_reduction_factor_sets_the_side_width():
    widths = {r: build("tiny-bert", reduction_factor=r)[1].side.norm.normalized_shape[0] for r in (4, 8, 16)}
    assert widths == {4: 16, 8: 8, 16: 4}


@pytest.mark.parametrize(
    "bad, message",
    [({"reduction_factor": 0}, "0"), ({"gate_temperature": -1.0}, "-1.0"), ({"init": "magic"}, "init.*magic")],
)
def test_bad_config_names_the_value(bad, message):
    with pytest.raises(UsageError, match=message) as caught:
        get_method("lst").make_config(bad)
    assert "\n" not in str(caught.value)


def test_an_init_choice_names_both_values():
    with pytest.raises(UsageError) as caught:
        get_method("lst").make_config({"init": "pretrained"})
    assert "pruned" in str(caught.value) and "random" in str(caught.value)


def test_a_side_width_the_heads_cannot_split_is_refused_before_a_sweep_naming_what_works():
    config = get_method("lst").make_config({"reduction_factor": 32})  # tiny-bert: width 64, 4 heads -> 2 wide
    with pytest.raises(UsageError, match="reduction factors that work: 1, 2, 4, 8, 16") as caught:
        config.check_width(64, "tiny-bert")
    assert "4 heads" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="4 heads"):
        build("tiny-bert", reduction_factor=32)


def test_reduction_factor_wider_than_the_model_is_refused_before_a_sweep():
    with pytest.raises(UsageError, match="128"):
        get_method("lst").make_config({"reduction_factor": 128}).check_width(64, "tiny-bert")


def stacks_of(model):
    return [s for s in (getattr(model, "encoder_side", None), model.side) if s is not None]


@pytest.mark.parametrize("preset", ["tiny-t5", "tiny-bert", "tiny-llama"])
@pytest.mark.parametrize("r", [4, 8])
def test_side_network_is_the_backbones_configuration_with_widths_divided(preset, r):
    classifier, model, _ = build(preset, reduction_factor=r)
    cfg = classifier.backbone.config
    width, heads = cfg.hidden_size, cfg.num_attention_heads
    ffn = getattr(cfg, "d_ff", None) or cfg.intermediate_size
    side = width // r
    for stack in stacks_of(model):
        assert len(stack.layers) == cfg.num_hidden_layers
        for layer in stack.layers:
            attention = layer.self_attention
            assert attention.heads == heads and attention.head_dim == side // heads  # the head count kept
            assert attention.query.weight.shape == (side, side)
            assert layer.ffn.inner.weight.shape == (ffn // r, side) and layer.ffn.outer.weight.shape == (side, ffn // r)
            assert layer.norm_self.weight.shape == (side,)
    assert model.side_network_summary()["heads"] == heads


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten() - a.mean(), b.flatten() - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def side_vs_backbone(preset: str, init: str) -> float:
    """Correlation of the side network's step-0 final state with the backbone's final state at the residual
    dimensions the pruning kept (the ones the side network's width stands for), over the real tokens."""
    from petlprof.methods.lst.pruning import _residual_dimensions
    from petlprof.models.architecture import describe

    classifier, model, inputs = build(preset, init=init)
    backbone = classifier.backbone
    kept = _residual_dimensions(backbone, describe(backbone).stacks[0], model.shape)
    model.eval()
    with torch.no_grad():
        states, masks = model.backbone_states(**inputs), model.state_masks(inputs["attention_mask"])
        name = "encoder" if model.encoder_decoder else "layers"
        ladder = model.encoder_side if model.encoder_decoder else model.side
        side = ladder.side_states(states[name], masks[name])
        final = states[name][:, :, -1]
        mask = masks[name]
    return correlation(side[mask], final[mask][:, kept])


@pytest.mark.parametrize("preset", ["tiny-t5", "tiny-bert"])
def test_pruned_side_network_starts_out_following_the_backbone(preset):
    pruned, random = side_vs_backbone(preset, "pruned"), side_vs_backbone(preset, "random")
    assert pruned > 0.8, pruned
    assert pruned > abs(random) + 0.5, (pruned, random)


def test_pruned_side_layers_are_the_backbone_layers_beside_them_pruned():
    """Side layer i starts as backbone layer i pruned: each side query row is a backbone query row of the same
    head read at the kept residual dimensions, and the kept dimensions have the largest embedding L1 norms."""
    from petlprof.methods.lst.pruning import _residual_dimensions
    from petlprof.models.architecture import describe

    classifier, model, _ = build("tiny-bert", reduction_factor=4)
    backbone = classifier.backbone
    kept = _residual_dimensions(backbone, describe(backbone).stacks[0], model.shape)
    norms = backbone.get_input_embeddings().weight.abs().sum(0)
    assert norms[kept].min() >= norms[[i for i in range(64) if i not in kept.tolist()]].max()
    head_dim, side_head_dim = 16, model.shape.head_dim
    for i, layer in enumerate(backbone.encoder.layer):
        query = layer.attention.self.query.weight[:, kept]
        side = model.side.layers[i].self_attention.query.weight
        for row in range(side.shape[0]):
            head = row // side_head_dim
            candidates = query[head * head_dim : (head + 1) * head_dim]
            assert (candidates == side[row]).all(1).any(), (i, row)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_side_attention_follows_the_backbones_implementation_and_computes_the_same(preset):
    """Eager side attention (its scores materialised, as ``estimate --attention eager`` builds the backbone) gives
    what scaled_dot_product_attention gives; the side network takes the backbone's implementation."""
    from petlprof.methods.lst.model import Attention

    classifier, model, inputs = build(preset)
    assert not model.shape.eager and model.shape.describe()["attention"] == "sdpa"
    model.eval()
    with torch.no_grad():
        sdpa = model(**inputs)
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        for layer in layers:
            layer.eager = True
        eager = model(**inputs)
    assert layers and torch.allclose(eager, sdpa, atol=1e-5), (eager - sdpa).abs().max()
    classifier.backbone.config._attn_implementation = "eager"
    spec = get_method("lst")
    rebuilt = spec.build()(classifier, spec.make_config({}))
    assert rebuilt.shape.eager and all(m.eager for m in rebuilt.modules() if isinstance(m, Attention))


def test_an_eager_estimate_prices_the_side_networks_attention_scores():
    """``estimate --attention eager``: LST's side layers materialise their scores too, so its training peak grows
    beside the backbone's own; with sdpa neither does."""
    from petlprof.estimate.core import Settings, estimate
    from petlprof.estimate.model import resolve_backbone

    resolved = resolve_backbone("bert-base", num_layers=2)
    peaks = {}
    for attention in ("sdpa", "eager"):
        settings = Settings(batch_size=8, max_length=128, device="cpu", attention=attention)
        for method in ("lst", "bitfit"):
            record = estimate(resolved, method, {}, settings)
            assert record["status"] == "ok", record["error"]
            peaks[attention, method] = record["memory"]["peak_train_bytes"]
    # a side layer's attention weights, saved for backward: batch 8 x 12 heads x 128 x 128 floats (the peak, late in
    # the backward pass, holds at least one of the two layers'; measured: 11.2 MiB of the two layers' 12 MiB)
    side_scores = 8 * 12 * 128 * 128 * 4
    grown = (peaks["eager", "lst"] - peaks["sdpa", "lst"]) - (peaks["eager", "bitfit"] - peaks["sdpa", "bitfit"])
    assert side_scores <= grown <= 2 * side_scores, (grown, side_scores, peaks)
