"""Trace one training step and one inference batch of a model whose weights live on the meta device.

The model's parameters, buffers, activations, gradients and optimiser state are meta tensors:
shapes and dtypes without storage, so a 70B model costs no memory.  The batch (token ids,
attention mask, labels) stays real, and so does everything computed from it alone (positions,
padding masks, the optimiser's step counters): the model's control flow reads those values
(transformers skips an all-ones mask; READ gathers the real tokens), so they must be known.

:class:`MetaTrace` is a dispatch mode that does both jobs:

* runs each ATen operation: an operation that mixes real and meta tensors runs on meta (real
  arguments moved there; a boolean index becomes the indices it selects, so the result's shape is
  known); moving a real tensor to the meta device keeps it real (a real run's inputs live on the
  model's device, so a value the model reads stays readable), and moving a meta tensor to a real
  device keeps it meta (a buffer moved to the inputs' device, as RoBERTa's token types are);
* remembers the result's shape of each operation on meta tensors that creates new tensors (no
  views, no in-place update), by the operation and its arguments' shapes: the layers of a stack
  repeat the same operations on the same shapes, so the meta kernels run once per distinct call;
* counts the bytes of every storage an operation creates, real or meta, until the last tensor on
  it is freed -- the rule of the ``cpu-tensors`` meter (:mod:`petlprof.meters.tensors`): an output
  that aliases an input (views, in-place updates) is not new memory, but a view keeps its storage
  alive until the view is freed too;
* runs a bitsandbytes operation that a CPU runs by its composite kernel (``gemm_4bit``: a 4-bit
  layer's weight dequantised whole, then multiplied) through that kernel under itself, so the
  temporaries inside it count (as one dispatched call, or by its meta kernel, only its output would).

An operation without a meta kernel raises :class:`UntraceableError`; the caller then uses the
exact fallback in :mod:`petlprof.estimate.fallback`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_is_leaf, tree_leaves, tree_map, tree_unflatten

from petlprof.estimate.autocast import MetaAutocast, policy_device
from petlprof.estimate.kernels import DeviceKernels, UntraceableError, flop_formulas
from petlprof.meters.tensors import run_composite, runs_composite
from petlprof.models.quantization import EIGHT_BIT_BLOCK, EIGHT_BIT_MIN_NUMEL
from petlprof.run.recipe import AUTOCAST_DTYPES, TrainRecipe
from petlprof.run.train import loss_fn as classifier_loss
from petlprof.vocabulary import ADAMW, FP16, FP32, IGNORE_INDEX

aten = torch.ops.aten
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


_CACHE_LIMIT = 200_000
_OUTPUTS: dict[tuple, tuple] = {}  # (op, arguments' shapes) -> (output tree spec, output leaves' metadata)
_RESHAPING = {aten.resize_.default, aten.set_.source_Storage, aten.set_.source_Tensor, aten.set_.default}
_ALIASING: set = set()  # operations seen returning a view of an argument although their schema says no alias
# a CPU allocation this large is mapped from the kernel each time (glibc's largest mmap threshold), so its first
# write faults in fresh pages: 64 MiB filled at 15 ms here, against 1.4 ms for a buffer used again; smaller ones
# come back from the heap already mapped (a 31 MiB buffer filled at 0.65 ms)
FRESH_PAGES_BYTES = 32 * 2**20
_KINDS: dict = {}  # operation -> "new" | "update" | "other" (see _kind)
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)
_LOSS_SCALE = 2.0**16  # GradScaler's first scale (the value changes no byte)


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _to_meta(value):
    return value.to("meta") if isinstance(value, torch.Tensor) and not value.is_meta else value


def _index_on_meta(args: tuple) -> tuple:
    """A real boolean index -> the real indices it selects (their count is the result's shape)."""
    indices = []
    for index in args[1]:
        if index is not None and not index.is_meta and index.dtype == torch.bool:
            indices.extend(index.nonzero(as_tuple=True))
        else:
            indices.append(index)
    return (args[0], indices, *args[2:])


class MetaTrace(TorchDispatchMode):
    """Runs a step on meta weights and real inputs; ``peak_bytes``: peak of the bytes created under it.

    ``count_flops`` (a context manager): while it is open, the operations are also counted as torch's
    ``FlopCounterMode`` counts them (:func:`petlprof.estimate.kernels.flop_formulas`; an operation with a
    composite kernel run by it, its parts counted), into ``flops``.  The same counts as that mode stacked on
    this one, without its second dispatch of every operation and without its module hooks (which keep
    tensors alive longer than a run does, so the bytes of a counted pass are those of an uncounted one)."""

    def __init__(self, op_costs: bool = False) -> None:
        super().__init__()
        self.record_costs = op_costs  # also keep each counted kernel's (FLOPs, bytes moved): a prediction needs them
        self.live_bytes = 0
        self.peak_bytes = 0
        self.flops = 0
        # (FLOPs, bytes read and written, random numbers drawn, a matrix product's (batch, M, K, N) or (), bytes of
        # the new storages of at least FRESH_PAGES_BYTES it makes) of each counted kernel
        self.op_costs: list[tuple[int, int, int, tuple[int, ...], int]] = []
        self.fresh_bytes = 0  # bytes of every new storage of at least FRESH_PAGES_BYTES made so far
        self._formulas: dict | None = None  # operation packet -> its FLOP formula while counting, else None
        self._storages: dict[int, list[int]] = {}  # storage key -> [bytes, tensors alive on it]
        # id of a weak reference to a tensor on a counted storage -> (the reference, kept so it calls back; the storage)
        self._watched: dict[int, tuple[weakref.ref, int]] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing under the trace is compiled: without this, torch wraps __torch_dispatch__ in a dynamo-disabling
        # frame (two eval-frame swaps and a callback lookup), entered for every operation
        return False

    @contextlib.contextmanager
    def count_flops(self):
        """Count the FLOPs of the operations run while open (added to ``flops``)."""
        self._formulas = flop_formulas()
        try:
            yield self
        finally:
            self._formulas = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formulas = self._formulas
        if formulas is not None and func not in formulas and func is not _PRIM_DEVICE and _decomposes(func):
            with self:  # as FlopCounterMode does: an operation with a composite kernel is counted by its parts
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        fresh_before = self.fresh_bytes
        out, inputs = self._run(func, args, kwargs)
        if isinstance(out, torch.Tensor):
            self._track(out, inputs)
        else:
            for tensor in _leaves(out):
                if isinstance(tensor, torch.Tensor):
                    self._track(tensor, inputs)
        if formulas is not None:
            formula = formulas.get(func._overloadpacket)
            flops = formula(*args, **kwargs, out_val=out) if formula is not None else 0
            self.flops += flops
            if self.record_costs and func is not _PRIM_DEVICE and not _is_view(func):  # a view launches no kernel
                cost = (
                    flops,
                    _bytes_moved(func, args, kwargs, out),
                    _drawn(func, out),
                    _timed_shape(func, args, kwargs),
                    self.fresh_bytes - fresh_before,
                )
                self.op_costs.append(cost)
        return out

    def _run(self, func, args, kwargs) -> tuple[Any, set[int]]:
        """(the operation's output, the storage keys of its tensor arguments)."""
        if runs_composite(func):
            return self._composite(func, args, kwargs)
        kind = _kind(func)
        first = args[0] if args else None
        if kind == "update" and isinstance(first, torch.Tensor) and first.is_meta:
            return first, {_storage_key(first)}  # an in-place update of a meta tensor changes only its values
        if (
            kind == "updates"
            and isinstance(first, list)
            and all(isinstance(t, torch.Tensor) and t.is_meta for t in first)
        ):
            return None, {_storage_key(t) for t in first}  # the same for a list of them (AdamW's foreach loop)
        if func is aten._to_copy.default and isinstance(first, torch.Tensor):
            target = _device_type(kwargs.get("device"))
            if target not in (None, first.device.type):
                # a move between meta and a real device keeps the tensor where it is: a real input stays readable,
                # and a meta buffer moved to an input's device (RoBERTa's token types) stays a shape without data
                return func(*args, **{k: v for k, v in kwargs.items() if k != "device"}), {_storage_key(first)}
        leaves: list = []
        spec = _flatten((args, kwargs), leaves)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        inputs = {_storage_key(t) for t in tensors}
        if tensors:
            metas = sum(t.is_meta for t in tensors)
            if 0 < metas < len(tensors):
                if func in _INDEX_OPS:
                    args = _index_on_meta(args)
                    leaves = []
                    spec = _flatten((args, kwargs), leaves)
                leaves = [_to_meta(leaf) for leaf in leaves]
                args, kwargs = _unflatten(spec, iter(leaves))
        key = _cache_key(func, spec, leaves) if kind == "new" and tensors else None
        if key is not None:
            known = _OUTPUTS.get(key)
            if known is not None:
                return _replay(*known), inputs
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as exc:
            if any(isinstance(t, torch.Tensor) and t.is_meta for t in tree_leaves((args, kwargs))):
                raise UntraceableError(f"{func} cannot run on meta tensors: {str(exc).splitlines()[0]}") from exc
            raise
        if key is not None and len(_OUTPUTS) < _CACHE_LIMIT:
            _remember(key, out, inputs | {_storage_key(t) for t in leaves if isinstance(t, torch.Tensor)})
        return out, inputs

    def _composite(self, func, args, kwargs) -> tuple[Any, set[int]]:
        """A library operation a CPU runs by its composite kernel, run so under this trace (its inner operations
        traced too, not counted: the operation's own FLOP formula counts it), real arguments moved to meta where
        any is meta."""
        tensors = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        inputs = {_storage_key(t) for t in tensors}
        if any(t.is_meta for t in tensors):
            args, kwargs = tree_map(_to_meta, (args, kwargs))
        formulas, self._formulas = self._formulas, None
        try:
            with self:
                return run_composite(func, args, kwargs), inputs
        finally:
            self._formulas = formulas

    def _track(self, tensor: torch.Tensor, inputs: set[int]) -> None:
        key = _storage_key(tensor)
        entry = self._storages.get(key)
        if entry is None and key in inputs:
            return  # a view or in-place result of a tensor this trace did not create (a weight, an input)
        if entry is None:
            entry = self._storages[key] = [tensor.untyped_storage().nbytes(), 0]
            self.live_bytes += entry[0]
            if entry[0] >= FRESH_PAGES_BYTES:
                self.fresh_bytes += entry[0]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[1] += 1
        watch = weakref.ref(tensor, self._freed)  # (a finalizer costs twice as much; thousands are made per step)
        self._watched[id(watch)] = (watch, key)

    def _freed(self, watch: weakref.ref) -> None:
        self._release(self._watched.pop(id(watch))[1])

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live_bytes -= entry[0]
            del self._storages[key]


def _kind(func) -> str:
    """``new``: creates new tensors only (no argument written, no output an alias); ``update``: writes its
    first argument only and returns it, without changing its shape (fills, optimiser updates); ``updates``: writes
    the tensors of its first argument, a list, only and returns nothing (the in-place ``_foreach`` operations of
    AdamW's foreach loop); else ``other``."""
    kind = _KINDS.get(func)
    if kind is None:
        kind = _KINDS[func] = _schema_kind(func)
    return kind


def _schema_kind(func) -> str:
    if not isinstance(func, torch._ops.OpOverload) or func in _ALIASING:
        return "other"
    schema = func._schema
    arguments, returns = list(schema.arguments), list(schema.returns)
    if all(a.alias_info is None for a in (*arguments, *returns)):
        return "new"
    if func in _RESHAPING or torch.Tag.inplace_view in func.tags or not arguments:
        return "other"
    first = arguments[0].alias_info
    if (
        not returns
        and str(arguments[0].type) == "List[Tensor]"
        and first is not None
        and first.is_write
        and all(a.alias_info is None for a in arguments[1:])
    ):
        return "updates"
    if len(returns) != 1:
        return "other"
    written = returns[0].alias_info
    if (
        first is not None
        and first.is_write
        and written is not None
        and written.is_write
        and all(a.alias_info is None for a in arguments[1:])
    ):
        return "update"
    return "other"


_VIEWS: dict = {}


def _is_view(func) -> bool:
    """Whether the operation returns a view of an argument without writing it (``view``, ``t``, ``expand``, ...):
    metadata only, no kernel."""
    view = _VIEWS.get(func)
    if view is None:
        schema = getattr(func, "_schema", None)
        returns = schema.returns if schema is not None else []
        view = _VIEWS[func] = bool(returns) and all(
            r.alias_info is not None and not r.alias_info.is_write for r in returns
        )
    return view


# in-place operations that write their first argument without reading it (every other in-place update, ``add_``,
# ``mul_``, AdamW's ``lerp_``, ``addcmul_`` and ``addcdiv_``, reads it and writes it back)
_WRITE_ONLY = frozenset(
    getattr(aten, name)
    for name in ("copy_", "fill_", "zero_", "_foreach_copy_", "_foreach_zero_", "_foreach_fill_")
    if hasattr(aten, name)
)


def _bytes_moved(func, args: tuple, kwargs: dict, out) -> int:
    """Bytes an operation reads and writes: its tensor arguments (and lists of them) and its outputs, each
    storage once, and an in-place update's first argument twice, as it is read and written back (AdamW's
    element-wise updates: 20 passes of 4 bytes a parameter, counted 14 when each storage counted once) -- what a
    kernel moves through memory at the least (a roofline's memory term)."""
    seen: dict[int, int] = {}

    def add(value) -> None:
        if isinstance(value, torch.Tensor):
            seen.setdefault(id(value), value.numel() * value.element_size())
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    seen.setdefault(id(item), item.numel() * item.element_size())

    for value in args:
        add(value)
    for value in kwargs.values():
        add(value)
    add(out)
    moved = sum(seen.values())
    packet = getattr(func, "_overloadpacket", None)
    if _kind(func) in ("update", "updates") and packet not in _WRITE_ONLY and packet not in _RANDOM:
        first = args[0] if args else None
        firsts = first if isinstance(first, (list, tuple)) else [first]
        moved += sum(t.numel() * t.element_size() for t in firsts if isinstance(t, torch.Tensor))
    return moved


# the operations that draw random numbers, one per element of their output (dropout's masks: bernoulli_ where an
# operation decomposes, native_dropout where it is one kernel)
_RANDOM = frozenset(
    getattr(aten, name)
    for name in ("bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_", "native_dropout")
    if hasattr(aten, name)
)


def _drawn(func, out) -> int:
    """Random numbers ``func`` drew: its (first) output's elements for a random operation, else 0."""
    if getattr(func, "_overloadpacket", None) not in _RANDOM:
        return 0
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    return first.numel() if isinstance(first, torch.Tensor) else 0


SDPA, SDPA_BACKWARD = "sdpa", "sdpa_backward"  # the first item of a CPU attention kernel's shape key
_CPU_ATTENTION: dict[Any, tuple[str, int, int, int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: (SDPA, 0, 3, 4),  # kind, query's position, dropout's, causal's
    aten._scaled_dot_product_flash_attention_for_cpu_backward: (SDPA_BACKWARD, 1, 6, 7),
}


def _timed_shape(func, args: tuple, kwargs: dict) -> tuple:
    """What a CPU profile times this kernel at its own shape by (:mod:`petlprof.estimate.products`): a matrix
    product's (batch, M, K, N), CPU flash attention's (:data:`SDPA` or :data:`SDPA_BACKWARD`, query, key and value
    shapes, the mask's shape or None, dropout, causal), else ()."""
    attention = _CPU_ATTENTION.get(getattr(func, "_overloadpacket", None))
    if attention is None:
        return _product(func, args)
    kind, query, dropout, causal = attention
    q, k, v = (tuple(t.shape) for t in args[query : query + 3])
    mask = kwargs.get("attn_mask")
    dropout_p = args[dropout] if len(args) > dropout else kwargs.get("dropout_p", 0.0)
    is_causal = args[causal] if len(args) > causal else kwargs.get("is_causal", False)
    return (kind, q, k, v, None if mask is None else tuple(mask.shape), float(dropout_p), bool(is_causal))


def _product(func, args: tuple) -> tuple[int, ...]:
    """(batch, M, K, N) of a matrix product (mm, addmm, bmm: an (M, K) by (K, N) product, ``batch`` times), else ()."""
    packet = getattr(func, "_overloadpacket", None)
    operands = args[1:3] if packet is aten.addmm else args[:2] if packet in (aten.mm, aten.bmm) else ()
    if len(operands) != 2 or not all(isinstance(t, torch.Tensor) for t in operands):
        return ()
    a, b = operands
    if a.dim() == 2 and b.dim() == 2:
        return (1, a.shape[0], a.shape[1], b.shape[1])
    if a.dim() == 3 and b.dim() == 3:
        return (a.shape[0], a.shape[1], a.shape[2], b.shape[2])
    return ()


def _cache_key(func, spec, leaves: list) -> tuple | None:
    """The call's identity by its arguments' shapes, or None where that does not decide its output."""
    key = [func, spec]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if not leaf.is_meta:
                return None
            key.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.storage_offset()))
        elif isinstance(leaf, _PLAIN):
            key.append((type(leaf), leaf))
        elif isinstance(leaf, torch.memory_format):
            key.append(str(leaf))
        else:
            return None
    return tuple(key)


