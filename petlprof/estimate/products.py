"""Matrix products timed at the shapes a traced step runs them, on this machine's CPU.

``petlprof calibrate`` measures the device's matrix throughput on large square products, which small and skinny
products do not reach: on this project's 2-core CPU a LoRA step of ``smollm2`` ran its rank-8 products at 18-64
GFLOP/s and its 49,152-wide LM head at 69-96, against 178 calibrated, so its 777 products took 0.83-0.93 s where the
calibrated rate priced 0.72 s; timed at their own shapes they came to 0.89 s.  :func:`product_rates` times each
distinct (batch, M, K, N) of a step once per process (random contiguous operands, the threads a run uses, repeated
as calibrate repeats its square products), for a :class:`~petlprof.estimate.roofline.DeviceModel` that asks for it (a
CPU profile); a product of more than :data:`MAX_TIMED_FLOP` runs at the calibrated rate, as large products do, so an
estimate of a 7B model stays fast.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch

from petlprof.estimate.calibrate import repeat_timed

MAX_TIMED_FLOP = 2e9  # larger products reach the calibrated rate (and take too long to time)
TIMED_S = 0.03  # each shape is repeated for at least this long


def product_rates(op_costs: Iterable[tuple], dtype: str) -> dict[tuple[int, ...], float]:
    """(batch, M, K, N) -> achieved FLOP/s on this CPU, for each product of ``op_costs`` (a trace's kernels) small
    enough to time; ``dtype``: the step's compute dtype."""
    shapes = {cost[3] for cost in op_costs if len(cost) > 3 and cost[3]}
    return {shape: _rate(shape, dtype) for shape in shapes if 2 * math.prod(shape) <= MAX_TIMED_FLOP}


@functools.cache
def _rate(shape: tuple[int, ...], dtype: str) -> float:
    """FLOP/s of products of ``shape`` in ``dtype``, timed as calibrate times its square ones."""
    batch, m, k, n = shape
    a = torch.randn(batch, m, k, dtype=getattr(torch, dtype))
    b = torch.randn(batch, k, n, dtype=getattr(torch, dtype))
    if batch == 1:  # an mm, not a bmm of one
        a, b = a[0], b[0]
    count, elapsed = repeat_timed(lambda: a @ b, "cpu", TIMED_S)
    return 2 * math.prod(shape) * count / elapsed
