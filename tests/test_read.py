"""READ on every architecture family: what trains, what never gets a graph, and what step 0 returns.

Tables of cases fed to shared checks: depth-independent trainable parameters (2-, 4- and 8-layer
presets of width 64), no gradient and no autograd graph on any backbone tensor, the backbone's own
output at step 0 (zero-initialised output projection), every cell × aggregation × initial state,
both encoder-decoder wirings, and decoder-only models under left and right padding.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from petlprof.bench.profile import MethodStep
from petlprof.methods.read import AGGREGATIONS, CELLS, INIT_STATES
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import SequenceClassifier
from petlprof.registry import get_method

TEXTS = ["what a wonderful day", "this is terrible and I hate it", "love it", "worst thing ever made"]
LABELS = torch.tensor([1, 0, 1, 0])
CASES = [
    ("tiny-bert", {}),
    ("tiny-gpt2", {}),
    ("tiny-llama", {}),
    ("tiny-t5", {"t5_wiring": "side"}),
    ("tiny-t5", {"t5_wiring": "encoder_output"}),
]


def build(preset: str, num_layers: int | None = None, padding_side: str = "right", method: str = "read", **config):
    torch.manual_seed(0)
    backbone = load_backbone(preset, num_layers=num_layers)
    if padding_side != backbone.tokenizer.padding_side:  # a copy: the tokenizer is shared in this process
        backbone.tokenizer = copy.deepcopy(backbone.tokenizer)
        backbone.tokenizer.padding_side = padding_side
    classifier = SequenceClassifier(backbone, 2)
    spec = get_method(method)
    model = spec.build()(classifier, spec.make_config(config))
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    return classifier, model, {k: batch[k] for k in ("input_ids", "attention_mask")}


pytestmark = pytest.mark.usefixtures("one_thread")


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def train_steps(model, inputs, steps: int = 2, lr: float = 1e-2):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    model.train()
    for _ in range(steps):
        torch.nn.functional.cross_entropy(model(**inputs), LABELS).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("preset, config", CASES)
def test_trainable_parameters_do_not_grow_with_depth(preset, config):
    counts = {n: trainable(build(preset, num_layers=n, **config)[1]) for n in (2, 4, 8)}
    assert len(set(counts.values())) == 1, counts


def _record_graphs(module, seen: list):
    def flatten(value):
        if torch.is_tensor(value):
            return [value]
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else []
        return [t for item in items for t in flatten(item)]

    def hook(_module, _args, output):
        seen.extend(t.requires_grad for t in flatten(output))

    return [m.register_forward_hook(hook) for m in module.modules()]


@pytest.mark.parametrize("preset, config", CASES)
def test_backbone_gets_no_gradient_and_no_graph(preset, config):
    classifier, model, inputs = build(preset, **config)
    train_steps(model, inputs, steps=2)  # zero-initialised outputs leave zero: now every side weight gets a gradient
    model.train()
    frozen_with_graph = (
        classifier.backbone.get_encoder() if config.get("t5_wiring") == "encoder_output" else classifier.backbone
    )  # that wiring back-propagates through the decoder's activations by design
    seen: list[bool] = []
    handles = _record_graphs(frozen_with_graph, seen)
    torch.nn.functional.cross_entropy(model(**inputs), LABELS).backward()
    for handle in handles:
        handle.remove()
    assert seen and not any(seen), "a frozen layer's output is part of the autograd graph"
    assert all(p.grad is None and not p.requires_grad for p in classifier.backbone.parameters())
    side = [p for name, p in model.named_parameters() if p.requires_grad and not name.startswith("classifier.")]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in side)
    assert not classifier.backbone.training, "the frozen backbone must stay in eval mode while training"


def test_encoder_output_wiring_backpropagates_through_decoder_activations_only():
    classifier, model, inputs = build("tiny-t5", t5_wiring="encoder_output")
    seen: list[bool] = []
    handles = _record_graphs(classifier.backbone.get_decoder(), seen)
    model.train()
    torch.nn.functional.cross_entropy(model(**inputs), LABELS).backward()
    for handle in handles:
        handle.remove()
    assert any(seen), "the decoder must run with autograd on the corrected encoder output"
    assert all(p.grad is None for p in classifier.backbone.parameters())
    assert model.encoder_side.out.weight.grad.abs().sum() > 0  # reached through the decoder at step 0


def test_encoder_output_wiring_saves_more_activations_than_side_wiring():
    saved = {
        wiring: MethodStep(
            "read", "tiny-t5", batch_size=8, seq_len=32, method_config={"t5_wiring": wiring}
        ).saved_activation_bytes()
        for wiring in ("side", "encoder_output")
    }
    assert saved["encoder_output"] > saved["side"], saved  # the decoder's activations, kept for backward


STEP0 = [
    (preset, dict(config, **extra))
    for preset, config in CASES
    for extra in ({}, {"cell": "lstm", "init_state": "embedding", "aggregation": "mean"})
]


@pytest.mark.parametrize("preset, config", STEP0)
def test_step0_output_is_the_backbones(preset, config):
    classifier, model, inputs = build(preset, **config)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**inputs), classifier(**inputs))


@pytest.mark.parametrize("cell, aggregation, init_state", list(itertools.product(CELLS, AGGREGATIONS, INIT_STATES)))
def test_every_cell_aggregation_and_initial_state_trains(cell, aggregation, init_state):
    classifier, model, inputs = build("tiny-bert", cell=cell, aggregation=aggregation, init_state=init_state)
    assert isinstance(model.side.rnn, {"rnn": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[cell])
    assert (model.side.init is not None) == (init_state == "embedding")
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**inputs), classifier(**inputs))
    loss0 = torch.nn.functional.cross_entropy(model(**inputs), LABELS).item()
    train_steps(model, inputs, steps=5, lr=1e-3)
    model.eval()
    with torch.no_grad():
        logits = model(**inputs)
    assert not torch.allclose(logits, classifier(**inputs)), "the side network changed nothing"
    assert torch.nn.functional.cross_entropy(logits, LABELS).item() < loss0


@pytest.mark.parametrize("preset", ["tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("method", ["read", "lst"])
def test_decoder_only_logits_do_not_depend_on_padding_side(preset, method):
    logits = {}
    for side in ("left", "right"):
        classifier, model, inputs = build(preset, padding_side=side, method=method)
        torch.manual_seed(1)
        for name, param in model.named_parameters():  # leave the zero-initialised start: a trained side network
            if param.requires_grad and "out" in name or name.startswith("side.up"):
                torch.nn.init.normal_(param, std=0.2)
        assert (inputs["attention_mask"][:, 0] == 0).any() == (side == "left")
        model.eval()
        with torch.no_grad():
            logits[side], backbone_logits = model(**inputs), classifier(**inputs)
    assert not torch.allclose(logits["left"], backbone_logits), "the side network changed nothing"
    torch.testing.assert_close(logits["left"], logits["right"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "bad",
    [
        {"hidden_size": 0},
        {"cell": "transformer"},
        {"aggregation": "max"},
        {"init_state": "random"},
        {"t5_wiring": "cross"},
    ],
)
def test_bad_config_names_the_value(bad):
    from petlprof.errors import UsageError

    with pytest.raises(UsageError, match=repr(next(iter(bad.values()))).strip("'")):
        get_method("read").make_config(bad)
