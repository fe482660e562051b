"""Matrix products timed at the shapes a traced step runs them, on this machine's CPU.

``petlprof calibrate`` measures the device's matrix throughput on large square products, which small and skinny
products do not reach: on this project's 2-core CPU a LoRA step of ``smollm2`` ran its rank-8 products at 18-64
GFLOP/s and its 49,152-wide LM head at 69-96, against 178 calibrated, so its 777 products took 0.83-0.93 s where the
calibrated rate priced 0.72 s; timed at their own shapes they came to 0.89 s.  :func:`product_rates` times each
distinct (batch, M, K, N) of a step once per process (random float operands, contiguous, the threads a run uses), for
a :class:`~petlprof.estimate.roofline.DeviceModel` that asks for it (a CPU profile); a product of more than
:data:`MAX_TIMED_FLOP` runs at the calibrated rate, as large products do, so an estimate of a 7B model stays fast.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable

import torch

MAX_TIMED_FLOP = 2e9  # larger products reach the calibrated rate (and take too long to time)
TIMED_S = 0.03  # each shape is repeated for at least this long
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def product_rates(op_costs: Iterable[tuple], dtype: str) -> dict[tuple[int, ...], float]:
    """(batch, M, K, N) -> achieved FLOP/s on this CPU, for each product of ``op_costs`` (a trace's kernels) small
    enough to time; ``dtype``: the step's compute dtype."""
    shapes = {cost[3] for cost in op_costs if len(cost) > 3 and cost[3]}
    return {shape: _rate(shape, dtype) for shape in shapes if 2 * _elements(shape) <= MAX_TIMED_FLOP}


def _elements(shape: tuple[int, ...]) -> int:
    batch, m, k, n = shape
    return batch * m * k * n


@functools.cache
def _rate(shape: tuple[int, ...], dtype: str) -> float:
    """FLOP/s of one product of ``shape`` in ``dtype``: the best of repeated timings after a warm-up."""
    batch, m, k, n = shape
    torch_dtype = DTYPES.get(dtype, torch.float32)
    a = (
        torch.randn(batch, m, k, dtype=torch_dtype).squeeze(0)
        if batch == 1
        else torch.randn(batch, m, k, dtype=torch_dtype)
    )
    b = (
        torch.randn(batch, k, n, dtype=torch_dtype).squeeze(0)
        if batch == 1
        else torch.randn(batch, k, n, dtype=torch_dtype)
    )
    product = torch.matmul
    product(a, b)  # warm-up: the kernel's first call pays its setup
    best = float("inf")
    deadline = time.perf_counter() + TIMED_S
    while True:
        start = time.perf_counter()
        product(a, b)
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() >= deadline:
            break
    return 2 * _elements(shape) / max(best, 1e-9)
