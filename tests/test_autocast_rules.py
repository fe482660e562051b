"""The estimator's copied autocast rules against torch's own autocast (issue 16).

``petlprof.estimate.autocast.POLICIES`` copies torch's autocast operation lists because real autocast ignores
meta tensors.  Here one table of calls, each a torch function a model calls on small tensors, is run under
torch's real autocast on real tensors and under :class:`MetaAutocast` on meta tensors of the same shapes,
at float32 and at bfloat16 inputs, and the output dtypes must agree.  An operation the device's rules name
must also give the dtype its rule says (lower: bfloat16; float32 and float32 output: float32; promote: the
widest input, float32 here); one they do not name must give what it gives without autocast, which catches an
operation torch casts but the copy misses.  A second check reads the operations that have a kernel under the
``AutocastCPU`` dispatch key from torch's dispatcher, so an operation the copy lacks is found even without
a call in the table.  The CPU table runs everywhere; the CUDA one needs a GPU (``gpu`` marker).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves, tree_map

from petlprof.estimate.autocast import FLOAT32, FLOAT32_OUTPUT, LOWER, POLICIES, REFUSED, MetaAutocast

BF16, F32 = torch.bfloat16, torch.float32
_RULE_DTYPE = {LOWER: BF16, FLOAT32: F32, FLOAT32_OUTPUT: F32}  # promote: the widest input, float32 in every case
_GEN = torch.Generator().manual_seed(0)


def r(*shape):
    return torch.randn(*shape, generator=_GEN)


def u(*shape):
    return torch.rand(*shape, generator=_GEN)


def spd(n: int = 3) -> torch.Tensor:
    """A well-conditioned symmetric positive definite matrix (the linear-algebra operations need one)."""
    a = r(n, n)
    return a @ a.T + n * torch.eye(n)


def signs(n: int = 4) -> torch.Tensor:
    return torch.tensor([1.0, -1.0] * (n // 2))


def case(op: str, call, *inputs, label: str = "", meta: bool = True, may_fail: str = ""):
    """One row: ``call(*inputs)`` exercises the operation ``op`` (its name in the rules).

    ``meta=False``: the operation has no meta kernel, so MetaAutocast's side runs on real tensors with
    torch's own autocast switched off inside it.  ``may_fail``: torch's real kernel may be missing on this
    machine (the reason); the row is skipped where it is."""
    return pytest.param(op, call, inputs, meta, may_fail, id=label or op)


_LU = torch.linalg.lu_factor(spd())
_QR = torch.geqrf(r(3, 3))
_CHOL = torch.linalg.cholesky(spd())
_POOLED2D = F.max_pool2d(r(1, 1, 4, 4), 2, return_indices=True)
_POOLED3D = F.max_pool3d(r(1, 1, 4, 4, 4), 2, return_indices=True)
_TARGETS = torch.tensor([0, 2])
_MULTILABEL = torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3]])
_GRID2D, _GRID3D = u(1, 3, 3, 2) * 2 - 1, u(1, 2, 2, 2, 3) * 2 - 1

MATRIX_PRODUCTS = [
    case("conv1d", F.conv1d, r(1, 2, 5), r(3, 2, 3)),
    case("conv2d", F.conv2d, r(1, 2, 5, 5), r(3, 2, 3, 3)),
    case("conv3d", F.conv3d, r(1, 2, 4, 4, 4), r(3, 2, 3, 3, 3)),
    case("conv_transpose1d", F.conv_transpose1d, r(1, 2, 5), r(2, 3, 3)),
    case("conv_transpose2d", F.conv_transpose2d, r(1, 2, 5, 5), r(2, 3, 3, 3)),
    case("conv_transpose3d", F.conv_transpose3d, r(1, 2, 4, 4, 4), r(2, 3, 3, 3, 3)),
    case("conv_tbc", torch.conv_tbc, r(5, 1, 2), r(3, 2, 4), r(4), 1),
    case(
        "convolution", lambda x, w: torch.convolution(x, w, None, [1], [0], [1], False, [0], 1), r(1, 2, 5), r(3, 2, 3)
    ),
    # the 12-argument (deprecated) overload, the one CPU autocast casts; the 13-argument one (allow_tf32) it
    # does not, which name-level rules cannot tell apart: layers call conv1d/2d/3d, never _convolution itself
    case(
        "_convolution",
        lambda x, w: torch._convolution(x, w, None, [1], [0], [1], False, [0], 1, False, False, False),
        r(1, 2, 5),
        r(3, 2, 3),
    ),
    case("prelu", F.prelu, r(2, 3, 4), r(3)),
    case("mm", torch.mm, r(2, 3), r(3, 4)),
    case("mv", torch.mv, r(2, 3), r(3)),
    case("bmm", torch.bmm, r(2, 2, 3), r(2, 3, 4)),
    case("addmm", torch.addmm, r(2, 4), r(2, 3), r(3, 4)),
    case("_addmm_activation", torch._addmm_activation, r(2, 4), r(2, 3), r(3, 4)),
    case("addmv", torch.addmv, r(2), r(2, 3), r(3)),
    case("addr", torch.addr, r(2, 3), r(2), r(3)),
    case("addbmm", torch.addbmm, r(2, 4), r(2, 2, 3), r(2, 3, 4)),
    case("baddbmm", torch.baddbmm, r(2, 2, 4), r(2, 2, 3), r(2, 3, 4)),
    case("matmul", torch.matmul, r(2, 3), r(3, 4)),
    case("matmul", lambda a, b: a @ b, r(2, 3), r(3, 4), label="__matmul__"),
    case("linalg_vecdot", torch.linalg.vecdot, r(2, 3), r(2, 3)),
    case("linear", F.linear, r(2, 3), r(4, 3), r(4)),
    case("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), r(2, 3), r(3, 4)),
    case("tensordot", lambda a, b: torch.tensordot(a, b, dims=1), r(2, 3), r(3, 4)),
    case("chain_matmul", torch.chain_matmul, r(2, 3), r(3, 4), r(4, 2)),
    case("linalg_multi_dot", lambda a, b, c: torch.linalg.multi_dot([a, b, c]), r(2, 3), r(3, 4), r(4, 2)),
    case("scaled_dot_product_attention", F.scaled_dot_product_attention, r(1, 2, 3, 4), r(1, 2, 3, 4), r(1, 2, 3, 4)),
    case(
        "_scaled_dot_product_flash_attention",
        torch._scaled_dot_product_flash_attention,
        *(r(1, 2, 3, 4),) * 3,
        may_fail="CUDA's flash attention kernel has no CPU implementation",
    ),
    case(
        "_native_multi_head_attention",
        lambda q, w, b, pw, pb: torch._native_multi_head_attention(q, q, q, 8, 2, w, b, pw, pb),
        r(1, 3, 8),
        r(24, 8),
        r(24),
        r(8, 8),
        r(8),
    ),
    case(
        "mkldnn_rnn_layer",
        lambda x, w0, w1, b0, b1, h, c: torch.mkldnn_rnn_layer(
            x, w0, w1, b0, b1, h, c, False, [], 2, 4, 1, True, False, False, False
        ),
        r(3, 1, 4),
        r(16, 4),
        r(16, 4),
        r(16),
        r(16),
        r(1, 4),
        r(1, 4),
        may_fail="oneDNN has no bfloat16 LSTM primitive for this CPU",
    ),
    case(
        "lstm", lambda m, x: m(x), torch.nn.LSTM(4, 4), r(3, 1, 4), may_fail="oneDNN has no bfloat16 LSTM for this CPU"
    ),
    case("gru", lambda m, x: m(x), torch.nn.GRU(4, 4), r(3, 1, 4)),  # see KNOWN_DEVIATIONS
    case("rnn_tanh", lambda m, x: m(x), torch.nn.RNN(4, 4), r(3, 1, 4)),
    case("rnn_relu", lambda m, x: m(x), torch.nn.RNN(4, 4, nonlinearity="relu"), r(3, 1, 4)),
    case("lstm_cell", lambda m, x: m(x), torch.nn.LSTMCell(4, 4), r(2, 4)),
    case("gru_cell", lambda m, x: m(x), torch.nn.GRUCell(4, 4), r(2, 4)),
    case("rnn_tanh_cell", lambda m, x: m(x), torch.nn.RNNCell(4, 4), r(2, 4)),
    case("rnn_relu_cell", lambda m, x: m(x), torch.nn.RNNCell(4, 4, nonlinearity="relu"), r(2, 4)),
    # nn.MultiheadAttention's training path: F.multi_head_attention_forward, whose products autocast casts
    case("multi_head_attention_forward", lambda m, x: m(x, x, x), torch.nn.MultiheadAttention(8, 2), r(3, 1, 8)),
]

LOSSES = [
    case("mse_loss", F.mse_loss, r(4), r(4)),
    case("l1_loss", F.l1_loss, r(4), r(4)),
    case("smooth_l1_loss", F.smooth_l1_loss, r(4), r(4)),
    case("huber_loss", F.huber_loss, r(4), r(4)),
    case("nll_loss", F.nll_loss, r(2, 3).log_softmax(-1), _TARGETS),
    case("nll_loss2d", torch._C._nn.nll_loss2d, r(1, 3, 2, 2).log_softmax(1), torch.tensor([[[0, 1], [2, 0]]])),
    case("nll_loss", F.nll_loss, r(1, 3, 2, 2), torch.tensor([[[0, 1], [2, 0]]]), label="nll_loss-4d"),
    case("cross_entropy_loss", F.cross_entropy, r(2, 3), _TARGETS, label="cross_entropy"),
    case("cross_entropy_loss", torch._C._nn.cross_entropy_loss, r(2, 3), _TARGETS),
    case("kl_div", lambda a, b: F.kl_div(a, b, reduction="batchmean"), r(2, 3).log_softmax(-1), u(2, 3)),
    case("poisson_nll_loss", F.poisson_nll_loss, r(4), u(4)),
    case("cosine_embedding_loss", F.cosine_embedding_loss, r(2, 3), r(2, 3), torch.tensor([1, -1])),
    case("hinge_embedding_loss", F.hinge_embedding_loss, r(4), signs()),
    case("margin_ranking_loss", F.margin_ranking_loss, r(4), r(4), signs()),
    case("soft_margin_loss", F.soft_margin_loss, r(4), signs()),
    case("triplet_margin_loss", F.triplet_margin_loss, r(2, 3), r(2, 3), r(2, 3)),
    case("multi_margin_loss", F.multi_margin_loss, r(2, 4), _TARGETS),
    case("multilabel_margin_loss", F.multilabel_margin_loss, r(2, 4), _MULTILABEL),
    case("binary_cross_entropy", F.binary_cross_entropy, u(4), u(4)),
    case("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits, r(4), u(4)),
    case("ctc_loss", lambda lp, t: F.ctc_loss(lp, t, [5], [2]), r(5, 1, 4).log_softmax(-1), torch.tensor([[1, 2]])),
]

LINEAR_ALGEBRA = [
    case("cdist", torch.cdist, r(3, 4), r(2, 4)),
    case("trace", torch.trace, r(3, 3)),
    case("prod", torch.prod, r(4)),
    case("prod", lambda x: torch.prod(x, 0), r(2, 3), label="prod.dim_int"),
    case("quantile", lambda x: torch.quantile(x, 0.5), r(6)),
    case("nanquantile", lambda x: torch.nanquantile(x, 0.5), r(6)),
    case("polar", torch.polar, u(4), r(4)),
    case("view_as_complex", torch.view_as_complex, r(3, 2)),
    case(
        "stft",
        lambda x: torch.stft(x, 8, window=torch.ones(8, device=x.device, dtype=x.dtype), return_complex=True),
        r(16),
    ),
    case("cholesky", torch.cholesky, spd()),
    case("cholesky_inverse", torch.cholesky_inverse, _CHOL),
    case("cholesky_solve", torch.cholesky_solve, r(3, 2), _CHOL),
    case("inverse", torch.inverse, spd()),
    case("pinverse", torch.pinverse, r(3, 4)),
    case("lu_solve", torch.lu_solve, r(3, 2), *_LU),
    case("_lu_with_info", torch.lu, spd(), label="lu"),
    case("_lu_with_info", lambda a: torch._lu_with_info(a), spd()),
    case("geqrf", torch.geqrf, r(3, 3), meta=False),  # no meta kernel
    case("orgqr", torch.orgqr, *_QR),
    case("ormqr", torch.ormqr, *_QR, r(3, 2)),
    case("qr", torch.qr, r(3, 3)),
    case("svd", torch.svd, r(3, 3)),
    case("triangular_solve", torch.triangular_solve, r(3, 2), _CHOL.T.contiguous()),
    case("linalg_cholesky", torch.linalg.cholesky, spd()),
    case("linalg_cholesky_ex", torch.linalg.cholesky_ex, spd()),
    case("linalg_cond", torch.linalg.cond, spd()),
    case("linalg_eig", torch.linalg.eig, spd()),
    case("linalg_eigh", torch.linalg.eigh, spd()),
    case("linalg_eigvals", torch.linalg.eigvals, spd()),
    case("linalg_eigvalsh", torch.linalg.eigvalsh, spd()),
    case("linalg_householder_product", torch.linalg.householder_product, *_QR),
    case("linalg_inv", torch.linalg.inv, spd()),
    case("linalg_inv_ex", torch.linalg.inv_ex, spd()),
    case("linalg_lstsq", torch.linalg.lstsq, spd(), r(3, 2), meta=False),  # no meta kernel
    case("linalg_matrix_rank", torch.linalg.matrix_rank, spd()),
    case("linalg_qr", torch.linalg.qr, r(3, 3)),
    case("linalg_solve", torch.linalg.solve, spd(), r(3, 2)),
    case("linalg_svd", torch.linalg.svd, r(3, 3)),
    case("linalg_svdvals", torch.linalg.svdvals, r(3, 3)),
    case("linalg_tensorinv", lambda a: torch.linalg.tensorinv(a, ind=2), spd(4).reshape(2, 2, 4)),
    case("linalg_tensorsolve", torch.linalg.tensorsolve, spd(4).reshape(2, 2, 4), r(2, 2)),
    *(case(f"fft_{name}", getattr(torch.fft, name), r(8)) for name in "fft ifft rfft irfft hfft ihfft".split()),
    *(case(f"fft_{name}", getattr(torch.fft, name), r(4, 4)) for name in "fft2 ifft2 rfft2 irfft2".split()),
    *(case(f"fft_{name}", getattr(torch.fft, name), r(2, 4, 4)) for name in "fftn ifftn rfftn irfftn".split()),
    # no meta kernel (fake_quantize_per_tensor_affine_cachemask)
    case(
        "fake_quantize_per_tensor_affine",
        lambda x: torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127),
        r(4),
        meta=False,
    ),
]

POOLING_AND_SAMPLING = [
    case("avg_pool3d", lambda x: F.avg_pool3d(x, 2), r(1, 1, 2, 4, 4)),
    case("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, 2), r(1, 1, 4, 4, 4)),
    case("max_pool3d", lambda x: F.max_pool3d(x, 2), r(1, 1, 2, 4, 4)),
    case("max_pool3d", lambda x: torch.max_pool3d(x, 2), r(1, 1, 2, 4, 4), label="torch.max_pool3d"),
    # with indices torch runs max_pool3d_with_indices, which no device casts
    case("max_pool3d_with_indices", lambda x: F.max_pool3d(x, 2, return_indices=True), r(1, 1, 2, 4, 4)),
    case("adaptive_max_pool3d", lambda x: F.adaptive_max_pool3d(x, 2), r(1, 1, 4, 4, 4)),
    case("fractional_max_pool2d", lambda x: F.fractional_max_pool2d(x, 2, output_size=2), r(1, 1, 4, 4)),
    case("fractional_max_pool3d", lambda x: F.fractional_max_pool3d(x, 2, output_size=2), r(1, 1, 4, 4, 4)),
    case("max_unpool2d", lambda x, i: F.max_unpool2d(x, i, 2), *_POOLED2D),
    case("max_unpool3d", lambda x, i: F.max_unpool3d(x, i, 2), *_POOLED3D),
    case("reflection_pad1d", lambda x: F.pad(x, (1, 1), mode="reflect"), r(1, 2, 5)),
    case("reflection_pad2d", lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), r(1, 2, 5, 5)),
    case("reflection_pad3d", lambda x: F.pad(x, (1, 1) * 3, mode="reflect"), r(1, 2, 3, 3, 3)),
    case("replication_pad1d", lambda x: F.pad(x, (1, 1), mode="replicate"), r(1, 2, 5)),
    case("replication_pad2d", lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate"), r(1, 2, 5, 5)),
    case("replication_pad3d", lambda x: F.pad(x, (1, 1) * 3, mode="replicate"), r(1, 2, 3, 3, 3)),
    case(
        "reflection_pad1d",
        lambda x: torch._C._nn.reflection_pad1d(x, [1, 1]),
        r(1, 2, 5),
        label="aten-reflection_pad1d",
    ),
    case("constant_pad_nd", lambda x: F.pad(x, (1, 1)), r(1, 2, 5)),
    case("circular_pad", lambda x: F.pad(x, (1, 1), mode="circular"), r(1, 2, 5)),
    case(
        "grid_sampler",
        lambda x, g: F.grid_sample(x, g, align_corners=False),
        r(1, 1, 4, 4),
        _GRID2D,
        label="grid_sample",
    ),
    case("grid_sampler", lambda x, g: torch.grid_sampler(x, g, 0, 0, False), r(1, 1, 4, 4), _GRID2D),
    case("grid_sampler_2d", lambda x, g: torch.grid_sampler_2d(x, g, 0, 0, False), r(1, 1, 4, 4), _GRID2D),
    case("grid_sampler_3d", lambda x, g: torch.grid_sampler_3d(x, g, 0, 0, False), r(1, 1, 3, 3, 3), _GRID3D),
    case(
        "_grid_sampler_2d_cpu_fallback",
        lambda x, g: torch._grid_sampler_2d_cpu_fallback(x, g, 0, 0, False),
        r(1, 1, 4, 4),
        _GRID2D,
        meta=False,  # a CPU kernel only
    ),
    *(  # F.interpolate runs upsample_<mode><n>d
        case(
            f"upsample_{mode}{dims}d",
            lambda x, mode=mode: F.interpolate(x, scale_factor=2, mode=mode),
            r(1, 1, *[4] * dims),
            label=f"interpolate-{mode}{dims}d",
        )
        for mode, dims in (
            ("nearest", 1),
            ("nearest", 3),
            ("linear", 1),
            ("bilinear", 2),
            ("bicubic", 2),
            ("trilinear", 3),
        )
    ),
    *(  # mode nearest-exact runs _upsample_nearest_exact<n>d
        case(
            f"_upsample_nearest_exact{dims}d",
            lambda x: F.interpolate(x, scale_factor=2, mode="nearest-exact"),
            r(1, 1, *[4] * dims),
            label=f"interpolate-nearest-exact{dims}d",
        )
        for dims in (1, 2, 3)
    ),
    *(  # antialiased bilinear/bicubic run _upsample_<mode>2d_aa
        case(
            f"_upsample_{mode}2d_aa",
            lambda x, mode=mode: F.interpolate(x, scale_factor=0.5, mode=mode, antialias=True),
            r(1, 1, 8, 8),
            label=f"interpolate-{mode}-antialias",
        )
        for mode in ("bilinear", "bicubic")
    ),
    case("upsample_nearest2d", lambda x: torch._C._nn.upsample_nearest2d(x, [8, 8]), r(1, 1, 4, 4)),
]

PROMOTING = [  # each mixes a bfloat16 (or the row's float) tensor with a float32 one
    case("cat", lambda a, b: torch.cat([a, b.float()]), r(2, 3), r(2, 3)),
    case("stack", lambda a, b: torch.stack([a, b.float()]), r(2, 3), r(2, 3)),
    case("index_copy", lambda a, i, b: a.index_copy(0, i, b.float()), r(2, 3), torch.tensor([1, 0]), r(2, 3)),
    case("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c.float()), r(3), r(3), u(3) + 1),
    case("addcmul", lambda a, b, c: torch.addcmul(a, b, c.float()), r(3), r(3), r(3)),
    case("atan2", lambda a, b: torch.atan2(a, b.float()), r(3), r(3)),
    case("bilinear", lambda a, b, w: F.bilinear(a, b.float(), w), r(2, 3), r(2, 3), r(4, 3, 3)),
    case("cross", lambda a, b: torch.cross(a, b.float(), dim=-1), r(2, 3), r(2, 3)),
    case("dot", lambda a, b: torch.dot(a, b.float()), r(3), r(3)),
    case("vdot", lambda a, b: torch.vdot(a, b.float()), r(3), r(3)),
    case("index_put", lambda a, i, b: a.index_put((i,), b.float()), r(2, 3), torch.tensor([1, 0]), r(2, 3)),
    case("scatter_add", lambda a, i, b: a.scatter_add(0, i, b.float()), r(2, 3), torch.tensor([[1, 0, 1]]), r(1, 3)),
]

ELEMENTWISE_AND_NORMS = [
    *(
        case(name, getattr(torch, name), r(3))
        for name in "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan".split()
    ),
    case("pow", lambda x: torch.pow(x, 2), r(3)),
    case("pow", lambda x: x**2, r(3), label="__pow__"),
    case("pow", lambda x: 2**x, r(3), label="__rpow__"),
    case("softplus", F.softplus, r(3)),
    case("layer_norm", lambda x: F.layer_norm(x, (4,)), r(2, 4)),
    # its output only: the CPU kernel keeps bfloat16 statistics where the meta kernel gives float32 ones
    case("native_layer_norm", lambda x: torch.native_layer_norm(x, (4,), None, None, 1e-5)[0], r(2, 4)),
    case("rms_norm", lambda x: F.rms_norm(x, (4,)), r(2, 4)),
    case("group_norm", lambda x: F.group_norm(x, 1), r(1, 2, 4)),
    case("frobenius_norm", lambda x: torch.frobenius_norm(x, [0, 1]), r(2, 3)),
    case("nuclear_norm", torch.nuclear_norm, r(3, 3)),
    case("norm", torch.norm, r(3)),
    case("cosine_similarity", F.cosine_similarity, r(2, 3), r(2, 3)),
    case("dist", torch.dist, r(3), r(3)),
    case("pdist", F.pdist, r(3, 2)),
    case("renorm", lambda x: torch.renorm(x, 2, 0, 1.0), r(2, 3)),
    case("logsumexp", lambda x: torch.logsumexp(x, 0), r(3)),
    case("softmax", lambda x: torch.softmax(x, -1), r(2, 3)),
    case("softmax", lambda x: F.softmax(x, -1), r(2, 3), label="F.softmax"),
    case("log_softmax", lambda x: torch.log_softmax(x, -1), r(2, 3)),
    case("cumsum", lambda x: torch.cumsum(x, 0), r(3)),
    case("cumprod", lambda x: torch.cumprod(x, 0), r(3)),
    case("sum", torch.sum, r(3)),
    case("linalg_vector_norm", torch.linalg.vector_norm, r(3)),
    case("linalg_matrix_norm", torch.linalg.matrix_norm, r(3, 3)),
]

COMMON_UNCAST = [  # what a transformer calls most that no device's rules name
    case("add", torch.add, r(3), r(3)),
    case("mul", torch.mul, r(3), r(3)),
    case("gelu", F.gelu, r(3)),
    case("silu", F.silu, r(3)),
    case("relu", F.relu, r(3)),
    case("tanh", torch.tanh, r(3)),
    case("sigmoid", torch.sigmoid, r(3)),
    case("dropout", lambda x: F.dropout(x, 0.5), r(3)),
    case("embedding", lambda i, w: F.embedding(i, w), torch.tensor([0, 2]), r(3, 4)),
    case("mean", torch.mean, r(3)),
    case("batch_norm", lambda x, m, v: F.batch_norm(x, m, v), r(2, 3), r(3), u(3)),
    case("where", lambda x, y: torch.where(x > 0, x, y), r(3), r(3)),
    case("normalize", F.normalize, r(2, 3)),
]

CASES = (
    MATRIX_PRODUCTS + LOSSES + LINEAR_ALGEBRA + POOLING_AND_SAMPLING + PROMOTING + ELEMENTWISE_AND_NORMS + COMMON_UNCAST
)

# operations a device's rules name that no row calls, and why
NOT_CALLED = {
    "cpu": {},
    "cuda": {
        "cudnn_convolution": "internal cuDNN kernel, reached through conv*d",
        "cudnn_convolution_transpose": "internal cuDNN kernel, reached through conv_transpose*d",
        "_thnn_fused_lstm_cell": "internal fused kernel of a GPU LSTM step without cuDNN, reached through nn.LSTM",
        "_thnn_fused_gru_cell": "internal fused kernel of a GPU GRU step without cuDNN, reached through nn.GRU",
    },
}
# rows whose dtypes the rules are known to get wrong, and why: a row listed here must fail its check
KNOWN_DEVIATIONS = {
    # torch's CPU GRU runs its products in bfloat16 but carries its float32 hidden state, so its outputs are
    # float32; it is cast as a whole here (all float32 would miss the bfloat16 products, and a float32 hidden
    # state next to bfloat16 weights has no meta kernel), so its outputs count at half their size
    ("cpu", "gru"): "torch's CPU GRU gives float32 outputs, the rules cast it as a whole to bfloat16",
}
# operations with a kernel under the AutocastCPU key that the CPU rules need not name: not reachable by that
# name from Python, torch's own functions reach them only through an operation the rules name
CPU_INTERNAL = {
    "multilabel_margin_loss_forward": "aten-only; F.multilabel_margin_loss calls multilabel_margin_loss",
}
# names in the CPU rules with no CPU autocast kernel: torch functions whose inner operations CPU autocast casts
# (each has a row above, which checks that casting it as a whole gives the dtypes torch gives)
CPU_COMPOSITES = {
    "einsum",
    "tensordot",
    "chain_matmul",
    "linalg_multi_dot",
    "rnn_tanh",
    "rnn_relu",
    "gru",
    "lstm",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "multi_head_attention_forward",
}


def _on(inputs, device: str, dtype: torch.dtype):
    """``inputs`` on ``device``, floating tensors and modules' weights at ``dtype``."""

    def move(value):
        if isinstance(value, torch.nn.Module):
            return copy.deepcopy(value).to(device, dtype)
        if not isinstance(value, torch.Tensor):
            return value
        return value.to(device, dtype) if value.is_floating_point() else value.to(device)

    return tree_map(move, inputs, is_leaf=lambda value: isinstance(value, torch.nn.Module))


