"""The GPU part of ``petlprof meters --check``: the NVML energy counter against integrated power under a
steady and a bursty load, the counter's and the power field's real update periods, the sampler's
achieved rate, the spread of repeated short windows, idle power, and the CUDA allocator against an
allocation of known size and against NVML's view of the process's memory.  Runs on ``cuda`` (the
first visible GPU) in about a minute."""

from __future__ import annotations

import os
import time

from petlprof.meters.base import Reading, Window
from petlprof.meters.devices import nvml as nvml_dev
from petlprof.meters.energy import NvmlEnergyMeter
from petlprof.meters.memory import CudaMemoryMeter
from petlprof.meters.verdicts import FAIL, KNOWN_BYTES, PASS, REPEATS, WARN, Check, graded
from petlprof.results.figures import ENERGY, ENERGY_COUNTER, ENERGY_INTEGRATED, ENERGY_WINDOW, PEAK_MEMORY

DEVICE = "cuda"
LOAD_S = 5.0
AGREE_STEADY = (0.05, 0.15)  # |integrated - counter| / counter: pass below, warn below
AGREE_BURSTY = (0.10, 0.30)


def gpu_work(seconds: float, duty: float = 1.0, period_s: float = 0.1) -> None:
    """Matrix products on the GPU for ``seconds``: all the time (``duty`` 1) or busy for ``duty`` of
    every ``period_s`` and idle for the rest (bursts locked to the sensor's update period)."""
    # torch: slow to import, loaded only when used
    import torch

    x = torch.randn(4096, 4096, device=DEVICE)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        while time.perf_counter() - start < duty * period_s:
            x = (x @ x) / 4096
            torch.cuda.synchronize(DEVICE)
        rest = period_s - (time.perf_counter() - start)
        if rest > 0:
            time.sleep(rest)


def _metered(timeline, seconds: float, duty: float = 1.0, period_s: float = 0.1) -> Reading:
    """The NVML meter's reading of ``gpu_work`` over one window."""

    meter = NvmlEnergyMeter(DEVICE, timeline=timeline)
    try:
        with Window([meter], DEVICE) as window:
            gpu_work(seconds, duty=duty, period_s=period_s)
    finally:
        meter.close()
    return window.reading


def _agreement(name: str, reading: Reading, limits: tuple[float, float], load: str) -> Check:
    counter, integrated = reading.value(ENERGY_COUNTER), reading.value(ENERGY_INTEGRATED)
    if not counter or integrated is None:
        return Check(name, None, "ratio", WARN, f"no counter ({counter}) or no integrated figure ({integrated})")
    gap = abs(integrated - counter) / counter
    return Check(
        name,
        round(integrated / counter, 4),
        "ratio",
        graded(gap, *limits),
        f"integrated {integrated:.1f} J / counter {counter:.1f} J over {reading.value(ENERGY_WINDOW):.1f} s of "
        f"{load}, {reading.get('power_field')} power field at {reading.get('power_sample_rate_hz') or 0:.0f} Hz "
        f"(pass within {limits[0]:.0%}, warn within {limits[1]:.0%})",
    )


