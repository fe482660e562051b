"""Quantised frozen backbones (``--quantize``): a backbone's linear layers as bitsandbytes 8-bit layers
(``int8``, LLM.int8()) or 4-bit layers (``nf4``, ``fp4``; NF4 is QLoRA's), for the methods that keep the
backbone frozen (LoRA on an NF4 backbone is QLoRA).

How: transformers quantises inside ``from_pretrained(quantization_config=...)`` only, as it reads a
checkpoint; the tiny presets and ``--random-init`` backbones are built from a config and ``smollm2`` from a
GGUF file.  So every backbone is built as before and then quantised in place (:func:`quantize_model`) with
transformers' own pieces: its :class:`~transformers.BitsAndBytesConfig`, its choice of the layers that stay
in float (``get_keys_to_not_convert`` and the model class's ``_keep_in_fp32_modules``), its module swap
(``replace_with_bnb_linear``) and the parameters its loader makes (``Params4bit``/``Int8Params`` moved to the
run's device, which is where bitsandbytes quantises).  A test checks the result equals ``from_pretrained``'s
byte for byte on MiniLM.

What stays in float, as ``from_pretrained`` leaves it: the LM head (the output embeddings) and weights tied
to it, and the modules a model class keeps in float32 (T5's feed-forward output ``wo``).  Embeddings and
normalisation layers are not linear layers, which are all bitsandbytes quantises; a classification head is
made after the backbone and trains in float32.  PEFT's ``prepare_model_for_kbit_training`` casts such float16
or bfloat16 layers to float32 (petlprof loads float32 already) and turns gradient checkpointing on, which
petlprof leaves off: it trades time for memory whatever the weights, so a quantised run differs from the
unquantised one by the quantisation alone.

On CPUs with AVX512-BF16, bitsandbytes 0.50 repacks a 4-bit layer for its inference kernel at the first
forward pass in eval mode without gradients (undoing double quantisation), and afterwards the layer passes no
gradient back: training after an evaluation (a ``--target-value`` check) would stop learning unseen.  Every
4-bit layer here keeps its training layout (``support_avx512bf16_for_cpu = False``), so training, evaluation
and inference run the same kernels; the record says so.

Imports nothing heavy at module level: the options and the method contract read :data:`QUANTIZE_CHOICES`.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from petlprof.errors import UsageError

NONE, INT8, NF4, FP4 = "none", "int8", "nf4", "fp4"
QUANTIZE_CHOICES = (NONE, INT8, NF4, FP4)  # --quantize (run and estimate)
FOUR_BIT = (NF4, FP4)
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")  # --quantize-compute-dtype
DEFAULT_COMPUTE_DTYPE = "float32"  # BitsAndBytesConfig's default, and the dtype petlprof loads weights in
INSTALL = "pip install 'petlprof[quantize]'"
# bitsandbytes' 8-bit optimisers (--optimizer adamw8bit, paged_adamw8bit): a tensor of at least min_8bit_size elements
# keeps each state as one byte per element with a float32 absmax per block of 256; a smaller one keeps float32
# states; the two 256-entry float32 quantile maps are shared by all of an optimiser's tensors
EIGHT_BIT_MIN_NUMEL = 4096
EIGHT_BIT_BLOCK = 256
EIGHT_BIT_QMAP_BYTES = 2 * 256 * 4


def adamw_state_bytes(numel: int, element_size: int, eight_bit: bool = False) -> int:
    """Bytes of AdamW's state for one trained tensor of ``numel`` elements of ``element_size`` bytes: torch's
    ``exp_avg`` and ``exp_avg_sq`` in the tensor's dtype plus a 4-byte ``step``; bitsandbytes' 8-bit AdamW
    (``eight_bit``) two uint8 states and two float32 block scales, or two float32 states under
    :data:`EIGHT_BIT_MIN_NUMEL` elements (its ``step`` is a Python int; the shared quantile maps are
    :data:`EIGHT_BIT_QMAP_BYTES`, once per optimiser)."""
    if not eight_bit:
        return 2 * numel * element_size + 4
    if numel < EIGHT_BIT_MIN_NUMEL:
        return 2 * numel * 4
    return 2 * numel + 2 * 4 * math.ceil(numel / EIGHT_BIT_BLOCK)


# two bitsandbytes log lines that are noise in a run's output: its CPU backend warns at import (PEFT imports it
# whenever it is installed) that package `kernels` is missing to download a kernel from the Hugging Face hub, which
# serves only the inference repacking petlprof turns off (module docstring) -- runs never download code; and every
# 8-bit layer warns at every forward pass that LLM.int8() quantises its float32 inputs through float16, which is the
# algorithm (the record's int8 entry says so)
_QUIET = {
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
    "bitsandbytes.autograd._functions": "MatMul8bitLt: inputs will be cast from",
}


def _not_starting(start: str) -> Callable[[logging.LogRecord], bool]:
    return lambda record: not str(record.msg).startswith(start)


for _logger, _start in _QUIET.items():
    logging.getLogger(_logger).addFilter(_not_starting(_start))


class _QuantizedLayers(TypedDict):
    method: str  # int8, nf4 or fp4
    library: str  # bitsandbytes and its version
    quantized_layers: int
    quantized_modules: list[str]  # layer indices as *
    kept_in_float: list[str]  # linear layers left in float: the LM head, weights tied to it, T5's wo
    packed_bytes: int  # the quantised weights as stored
    state_bytes: int  # what dequantises them: block scales (and their own, double quantised), int8 row scales


class QuantizationInfo(_QuantizedLayers, total=False):
    """``--quantize``: how the backbone's linear layers were quantised (:func:`quantize_model`), as the run record's
    ``training.quantization`` and the estimate record's ``quantization`` state it; the 4-bit fields or the int8 ones."""

    compute_dtype: str  # 4-bit: the dtype the dequantised weights multiply in
    double_quant: bool  # 4-bit: the block scales quantised too
    blocksize: int | None  # 4-bit: weights per scale (None without a quantised layer)
    cpu_inference_repacking: bool  # 4-bit: bitsandbytes' AVX512-BF16 inference layout (off: one layout throughout)
    inputs: str  # int8: how a product with an 8-bit weight runs on the device (training and evaluation)
    outlier_threshold: float  # int8: input columns with a value beyond it are multiplied in float16