def _remember(key: tuple, out, inputs: set[int]) -> None:
    leaves, spec = tree_flatten(out)
    meta: list[tuple[Any, ...]] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if _storage_key(leaf) in inputs:  # e.g. _unsafe_view: no alias in its schema, but a view
                _ALIASING.add(key[0])
                _KINDS[key[0]] = "other"
                return
            plain = torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device="meta")
            if leaf.storage_offset() or leaf.untyped_storage().nbytes() != plain.untyped_storage().nbytes():
                return  # an output on a larger storage: not replayable by empty_strided
            meta.append((tuple(leaf.shape), leaf.stride(), leaf.dtype))
        elif isinstance(leaf, (int, float, bool, type(None))):
            meta.append(("value", leaf))
        else:
            return
    _OUTPUTS[key] = (spec, meta)


def _replay(spec, meta):
    leaves = [
        leaf[1] if leaf[0] == "value" else torch.empty_strided(leaf[0], leaf[1], dtype=leaf[2], device="meta")
        for leaf in meta
    ]
    return tree_unflatten(leaves, spec)


def _device_type(device) -> str | None:
    return None if device is None else torch.device(device).type


_PRIM_DEVICE = torch.ops.prim.device.default
_DECOMPOSES: dict = {}  # operation -> whether it has a composite (CompositeImplicitAutograd) kernel to decompose by
_SEQUENCES = (tuple, list, torch.Size)
_LEAF_TYPES: dict[type, bool] = {}  # type -> whether pytree takes its values as leaves