def _outcome(call, inputs) -> tuple[torch.dtype, ...] | str:
    """The dtypes of what ``call`` returns, or ``"raises"``."""
    try:
        return tuple(t.dtype for t in tree_leaves(call(*inputs)) if isinstance(t, torch.Tensor))
    except (RuntimeError, NotImplementedError, ValueError):
        return "raises"


def _check(device: str, op: str, call, inputs, meta: bool, may_fail: str) -> None:
    known = KNOWN_DEVIATIONS.get((device, op))
    if known is None:
        return _compare(device, op, call, inputs, meta, may_fail)
    with pytest.raises(AssertionError):  # strict: a deviation that went away must leave the list
        _compare(device, op, call, inputs, meta, may_fail)
    pytest.xfail(known)


def _compare(device: str, op: str, call, inputs, meta: bool, may_fail: str) -> None:
    rule = POLICIES[device].get(op)
    if rule == REFUSED:  # torch's autocast raises for it, and so must the rules
        return _compare_refused(device, op, call, inputs)
    for dtype in (F32, BF16):
        with torch.autocast(device, dtype=BF16):
            real = _outcome(call, _on(inputs, device, dtype))
        with MetaAutocast(BF16, device):
            if meta:
                ours = _outcome(call, _on(inputs, "meta", dtype))
            else:
                with torch.autocast(device, enabled=False):  # our casts alone, on real tensors
                    ours = _outcome(call, _on(inputs, device, dtype))
        if real == "raises" and may_fail:
            pytest.skip(may_fail)
        plain = _outcome(call, _on(inputs, device, dtype))
        if real == plain == "raises":  # no kernel for these dtypes, autocast or not: nothing to compare
            continue
        if rule is None:
            assert real == plain, (
                f"{op} at {dtype}: torch's {device} autocast casts it to {real}, the rules name it not"
            )
        else:
            assert real != "raises", f"{op} at {dtype}: raises under torch's {device} autocast"
            floating = {d.to_real() for d in real if d.is_floating_point or d.is_complex}  # none: matrix_rank
            assert floating <= {_RULE_DTYPE.get(rule, F32)}, (
                f"{op} at {dtype}: torch's autocast gives {real}, rule {rule}"
            )
        assert ours == real, f"{op} at {dtype}: MetaAutocast gives {ours}, torch's {device} autocast {real}"


