"""LST's pruned initialisation: each side layer from the backbone layer it sits beside, structurally pruned.

The criterion is the LST authors' (their ``pruning_v2``): keep the rows/columns whose weights have the
largest L1 norm, with the query, key and value rows of an attention block ranked together by the L1 norm
of their elementwise product.  Three choices differ from their T5-only code, and are said in
:mod:`petlprof.methods.lst.model`: the residual dimensions are picked once per stack (from the embedding
matrix, their first step) rather than after every projection; query/key/value rows are picked within
each head (the head count is kept); and the ladders start as the selection of the kept dimensions.
Works from the architecture description (:mod:`petlprof.models.architecture`), so any family whose attention
projections and feed-forward output it names (BERT, T5, LLaMA, GPT-2's fused ``c_attn`` included).
"""

from __future__ import annotations

import functools
import operator

import torch
from torch import nn

from petlprof.errors import UsageError
from petlprof.models.architecture import describe
from petlprof.models.quantization import float_weight


def _weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [out, in], bias) of a linear layer or of GPT-2's Conv1D (stored [in, out])."""
    weight = float_weight(module)  # a quantised backbone's (--quantize) packed weight, dequantised
    if not isinstance(module, nn.Linear) and hasattr(module, "nf"):
        weight = weight.t()
    bias = getattr(module, "bias", None)
    return weight, (None if bias is None else bias.detach())