class QuantizeFields(TypedDict):
    """A run's ``--quantize`` settings as its RunSpec (and an estimate record) names them (:func:`run_fields`)."""

    quantize: str
    quantize_compute_dtype: str
    quantize_double: bool


@dataclass(frozen=True)
class Quantization:
    """How a run's backbone is quantised: ``method`` (int8, nf4, fp4) and, for 4 bits, the dtype the
    dequantised weights multiply in and whether the per-block scales are quantised too (double quantisation)."""

    method: str
    compute_dtype: str = DEFAULT_COMPUTE_DTYPE
    double_quant: bool = False

    @classmethod
    def of(cls, spec) -> Quantization | None:
        """The quantisation a :class:`~petlprof.sweep.spec.RunSpec` asks for (None: ``--quantize none``)."""
        if spec.quantize == NONE:
            return None
        return cls(spec.quantize, spec.quantize_compute_dtype, spec.quantize_double)

    @property
    def four_bit(self) -> bool:
        return self.method in FOUR_BIT

    def bnb_config(self):
        """transformers' :class:`~transformers.BitsAndBytesConfig` of these settings."""
        # transformers: slow to import, loaded only when used
        from transformers import BitsAndBytesConfig

        if not self.four_bit:
            return BitsAndBytesConfig(load_in_8bit=True)
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.method,
            bnb_4bit_compute_dtype=self.compute_dtype,
            bnb_4bit_use_double_quant=self.double_quant,
        )


def run_fields(quantize: str, compute_dtype: str, double_quant: bool) -> QuantizeFields:
    """The RunSpec fields of one run of a sweep's ``--quantize`` value: the 4-bit settings only where they act
    (an unquantised or int8 run keeps the defaults, so its run key does not depend on them)."""
    four_bit = quantize in FOUR_BIT
    return {
        "quantize": quantize,
        "quantize_compute_dtype": compute_dtype if four_bit else DEFAULT_COMPUTE_DTYPE,
        "quantize_double": double_quant if four_bit else False,
    }