def _decomposes(func) -> bool:
    """Whether ``func.decompose`` can run (``OpOverload.decompose``'s own test, remembered per operation)."""
    known = _DECOMPOSES.get(func)
    if known is None:
        key = torch._C.DispatchKey.CompositeImplicitAutograd
        known = _DECOMPOSES[func] = isinstance(func, torch._ops.OpOverload) and (
            key in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)
        )
    return known


class _Unusual(Exception):
    """A container other than a tuple, list, torch.Size or dict: pytree flattens it."""


def _flatten(tree, leaves: list):
    """``tree``'s leaves appended to ``leaves`` in pytree's order, and its structure (hashable): pytree's flatten
    for the arguments of ATen operations (tuples, lists, sizes, dicts), without its generality's cost; any other
    container is left to pytree (its spec then is the structure)."""
    try:
        return _walk(tree, leaves)
    except _Unusual:
        leaves.clear()
        flat, spec = tree_flatten(tree)
        leaves.extend(flat)
        return spec


def _walk(tree, leaves: list):
    """The structure: None for a leaf; (type, n) for a sequence of n leaves (most are: sizes, lists of tensors);
    (type, its items' structures) for another sequence; (dict, its keys, its values' structures) for a dict."""
    kind = type(tree)
    if kind in _SEQUENCES:
        if all(_is_leaf(value) for value in tree):
            leaves.extend(tree)
            return (kind, len(tree))
        return (kind, tuple(_walk(value, leaves) for value in tree))
    if kind is dict:
        return (dict, tuple(tree), tuple(_walk(value, leaves) for value in tree.values()))
    if not _is_leaf(tree):
        raise _Unusual
    leaves.append(tree)
    return None


