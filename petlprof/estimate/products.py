"""Matrix products timed at the shapes a traced step runs them, on this machine's CPU.

``petlprof calibrate`` measures the device's matrix throughput on large square products, which small and skinny
products do not reach: on this project's 2-core CPU a LoRA step of ``smollm2`` ran its rank-8 products at 18-64
GFLOP/s and its 49,152-wide LM head at 69-96, against 178 calibrated, so its 777 products took 0.83-0.93 s where the
calibrated rate priced 0.72 s; timed at their own shapes they came to 0.89 s.  :func:`product_rates` times each
distinct (batch, M, K, N) of a step once per process (random contiguous operands, the threads a run uses, repeated
as calibrate repeats its square products), for a :class:`~petlprof.estimate.roofline.DeviceModel` that asks for it (a
CPU profile); a product of more than :data:`MAX_TIMED_FLOP` runs at the calibrated rate, as large products do, so an
estimate of a 7B model stays fast.

CPU flash attention is timed the same way, forward and backward at each distinct shape (its keys from
:func:`petlprof.estimate.trace._timed_shape`): priced at the calibrated product rate, LST's step on MiniLM (batch 32 x
64 tokens) came to 6 ms of attention where it ran 42 ms (``torch.profiler``, 12 forward and 6 backward calls), the
largest part of that step's 0.70 predicted / measured.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from petlprof.estimate.calibrate import repeat_timed
from petlprof.estimate.trace import SDPA, SDPA_BACKWARD

MAX_TIMED_FLOP = 2e9  # larger products reach the calibrated rate (and take too long to time)
TIMED_S = 0.03  # each shape is repeated for at least this long


def product_rates(op_costs: Iterable[tuple], dtype: str) -> dict[tuple, float]:
    """A kernel's shape key -> achieved FLOP/s on this CPU, for each matrix product (batch, M, K, N) and CPU flash
    attention call of ``op_costs`` (a trace's kernels) small enough to time; ``dtype``: the step's compute dtype."""
    shapes = {cost[3] for cost in op_costs if len(cost) > 3 and cost[3]}
    return {shape: _rate(shape, dtype) for shape in shapes if 0 < _flops(shape) <= MAX_TIMED_FLOP}


def _flops(shape: tuple) -> int:
    """The FLOPs the trace counts for the kernel of ``shape`` (the formulas :mod:`petlprof.estimate.kernels` uses)."""
    if shape[0] == SDPA:
        return sdpa_flop_count(*shape[1:4])
    if shape[0] == SDPA_BACKWARD:
        return sdpa_backward_flop_count(_attention_output(shape), *shape[1:4])
    return 2 * math.prod(shape)


def _attention_output(shape: tuple) -> tuple[int, ...]:
    """The output's shape of an attention key: the query's, with the value's last dimension."""
    return (*shape[1][:-1], shape[3][-1])


@functools.cache
def _rate(shape: tuple, dtype: str) -> float:
    """FLOP/s of the kernel of ``shape`` in ``dtype``, timed as calibrate times its square products."""
    if shape[0] in (SDPA, SDPA_BACKWARD):
        kernel = _attention(shape, getattr(torch, dtype))
        count, elapsed = repeat_timed(kernel, "cpu", TIMED_S)
        return _flops(shape) * count / elapsed
    batch, m, k, n = shape
    a = torch.randn(batch, m, k, dtype=getattr(torch, dtype))
    b = torch.randn(batch, k, n, dtype=getattr(torch, dtype))
    if batch == 1:  # an mm, not a bmm of one
        a, b = a[0], b[0]
    count, elapsed = repeat_timed(lambda: a @ b, "cpu", TIMED_S)
    return 2 * math.prod(shape) * count / elapsed


def _attention(shape: tuple, dtype: torch.dtype):
    """A call of the CPU flash attention kernel (forward, or backward of one forward) at ``shape``, on random inputs
    (an additive mask of zeros where the traced call had a mask)."""
    kind, query, key, value, mask, dropout, causal = shape
    q, k, v = (torch.randn(*s, dtype=dtype) for s in (query, key, value))
    options = {"attn_mask": None if mask is None else torch.zeros(*mask, dtype=dtype)}
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if kind == SDPA:
        return lambda: forward(q, k, v, dropout, causal, **options)
    out, logsumexp = forward(q, k, v, dropout, causal, **options)
    grad = torch.randn_like(out)
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    return lambda: backward(grad, q, k, v, out, logsumexp, dropout, causal, **options)