def check_available(method: str) -> None:
    """A quantising ``--quantize`` needs bitsandbytes (an optional dependency): one line naming the extra."""
    if method != NONE and importlib.util.find_spec("bitsandbytes") is None:
        raise UsageError(f"--quantize {method} needs bitsandbytes, which is not installed: {INSTALL}")


def kept_in_float(model) -> list[str]:
    """The module names ``from_pretrained`` leaves unquantised: the output embeddings (LM head), weights tied
    to them, the model's last module, and the model class's ``_keep_in_fp32_modules`` (T5: ``wo``)."""
    # transformers: slow to import, loaded only when used
    from transformers.quantizers.base import get_keys_to_not_convert

    return sorted({*get_keys_to_not_convert(model), *(getattr(model, "_keep_in_fp32_modules", None) or ())})


def quantize_model(model, settings: Quantization, device: str) -> QuantizationInfo:
    """Quantise ``model``'s linear layers in place, on ``device``, as ``from_pretrained`` with
    ``settings.bnb_config()`` would (see the module's docstring); returns the record's
    ``training.quantization``."""
    check_available(settings.method)
    # bitsandbytes: optional (petlprof[quantize]); torch, transformers: slow to import, loaded only when used
    import bitsandbytes as bnb
    import torch
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D

    linears = {
        name: module
        for name, module in model.named_modules()
        if type(module) is torch.nn.Linear or isinstance(module, Conv1D)
    }
    replace_with_bnb_linear(
        model, modules_to_not_convert=kept_in_float(model), quantization_config=settings.bnb_config()
    )
    quantized = [
        name for name, module in model.named_modules() if isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))
    ]
    for name in quantized:
        _load_quantized(bnb, model.get_submodule(name), linears[name], settings, device)
    model.is_loaded_in_4bit, model.is_loaded_in_8bit = settings.four_bit, not settings.four_bit  # PEFT reads these
    return _describe(bnb, model, settings, quantized, [name for name in linears if name not in quantized], device)


def _load_quantized(bnb, layer, source, settings: Quantization, device: str) -> None:
    """Give a bitsandbytes layer (made on the meta device) the weights of the float layer it replaces,
    quantised on ``device`` as transformers' loader does; GPT-2's Conv1D stores its weight transposed."""
    # torch, transformers: slow to import, loaded only when used
    import torch
    from transformers.pytorch_utils import Conv1D

    weight = source.weight.data
    weight = (weight.T if isinstance(source, Conv1D) else weight).contiguous()
    attributes = dict(layer.weight.__dict__)  # the meta parameter's settings (block size, quant type, ...)
    if settings.four_bit:
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, **attributes).to(device)
        layer.support_avx512bf16_for_cpu = False  # keep the training layout in every phase (module docstring)
    else:
        attributes.pop("SCB", None)
        layer.weight = bnb.nn.Int8Params(weight.to("cpu"), requires_grad=False, **attributes).to(device)
    if source.bias is not None:
        # a 4-bit layer casts its bias to the compute dtype at its first forward pass; done now, so the memory
        # breakdown taken before training is the one training runs with
        dtype = getattr(torch, settings.compute_dtype) if settings.four_bit else source.bias.dtype
        bias = source.bias.data.to(device=device, dtype=dtype)
        layer.bias = torch.nn.Parameter(bias, requires_grad=source.bias.requires_grad)