def _is_leaf(value) -> bool:
    kind = type(value)
    leaf = _LEAF_TYPES.get(kind)
    if leaf is None:
        leaf = _LEAF_TYPES[kind] = kind not in _SEQUENCES and kind is not dict and tree_is_leaf(value)
    return leaf


def _unflatten(structure, leaves):
    """The tree of :func:`_flatten`'s ``structure`` with ``leaves`` (an iterator) in its leaves' places."""
    if structure is None:
        return next(leaves)
    if not isinstance(structure, tuple):
        return tree_unflatten(list(leaves), structure)  # pytree's spec
    if structure[0] is dict:
        return {name: _unflatten(child, leaves) for name, child in zip(structure[1], structure[2])}
    kind, items = structure
    if isinstance(items, int):
        return kind([next(leaves) for _ in range(items)])
    return kind([_unflatten(child, leaves) for child in items])


def _leaves(out) -> list:
    """pytree's leaves of an operation's output (a tuple or list of tensors, mostly)."""
    if type(out) in (tuple, list) and all(isinstance(value, torch.Tensor) or value is None for value in out):
        return [value for value in out if value is not None]
    return tree_leaves(out)


@dataclass
class StepTrace:
    """What one traced phase created: the peak of its new bytes and its FLOPs (and the shape and bytes
    of the model's output: an LM's logits)."""

    peak_new_bytes: int
    flops: int
    output_shape: tuple[int, ...] = ()
    output_bytes: int = 0
    attention_kernels: tuple[str, ...] = ()  # the kernels its scaled_dot_product_attention calls ran (eager: none)
    op_costs: tuple[tuple[int, int, int, tuple[int, ...], int], ...] = ()  # as MetaTrace.op_costs, of the counted pass
    # a training step's: the kernels at the end of op_costs that clip the gradients and step the optimiser (fp16's
    # unscaling before them is not among them), and the elements of each tensor AdamW updates (none for another
    # optimiser)
    optimizer_kernels: int = 0
    trained_numels: tuple[int, ...] = ()


