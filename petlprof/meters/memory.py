"""Peak memory of a phase: CUDA allocator peaks on GPU, the process RSS high-water mark on CPU,
and the static per-method breakdown (weights, gradients, optimiser state) that explains them.

CPU: Linux keeps the resident-set high-water mark (``VmHWM``) per process and lets a process
reset it by writing ``5`` to ``/proc/self/clear_refs``.  A phase's figure is the high-water mark
during the phase minus the process's RSS *before the backbone was loaded* (the Python + torch
runtime), so it covers weights, activations, gradients and optimiser state — the same things the
CUDA allocator's peak covers.  Freed memory is returned to the OS (``malloc_trim``) before each
window, and every run executes in a fresh process, so the figure does not depend on what ran
earlier.  Where ``clear_refs`` is not writable the reading says so (``memory_source``
``rss-hwm-unreset``) instead of silently mixing phases.
"""

from __future__ import annotations

import ctypes
import gc
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from petlprof.meters.base import Meter, Provenance, Reading
from petlprof.models.quantization import (
    EIGHT_BIT_MIN_NUMEL,
    EIGHT_BIT_QMAP_BYTES,
    adamw_state_bytes,
    quantization_state,
)
from petlprof.results.figures import (
    BREAKDOWN_BUFFERS,
    BREAKDOWN_FROZEN_WEIGHTS,
    BREAKDOWN_GRADIENTS,
    BREAKDOWN_OPTIMIZER_STATE,
    BREAKDOWN_QUANTIZATION_STATE,
    BREAKDOWN_TOTAL,
    BREAKDOWN_TRAINABLE_WEIGHTS,
    PEAK_MEMORY,
    PEAK_RESERVED,
    STATIC_BREAKDOWN,
)
from petlprof.vocabulary import MEASURED

_STATUS = "/proc/self/status"


