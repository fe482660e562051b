"""Cost benchmarks and regression checks for every registered method.

Timings go to pytest-benchmark (for information and its JSON output); what is *asserted* against
``petlprof-baseline.json`` is deterministic (trainable parameters, saved-activation and training
tensor bytes) or a ratio of two timings taken in alternation in this process.
Refresh the baseline: ``pytest tests/benchmarks --petlprof-update-baseline``.
"""

from __future__ import annotations

import pytest

from petlprof.bench.profile import MethodStep
from petlprof.meters import Window, energy_meter_for, memory_meter_for
from petlprof.registry import get_method, method_names

METHODS = [name for name in method_names() if "classification" in get_method(name).objectives]  # these shapes classify
SMALL = {"backbone": "tiny-bert", "batch_size": 8, "seq_len": 32}
REAL = {"backbone": "minilm", "num_layers": 2, "batch_size": 16, "seq_len": 64}  # the pretrained slice


def _extra_info(benchmark, step: MethodStep) -> None:
    profile = step.profile()
    benchmark.extra_info.update(profile.figures())
    meters = [energy_meter_for(step.device), memory_meter_for(step.device)]
    with Window(meters, step.device) as window:
        step.train_step()
    reading = window.reading
    benchmark.extra_info.update(
        peak_memory_bytes=reading["peak_memory_bytes"],
        memory_source=reading["memory_source"],
        energy_j=reading["energy_j"],
        energy_kind=reading["energy_kind"],
    )
    return profile


@pytest.mark.parametrize("method", METHODS)
def test_train_step(benchmark, petlprof_bench, method):
    step = MethodStep(method, **SMALL)
    profile = _extra_info(benchmark, step)
    benchmark.pedantic(step.train_step, rounds=10, warmup_rounds=2)
    petlprof_bench.check(profile)


@pytest.mark.parametrize("method", METHODS)
def test_inference_batch(benchmark, method):
    step = MethodStep(method, **SMALL)
    benchmark.extra_info["trainable_params"] = sum(p.numel() for p in step.params)
    benchmark.pedantic(step.infer_batch, rounds=10, warmup_rounds=2)


@pytest.mark.parametrize("method", ["read", "full"])
def test_real_backbone_figures(petlprof_bench, method):
    """READ's saved activations on the pretrained slice: back-propagating through the backbone
    would multiply them (and its trainable parameters)."""
    petlprof_bench.check(MethodStep(method, **REAL).profile())


def test_read_step_time_ratio_to_full(petlprof_bench, record_property):
    real = {k: v for k, v in REAL.items() if k != "backbone"}
    ratio = petlprof_bench.check_ratio("read", "full", backbone="minilm", rounds=8, **real)
    record_property("read/full step time", ratio)
    assert ratio < 1.0, f"READ's step is not cheaper than full fine-tuning's: {ratio:.2f}x"


def test_read_side_network_step(benchmark):
    """The READ side network alone (forward + backward) on the hidden states of the real slice."""
    step = MethodStep("read", **REAL)
    stack, side = step.model.backbone_states(**step.inputs)["layers"], step.model.side
    params = [p for p in side.parameters() if p.requires_grad]

    def side_step():
        side(stack, step.inputs["attention_mask"].bool()).sum().backward()
        for p in params:
            p.grad = None

    benchmark.extra_info["side_network_params"] = sum(p.numel() for p in params)
    benchmark.pedantic(side_step, rounds=20, warmup_rounds=3)
