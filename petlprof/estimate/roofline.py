"""Predicted time and energy of a traced step: a roofline per kernel on a device model, labelled *predicted*.

The trace (:mod:`petlprof.estimate.trace`) records each kernel of a counted pass as (FLOPs, bytes it reads and
writes, random numbers it draws).  On a :class:`DeviceModel` a kernel takes the longer of its compute time (FLOPs /
the device's achieved matrix throughput in the step's compute dtype, plus the numbers it draws x the device's cost of
one: a dropout mask on a CPU, where drawing costs about 6 ns a number and a LoRA step's masks were 6% of its time)
and its memory time (bytes / the achieved memory bandwidth), plus a fixed cost per kernel (dispatch and launch); a
phase's time is their sum, split into its compute-bound part, its memory-bound part and the per-kernel part, so a
reader sees which one the prediction rests on.  Energy is that time
times the device's power while busy.

A device model comes from ``petlprof calibrate`` (measured on this machine: :mod:`petlprof.estimate.calibrate`) or,
for a GPU without one, from the bundled table (:mod:`petlprof.estimate.gpus`) with the default efficiencies below,
and says which (``calibrated``).  Known misses: every kernel is assumed to run alone at the device's achieved rate
(small matrices run below it, fused kernels move fewer bytes than their parts), caches are ignored (a CPU's L2/L3
holds small models' activations, so memory-bound parts come out slow there), and the data loader, the Python around
the step and the optimiser's host work are not in the trace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict

from petlprof.estimate.gpus import Gpu
from petlprof.results.figures import ENERGY, ENERGY_PER_TOKEN, TIME, TOKENS_PER_S
from petlprof.sweep.resources import training_batches

# default efficiencies for a GPU without a profile: assumptions, stated in every prediction they make
GPU_MATMUL_EFFICIENCY = 0.6  # of the dense peak: large cuBLAS products reach more, a fine-tuning step's small ones less
GPU_BANDWIDTH_EFFICIENCY = 0.8  # of the nominal memory bandwidth (STREAM-like copies reach about this on HBM)
GPU_KERNEL_OVERHEAD_S = 6e-6  # PyTorch eager dispatch + CUDA launch per kernel, a few microseconds
GPU_BUSY_POWER_SHARE = 0.8  # of the board power (TDP) while a training step runs
DEFAULTS_SOURCE = (
    f"uncalibrated: the GPU table's peak x {GPU_MATMUL_EFFICIENCY:g} (matrix products), its bandwidth x "
    f"{GPU_BANDWIDTH_EFFICIENCY:g}, {GPU_KERNEL_OVERHEAD_S * 1e6:g} us a kernel, {GPU_BUSY_POWER_SHARE:g} x its "
    "TDP while busy (petlprof's assumptions; `petlprof calibrate` on the GPU measures them)"
)


@dataclass(frozen=True)
class DeviceModel:
    """What a prediction needs of a device: achieved matrix throughput per compute dtype (FLOP/s), memory bandwidth
    (bytes/s), a fixed cost per kernel (s), power while busy and idle (W), and where each came from."""

    name: str
    flops_per_s: dict[str, float]
    bytes_per_s: float
    kernel_overhead_s: float
    busy_w: float
    idle_w: float
    calibrated: bool
    source: str
    power_source: str
    random_s_per_number: float = 0.0  # drawing one random number (0: a draw costs its bytes, as on the GPU table)
    # time each matrix product of a step at its own shape on this machine (a CPU profile's; petlprof.estimate.products)
    measure_products: bool = False
    # (elements of a tensor, seconds the optimiser's work on one such tensor takes: gradient clipping and an AdamW step
    # as torch runs them on this device), measured by ``petlprof calibrate`` at a few sizes; empty: the roofline prices
    # the optimiser's kernels like any other
    optimizer_s: tuple[tuple[int, float], ...] = ()
    # seconds a byte of a fresh allocation costs on its first write beyond the write itself (a CPU maps large
    # allocations anew each time: petlprof.estimate.trace.FRESH_PAGES_BYTES); 0: none (a GPU's caching allocator)
    fresh_s_per_byte: float = 0.0

    def throughput(self, dtype: str) -> float:
        """Achieved FLOP/s in ``dtype`` (float32's where the model has no figure for it)."""
        return self.flops_per_s.get(dtype) or self.flops_per_s["float32"]

    def to_json(self) -> dict:
        return asdict(self)


def optimizer_time(numels: Sequence[int], table: Sequence[tuple[int, float]]) -> float:
    """Seconds clipping and an AdamW step take on tensors of ``numels`` elements, from the calibrated ``table`` of
    (elements, seconds a tensor): linear in the elements between two measured sizes (a fixed cost a tensor plus a
    cost an element, which grows where the tensors no longer fit the caches), the smallest size's time below it,
    and the largest size's time an element beyond it."""
    points = sorted(table)
    total = 0.0
    for n in numels:
        if n <= points[0][0]:
            total += points[0][1]
            continue
        if n >= points[-1][0]:
            total += points[-1][1] * n / points[-1][0]
            continue
        upper = next(i for i, (size, _) in enumerate(points) if size >= n)
        (n0, t0), (n1, t1) = points[upper - 1], points[upper]
        total += t0 + (t1 - t0) * (n - n0) / (n1 - n0)
    return total


def table_model(gpu: Gpu) -> DeviceModel:
    """A GPU of the bundled table with the default efficiencies: uncalibrated, and says so."""
    return DeviceModel(
        name=gpu.name,
        flops_per_s={
            "float32": gpu.fp32_tflops * 1e12 * GPU_MATMUL_EFFICIENCY,
            "bfloat16": gpu.bf16_tflops * 1e12 * GPU_MATMUL_EFFICIENCY,
            "float16": gpu.bf16_tflops * 1e12 * GPU_MATMUL_EFFICIENCY,
        },
        bytes_per_s=gpu.bandwidth_gb_s * 1e9 * GPU_BANDWIDTH_EFFICIENCY,
        kernel_overhead_s=GPU_KERNEL_OVERHEAD_S,
        busy_w=gpu.tdp_w * GPU_BUSY_POWER_SHARE,
        idle_w=0.0,
        calibrated=False,
        source=f"{DEFAULTS_SOURCE}; figures from {gpu.source}",
        power_source=f"{GPU_BUSY_POWER_SHARE:g} x TDP {gpu.tdp_w:g} W (assumed)",
    )


@dataclass(frozen=True)
class PhaseTime:
    """A phase's predicted time (s), split by what bounds each kernel, and its kernels."""

    time_s: float
    compute_bound_s: float
    memory_bound_s: float
    overhead_s: float
    kernels: int


# a kernel's (FLOPs, bytes read and written[, random numbers drawn[, a product's (batch, M, K, N)[, bytes of its new
# storages large enough to be fresh pages]]])
Cost = tuple
ProductRates = Mapping[tuple[int, ...], float]  # a matrix product's (batch, M, K, N) -> its achieved FLOP/s


def phase_time(
    op_costs: Sequence[Cost], device: DeviceModel, dtype: str, product_rates: ProductRates | None = None
) -> PhaseTime:
    """The roofline sum over a pass's kernels (see the module); a matrix product with a rate in ``product_rates``
    (measured at its shape) computes at that rate instead of the device's."""
    flops_per_s, bytes_per_s = device.throughput(dtype), device.bytes_per_s
    rates = product_rates or {}
    compute = memory = 0.0
    for cost in op_costs:
        flops, moved = cost[0], cost[1]
        drawn = cost[2] if len(cost) > 2 else 0
        rate = rates.get(cost[3], flops_per_s) if len(cost) > 3 else flops_per_s
        c = flops / rate + drawn * device.random_s_per_number
        m = moved / bytes_per_s
        if c >= m:
            compute += c
        else:
            memory += m
        if len(cost) > 4:
            memory += cost[4] * device.fresh_s_per_byte  # its new large storages' pages, faulted in as first written
    overhead = len(op_costs) * device.kernel_overhead_s
    return PhaseTime(compute + memory + overhead, compute, memory, overhead, len(op_costs))


@dataclass(frozen=True)
class Budget:
    """A training run's length as ``petlprof run`` reads its options: ``train_size`` examples in batches of
    ``batch_size`` (the last one short), ``epochs`` passes or ``max_steps`` optimiser steps (which override them, and
    need no ``train_size``), ``accumulation`` batches a step."""

    train_size: int | None
    epochs: int
    max_steps: int | None
    batch_size: int
    accumulation: int = 1

    def steps_and_batches(self) -> tuple[int, int]:
        """(optimiser steps, batches), as the run counts them (:func:`petlprof.sweep.resources.training_batches`)."""
        per_epoch = 0 if self.train_size is None else math.ceil(self.train_size / self.batch_size)
        return training_batches(per_epoch, self.epochs, self.max_steps, self.accumulation)


# figure-keyed parts (TIME.name, ENERGY.name, ...: their names are declared once, in petlprof.results.figures, which a
# TypedDict cannot list without spelling them again): plain dicts of numbers
TrainTotal = dict[str, float | int | None]  # the budget's fields, its steps and batches, its time (s) and energy (J)
GenerationPrediction = dict[str, float | int | dict[str, int]]  # tokens, time, rates, the decode step's shape


class TrainSplit(TypedDict):
    """Where a predicted training step's seconds go."""

    compute: float  # kernels bound by the matrix throughput
    memory: float  # kernels bound by the bandwidth
    kernels: float  # the kernels' fixed costs
    optimizer: float  # calibrated (0: priced in the roofline's parts)


class Predicted(TypedDict, total=False):
    """An estimate record's ``predicted`` block (:func:`prediction`), with the LM objective's ``generation`` and,
    where a run length is given, the run's ``train_total``."""

    kind: str  # "predicted": never a measurement
    device: str
    calibrated: bool
    model: str  # where the device model came from
    power_source: str
    train_step_s: float
    train_step_energy_j: float
    inference_batch_s: float
    train_split_s: TrainSplit
    train_kernels: int
    products_timed_at_their_shapes: int
    generation: GenerationPrediction
    train_total: TrainTotal


def train_total(predicted: Predicted, budget: Budget) -> TrainTotal:
    """The predicted training time (s) and energy (J) of ``budget``: each batch priced as ``predicted``'s step prices
    one of its micro-batches (its time over the batches a step accumulates), an epoch's short last batch as a full
    one (an upper bound by at most one batch an epoch); the warm-up steps are among the steps, as in a run."""
    steps, batches = budget.steps_and_batches()
    share = batches / budget.accumulation  # optimiser steps' worth of batches: the last step may be short of some
    return {
        **asdict(budget),
        "optimiser_steps": steps,
        "batches": batches,
        TIME.name: predicted["train_step_s"] * share,
        ENERGY.name: predicted["train_step_energy_j"] * share,
    }


@dataclass(frozen=True)
class DecodeStep:
    """What one step of greedy generation (a new token for each of ``batch`` rows) reads and computes, at a position:
    ``weights_bytes`` (every weight a token passes, read once a step whatever the batch), ``flops_per_row`` (2 per
    weight of each linear layer it passes, and an encoder-decoder's cross-attention over the prompt),
    ``attention_flops_per_position`` (a row's QK and AV products over one position of its own sequence: a step at
    position p attends to p + 1, itself included), ``kv_bytes_per_position`` (the batch's cached keys and values of
    one position), ``fixed_bytes`` (an encoder-decoder's cross-attention cache, read every step), ``kernels`` (a
    forward pass's), ``prompt_length`` (positions cached before the first step: a decoder's prompt; an
    encoder-decoder's decoder starts empty)."""

    weights_bytes: int
    flops_per_row: int
    attention_flops_per_position: int
    kv_bytes_per_position: int
    fixed_bytes: int
    kernels: int
    batch: int
    prompt_length: int
    target_length: int


def generation(step: DecodeStep, device: DeviceModel, dtype: str) -> GenerationPrediction:
    """Greedy decoding of ``target_length`` tokens after the prompt, on the roofline: each step takes the longer of its
    FLOPs / the matrix throughput and its bytes (weights, the KV cache up to its position) / the bandwidth, plus its
    kernels' fixed cost, summed over the steps; tokens per second and joules per token over the whole generation.
    The prompt's own forward pass (prefill) is not in it: it is one evaluation batch."""
    flops_per_s, bytes_per_s = device.throughput(dtype), device.bytes_per_s
    total = memory_bound = 0.0
    for position in range(step.prompt_length, step.prompt_length + step.target_length):
        flops = step.batch * (step.flops_per_row + step.attention_flops_per_position * (position + 1))
        moved = step.weights_bytes + step.kv_bytes_per_position * position + step.fixed_bytes
        compute, memory = flops / flops_per_s, moved / bytes_per_s
        memory_bound += memory > compute
        total += max(compute, memory) + step.kernels * device.kernel_overhead_s
    tokens = step.batch * step.target_length
    return {
        "tokens": tokens,
        TIME.name: total,
        TOKENS_PER_S.name: tokens / total if total else math.inf,
        ENERGY_PER_TOKEN.name: total * device.busy_w / tokens if tokens else 0.0,
        "memory_bound_steps": int(memory_bound),
        "step": asdict(step),
    }


def prediction(
    train_costs: Sequence[Cost],
    inference_costs: Sequence[Cost],
    device: DeviceModel,
    dtype: str,
    product_rates: ProductRates | None = None,
    optimizer: tuple[int, Sequence[int]] | None = None,
) -> Predicted:
    """The record's ``predicted`` block: train step and evaluation batch times (s) with their split, and the train
    step's energy (J), on ``device``, every figure predicted (matrix products at ``product_rates`` where given).
    ``optimizer``: (the optimiser's kernels at the end of ``train_costs``, the elements of each tensor it updates),
    priced from the device's calibrated optimiser times where it has them (:func:`optimizer_time`) instead of by
    the roofline, whose bandwidth (a large copy's) its element-wise passes do not reach: at smollm2's tensors a
    real AdamW step took 0.40 s where the roofline priced 0.22 s."""
    optimizer_s = 0.0
    if optimizer is not None and device.optimizer_s and optimizer[0] <= len(train_costs):
        kernels, numels = optimizer
        train_costs = train_costs[: len(train_costs) - kernels]
        optimizer_s = optimizer_time(numels, device.optimizer_s)
    train = phase_time(train_costs, device, dtype, product_rates)
    train = PhaseTime(
        train.time_s + optimizer_s, train.compute_bound_s, train.memory_bound_s, train.overhead_s, train.kernels
    )
    infer = phase_time(inference_costs, device, dtype, product_rates)
    return {
        "kind": "predicted",
        "device": device.name,
        "calibrated": device.calibrated,
        "model": device.source,
        "power_source": device.power_source,
        "train_step_s": train.time_s,
        "train_step_energy_j": train.time_s * device.busy_w,
        "inference_batch_s": infer.time_s,
        "train_split_s": {
            "compute": train.compute_bound_s,
            "memory": train.memory_bound_s,
            "kernels": train.overhead_s,
            "optimizer": optimizer_s,  # calibrated (0: priced in the roofline's parts)
        },
        "train_kernels": train.kernels,
        "products_timed_at_their_shapes": len(product_rates or {}),
    }