def _status_kib(field: str) -> int | None:
    try:
        with open(_STATUS) as fh:
            match = re.search(rf"^{field}:\s+(\d+)\s+kB", fh.read(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def status_bytes(field: str) -> int | None:
    """A ``/proc/self/status`` memory field (VmRSS, VmHWM, VmSize, ...) in bytes, None if unreadable."""
    kib = _status_kib(field)
    return None if kib is None else kib * 1024


def rss_bytes() -> int | None:
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


@contextmanager
def live_objects_unscanned(freeze: Callable[[], object] | None = None) -> Iterator[None]:
    """While the block runs, the garbage collector leaves the objects alive at its start out of its scans
    (``gc.freeze``, after collecting what was already garbage; or ``freeze``, which freezes them its own way);
    afterwards they are scanned again, unless something had frozen objects before (then they stay frozen, as that
    caller chose).  ``petlprof estimate`` passes the run's imports, frozen while the collector is still paused
    (:func:`petlprof.run.libraries.import_runtime_libraries`): a program that calls the command in its own process
    (a notebook's ``main([...])``) gets its collector back as it had it.

    A run in the sweep's own process (``--in-process``, a notebook) collects garbage before each phase
    (:func:`release_free_memory`), and each collection walked every object of the process: torch's,
    transformers' and the caller's, about 0.3 s of CPU five times per run.  A run's own garbage is young,
    so it is still collected; a run in a worker process is already spared this (its imports are frozen)."""
    frozen_before = gc.get_freeze_count() > 0
    if freeze is None:
        gc.collect()
        gc.freeze()
    else:
        freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


def release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS so the next window starts clean."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class CpuMemoryMeter(Meter):
    """Peak resident memory of this process during the window, above a runtime baseline."""

    name = "cpu-rss"
    FIGURES = (PEAK_MEMORY,)
    EXTRAS = ("peak_rss_bytes", "rss_baseline_bytes")

    def __init__(self, device: str = "cpu", baseline_bytes: int | None = None):
        """``baseline_bytes``: RSS to subtract (the runtime's); by default the RSS when the window opens."""
        super().__init__(device)
        self._fixed_baseline = baseline_bytes
        self.baseline_bytes = baseline_bytes or 0
        self._was_reset = False

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if _status_kib("VmHWM") is None:
            return False, f"{_STATUS} has no VmHWM (not Linux?)"
        return True, "process RSS high-water mark from /proc/self/status"

    def prepare(self) -> None:
        release_free_memory()
        if self._fixed_baseline is None:  # after the release, so memory freed earlier is not subtracted
            self.baseline_bytes = rss_bytes() or 0
        self._was_reset = reset_rss_peak()

    def _end(self) -> Reading:
        hwm = (_status_kib("VmHWM") or 0) * 1024
        return Reading(
            {PEAK_MEMORY: max(hwm - self.baseline_bytes, 0)},
            provenance={PEAK_MEMORY: Provenance(MEASURED, "rss-hwm" if self._was_reset else "rss-hwm-unreset")},
            extras={"peak_rss_bytes": hwm, "rss_baseline_bytes": self.baseline_bytes},
        )


class CudaMemoryMeter(Meter):
    """CUDA caching-allocator peaks (allocated and reserved) during the window; optionally a memory
    snapshot of the window (``snapshot_path``, a pickle that https://pytorch.org/memory_viz opens)."""

    name = "cuda-allocator"
    FIGURES = (PEAK_MEMORY,)
    MORE_FIGURES = (PEAK_RESERVED,)
    EXTRAS = ("memory_snapshot_file",)
    SNAPSHOT_ENTRIES = 100_000

    def __init__(self, device: str = "cuda", snapshot_path: str | None = None):
        super().__init__(device)
        self.snapshot_path = snapshot_path

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            # torch: slow to import, loaded only when used
            import torch
        except ImportError:
            return False, "torch is not installed"
        if not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
        return True, "torch.cuda.max_memory_allocated / max_memory_reserved"

    def prepare(self) -> None:
        # torch: slow to import, loaded only when used
        import torch

        gc.collect()  # the allocator cache is kept: emptying it would undo the warm-up steps
        torch.cuda.reset_peak_memory_stats(self.device)
        if self.snapshot_path:
            torch.cuda.memory._record_memory_history(max_entries=self.SNAPSHOT_ENTRIES)

    def _end(self) -> Reading:
        # torch: slow to import, loaded only when used
        import torch

        figures = {
            PEAK_MEMORY: int(torch.cuda.max_memory_allocated(self.device)),
            PEAK_RESERVED: int(torch.cuda.max_memory_reserved(self.device)),
        }
        provenance = {PEAK_MEMORY: Provenance(MEASURED, "cuda-allocator")}
        if not self.snapshot_path:
            return Reading(figures, provenance=provenance)
        Path(self.snapshot_path).parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(self.snapshot_path))
        torch.cuda.memory._record_memory_history(enabled=None)
        return Reading(
            figures,
            provenance=provenance,
            extras={"memory_snapshot_file": str(self.snapshot_path)},
            warnings=[
                "--memory-snapshot was on: recording allocation stacks slows every "
                "allocation, so this phase's time, latency and energy include it"
            ],
        )


def static_breakdown(model, eight_bit_optimizer: bool = False) -> dict[str, int]:
    """Bytes the method's model holds whatever the batch: frozen and trainable weights, buffers,
    the gradients of the trainable weights, and AdamW's state (``exp_avg`` and ``exp_avg_sq`` in
    the parameter's dtype, plus a 4-byte ``step`` per trainable tensor; bitsandbytes' 8-bit state with
    ``eight_bit_optimizer``: :func:`petlprof.models.quantization.adamw_state_bytes`).  Shared (tied) tensors
    count once: tensors are told apart by their storage, so a model on the ``meta`` device (no data
    pointer) is counted the same way (``petlprof estimate`` uses this too).  A quantised backbone's
    (``--quantize``) weights count as stored (packed), and ``quantization_state_bytes``, present only
    then, counts what dequantises them (:func:`petlprof.models.quantization.quantization_state`)."""
    seen: set[int] = set()
    figures = dict.fromkeys(STATIC_BREAKDOWN, 0)
    for param in model.parameters():
        if _storage(param) in seen:
            continue
        seen.add(_storage(param))
        size = param.numel() * param.element_size()
        if param.requires_grad:
            figures[BREAKDOWN_TRAINABLE_WEIGHTS] += size
            figures[BREAKDOWN_GRADIENTS] += size
            figures[BREAKDOWN_OPTIMIZER_STATE] += adamw_state_bytes(
                param.numel(), param.element_size(), eight_bit_optimizer
            )
        else:
            figures[BREAKDOWN_FROZEN_WEIGHTS] += size
    if eight_bit_optimizer and any(p.numel() >= EIGHT_BIT_MIN_NUMEL for p in model.parameters() if p.requires_grad):
        figures[BREAKDOWN_OPTIMIZER_STATE] += EIGHT_BIT_QMAP_BYTES
    for buffer in model.buffers():
        if _storage(buffer) not in seen:
            seen.add(_storage(buffer))
            figures[BREAKDOWN_BUFFERS] += buffer.numel() * buffer.element_size()
    for tensor in quantization_state(model):
        if _storage(tensor) not in seen:
            seen.add(_storage(tensor))
            state = figures.get(BREAKDOWN_QUANTIZATION_STATE, 0)
            figures[BREAKDOWN_QUANTIZATION_STATE] = state + tensor.nbytes
    figures[BREAKDOWN_TOTAL] = sum(figures.values())
    return figures


def _storage(tensor) -> int:
    """Which storage ``tensor`` lives in (tied tensors share one), on any device including ``meta``."""
    return tensor.untyped_storage()._cdata