def example_batch(
    batch_size: int, max_length: int, token_id: int, real_tokens: int | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A batch padded to ``max_length``: every row real tokens (the worst case a run's dynamic padding meets), or
    ``real_tokens`` of them in all, the first row ``max_length`` (the longest, which the batch is padded to) and the
    rest shared evenly by the others, padding after them (a side network that runs on the real tokens only, READ's,
    holds what they make)."""
    rows = [max_length] * batch_size
    if real_tokens is not None and batch_size > 1:
        rest = min(max(real_tokens - max_length, batch_size - 1), (batch_size - 1) * max_length)
        rows[1:] = [rest // (batch_size - 1) + (i < rest % (batch_size - 1)) for i in range(batch_size - 1)]
    mask = (torch.arange(max_length) < torch.tensor(rows).unsqueeze(1)).long()
    inputs = {"input_ids": torch.full((batch_size, max_length), token_id, dtype=torch.long), "attention_mask": mask}
    return inputs, torch.zeros(batch_size, dtype=torch.long)


def lm_batch(
    batch_size: int, prompt_length: int, target_length: int, token_id: int, encoder_decoder: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A full language-modelling batch, every row ``prompt_length`` prompt and ``target_length`` target tokens.

    Decoder: the sequence is prompt + target, ``labels`` aligned with it and the prompt's positions
    ignored, so the loss counts the ``target_length`` target tokens of each row.  Encoder-decoder: the
    encoder reads the prompt, the decoder the target (shifted right), and ``labels`` are the target."""
    if encoder_decoder:
        ids = torch.full((batch_size, prompt_length), token_id, dtype=torch.long)
        labels = torch.full((batch_size, target_length), token_id, dtype=torch.long)
    else:
        ids = torch.full((batch_size, prompt_length + target_length), token_id, dtype=torch.long)
        labels = ids.clone()
        labels[:, :prompt_length] = IGNORE_INDEX
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}, labels


@contextlib.contextmanager
def forward_rules(precision: str, device: str, kernels: DeviceKernels | None = None):
    """The forward pass's context: ``device``'s kernel choices (``kernels``, a :class:`DeviceKernels`), and at
    bf16/fp16 its autocast rules (:class:`MetaAutocast`; it casts first, as autocast runs before a kernel is
    chosen)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(kernels or DeviceKernels(device))
        if precision != FP32:
            stack.enter_context(MetaAutocast(getattr(torch, AUTOCAST_DTYPES[precision]), device))
        yield


def train_steps(
    model,
    inputs: dict,
    labels: torch.Tensor,
    steps: int = 2,
    precision: str = FP32,
    device: str = "cuda",
    loss_fn: Callable | None = None,
    attention_kernel: str | None = None,
    op_costs: bool = False,
    optimizer_kind: str = ADAMW,
    accumulation: int = 1,
) -> StepTrace:
    """Trace ``steps`` training steps as :func:`petlprof.run.train.train` runs them with the run's
    :class:`~petlprof.run.recipe.TrainRecipe` (forward and loss under ``precision``'s autocast by ``device``'s
    rules, backward -- of the scaled loss for fp16, the gradients unscaled in place --, gradient clipping,
    AdamW step, gradients set to None).  The first step creates the optimiser state, which stays alive as
    the later ones run.  FLOPs are counted in the first step (by the trace itself,
    :meth:`MetaTrace.count_flops`) and the peak is read from the later ones, a run's steady state.
    ``loss_fn(logits, labels)``: the classifier's loss by default (the LM objective passes its own);
    ``attention_kernel``: the attention kernel every call runs (``--attention flash``), else the device's choice;
    ``op_costs``: keep each counted kernel's FLOPs and bytes moved (a time prediction's input; off: no cost).
    ``optimizer_kind``: ``--optimizer`` (bitsandbytes' 8-bit AdamW as :class:`MetaAdamW8bit`, which makes its
    state); ``accumulation``: ``--gradient-accumulation``: a step runs two micro-batches (the second's
    backward is where gradients already held meet new ones; more change no peak), its FLOPs scaled to
    ``accumulation`` of them and its kernels repeated as a run repeats them (:func:`_accumulated`)."""
    if loss_fn is None:
        loss_fn = classifier_loss

    if steps < 2:
        raise ValueError(f"train_steps needs steps >= 2 (one to count FLOPs, one to read the peak); got {steps}")
    recipe = TrainRecipe(lr=1e-3, precision=precision)  # the learning rate changes no shape
    if optimizer_kind == ADAMW:
        optimizer, params = recipe.optimizer(model)
        for group in optimizer.param_groups:  # torch's default for the device: a GPU runs AdamW's foreach loop
            group["foreach"] = policy_device(device) == "cuda"
    else:
        groups = recipe.param_groups(model)
        optimizer, params = MetaAdamW8bit(groups), [p for group in groups for p in group["params"]]
    micro = min(accumulation, 2)
    first_marks: list[int] = []
    optimizer_kernels = 0
    model.train()
    tracer, kernels = MetaTrace(op_costs), DeviceKernels(device, attention_kernel)
    _recompute_under_rules(model, lambda: forward_rules(precision, device, kernels))
    with tracer:
        for step in range(steps):
            if step == 1:
                tracer.peak_bytes = tracer.live_bytes  # the optimiser state is alive from here on
            with tracer.count_flops() if step == 0 else contextlib.nullcontext():
                marks = []  # where each micro-batch's kernels end in the counted step's list
                for _ in range(micro):
                    with forward_rules(precision, device, kernels):
                        loss = loss_fn(model(**inputs), labels)
                    loss = loss / micro if micro > 1 else loss
                    (loss * _LOSS_SCALE if precision == FP16 else loss).backward()
                    del loss
                    marks.append(len(tracer.op_costs))
                if step == 0:
                    first_marks = marks
                if precision == FP16:  # GradScaler.unscale_: in place, before clipping
                    torch._foreach_mul_([p.grad for p in params if p.grad is not None], 1 / _LOSS_SCALE)
                clipping = len(tracer.op_costs)  # the optimiser's work starts here (a calibrated device times it)
                torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)  # recipe.clip reads the norm's value
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step == 0:
                    optimizer_kernels = len(tracer.op_costs) - clipping
        del optimizer
    return StepTrace(
        tracer.peak_bytes,
        round(tracer.flops * accumulation / micro),  # the optimiser's element-wise work is not counted
        attention_kernels=tuple(sorted(kernels.attention_kernels)),
        op_costs=_accumulated(tracer.op_costs, first_marks, accumulation),
        optimizer_kernels=optimizer_kernels,
        trained_numels=tuple(p.numel() for p in params) if _calibrated_optimizer(optimizer_kind, params) else (),
    )


def _calibrated_optimizer(optimizer_kind: str, params: list) -> bool:
    """Whether a calibrated device's optimiser times price this step's: AdamW on float32 tensors, as ``petlprof
    calibrate`` times it (half-precision weights, 8-bit state: the roofline prices their kernels)."""
    return optimizer_kind == ADAMW and all(p.dtype == torch.float32 for p in params)


def _accumulated(costs: list, marks: list[int], accumulation: int) -> tuple:
    """The counted step's kernels for ``accumulation`` micro-batches from those of the traced ones (``marks``: where
    each ended): the first micro-batch's, the second's (which adds into held gradients) once per later one, then
    the optimiser's."""
    if accumulation <= 1 or not costs:
        return tuple(costs)
    first, later = costs[: marks[0]], costs[marks[0] : marks[1]]
    return (*first, *later * (accumulation - 1), *costs[marks[1] :])


