"""The language-modelling objective of an estimate (``--objective lm``): what its step reads and the KV cache.

A language-modelling step reads a prompt of ``--max-length`` tokens and a target of ``--target-length``
tokens.  A decoder reads them as one sequence (prompt + target) and its loss counts the target's
positions only; an encoder-decoder's encoder reads the prompt and its decoder only the target (shifted
right), so its decoder costs ``target-length`` positions, not the input's.  The step traced is the
run's (:class:`petlprof.models.classifier.make_task_model`'s language model: the backbone's own LM head, logits
over the whole vocabulary, only at the positions that predict a target token, as the run computes them
given labels), so the logits' bytes are those the task model creates; the record says at how many
positions it computes them (a decoder's target positions, not its prompt's) and how many the loss counts.

Generation keeps a key and a value per layer, KV head and generated token: its cache grows by
``2 x layers x kv_heads x head_dim x dtype bytes x batch`` bytes a token (grouped-query attention
has fewer KV heads than query heads; an encoder-decoder caches its decoder's self-attention so, and
its cross-attention once for the whole prompt).
"""

from __future__ import annotations

import math
from typing import TypedDict

from petlprof.errors import UsageError
from petlprof.estimate.roofline import DecodeStep

DEFAULT_TARGET_LENGTH = 32
KV_FORMULA = "2 x layers x kv_heads x head_dim x dtype bytes x batch"


class AttentionShape(TypedDict):
    """What generating caches per token (:func:`attention_shape`)."""

    layers: int  # layers that cache keys and values (an encoder-decoder's decoder)
    kv_heads: int
    head_dim: int


class _KvPerToken(AttentionShape):
    bytes_per_generated_token: int
    formula: str  # KV_FORMULA
    dtype_bytes: int
    batch_size: int


class _KvCache(_KvPerToken):
    bytes_at_end: int  # after the prompt and the target


class KvCache(_KvCache, total=False):
    """The KV cache of generation (:func:`kv_cache`), the ``lm`` section's ``kv_cache``."""

    self_attention_bytes_at_end: int  # an encoder-decoder's: its decoder's self-attention, over the target
    cross_attention_bytes: int  # an encoder-decoder's: cross-attention's, over the prompt, once


class LmFigures(TypedDict):
    """The estimate record's ``lm`` section (:func:`lm_figures`)."""

    prompt_length: int
    target_length: int | None
    reads: str  # what the encoder and decoder (or the one decoder) read, in words
    loss_positions: int  # target tokens; prompt (and padding) positions ignored
    logits_shape: list[int]  # the task model's logits: scored positions (of every row) x vocabulary
    logits_positions: int
    logits_bytes: int
    kv_cache: KvCache


def check_family(family: str, backbone: str) -> None:
    """The LM objective needs a backbone that generates: a decoder or an encoder-decoder."""
    # kept out of petlprof --help's imports
    from petlprof.models.families import ENCODER

    if family == ENCODER:
        raise UsageError(
            f"--objective lm needs a decoder or an encoder-decoder backbone; '{backbone}' is an encoder (it has no "
            "language-modelling head to generate with)"
        )


def attention_shape(config) -> AttentionShape:
    """Layers that cache keys and values when generating (an encoder-decoder's decoder), KV heads and head width."""
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    layers = getattr(config, "num_decoder_layers", None) if encoder_decoder else None
    layers = int(layers if layers is not None else config.num_hidden_layers)
    heads = int(config.num_attention_heads)  # every supported config maps this name (T5 num_heads, GPT-2 n_head)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "d_kv", None) or int(config.hidden_size) // heads
    return {"layers": layers, "kv_heads": int(kv_heads), "head_dim": int(head_dim)}


def kv_cache(config, batch_size: int, dtype_bytes: int, prompt_length: int, target_length: int) -> KvCache:
    """Bytes the KV cache adds per generated token, and holds after ``target_length`` tokens of a prompt."""
    shape = attention_shape(config)
    per_token = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * dtype_bytes * batch_size
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    figures: _KvPerToken = {
        "bytes_per_generated_token": per_token,
        "formula": KV_FORMULA,
        **shape,
        "dtype_bytes": dtype_bytes,
        "batch_size": batch_size,
    }
    if encoder_decoder:  # the decoder's self-attention caches the target; cross-attention the prompt, once
        return {
            **figures,
            "self_attention_bytes_at_end": per_token * target_length,
            "cross_attention_bytes": per_token * prompt_length,
            "bytes_at_end": per_token * (target_length + prompt_length),
        }
    # the prompt's keys and values, then one more position per generated token
    return {**figures, "bytes_at_end": per_token * (prompt_length + target_length)}


