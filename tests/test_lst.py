"""Ladder Side-Tuning on every architecture family, through the same checks as READ where they apply.

LST has one side layer per backbone layer, so its trainable parameters grow with depth — linearly,
which is checked instead of READ's constancy.  Step 0 reproduces the backbone (zero-initialised
upsampler), the backbone never gets a gradient or an autograd graph, the gates start balanced,
and the reduction factor shrinks the side network.
"""

from __future__ import annotations

import pytest
import torch

from petlprof.backbones import load_backbone
from petlprof.errors import UsageError
from petlprof.modeling import SequenceClassifier
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


@pytest.mark.parametrize("preset", PRESETS)
def test_backbone_gets_no_gradient_and_no_graph_and_the_side_learns(preset):
    classifier, model, inputs = build(preset)
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
    [({"reduction_factor": 0}, "0"), ({"gate_temperature": -1.0}, "-1.0"), ({"num_heads": "four"}, "four")],
)
def test_bad_config_names_the_value(bad, message):
    with pytest.raises(UsageError, match=message):
        get_method("lst").make_config(bad)


def test_reduction_factor_wider_than_the_model_is_refused_before_a_sweep():
    with pytest.raises(UsageError, match="128"):
        get_method("lst").make_config({"reduction_factor": 128}).check_width(64, "tiny-bert")
