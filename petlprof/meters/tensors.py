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

from petlprof.meters.base import MEASURED, Meter


def _mode_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveTensorBytes(TorchDispatchMode):
        """Live and peak bytes of the CPU storages created by operations under this mode."""

        def __init__(self):
            super().__init__()
            self.live_bytes = 0
            self.peak_bytes = 0
            self._storages: dict[int, list] = {}  # data_ptr -> [bytes, ids of the tensors alive on it]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
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
    FIGURES = ("peak_tensor_bytes",)

    def __init__(self, device: str = "cpu", resident_bytes: int = 0):
        super().__init__(device)
        self.resident_bytes = resident_bytes
        self._mode = None

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

    def _end(self) -> dict[str, Any]:
        self._mode.__exit__(None, None, None)
        if self.device != "cpu":
            return {
                "peak_tensor_bytes": None,
                "tensor_warnings": [f"cpu-tensors counts CPU tensors only; the run is on {self.device}"],
            }
        return {
            "peak_tensor_bytes": self.resident_bytes + self._mode.peak_bytes,
            "tensor_resident_bytes": self.resident_bytes,
            "tensor_peak_new_bytes": self._mode.peak_bytes,
            "tensor_kind": MEASURED,
            "tensor_source": "torch-dispatch-mode live CPU tensor storages",
            "tensor_warnings": [
                "cpu-tensors was on: this phase's time, latency and energy include its per-operation bookkeeping"
            ],
        }
