"""``petlprof estimate --quantize int8|nf4|fp4``: the frozen backbone as bitsandbytes stores it, on the meta device.

The backbone is quantised by the run's own function (:func:`petlprof.models.quantization.quantize_model`):
transformers' choice of the layers that stay in float (the LM head and weights tied to it, a model
class's ``_keep_in_fp32_modules``), its module swap, the biases cast as a run casts them, the flags PEFT
reads, so LoRA on it is PEFT's bitsandbytes LoRA layer as in a run.  bitsandbytes quantises a parameter
as it moves to a device, and not to meta; so on meta each swapped layer's weight is then quantised here
by the same public functions its parameter classes call (``Params4bit`` and ``Int8Params``), whose meta
kernels give the exact shapes and dtypes (bitsandbytes 0.50, ``functional.quantize_4bit`` and
``functional.int8_vectorwise_quant``):

* 4-bit (nf4, fp4): the weight packed two values a byte (``uint8``, ``ceil(n / 2)`` bytes), its float32
  absolute maximum per block of 64 values and a 16-entry float32 code book per layer; with double
  quantisation the block maxima are themselves quantised to one ``uint8`` each, with a float32 maximum
  per block of 256 of them, a float32 offset and the 256-entry float32 code book, per layer;
* int8: one ``int8`` byte per weight and a float32 scale per output row (``SCB``).

Everything else stays as the run leaves it (embeddings, norms, the head, a kept layer's weight: float32;
a 4-bit layer's bias in its compute dtype).  In the step, a 4-bit layer dequantises its whole weight to
the compute dtype for each product, forward (``gemm_4bit``: the dequantised block maxima with double
quantisation, then the weight, then ``linear``) and backward (``MatMul4Bit``); the trace runs
bitsandbytes' own code for both, so these temporaries count where they are alive
(:mod:`petlprof.estimate.trace`).  An int8 layer is not traced on meta: bitsandbytes picks its int8
product by the input's device (a CPU trains through ``MatMul8bitFp``, a GPU through LLM.int8() with
outlier columns found in the activations' values), which a meta tensor has neither of; such a step takes
the exact fallback on real tensors (:mod:`petlprof.estimate.fallback`), a CPU's path.
"""

from __future__ import annotations

from petlprof.estimate.kernels import UntraceableError
from petlprof.estimate.trace import MetaTrace
from petlprof.models.quantization import QuantizationInfo, quantization_state, quantize_model


def quantize_backbone(model, quantization, device: str) -> QuantizationInfo:
    """Quantise ``model``'s linear layers in place as a run does (``quantization``: a
    :class:`petlprof.models.quantization.Quantization`), on ``device`` (``meta``: with the weights quantised here, see
    the module docstring); returns the record's ``quantization`` (the run record's ``training.quantization``)."""

    if device != "meta":
        return quantize_model(model, quantization, device)
    check_traceable(quantization)
    # bitsandbytes: optional (petlprof[quantize])
    import bitsandbytes as bnb

    # under the tracer a real tensor moved to meta stays real: bitsandbytes' shared code book (``name2qmap``),
    # made on the first double quantisation, stays a CPU tensor that later real runs in this process can use
    with MetaTrace():
        info = quantize_model(model, quantization, device)
        layers = quantized_layers(bnb, model)
        for layer in layers:
            _pack_4bit(bnb, layer)
    info.update({"packed_bytes": packed_bytes(layers), "state_bytes": state_bytes(model, layers)})
    return info


def _pack_4bit(bnb, layer) -> None:
    """``Params4bit._quantize`` on meta: ``quantize_4bit`` of the float weight, the packed bytes kept."""
    weight = layer.weight
    packed, state = bnb.functional.quantize_4bit(
        weight.data.contiguous(),
        blocksize=weight.blocksize,
        compress_statistics=weight.compress_statistics,
        quant_type=weight.quant_type,
        quant_storage=weight.quant_storage,
    )
    weight.data, weight.quant_state, weight.bnb_quantized = packed, state, True
    layer.quant_state = state


def quantized_layers(bnb, model) -> list:
    return [m for m in model.modules() if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))]


def packed_bytes(layers: list) -> int:
    """Bytes of the quantised layers' weights as stored (packed 4-bit, or int8)."""
    return sum(layer.weight.numel() * layer.weight.element_size() for layer in layers)


def state_bytes(model, layers: list) -> int:
    """Bytes of the quantisation state beside the weights (:func:`petlprof.models.quantization.quantization_state`),
    each storage once; an int8 layer's ``CB`` is its weight and not counted again."""

    seen = {layer.weight.untyped_storage()._cdata for layer in layers}
    total = 0
    for tensor in quantization_state(model):
        key = tensor.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def check_traceable(quantization) -> None:
    """An int8 backbone is not built on meta (the module docstring): the caller takes the exact fallback."""
    if quantization is not None and not quantization.four_bit:
        raise UntraceableError(
            "bitsandbytes picks its int8 product by the input's device (a CPU's MatMul8bitFp, a GPU's LLM.int8() "
            "with outlier columns taken from the activations' values), which a meta tensor has neither of"
        )
