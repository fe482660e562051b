"""The kernels an estimate assumes a device runs (``petlprof.estimate.kernels``): torch's own CPU attention
choice, the copied CUDA rules, the CPU recurrent layers' order of operations, and their FLOPs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from petlprof.estimate import kernels
from petlprof.estimate.kernels import EFFICIENT, FLASH, MATH, attention, cuda_backend, flop_counter

# (query shape, key/value shape, dtype, mask: None | "bool" | "float", dropout, causal, grouped-query heads)
ATTENTION = [
    ((2, 4, 16, 32), (2, 4, 16, 32), torch.float32, None, 0.0, False, False),
    ((2, 4, 16, 32), (2, 4, 16, 32), torch.float32, None, 0.1, False, False),
    ((2, 4, 16, 32), (2, 4, 16, 32), torch.bfloat16, "bool", 0.0, False, False),
    ((2, 4, 16, 32), (2, 4, 16, 32), torch.float32, "float", 0.0, False, False),
    ((1, 8, 24, 64), (1, 2, 24, 64), torch.float32, None, 0.0, True, True),
    ((2, 4, 16, 36), (2, 4, 16, 36), torch.float16, None, 0.0, True, False),
    ((2, 16, 32), (2, 16, 32), torch.float32, None, 0.0, False, False),
]


def _tensors(row, device: str, requires_grad: bool = False):
    q_shape, kv_shape, dtype, mask, *_ = row
    q, k, v = (torch.randn(shape, device=device).to(dtype) for shape in (q_shape, kv_shape, kv_shape))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    m = None
    if mask is not None:
        m = torch.rand(q_shape[-2], kv_shape[-2], device=device) > 0.3
        m[:, 0] = True  # no row without a key
        if mask == "float":
            m = torch.zeros(m.shape, device=device).masked_fill(~m, float("-inf"))
    return q, k, v, m


@pytest.mark.parametrize("row", ATTENTION)
def test_the_cpu_attention_choice_is_torchs_own(row):
    *_, dropout, causal, gqa = row
    real = _tensors(row, "cpu")
    meta = tuple(None if t is None else t.to("meta") for t in real)
    mask = kernels._float_mask(real[3], real[0].dtype)
    expected = torch._fused_sdp_choice(*real[:3], mask, dropout, causal, enable_gqa=gqa)
    assert kernels._cpu_backend(*meta[:3], kernels._float_mask(meta[3], meta[0].dtype), dropout, causal, None, gqa) == (
        kernels._CPU_BACKENDS.get(int(expected), MATH)
    )


def test_the_attention_table_reaches_each_cpu_kernel():
    """So that a choice fixed to one kernel fails the row-by-row comparison above."""
    chosen = set()
    for row in ATTENTION:
        q, k, v, m = (None if t is None else t.to("meta") for t in _tensors(row, "cpu"))
        chosen.add(kernels._cpu_backend(q, k, v, kernels._float_mask(m, q.dtype), row[4], row[5], None, row[6]))
    assert chosen == {FLASH, MATH}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("row", ATTENTION)
def test_attention_by_any_kernel_has_sdpas_output_and_gradients(device, row):
    *_, dropout, causal, gqa = row
    q, k, v, m = (None if t is None else t.to("meta") for t in _tensors(row, "cpu", requires_grad=False))
    for t in (q, k, v):
        t.requires_grad_(True)
    extra = {"enable_gqa": True} if gqa else {}
    out = attention(device, q, k, v, attn_mask=m, dropout_p=dropout, is_causal=causal, **extra)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=dropout, is_causal=causal, **extra)
    assert (out.shape, out.dtype) == (reference.shape, reference.dtype)
    out.float().sum().backward()
    assert [t.grad.shape for t in (q, k, v)] == [t.shape for t in (q, k, v)]


# (dtype, head size, mask, grouped-query heads) -> the kernel an sm80+ GPU runs
CUDA_RULES = [
    (torch.bfloat16, 128, False, False, FLASH),
    (torch.float16, 36, False, True, FLASH),  # flash pads the head to a multiple of 8; it takes grouped heads
    (torch.bfloat16, 512, False, False, EFFICIENT),  # beyond flash's 256
    (torch.bfloat16, 128, True, False, EFFICIENT),  # a mask rules flash out
    (torch.float32, 64, False, False, EFFICIENT),
    (torch.float32, 64, True, False, EFFICIENT),
    (torch.float32, 64, False, True, MATH),  # memory-efficient attention has no grouped-query heads
    (torch.float32, 34, False, False, MATH),  # fp32 needs a multiple of 4
    (torch.bfloat16, 36, True, False, MATH),  # fp16/bf16 need a multiple of 8
    (torch.float64, 64, False, False, MATH),
]


@pytest.mark.parametrize("dtype, head, mask, gqa, expected", CUDA_RULES)
def test_the_cuda_rules(dtype, head, mask, gqa, expected):
    q = torch.empty(2, 8, 16, head, device="meta", dtype=dtype)
    kv = torch.empty(2, 2 if gqa else 8, 16, head, device="meta", dtype=dtype)
    m = torch.zeros(16, 16, device="meta", dtype=dtype) if mask else None
    assert cuda_backend(q, kv, kv, m, 0.0, False, None, gqa) == expected


def test_fused_attention_counts_the_same_flops_on_either_device():
    """The CPU flash kernel is taught to torch's counter with the GPU kernels' formulas."""
    flops = {}
    for device in ("cpu", "cuda"):
        q = torch.empty(2, 4, 64, 32, device="meta", requires_grad=True)
        with flop_counter() as counter:
            attention(device, q, q, q).sum().backward()
        flops[device] = counter.get_total_flops()
    forward = 2 * (2 * 2 * 4 * 64 * 64 * 32)  # scores and output: two products of 2 * B*H*L*L*D
    assert flops["cpu"] == flops["cuda"] > 2 * forward


@pytest.mark.parametrize("cls, cell", [(nn.GRU, "gru"), (nn.RNN, "tanh")])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch_first", [True, False])
def test_the_cpu_rnn_order_computes_what_torch_computes(cls, cell, num_layers, batch_first):
    """The copied order of operations is the layer's own arithmetic: same outputs, same final states."""
    torch.manual_seed(0)
    rnn = cls(6, 5, num_layers=num_layers, batch_first=batch_first)
    x = torch.randn((3, 4, 6) if batch_first else (4, 3, 6))
    h0 = torch.randn(num_layers, 3, 5)
    expected, expected_h = rnn(x, h0)
    args = [x, h0, rnn._flat_weights, True, num_layers, 0.0, True, False, batch_first]
    output, final = kernels._cpu_rnn(cell, args)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(final, expected_h)


def test_an_rnn_order_not_copied_takes_the_meta_path():
    rnn = nn.GRU(6, 5, bidirectional=True)
    args = [torch.randn(4, 3, 6), torch.zeros(2, 3, 5), rnn._flat_weights, True, 1, 0.0, True, True, False]
    assert kernels._cpu_rnn("gru", args) is None and len(args) == 9