def _top(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the ``keep`` largest scores, in their original order."""
    return torch.sort(torch.topk(scores, keep).indices).values


def _copy(target: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    target.weight.copy_(weight.to(target.weight.dtype))
    if target.bias is not None:
        if bias is None:
            target.bias.zero_()
        else:
            target.bias.copy_(bias.to(target.bias.dtype))


def _norm_tensor(norm: nn.Module, name: str) -> torch.Tensor | None:
    """A norm layer's ``weight`` or ``bias``; None where it has none."""
    value = getattr(norm, name, None)
    return value if isinstance(value, torch.Tensor) else None


def _copy_norm(target: nn.Module, source: nn.Module | None, kept: torch.Tensor) -> None:
    if source is None:
        return
    weight, source_weight = _norm_tensor(target, "weight"), _norm_tensor(source, "weight")
    if weight is None or source_weight is None:
        raise ValueError(
            f"side norm {type(target).__name__} cannot start from {type(source).__name__}: one of them has no weight"
        )
    weight.copy_(source_weight.detach()[kept].to(weight.dtype))
    bias, source_bias = _norm_tensor(target, "bias"), _norm_tensor(source, "bias")
    if bias is not None and source_bias is not None:
        bias.copy_(source_bias.detach()[kept].to(bias.dtype))


def _norms(module: nn.Module, width: int) -> list[nn.Module]:
    """The norm layers over the model width inside ``module``, in module order."""
    return [
        m
        for _, m in module.named_modules()
        if "norm" in type(m).__name__.lower()
        and isinstance(getattr(m, "weight", None), torch.Tensor)
        and m.weight.shape == (width,)
    ]


def _attention(target, backbone, attention, kept, shape) -> None:
    """Prune one attention block to the side's per-head width; ``kept``: the residual dimensions."""
    if attention.fused_qkv:
        fused, fused_bias = _weight(backbone.get_submodule(attention.fused_qkv))
        # [query; key; value] rows: the query as wide as the model, key and value narrower under grouped or
        # multi-query attention (GPT-2's c_attn: thirds; Falcon's multi-query: hidden + 2 x head_dim)
        kv = (fused.shape[0] - shape.width) // 2
        sizes = [fused.shape[0] - 2 * kv, kv, kv]
        q, k, v = fused.split(sizes, dim=0)
        qb, _, vb = (None, None, None) if fused_bias is None else fused_bias.split(sizes)
    else:
        (q, qb), (k, _), (v, vb) = (
            _weight(backbone.get_submodule(getattr(attention, n))) for n in ("query", "key", "value")
        )
    o, ob = _weight(backbone.get_submodule(attention.output))
    q, k, v = q[:, kept], k[:, kept], v[:, kept]
    heads, kv_heads = shape.heads, shape.kv_heads
    head_dim = q.shape[0] // heads
    group = heads // kv_heads
    q_abs = q.abs().reshape(kv_heads, group, head_dim, -1).mean(1)  # the query heads that share each key/value head
    importance = (q_abs * k.abs().reshape(kv_heads, head_dim, -1) * v.abs().reshape(kv_heads, head_dim, -1)).sum(-1)
    rows = torch.stack([_top(importance[g], shape.head_dim) for g in range(kv_heads)])  # [kv_heads, head_dim']
    offsets = torch.arange(heads, device=rows.device)[:, None] * head_dim
    kv_rows = (rows + offsets[:kv_heads]).reshape(-1)
    q_rows = (rows.repeat_interleave(group, 0) + offsets).reshape(-1)
    _copy(target.query, q[q_rows], None if qb is None else qb[q_rows])
    _copy(target.key, k[kv_rows], None)
    _copy(target.value, v[kv_rows], None if vb is None else vb[kv_rows])
    _copy(target.out, o[kept][:, q_rows], None if ob is None else ob[kept])


def _feed_forward(target, backbone, block, attention_names, kept, shape) -> None:
    width = shape.width
    block_module = backbone.get_submodule(block.name)
    inputs = []
    for name, module in block_module.named_modules():
        full = f"{block.name}.{name}"
        if not name or any(full.startswith(a + ".") or full == a for a in attention_names):
            continue
        if isinstance(module, nn.Linear) or hasattr(module, "nf"):
            weight, _ = _weight(module)
            if weight.shape[1] == width and weight.shape[0] != width:
                inputs.append(module)
    out, out_bias = _weight(backbone.get_submodule(block.ffn_output))
    if not inputs or (shape.gated and len(inputs) < 2):
        raise UsageError(
            f"lst init=pruned cannot find the feed-forward input of block '{block.name}'; use lst.init=random"
        )
    gate, inner = (inputs[0], inputs[1]) if shape.gated else (None, inputs[0])
    inner_w, inner_b = _weight(inner)
    importance = inner_w[:, kept].abs() * out[kept].t().abs()
    if gate is not None:
        gate_w, gate_b = _weight(gate)
        importance = importance * gate_w[:, kept].abs()
    units = _top(importance.sum(-1), shape.ffn)
    _copy(target.inner, inner_w[units][:, kept], None if inner_b is None else inner_b[units])
    if gate is not None:
        _copy(target.gate, gate_w[units][:, kept], None if gate_b is None else gate_b[units])
    _copy(target.outer, out[kept][:, units], None if out_bias is None else out_bias[kept])


def _final_norm(backbone, stack_name: str, width: int) -> nn.Module | None:
    parent = stack_name.rsplit(".", 1)[0] if "." in stack_name else ""
    module = backbone.get_submodule(parent) if parent else backbone
    for name, child in module.named_children():
        if name != stack_name.rsplit(".", 1)[-1] and _norms(child, width) == [child]:
            return child
    return None


def _residual_dimensions(backbone, stack, shape) -> torch.Tensor:
    """The side width's residual dimensions: the embedding columns of largest L1 norm (the authors' first step);
    where the embeddings are narrower than the model (ALBERT), the columns of largest L1 norm of the first
    block's query, key and value weights, which read the residual stream."""
    embedding = backbone.get_input_embeddings().weight.detach()
    if embedding.shape[1] == shape.width:
        return _top(embedding.abs().sum(0), shape.side)
    attention = stack.blocks[0].attentions[0]
    names = [attention.fused_qkv] if attention.fused_qkv else [attention.query, attention.key, attention.value]
    scores = functools.reduce(operator.add, [_weight(backbone.get_submodule(n))[0].abs().sum(0) for n in names if n])
    return _top(scores, shape.side)


@torch.no_grad()
def initialise_from_backbone(model, backbone) -> None:
    """Copy each backbone layer, pruned to the side width, into the side layer beside it."""
    shape = model.shape
    arch = describe(backbone)
    ladders = [model.encoder_side, model.side] if model.encoder_decoder else [model.side]
    stacks = list(arch.stacks)
    if len(stacks) != len(ladders) or any(
        not s.blocks or len(s.blocks) > len(ladder.layers) for s, ladder in zip(stacks, ladders)
    ):
        raise UsageError(
            f"lst init=pruned cannot pair the {arch.model_type} backbone's layers with the side network's; "
            "use lst.init=random"
        )
    kept = _residual_dimensions(backbone, stacks[0], shape)
    for stack, ladder in zip(stacks, ladders):
        depth = len(ladder.layers)
        for i, layer in enumerate(ladder.layers):  # ALBERT: every layer runs the same shared block
            block = stack.blocks[i * len(stack.blocks) // depth]
            block_module = backbone.get_submodule(block.name)
            attentions = [layer.self_attention] + ([layer.cross_attention] if layer.cross_attention is not None else [])
            if len(block.attentions) < len(attentions) or any(not a.output for a in block.attentions):
                raise UsageError(f"lst init=pruned cannot read block '{block.name}'; use lst.init=random")
            for target, attention in zip(attentions, block.attentions):
                _attention(target, backbone, attention, kept, shape)
            _feed_forward(
                target=layer.ffn,
                backbone=backbone,
                block=block,
                attention_names=[a.name for a in block.attentions],
                kept=kept,
                shape=shape,
            )
            side_norms = (
                [layer.norm_self] + ([layer.norm_cross] if layer.norm_cross is not None else []) + [layer.norm_ffn]
            )
            for target, source in zip(side_norms, _norms(block_module, shape.width)):
                _copy_norm(target, source, kept)
        _copy_norm(ladder.norm, _final_norm(backbone, stack.name, shape.width), kept)
        for down in ladder.down:  # the ladders start as the selection of the kept dimensions
            down.weight.zero_()
            down.weight[torch.arange(shape.side, device=down.weight.device), kept.to(down.weight.device)] = 1.0
            down.bias.zero_()