def nvml_checks() -> list[Check]:
    # looked up at each call, not bound at import: tests replace petlprof.meters.start_power_timeline
    from petlprof.meters import start_power_timeline

    # petlprof.meters.idle (numpy): slow to import, loaded only when used
    from petlprof.meters.idle import measure_idle

    idle = measure_idle(DEVICE, seconds=2.0)
    timeline = start_power_timeline(DEVICE)
    try:
        info = timeline.info
        update = info.update_period_s
        checks = [
            Check(
                "counter update period",
                update,
                "s",
                PASS if update is not None and update <= 0.1 else WARN,
                f"median time between changes of the {'energy counter' if info.counter else 'power reading'}, "
                f"watched for 1 s; the sampler reads power every {info.period_s * 1000:.0f} ms",
            ),
            Check(
                "power field",
                info.power_field,
                None,
                PASS if info.power_field == "instant" else WARN,
                "instantaneous field (covers part of each update period)"
                if info.power_field == "instant"
                else "only the averaged field (a 1 s moving average on Ampere and later): integrated energy lags",
            ),
        ]
        burst_s = max(2 * (update or 0.05), 0.02)  # busy one update period, idle the next
        readings = {
            load: _metered(timeline, LOAD_S, duty, burst_s) for load, duty in (("steady", 1.0), ("bursty", 0.5))
        }
        checks.append(_agreement("counter vs integrated, steady", readings["steady"], AGREE_STEADY, "steady load"))
        checks.append(
            _agreement("counter vs integrated, bursty", readings["bursty"], AGREE_BURSTY, "bursts at the update period")
        )
        rate, wanted = readings["steady"].get("power_sample_rate_hz") or 0.0, 1.0 / info.period_s
        checks.append(
            Check(
                "sampling rate",
                round(rate, 1),
                "Hz",
                graded(-rate / wanted, -0.8, -0.5),
                f"achieved by the sampler process under load; asked for {wanted:.0f} Hz",
            )
        )
        checks.append(_spread(timeline))
    finally:
        timeline.stop()
    watts = list((idle.get("nvml_w") or {}).values())
    checks.append(
        Check(
            "idle power",
            round(watts[0], 2) if watts else None,
            "W",
            PASS if watts and watts[0] > 0 else FAIL,
            f"first visible GPU over 2 s before the load, from {idle.get('nvml_source')}; "
            + "; ".join(f"{u}: {w:.1f} W" for u, w in (idle.get("nvml_w") or {}).items()),
        )
    )
    return checks


def _spread(timeline) -> Check:
    # numpy: slow to import, loaded only when used
    import numpy as np

    energies = [_metered(timeline, 0.5)[ENERGY.name] for _ in range(REPEATS)]
    cv = float(np.std(energies) / np.mean(energies))
    return Check(
        "short-window spread",
        round(cv, 4),
        "cv",
        graded(cv, 0.05, 0.20),
        f"{REPEATS} windows of 0.5 s of the same GPU work: mean {np.mean(energies):.1f} J; short windows "
        "hold few counter updates, which is why runs repeat or lengthen them",
    )


def cuda_allocator_checks() -> list[Check]:
    # torch: slow to import, loaded only when used
    import torch

    with Window([CudaMemoryMeter(DEVICE)], DEVICE) as window:
        block = torch.empty(KNOWN_BYTES, dtype=torch.uint8, device=DEVICE)
        del block
    peak = window.reading.value(PEAK_MEMORY)
    checks = [
        Check(
            "known allocation",
            peak,
            "bytes",
            PASS if KNOWN_BYTES <= peak <= KNOWN_BYTES + 2**21 else FAIL,
            f"a {KNOWN_BYTES}-byte tensor allocated and freed in the window (pass: within 2 MiB above it)",
        )
    ]
    reserved = int(torch.cuda.memory_reserved(DEVICE))
    with nvml_dev.session() as nvml:
        gpu = nvml_dev.handle(nvml, nvml_dev.cuda_uuid(DEVICE))
        own = [used for pid, used in nvml_dev.compute_processes(nvml, gpu) if pid == os.getpid()]
    if not own:
        checks.append(
            Check(
                "allocator vs NVML",
                None,
                "bytes",
                WARN,
                "NVML does not list this process (a container's own PID namespace?): no cross-check",
            )
        )
    else:
        extra = own[0] - reserved
        checks.append(
            Check(
                "allocator vs NVML",
                extra,
                "bytes",
                PASS if extra >= 0 else FAIL,
                f"NVML's process memory {own[0] / 2**20:.0f} MiB - allocator reserved {reserved / 2**20:.0f} MiB: "
                "the CUDA context and libraries, which the allocator's peaks leave out",
            )
        )
    return checks
