"""The kernels a real run's device would pick, for the operations whose meta path differs from them.

A few composite operations choose their kernel by the device of their tensors, and meta is neither a
CPU nor a GPU, so on meta they take a generic path that a real run does not:

* ``F.scaled_dot_product_attention`` takes the *math* path on meta: it materialises the
  ``batch x heads x length x length`` scores and keeps them for backward.  A real run picks a fused
  kernel where its checks pass (flash attention, memory-efficient attention), which keeps only the
  output and a log-sum-exp per query.  At length 64 the difference is already 15% of an inference
  peak; at length 4096 it is most of it.
* the recurrent layers (``nn.RNN``, ``nn.GRU``) run the input projection step by step on meta; on a
  CPU, torch projects the whole sequence at once before the steps (``FullLayer`` in
  ``aten/src/ATen/native/RNN.cpp``), which holds ``steps x batch x gates`` bytes at once.

:class:`DeviceKernels` is a ``TorchFunctionMode`` that sends these calls, when their tensors are meta,
to the kernel the target device would run (torch's meta kernels of the fused attention operations
give their outputs' shapes and autograd saves what their backward needs):

* **cpu**: attention by torch's own CPU choice (``torch._fused_sdp_choice`` asked about real
  zero-stride stand-ins of the same shapes, strides' last entry, dtypes and mask), so the choice is
  exact; ``nn.RNN`` and ``nn.GRU`` by ``FullLayer``'s order of operations (below, :func:`_cpu_rnn`);
  ``nn.LSTM`` runs oneDNN's ``mkldnn_rnn_layer``, whose meta kernel gives no size to its workspace (the
  largest part of an LSTM's training bytes on a CPU), so it raises :class:`UntraceableError` and the
  estimate takes the exact fallback on real tensors (:mod:`petlprof.estimate.fallback`).
* **cuda**: attention by the checks of ``sdp_utils.cpp`` for an sm80+ GPU (A100, H100, H200) in
  torch's priority order: flash attention (fp16/bf16, no mask, head size <= 256), else memory-efficient
  attention (head size a multiple of 8 at fp16/bf16, of 4 at fp32; no grouped-query heads), else math.
  This is a copy of the rules, not yet checked on a GPU.  Recurrent layers keep the meta path (a GPU run
  uses cuDNN, whose workspace is not modelled).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from petlprof.estimate.autocast import policy_device

FLASH, EFFICIENT, MATH = "flash", "efficient", "math"
_HALF = (torch.float16, torch.bfloat16)
_CPU_BACKENDS = {1: FLASH, 2: EFFICIENT}  # torch._fused_sdp_choice's numbers (sdp::SDPBackend); else math
_RNN_CELLS = {"rnn_tanh": "tanh", "rnn_relu": "relu", "gru": "gru"}


class UntraceableError(RuntimeError):
    """An operation of the step has no meta kernel (or needs a value only a real tensor has)."""


class DeviceKernels(TorchFunctionMode):
    """Runs meta attention and recurrent layers with the kernels ``device`` (``cpu`` or ``cuda``) would pick;
    ``force``: the attention kernel every call runs (``flash``: ``--attention flash``), else the device's choice.
    ``attention_kernels``: the attention kernels the calls under it ran."""

    def __init__(self, device: str = "cuda", force: str | None = None):
        super().__init__()
        self.device = policy_device(device)
        self.force = force
        self.attention_kernels: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and _is_meta(args[0] if args else kwargs.get("query")):
            backend = self.force or backend_for(self.device, *args, **kwargs)
            self.attention_kernels.add(backend)
            return attention(self.device, *args, force=backend, **kwargs)
        name = getattr(func, "__name__", "")
        if name == "lstm" and self.device == "cpu" and args and _is_meta(args[0]):
            raise UntraceableError("a CPU runs nn.LSTM by oneDNN (mkldnn_rnn_layer): its workspace has no meta size")
        cell = _RNN_CELLS.get(name)
        if cell and self.device == "cpu" and len(args) == 9 and _is_meta(args[0]) and not kwargs:
            args = list(args)
            out = _cpu_rnn(cell, args)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _cpu_flash_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _gemm_4bit_flops(a_shape, b_shape, shape_b, *args, **kwargs) -> int:
    """A bitsandbytes 4-bit layer's product: input (..., K) times the dequantised (N, K) weight, as ``mm``."""
    return 2 * math.prod(a_shape) * int(shape_b[0])


