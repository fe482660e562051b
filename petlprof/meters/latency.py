"""Per-step latency: CUDA events on a GPU, ``perf_counter`` around a synchronised step on a CPU.

On CUDA a pair of timing events is recorded around each step on the current stream *of the run's
device* (not of whichever GPU is current in the process: with ``cuda:1`` they would otherwise time
GPU 0's idle queue) and read only when the phase ends
(one synchronisation for the whole phase), so the timer does not stall the queue; the figure is
the GPU time from the first kernel queued after the start event to the last one before the end
event.  On CPU the device is synchronised (a no-op) and the wall time of the step is taken.
Steps started with ``keep=False`` (warm-up) are not recorded.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from petlprof.meters.base import synchronize

if TYPE_CHECKING:
    import torch


class StepTimer:
    def __init__(self, device: str):
        self.device = device
        self.cuda = device.startswith("cuda")
        self.source = "cuda-events" if self.cuda else "perf-counter"
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._times_s: list[float] = []
        self._start_event: torch.cuda.Event | None = None  # on CUDA
        self._start_s: float | None = None  # on CPU

    def start(self) -> None:
        if self.cuda:
            # torch: slow to import, loaded only when used
            import torch

            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record(torch.cuda.current_stream(self.device))
        else:
            synchronize(self.device)
            self._start_s = time.perf_counter()

    def stop(self, keep: bool = True) -> None:
        if self.cuda:
            # torch: slow to import, loaded only when used
            import torch

            if self._start_event is None:
                raise RuntimeError("StepTimer.stop() called before start()")
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            if keep:
                self._events.append((self._start_event, end))
        else:
            if self._start_s is None:
                raise RuntimeError("StepTimer.stop() called before start()")
            synchronize(self.device)
            if keep:
                self._times_s.append(time.perf_counter() - self._start_s)

    def latencies_s(self) -> list[float]:
        """Every kept step's latency in seconds (synchronises the device once on CUDA)."""
        if self.cuda and self._events:
            synchronize(self.device)
            self._times_s.extend(start.elapsed_time(end) / 1000.0 for start, end in self._events)
            self._events.clear()
        return list(self._times_s)