def _compare_refused(device: str, op: str, call, inputs) -> None:
    with torch.autocast(device, dtype=BF16):
        real = _outcome(call, _on(inputs, device, F32))
    with MetaAutocast(BF16, device):
        ours = _outcome(call, _on(inputs, "meta", F32))
    assert real == ours == "raises", f"{op}: torch's {device} autocast gives {real}, MetaAutocast {ours}"


@pytest.mark.parametrize(("op", "call", "inputs", "meta", "may_fail"), CASES)
def test_cpu_rules_give_the_dtypes_of_torchs_cpu_autocast(op, call, inputs, meta, may_fail):
    _check("cpu", op, call, inputs, meta, may_fail)


@pytest.mark.gpu
@pytest.mark.parametrize(("op", "call", "inputs", "meta", "may_fail"), CASES)
def test_cuda_rules_give_the_dtypes_of_torchs_cuda_autocast(op, call, inputs, meta, may_fail):
    _check("cuda", op, call, inputs, meta, may_fail)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_rule_is_called_by_a_row(device):
    called = {param.values[0] for param in CASES}
    assert set(POLICIES[device]) - called == set(NOT_CALLED[device])


def test_cpu_rules_name_every_operation_torch_casts_on_a_cpu():
    """Torch's dispatcher knows which ATen operations have a CPU autocast kernel: each is named by the rules
    (or is internal), and each name but the composites (whose inner products torch casts) has one."""
    cast = {
        op.split("::")[1].split(".")[0]
        for op in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCPU")
    }
    assert cast - set(POLICIES["cpu"]) == set(CPU_INTERNAL)
    assert set(POLICIES["cpu"]) - cast == CPU_COMPOSITES