def lm_figures(config, settings, logits_shape: tuple[int, ...], logits_bytes: int, dtype_bytes: int) -> LmFigures:
    """The record's ``lm`` section: lengths, the positions the logits and the loss cover, the KV cache."""
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    prompt, target = settings.max_length, settings.target_length
    return {
        "prompt_length": prompt,
        "target_length": target,
        "reads": (
            f"encoder: the {prompt} prompt tokens; decoder: the {target} target tokens (shifted right)"
            if encoder_decoder
            else f"one sequence of {prompt} prompt + {target} target tokens"
        ),
        "loss_positions": settings.batch_size * target,  # target tokens; prompt (and padding) positions ignored
        "logits_shape": list(logits_shape),  # the task model's logits: scored positions (of every row) x vocabulary
        "logits_positions": math.prod(logits_shape[:-1]) if logits_shape else 0,
        "logits_bytes": logits_bytes,
        "kv_cache": kv_cache(config, settings.batch_size, dtype_bytes, prompt, target),
    }


def decode_reads(model, config) -> tuple[int, int]:
    """(bytes of the weights, FLOPs per row) of one generation step of ``model`` (a task model on any device, meta
    included): every parameter a new token passes, stored as it is (a quantised layer's packed bytes), read once a
    step; 2 FLOPs per weight of each linear layer it passes (the LM head included).  Not the encoder of an
    encoder-decoder (it reads the prompt once) nor its cross-attention's key and value projections (computed once
    over the encoder's output, then cached), nor an input embedding's table (a step reads one row of it), unless the
    LM head multiplies by it (tied)."""
    # torch: slow to import, loaded only when used
    from torch import nn

    # transformers: loaded by the estimate already
    from transformers import PreTrainedModel

    # the transformers model inside the task model (and inside a method's wrapper of it): its encoder and head
    hf = next(m for m in model.modules() if isinstance(m, PreTrainedModel))
    encoder = hf.get_encoder() if bool(getattr(config, "is_encoder_decoder", False)) else None
    skipped = {id(p) for p in encoder.parameters()} if encoder is not None else set()
    skipped |= {id(p) for name, m in model.named_modules() if _cross_key_value(name) for p in m.parameters()}
    head = getattr(model, "untied_head", None) or hf.get_output_embeddings()
    tied = {id(head.weight)} if head is not None else set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            skipped |= {id(p) for p in module.parameters()} - tied
    skipped -= tied
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skipped)
    flops = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Embedding) or weight is None or id(weight) in skipped or weight.dim() != 2:
            continue
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":  # GPT-2's linear layers
            # a quantised layer's logical shape, not its packed storage's
            flops += (
                2 * getattr(module, "in_features", weight.shape[0]) * getattr(module, "out_features", weight.shape[1])
            )
    return weights, flops


# an encoder-decoder's cross-attention: its parent module's name, and its key and value projections' (T5, BART's
# family, Marian, Pegasus, Whisper, ...), which read the encoder's output once and are cached for every later step
_CROSS_ATTENTION = ("EncDecAttention", "encoder_attn", "crossattention", "cross_attn")
_KEY_VALUE = ("k", "v", "k_proj", "v_proj", "key", "value")


def _cross_key_value(name: str) -> bool:
    """Whether module ``name`` (dotted) is a cross-attention's key or value projection."""
    parts = name.split(".")
    return len(parts) > 1 and parts[-1] in _KEY_VALUE and parts[-2] in _CROSS_ATTENTION


def decode_step(model, config, settings, kv: KvCache, kernels: int) -> DecodeStep:
    """The :class:`~petlprof.estimate.roofline.DecodeStep` of generating ``settings.target_length`` tokens after a
    prompt of ``settings.max_length`` with ``model``: a decoder's cache holds the prompt from its first step, an
    encoder-decoder's decoder starts empty and reads the prompt's cross-attention cache every step."""
    weights, flops = decode_reads(model, config)
    shape = attention_shape(config)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    per_position = 4 * shape["layers"] * int(config.num_attention_heads) * shape["head_dim"]  # QK and AV, 2 FLOPs each
    return DecodeStep(
        weights_bytes=weights,
        flops_per_row=flops + (per_position * settings.max_length if encoder_decoder else 0),  # cross-attention
        attention_flops_per_position=per_position,
        kv_bytes_per_position=kv["bytes_per_generated_token"],
        fixed_bytes=kv.get("cross_attention_bytes", 0),
        kernels=kernels,
        batch=settings.batch_size,
        prompt_length=0 if encoder_decoder else settings.max_length,
        target_length=settings.target_length,
    )
