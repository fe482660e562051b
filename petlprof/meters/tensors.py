"""``cpu-tensors``: peak live tensor bytes of a window, independent of the allocator and of the past.

An extra meter (``--meters cpu-tensors``), off by default because it costs a Python call per
tensor operation.  A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every ATen
operation of the window — forward and backward — and counts the storage of each CPU tensor an
operation creates until the last tensor on that storage, views included (``.detach()``, slices,
inference-mode views), is freed; outputs that alias an input from before the window are not new
memory and are not counted.  Tensors that exist when the
window opens are not seen by the mode, so the caller states them: ``resident_bytes`` (weights,
plus optimiser state in training, from :func:`~petlprof.meters.memory.static_breakdown`).

``peak_tensor_bytes = resident_bytes + peak of the bytes created in the window and still alive``.
Unlike the RSS high-water mark it ignores allocator caching, fragmentation and library buffers,
and it is the same whatever ran earlier in the process.
"""

from __future__ import annotations

import weakref
from typing import Any

from petlprof.meters.base import Meter, Reading
from petlprof.results.figures import PEAK_TENSORS
from petlprof.vocabulary import MEASURED

_COMPOSITES: dict = {}  # operation -> whether a dispatch mode runs its composite kernel (see runs_composite)


def runs_composite(func) -> bool:
    """bitsandbytes' operations without a CPU kernel of their own (a CPU runs their composite kernel: the 4-bit
    product ``gemm_4bit`` dequantises its whole weight, then multiplies).  Dispatched as one operation, their
    inner tensors are hidden from a dispatch mode (and their meta kernel creates only the output); run by their
    composite kernel under the mode (:func:`run_composite`), their temporaries count where they are alive.  The
    ``cpu-tensors`` meter and the estimate's trace both do so."""
    known = _COMPOSITES.get(func)
    if known is None:
        # torch: slow to import, loaded only when used
        import torch

        name = func._schema.name if isinstance(func, torch._ops.OpOverload) else ""
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        known = _COMPOSITES[func] = (
            name.startswith("bitsandbytes::") and has(name, "CompositeExplicitAutograd") and not has(name, "CPU")
        )
    return known


def run_composite(func, args, kwargs):
    """Run ``func`` by its composite kernel; called inside a dispatch mode's ``__torch_dispatch__`` with the
    mode re-entered, so the kernel's inner operations come back to the mode one by one."""
    # torch: slow to import, loaded only when used
    import torch

    return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd), *args, **kwargs)


def _mode_class():
    # torch: slow to import, loaded only when used
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveTensorBytes(TorchDispatchMode):
        """Live and peak bytes of the CPU storages created by operations under this mode."""

        def __init__(self) -> None:
            super().__init__()
            self.live_bytes = 0
            self.peak_bytes = 0
            self._storages: dict[int, list] = {}  # data_ptr -> [bytes, ids of the tensors alive on it]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if runs_composite(func):  # a 4-bit product: its dequantised weight is a temporary worth counting
                with self:
                    out = run_composite(func, args, kwargs or {})
            else:
                out = func(*args, **(kwargs or {}))
            inputs = {
                t.untyped_storage().data_ptr()
                for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and t.device.type == "cpu"
            }
            for tensor in tree_leaves(out):
                if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                    self._track(tensor, inputs)
            return out

        def _track(self, tensor, inputs: set[int]) -> None:
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            entry = self._storages.get(key)
            if entry is None:
                if key == 0 or key in inputs:  # an alias of memory from before the window: not new
                    return
                entry = self._storages[key] = [storage.nbytes(), set()]
                self.live_bytes += entry[0]
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            if id(tensor) in entry[1]:  # an in-place op returns the tensor it was given
                return
            entry[1].add(id(tensor))  # a view (.detach(), slicing, inference-mode views) keeps it alive too
            weakref.finalize(tensor, self._release, key, id(tensor))

        def _release(self, key: int, tensor_id: int) -> None:
            entry = self._storages.get(key)
            if entry is None:
                return
            entry[1].discard(tensor_id)
            if not entry[1]:
                self.live_bytes -= entry[0]
                del self._storages[key]

    return LiveTensorBytes


class CpuTensorMeter(Meter):
    """Peak bytes of live CPU tensors during the window (see the module docstring)."""

    name = "cpu-tensors"
    OWN = (PEAK_TENSORS,)
    EXTRAS = ("tensor_resident_bytes", "tensor_peak_new_bytes", "tensor_kind", "tensor_source")

    def __init__(self, device: str = "cpu", resident_bytes: int = 0):
        super().__init__(device)
        self.resident_bytes = resident_bytes
        # an instance of the class _mode_class() builds once torch is imported: no static type to name
        self._mode: Any = None

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401
        except ImportError as exc:
            return False, f"torch has no TorchDispatchMode: {exc}"
        return True, "live CPU tensor bytes from a TorchDispatchMode (extra meter: --meters cpu-tensors)"

    def _begin(self) -> None:
        self._mode = _mode_class()()
        self._mode.__enter__()

    def _end(self) -> Reading:
        self._mode.__exit__(None, None, None)
        if self.device != "cpu":
            return Reading(
                extras={PEAK_TENSORS: None},
                warnings=[f"cpu-tensors counts CPU tensors only; the run is on {self.device}"],
            )
        return Reading(
            extras={
                PEAK_TENSORS: self.resident_bytes + self._mode.peak_bytes,
                "tensor_resident_bytes": self.resident_bytes,
                "tensor_peak_new_bytes": self._mode.peak_bytes,
                "tensor_kind": MEASURED,
                "tensor_source": "torch-dispatch-mode live CPU tensor storages",
            },
            warnings=[
                "cpu-tensors was on: this phase's time, latency and energy include its per-operation bookkeeping"
            ],
        )