# names in the CUDA rules with no CUDA autocast kernel: torch functions whose inner operations CUDA autocast
# casts (cross_entropy: its log_softmax and nll_loss, both float32 on CUDA)
CUDA_COMPOSITES = {"rnn_tanh", "rnn_relu", "gru", "lstm", "multi_head_attention_forward", "cross_entropy_loss"}


def test_cuda_rules_name_every_operation_torch_casts_on_a_gpu():
    """The CPU build of torch registers the CUDA autocast kernels too, so the CUDA rules' names can be checked
    here: the same two-way check as for the CPU (the dtypes each gives need a GPU: the gpu-marked table)."""
    cast = {
        op.split("::")[1].split(".")[0]
        for op in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCUDA")
    }
    assert not cast - set(POLICIES["cuda"]), "CUDA autocast casts these, the rules name them not"
    assert set(POLICIES["cuda"]) - cast == CUDA_COMPOSITES


@pytest.mark.parametrize(
    "call, op",
    [
        (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), "upsample_bilinear2d"),
        (lambda x: F.interpolate(x, scale_factor=0.5, mode="bicubic", antialias=True), "_upsample_bicubic2d_aa"),
        (lambda x: F.interpolate(x, scale_factor=2, mode="nearest-exact"), "_upsample_nearest_exact2d"),
        (lambda x: F.interpolate(x, scale_factor=2), "upsample_nearest2d"),
    ],
)
def test_cuda_rules_run_interpolate_in_float32(call, op):
    """F.interpolate reaches CUDA autocast as the upsampling operation of its mode, which runs in float32."""
    assert POLICIES["cuda"][op] == FLOAT32
    with MetaAutocast(BF16, "cuda"):
        assert call(torch.empty(1, 1, 8, 8, device="meta", dtype=BF16)).dtype == F32
