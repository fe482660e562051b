"""Cost benchmarks and regression checks for every registered method.

Timings go to pytest-benchmark (for information and its JSON output); what is *asserted* against
``petlprof-baseline.json`` is deterministic (trainable parameters, saved-activation and training
tensor bytes) or a ratio of two timings taken in alternation in this process.
Refresh the baseline: ``pytest tests/benchmarks --petlprof-update-baseline``.
"""

from __future__ import annotations

import statistics
import time

import pytest

from petlprof.bench import MethodStep, time_alternating
from petlprof.meters import Window, energy_meter_for, memory_meter_for
from petlprof.meters.memory import release_free_memory
from petlprof.registry import method_names

METHODS = method_names()
SMALL = {"backbone": "tiny-bert", "batch_size": 8, "seq_len": 32}
REAL = {"backbone": "minilm", "num_layers": 2, "batch_size": 16, "seq_len": 64}  # the pretrained slice


def _extra_info(benchmark, step: MethodStep) -> None:
    profile = step.profile()
    benchmark.extra_info.update(profile.figures())
    meters = [energy_meter_for(step.device), memory_meter_for(step.device)]
    with Window(meters, step.device) as window:
        step.train_step()
    reading = window.reading
    benchmark.extra_info.update(peak_memory_bytes=reading["peak_memory_bytes"],
                                memory_source=reading["memory_source"],
                                energy_j=reading["energy_j"], energy_kind=reading["energy_kind"])
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


def test_meter_overhead(petlprof_bench, record_property):
    """Time inside a 3-step training window with the energy and memory meters on, against off.

    The meters' preparation (garbage collection, returning freed memory to the OS, resetting the
    RSS peak) runs before the window opens; it is recorded here but is not part of any figure.
    """
    step = MethodStep("full", **REAL)
    inside: dict[str, list[float]] = {"on": [], "off": []}
    prepare_s = []

    def phase(mode: str):
        def run():
            meters = [energy_meter_for(step.device), memory_meter_for(step.device)] if mode == "on" else []
            release_free_memory()  # both modes start from the same heap: the comparison is of the meters alone
            window = Window(meters, step.device)
            t0 = time.perf_counter()
            with window:
                for _ in range(3):
                    step.train_step()
            inside[mode].append(window.time_s)
            if mode == "on":
                prepare_s.append(time.perf_counter() - t0 - window.time_s)
        return run

    time_alternating({"on": phase("on"), "off": phase("off")}, rounds=4, warmup=1)
    ratio = statistics.median(inside["on"]) / statistics.median(inside["off"])
    record_property("meters on/off (time inside the window)", ratio)
    record_property("meter preparation before the window (s)", statistics.median(prepare_s))
    petlprof_bench.check_value("meters/on_over_off/window_time_ratio", ratio, rtol=0.25)


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