def _int8_flops(a_shape, b_shape, *args, **kwargs) -> int:
    """An LLM.int8() product: the int8 input (..., K) times the int8 (N, K) weight, as ``mm``."""
    return 2 * math.prod(a_shape) * int(b_shape[0])


def _int8_mixed_flops(a_shape, int8_a_shape, b_shape, *args, **kwargs) -> int:
    """LLM.int8() with outlier columns: the same product, its columns split between int8 and float."""
    return _int8_flops(a_shape, b_shape)


def flop_counter() -> FlopCounterMode:
    """torch's FLOP counter, taught the CPU flash attention kernel (it counts the GPU ones only), with the
    same formulas as the GPU kernels: the products of the scores and of the output, and in backward
    their gradients and the recomputed scores; and, once bitsandbytes is imported, its layers' fused products
    (``gemm_4bit``: the product of the dequantised weight, whose backward is a plain ``matmul``; the int8
    products LLM.int8() runs without gradients)."""
    aten = torch.ops.aten
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
    }
    if "bitsandbytes" in sys.modules:
        bnb = torch.ops.bitsandbytes
        mapping.update({bnb.gemm_4bit: _gemm_4bit_flops, bnb.int8_scaled_mm: _int8_flops})
        mapping[bnb.int8_mixed_scaled_mm] = _int8_mixed_flops
    return FlopCounterMode(display=False, custom_mapping=mapping)


def flop_formulas() -> dict[torch._ops.OpOverloadPacket, Callable[..., int]]:
    """The formulas :func:`flop_counter` counts by: operation packet -> FLOPs of a call (its arguments and
    ``out_val``, its output); :class:`petlprof.estimate.trace.MetaTrace` counts by them itself."""
    return flop_counter().flop_registry


def _is_meta(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


def attention(
    device: str,
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    force: str | None = None,
    **extra,
):
    """``F.scaled_dot_product_attention`` on meta tensors by the kernel ``device`` would run (``force``: that
    kernel, whatever the device's checks say)."""
    mask = _float_mask(attn_mask, query.dtype)
    backend = force or backend_for(device, query, key, value, attn_mask, dropout_p, is_causal, scale, **extra)
    if backend == FLASH and device == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale
        )[0]
    if backend == FLASH:
        return _cuda_flash(query, key, value, dropout_p, is_causal, scale)
    if backend == EFFICIENT:
        grad = any(t.requires_grad for t in (query, key, value)) and torch.is_grad_enabled()
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, mask, grad, dropout_p, is_causal, scale=scale
        )[0]
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **extra
    )


def backend_for(device: str, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **extra):
    """The attention kernel ``device`` picks for these arguments: flash, efficient or math."""
    with _disable_current_modes():  # the float mask it looks at is not the step's memory (attention makes its own)
        mask = _float_mask(attn_mask, query.dtype)
    args = (query, key, value, mask, dropout_p, is_causal, scale)
    enable_gqa = bool(extra.get("enable_gqa", False))
    return _cpu_backend(*args, enable_gqa) if device == "cpu" else cuda_backend(*args, enable_gqa)


def _float_mask(mask, dtype: torch.dtype):
    """A boolean mask becomes an additive one of the query's dtype, as ``convert_boolean_attn_mask`` does."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), float("-inf"), torch.zeros((), dtype=dtype, device=mask.device))


def _stand_in(tensor: torch.Tensor) -> torch.Tensor:
    """A real CPU tensor of ``tensor``'s shape, dtype and last stride on a storage of one row."""
    last = tensor.shape[-1] if tensor.dim() else 1
    row = torch.empty(last, 2 if tensor.dim() and tensor.stride(-1) != 1 else 1, dtype=tensor.dtype)[:, 0]
    return row.expand(tensor.shape) if tensor.dim() else row[0]