def _describe(
    bnb, model, settings: Quantization, quantized: list[str], kept: list[str], device: str
) -> QuantizationInfo:
    # kept out of petlprof --help's imports
    from petlprof.models.architecture import name_patterns

    layers = [model.get_submodule(name) for name in quantized]
    info: QuantizationInfo = {
        "method": settings.method,
        "library": f"bitsandbytes {bnb.__version__}",
        "quantized_layers": len(quantized),
        "quantized_modules": name_patterns(quantized),
        "kept_in_float": name_patterns(kept),
        "packed_bytes": sum(layer.weight.numel() * layer.weight.element_size() for layer in layers),
        "state_bytes": _distinct_bytes(quantization_state(model), [layer.weight for layer in layers]),
    }
    if settings.four_bit:
        info.update(
            {
                "compute_dtype": settings.compute_dtype,
                "double_quant": settings.double_quant,
                "blocksize": int(layers[0].weight.blocksize) if layers else None,
                "cpu_inference_repacking": False,
            }
        )
    else:
        info.update(
            {
                "inputs": _int8_products(device),
                "outlier_threshold": float(settings.bnb_config().llm_int8_threshold),
            }
        )
    return info


def quantization_state(model) -> list:
    """The tensors beside the packed weights that a quantised model's layers keep: per 4-bit layer its block
    scales (``absmax``), code book and, with double quantisation, the scales' own scales, code book and offset;
    per 8-bit layer its row scales (``SCB``; on the layer's matmul state after its first forward pass, where
    ``CB`` is the weight itself).  Empty for a model without bitsandbytes layers."""
    if "bitsandbytes" not in sys.modules:  # no bitsandbytes layer can exist
        return []
    # torch: slow to import, loaded only when used
    import torch

    bnb = sys.modules["bitsandbytes"]
    tensors = []
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            nested = getattr(state, "state2", None)
            parts = [] if state is None else [state.absmax, state.code, state.offset]
            parts += [] if nested is None else [nested.absmax, nested.code]
        elif isinstance(module, bnb.nn.Linear8bitLt):
            parts = [module.weight.SCB, module.weight.CB, module.state.SCB, module.state.CB]
        else:
            continue
        tensors += [t for t in parts if isinstance(t, torch.Tensor)]
    return tensors


def _distinct_bytes(tensors: list, besides: list) -> int:
    """Bytes of ``tensors``, each storage once and none of ``besides``' (an 8-bit layer's ``CB`` is its weight)."""
    seen = {tensor.untyped_storage()._cdata for tensor in besides}
    total = 0
    for tensor in tensors:
        if tensor.untyped_storage()._cdata not in seen:
            seen.add(tensor.untyped_storage()._cdata)
            total += tensor.numel() * tensor.element_size()
    return total


def float_weight(module) -> Any:
    """A linear layer's weight as float numbers, detached: a bitsandbytes layer's packed weight dequantised
    (through transformers' ``dequantize_bnb_weight``, which knows both layouts), any other weight as it is.
    For code that reads a frozen backbone's weights, such as LST's pruned initialisation."""
    weight = module.weight
    if type(weight).__name__ in ("Params4bit", "Int8Params"):
        # transformers: slow to import, loaded only when used
        from transformers.integrations.bitsandbytes import dequantize_bnb_weight

        return dequantize_bnb_weight(weight, getattr(module, "state", None)).detach().float()
    return weight.detach()


def parameter_count(model) -> int:
    """Parameters of ``model`` as weights, not as stored: a 4-bit layer's packed weight holds two a byte
    (its quantisation state knows the weight's shape), as PEFT's ``get_nb_trainable_parameters`` counts them.
    The run's and the estimate's ``total_params``."""

    total = 0
    for param in model.parameters():
        state = getattr(param, "quant_state", None)
        total += math.prod(state.shape) if state is not None else param.numel()
    return total


def _int8_products(device: str) -> str:
    """How bitsandbytes multiplies by an 8-bit weight on ``device`` (its ``autograd._functions.matmul``): in
    training on a CPU the weight is dequantised for each product, which runs in float (``MatMul8bitFp``, faster
    there than LLM.int8()'s int8 kernels); otherwise LLM.int8()."""
    int8 = "LLM.int8() (inputs quantised per row through float16, outlier columns beyond the threshold in float16)"
    if device.split(":")[0] in ("cpu", "xpu"):
        return f"training: weights dequantised for each product, in float (MatMul8bitFp); evaluation: {int8}"
    return int8
