"""A settled GPU (``--settle``): loaded until its temperature holds, right before a run's measured phases.

A GPU's temperature, and with it its clocks and power, drifts for tens of seconds after a load starts, so the first
method of a sweep would run on a cooler chip than the last.  With ``--settle`` each run, once its model and data are
loaded (so the sweep's first run settles the GPU before any measurement, and every later run after the pause its
own start-up made), keeps the GPU busy with matrix multiplications until its temperature has moved at most
:data:`TOLERANCE_C` over the last :data:`STEADY_S` seconds, or for at most :data:`MAX_S` seconds.  The run's train
phase records what it took (:data:`KEYS`): the seconds spent, the temperature before and after, and whether it held
(``settled`` false: the cap was reached first, and the phase's warnings say so).  Without ``--settle`` nothing is
done here; each energy window still records the GPU's temperature at its edges, and its grade
(:mod:`petlprof.results.grades`) says how far it moved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from petlprof.meters.devices import nvml as nvml_dev

STEADY_S = 10.0  # the temperature must hold over this long
TOLERANCE_C = 1.0  # ... within this many degrees
MAX_S = 120.0  # the most a run spends settling
READ_EVERY_S = 1.0
KEYS = ("settle_s", "settle_start_c", "settle_end_c", "settled")
MATMUL_SIZE = 4096


@dataclass(frozen=True)
class Settled:
    """What settling took: seconds, the temperature (°C) before and after, whether it held by the end."""

    seconds: float
    start_c: float
    end_c: float
    steady: bool

    def record(self) -> dict[str, float | bool]:
        return dict(zip(KEYS, (round(self.seconds, 3), self.start_c, self.end_c, self.steady)))

    def warnings(self) -> list[str]:
        if self.steady:
            return []
        return [
            f"--settle: the GPU's temperature still moved more than {TOLERANCE_C:g} °C over {STEADY_S:g} s after "
            f"{self.seconds:.0f} s of load ({self.start_c:.0f} -> {self.end_c:.0f} °C); measured as it was"
        ]


def settle(
    read_c: Callable[[], float],
    work: Callable[[], None],
    *,
    steady_s: float = STEADY_S,
    tolerance_c: float = TOLERANCE_C,
    max_s: float = MAX_S,
    every_s: float = READ_EVERY_S,
) -> Settled:
    """Run ``work`` (a burst of load, well under ``every_s``) until ``read_c`` has held within ``tolerance_c`` over
    the last ``steady_s`` seconds, or ``max_s`` have passed."""
    start = time.perf_counter()
    readings = [(0.0, read_c())]
    next_read = every_s
    while True:
        work()
        elapsed = time.perf_counter() - start
        if elapsed < next_read:
            continue
        next_read = elapsed + every_s
        readings.append((elapsed, read_c()))
        recent = [c for t, c in readings if t >= elapsed - steady_s]
        if elapsed >= steady_s and max(recent) - min(recent) <= tolerance_c:
            return Settled(elapsed, readings[0][1], readings[-1][1], True)
        if elapsed >= max_s:
            return Settled(elapsed, readings[0][1], readings[-1][1], False)


def settle_gpu(device: str) -> Settled:
    """Settle the CUDA GPU ``device``: matrix multiplications on it, its temperature read through NVML."""
    # torch: slow to import, loaded only when used
    import torch

    held = [torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device)]  # freed once settled, before the run's phases

    def work() -> None:
        for _ in range(8):
            held[0] @ held[0]
        torch.cuda.synchronize(device)

    with nvml_dev.session() as nvml:
        gpu = nvml_dev.handle(nvml, nvml_dev.cuda_uuid(device))

        def read_c() -> float:
            value = nvml_dev.temperature_c(nvml, gpu)
            if value is None:
                raise RuntimeError("--settle: NVML gives no temperature for this GPU")
            return float(value)

        try:
            return settle(read_c, work)
        finally:
            held.clear()
            torch.cuda.empty_cache()
