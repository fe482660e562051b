"""``torch.autocast`` for a model whose weights live on the meta device.

Autocast casts only tensors of its own device (a CPU or CUDA tensor is "eligible", a meta tensor is
not), so under ``torch.autocast`` a meta trace would run everything in float32.  :class:`MetaAutocast`
makes the same casts itself, as a ``TorchFunctionMode``: above autograd, like autocast, so autograd
records each cast and saves the low-precision copies an operation keeps for its backward pass
(bfloat16 copies of frozen weights included), which is what the activation bytes of a mixed-precision
step are.  The rules are autocast's own, per device (``aten/src/ATen/autocast_mode.cpp`` and
``autocast_mode.h`` of torch 2.x, copied as lists; ``tests/test_autocast_rules.py`` checks the CPU lists
operation by operation against torch's own CPU autocast and dispatcher, and the CUDA lists the same way
where a GPU is present, and ``tests/test_estimate.py`` checks whole CPU steps):

* ``lower``: matrix products, convolutions, attention run in the autocast dtype (every floating
  argument but float64 cast to it); float32 leaf weights that require a gradient are cast once per
  autocast region and the copy kept until the region ends (autocast's weight cache);
* ``float32``: numerically touchy operations (losses, and on CUDA norms, exp/log/pow, ...) run in
  float32; ``float32 output``: reductions and softmax given ``dtype=float32`` when none is given;
* ``promote``: operations of several tensors (``cat``, ``stack``, ...) run in the widest dtype given.

Autocast applies them to ATen operations; here they apply to the torch functions a model calls
(``F.linear``, ``torch.matmul``, ``F.scaled_dot_product_attention``, ...), which for the operations
the rules name are the same calls.  A composite function whose inner products autocast would cast
(``einsum``, the recurrent layers) is cast as a whole: the same dtype, the operands cast once.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

LOWER, FLOAT32, FLOAT32_OUTPUT, PROMOTE = "lower", "float32", "float32 output", "promote"
REFUSED = "refused"  # autocast raises rather than run it (CUDA's binary_cross_entropy: unsafe in low precision)

# the operations whose inner matrix products autocast casts on every device (composites of bmm, mm, the RNN cells)
_COMPOSITE_PRODUCTS = ("einsum", "tensordot", "chain_matmul", "linalg_multi_dot", "rnn_tanh", "rnn_relu", "gru", "lstm")
_LOSSES = (
    "mse_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss l1_loss "
    "huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss kl_div "
    "multilabel_margin_loss binary_cross_entropy_with_logits cross_entropy_loss"
).split()

_FFTS = "fft ifft rfft irfft hfft ihfft fft2 ifft2 rfft2 irfft2 fftn ifftn rfftn irfftn".split()
_CPU_LINALG = (
    "cholesky cholesky_ex cond eig eigh eigvals eigvalsh householder_product inv inv_ex lstsq matrix_rank qr solve "
    "svd svdvals tensorinv tensorsolve"
).split()

POLICIES: dict[str, dict[str, str]] = {
    "cpu": {
        **dict.fromkeys(
            "conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm _addmm_activation addbmm linear _convolution "
            "matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu "
            "scaled_dot_product_attention _native_multi_head_attention".split(),
            LOWER,
        ),
        **dict.fromkeys(_COMPOSITE_PRODUCTS, LOWER),
        # composites whose every output CPU autocast computes in its dtype (CUDA's list names the two cells)
        **dict.fromkeys(("multi_head_attention_forward", "rnn_tanh_cell", "rnn_relu_cell"), LOWER),
        **dict.fromkeys(
            "avg_pool3d binary_cross_entropy grid_sampler grid_sampler_2d grid_sampler_3d "
            "_grid_sampler_2d_cpu_fallback polar prod quantile nanquantile stft cdist trace "
            "fake_quantize_per_tensor_affine _lu_with_info "
            "view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d "
            "max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d "
            "replication_pad2d replication_pad3d ctc_loss geqrf qr svd triangular_solve fractional_max_pool2d "
            "fractional_max_pool3d adaptive_max_pool3d".split()
            + [f"fft_{name}" for name in _FFTS]
            + [f"linalg_{name}" for name in _CPU_LINALG]
            + _LOSSES,
            FLOAT32,
        ),
        **dict.fromkeys(("stack", "cat", "index_copy"), PROMOTE),
    },
    "cuda": {
        **dict.fromkeys(
            "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d "
            "convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm "
            "chain_matmul linalg_multi_dot lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
            "_scaled_dot_product_flash_attention scaled_dot_product_attention cudnn_convolution "
            "cudnn_convolution_transpose _thnn_fused_lstm_cell _thnn_fused_gru_cell".split(),
            LOWER,
        ),
        **dict.fromkeys((*_COMPOSITE_PRODUCTS, "multi_head_attention_forward"), LOWER),
        **dict.fromkeys(
            "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus layer_norm "
            "native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm cosine_similarity dist pdist cdist "
            "renorm logsumexp norm upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_linear1d "
            "upsample_bilinear2d upsample_trilinear3d upsample_bicubic2d _upsample_bilinear2d_aa "
            "_upsample_bicubic2d_aa _upsample_nearest_exact1d _upsample_nearest_exact2d "
            "_upsample_nearest_exact3d".split()
            + _LOSSES,
            FLOAT32,
        ),
        "binary_cross_entropy": REFUSED,
        **dict.fromkeys(
            "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum".split(), FLOAT32_OUTPUT
        ),
        **dict.fromkeys(
            "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add".split(),
            PROMOTE,
        ),
    },
}
# torch functions named otherwise than the ATen operation autocast sees
_ATEN_NAMES = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__pow__": "pow",
    "__rpow__": "pow",
    "cross_entropy": "cross_entropy_loss",  # CUDA casts its log_softmax and nll_loss to float32: the same
    "grid_sample": "grid_sampler",
    "lu": "_lu_with_info",
}
_PADS = {"reflect": "reflection", "replicate": "replication"}  # F.pad's modes that run a padding operation of their own
# F.interpolate's modes -> the upsampling operation it runs ({} the number of spatial dimensions)
_UPSAMPLES = {
    "nearest": "upsample_nearest{}d",
    "nearest-exact": "_upsample_nearest_exact{}d",
    "linear": "upsample_linear1d",
    "bilinear": "upsample_bilinear2d",
    "bicubic": "upsample_bicubic2d",
    "trilinear": "upsample_trilinear3d",
}


def _aten_name(name: str, args, kwargs) -> str:
    """The operation autocast sees when ``name`` is called: ``F.pad`` reflects or replicates by
    ``reflection_pad1d`` ... ``replication_pad3d`` (by the padding's length), which the CPU rules name."""
    if name == "pad":
        mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
        width = kwargs.get("pad", args[1] if len(args) > 1 else ())
        return f"{_PADS[mode]}_pad{len(width) // 2}d" if mode in _PADS else name
    if name == "interpolate":
        return _upsample_name(args, kwargs) or name
    return _ATEN_NAMES.get(name, name)


def _upsample_name(args, kwargs) -> str | None:
    """The ``upsample_*`` operation ``F.interpolate`` runs (antialiased bilinear/bicubic: ``_upsample_*_aa``)."""
    tensor = args[0] if args else kwargs.get("input")
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    if not isinstance(tensor, torch.Tensor) or mode not in _UPSAMPLES:
        return None
    name = _UPSAMPLES[mode].format(tensor.dim() - 2)
    antialias = kwargs.get("antialias", args[6] if len(args) > 6 else False)
    return f"_{name}_aa" if antialias and mode in ("bilinear", "bicubic") else name


def policy_device(device: str) -> str:
    """The autocast rules a run on ``device`` follows: CUDA's for a GPU, the CPU's for ``cpu``."""
    return "cpu" if device.split(":")[0] == "cpu" else "cuda"


class MetaAutocast(TorchFunctionMode):
    """Autocast to ``dtype`` by ``device``'s rules (:data:`POLICIES`), for meta and real tensors alike."""

    def __init__(self, dtype: torch.dtype, device: str = "cuda"):
        super().__init__()
        self.dtype, self.rules = dtype, POLICIES[policy_device(device)]
        self._weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(weight) -> (weight, its cast)

    def __enter__(self):
        # torch's own autocast too, so that code asking whether autocast is on (nn.RNN's dtype check) is told
        # so; it casts only real CPU tensors, which the rules here have already cast where they apply
        self._torch = torch.autocast("cpu", dtype=self.dtype)
        self._torch.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self._weights.clear()  # autocast drops its cached weight casts as its region ends
        super().__exit__(*exc)
        return self._torch.__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        rule = self.rules.get(_aten_name(name, args, kwargs))
        if rule == REFUSED:
            raise RuntimeError(
                f"{name} is unsafe to autocast (torch's autocast refuses it on this device); "
                "compute the loss from logits (binary_cross_entropy_with_logits) or outside autocast"
            )
        if rule == LOWER:
            args, kwargs = tree_map(lambda value: self._cast(value, self.dtype), (args, kwargs))
        elif rule == FLOAT32:
            args, kwargs = tree_map(lambda value: self._cast(value, torch.float32), (args, kwargs))
        elif rule == FLOAT32_OUTPUT and kwargs.get("dtype") is None and _eligible(args[0] if args else None):
            kwargs = {**kwargs, "dtype": torch.float32}
        elif rule == PROMOTE:
            dtypes = [t.dtype for t in tree_leaves((args, kwargs)) if _eligible(t)]
            widest = torch.float32 if torch.float32 in dtypes else dtypes[0] if dtypes else None
            if widest is not None:
                args, kwargs = tree_map(lambda value: self._cast(value, widest), (args, kwargs))
        return func(*args, **kwargs)

    def _cast(self, value, dtype: torch.dtype):
        if not _eligible(value) or value.dtype == dtype:
            return value
        cached = dtype == self.dtype and value.dtype == torch.float32 and value.requires_grad and value.is_leaf
        if not cached or value._is_view():
            return value.to(dtype)
        entry = self._weights.get(id(value))
        if entry is None or entry[0] is not value:
            entry = self._weights[id(value)] = (value, value.to(dtype))
        return entry[1]


def _eligible(value) -> bool:
    """A tensor autocast casts: floating point, not float64."""
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