def _recompute_under_rules(model, rules: Callable) -> None:
    """With gradient checkpointing (``--gradient-checkpointing``), a layer's forward runs again inside the backward
    pass, outside the forward's context: there a run's autocast is restored by torch's checkpoint, and the trace's
    rules (``rules()``: the device's kernels and autocast, :func:`forward_rules`) must be too, or the recomputed
    tensors differ from the saved ones.  Each checkpointing module's function gets them as its recompute context."""
    for module in model.modules():
        function = getattr(module, "_gradient_checkpointing_func", None)
        if function is not None:
            module._gradient_checkpointing_func = functools.partial(
                function, context_fn=lambda: (contextlib.nullcontext(), rules())
            )


class MetaAdamW8bit(torch.optim.Optimizer):
    """bitsandbytes' 8-bit AdamW as the trace sees it: its first step makes each trained tensor's state as
    ``bitsandbytes.optim.AdamW8bit`` does (two uint8 states and two float32 block scales, or two float32 states
    for a tensor under :data:`~petlprof.models.quantization.EIGHT_BIT_MIN_NUMEL` elements; the two quantile maps
    once), and updates nothing (its kernels have no meta implementation)."""

    def __init__(self, groups) -> None:
        super().__init__(groups, {"lr": 1e-3})
        self.qmaps: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002 - the optimiser interface
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or self.state[p]:
                    continue
                if p.numel() < EIGHT_BIT_MIN_NUMEL:
                    self.state[p] = {
                        f"state{i}": torch.empty(p.shape, dtype=torch.float32, device=p.device) for i in (1, 2)
                    }
                    continue
                if not self.qmaps:
                    self.qmaps = [torch.empty(256, dtype=torch.float32, device=p.device) for _ in range(2)]
                blocks = math.ceil(p.numel() / EIGHT_BIT_BLOCK)
                self.state[p] = {
                    **{f"state{i}": torch.empty(p.shape, dtype=torch.uint8, device=p.device) for i in (1, 2)},
                    **{f"absmax{i}": torch.empty(blocks, dtype=torch.float32, device=p.device) for i in (1, 2)},
                }


@torch.no_grad()
def inference_batch(
    model,
    inputs: dict,
    precision: str = FP32,
    device: str = "cuda",
    attention_kernel: str | None = None,
    op_costs: bool = False,
) -> StepTrace:
    """Trace one evaluation forward pass (eval mode, no autograd) under ``precision``'s autocast (``op_costs``: as
    :func:`train_steps`)."""
    model.eval()
    tracer, kernels = MetaTrace(op_costs), DeviceKernels(device, attention_kernel)
    with tracer, tracer.count_flops(), forward_rules(precision, device, kernels):
        out = model(**inputs)
        out = getattr(out, "logits", out)  # a language model given labels: the logits of the scored positions
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else ()
        nbytes = math.prod(shape) * out.element_size() if shape else 0
        del out
    return StepTrace(
        tracer.peak_bytes, tracer.flops, shape, nbytes, tuple(sorted(kernels.attention_kernels)), tuple(tracer.op_costs)
    )