def _cpu_backend(query, key, value, mask, dropout_p, is_causal, scale, enable_gqa) -> str:
    """torch's own choice for CPU tensors like these (the choice reads shapes, strides and dtypes only)."""
    with _disable_current_modes():  # the stand-ins are not the step's memory
        choice = torch._fused_sdp_choice(
            _stand_in(query),
            _stand_in(key),
            _stand_in(value),
            None if mask is None else _stand_in(mask),
            dropout_p,
            is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    return _CPU_BACKENDS.get(int(choice), MATH)


def cuda_backend(query, key, value, mask, dropout_p, is_causal, scale, enable_gqa) -> str:
    """The kernel an sm80+ GPU runs (``sdp_utils.cpp``'s checks in its priority order; see the module docstring)."""
    dims = {t.dim() for t in (query, key, value)}
    head, value_head = query.shape[-1], value.shape[-1]
    if dims != {4} or query.dtype not in (*_HALF, torch.float32) or key.shape[-1] != head:
        return MATH
    if query.dtype in _HALF and mask is None and head <= 256 and value_head == head:
        return FLASH
    alignment = 8 if query.dtype in _HALF else 4
    same_heads = query.shape[1] == key.shape[1] == value.shape[1]
    if head % alignment == 0 and value_head % alignment == 0 and (same_heads or not enable_gqa):
        return EFFICIENT
    return MATH


def _cuda_flash(query, key, value, dropout_p, is_causal, scale):
    """CUDA flash attention: head sizes padded to a multiple of 8 and the output cut back, as torch does."""
    head = query.shape[-1]
    pad = -head % 8
    if pad:
        query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
    scale = head**-0.5 if scale is None else scale
    out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
    return out[..., :head] if pad else out


def _cpu_rnn(cell: str, args: list):
    """``torch.rnn_tanh/rnn_relu/gru`` as ATen runs them on a CPU: each layer projects the whole input
    sequence at once (``linear_ih``), then runs the cells on the projections one step at a time; each
    intermediate is dropped where ATen drops it (the projection after the layer's outputs are stacked,
    the initial state after the final states are).  ``args`` (emptied, so that no reference outlives
    ATen's): the operation's arguments.  None (the meta path runs) where that order is not copied here:
    bidirectional, dropout between layers."""
    input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
    if bidirectional or (dropout and train and num_layers > 1) or not input.numel():
        return None
    args.clear()
    if batch_first:
        input = input.transpose(0, 1)
    per_layer = 4 if has_biases else 2
    hiddens, finals = hx.unbind(0), []
    del hx
    for layer in range(num_layers):
        w_ih, w_hh, *biases = params[layer * per_layer : (layer + 1) * per_layer]
        b_ih, b_hh = biases if has_biases else (None, None)
        steps = F.linear(input, w_ih, b_ih).unbind(0)
        hidden, outputs = hiddens[layer], []
        for step in steps:
            hidden = _cell(cell, step, hidden, w_hh, b_hh)
            outputs.append(hidden)
        input = torch.stack(outputs, 0)
        del steps, step, outputs
        finals.append(hidden)
    final = torch.stack(finals, 0)
    del hiddens, hidden, finals
    return (input.transpose_(0, 1) if batch_first else input), final


def _cell(cell: str, gates_in, hidden, w_hh, b_hh):
    """One step of ATen's ``SimpleCell`` / ``GRUCell`` on a precomputed input projection, op for op."""
    if cell in ("tanh", "relu"):
        gates = F.linear(hidden, w_hh, b_hh).add_(gates_in)
        return torch.tanh(gates) if cell == "tanh" else torch.relu(gates)
    i_r, i_z, i_n = gates_in.unsafe_chunk(3, 1)
    h_r, h_z, h_n = F.linear(hidden, w_hh, b_hh).unsafe_chunk(3, 1)
    reset = h_r.add_(i_r).sigmoid_()
    update = h_z.add_(i_z).sigmoid_()
    new = i_n.add(h_n.mul_(reset)).tanh_()
    return (hidden - new).mul_(update).add_(new)
