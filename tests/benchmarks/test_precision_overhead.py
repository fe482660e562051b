"""What ``--precision``'s machinery costs an fp32 run, where it does nothing.

Every training step runs through the precision hooks whatever the precision: the forward pass
under ``recipe.autocast`` (a null context at fp32), the backward pass under ``kernels_checked`` (a
``try`` that re-raises), and ``torch.amp.GradScaler`` disabled (``scale`` returns the loss,
``unscale_``/``update`` return at once, ``step`` calls the optimiser's).  The target: under 1% of the
offline default's training step.

Measured directly, as the meter-overhead benchmark measures a meter's work: the CPU time of the
hooks' sequence for one step, over many repetitions, with an optimiser whose ``step`` does nothing
(so the whole cost of ``GradScaler.step`` counts as overhead, a conservative bound), set against the
CPU time of a real step (BitFit on the pretrained 2-layer MiniLM slice, batch 16 x 64, one intra-op
thread).  No subtraction of two noisy timings: the hooks' time is measured alone.
"""

from __future__ import annotations

import statistics
import time

import torch

from petlprof.bench.profile import MethodStep
from petlprof.run.recipe import TrainRecipe

TARGET_OVERHEAD = 0.01
HOOK_REPEATS = 2000
STEP_REPEATS = 5


class _NoStep(torch.optim.Optimizer):
    """An optimiser whose step does no work: what remains of ``scaler.step`` is the scaler's own cost."""

    def __init__(self, params):
        super().__init__(params, {})

    def step(self, closure=None):
        return None


def _hooks_cpu_s(recipe: TrainRecipe) -> float:
    """CPU seconds per step of the precision hooks around a step, at ``recipe``'s precision."""
    weight = torch.zeros(4, requires_grad=True)
    optimizer, scaler = _NoStep([weight]), recipe.scaler("cpu")
    loss = weight.sum()
    start = time.process_time()
    for _ in range(HOOK_REPEATS):
        with recipe.autocast("cpu"):
            pass
        with recipe.kernels_checked("cpu"):
            scaled = scaler.scale(loss)
        scaler.unscale_(optimizer)
        scale = scaler.get_scale()
        _ = scaler.is_enabled() and scale > 1
        scaler.step(optimizer)
        scaler.update()
    del scaled
    return (time.process_time() - start) / HOOK_REPEATS


def _step_cpu_s() -> float:
    step = MethodStep("bitfit", "minilm", num_layers=2, batch_size=16, seq_len=64)
    step.train_step()  # warm-up
    times = []
    for _ in range(STEP_REPEATS):
        start = time.process_time()
        step.train_step()
        times.append(time.process_time() - start)
    return statistics.median(times)


def test_fp32_pays_under_one_percent_for_the_precision_hooks(record_property):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hooks_s, step_s = _hooks_cpu_s(TrainRecipe(lr=1e-3)), _step_cpu_s()
    finally:
        torch.set_num_threads(threads)
    overhead = hooks_s / step_s
    print(
        f"\nfp32 precision hooks: {hooks_s * 1e6:.1f} us CPU per step; BitFit step on 2-layer MiniLM 16 x 64: "
        f"{step_s * 1e3:.1f} ms CPU; overhead {overhead:.4%} (target < {TARGET_OVERHEAD:.0%})"
    )
    record_property("fp32_precision_hooks_us", hooks_s * 1e6)
    record_property("fp32_precision_overhead", overhead)
    assert overhead < TARGET_OVERHEAD
