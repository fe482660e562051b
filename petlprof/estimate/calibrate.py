"""``petlprof calibrate``: measure what a prediction needs on this machine's device and keep it as a profile.

Seven measurements, each a few seconds (about 20 s in all on a 2-core CPU, half of it the optimiser's: its
:data:`MIN_SAMPLES` steps of 32,768 small tensors, their flushes and setup are past its share of ``seconds``):

* matrix throughput: square float32 products (and bfloat16 on a GPU) of :data:`MATMUL_SIZES`, the best of them, in
  FLOP/s (2 n^3 a product), with the threads a run uses;
* memory bandwidth: copies of a :data:`COPY_BYTES` tensor (read and written: twice its bytes a copy);
* the fixed cost of a kernel: a loop of in-place additions on an 8-element tensor;
* the cost of drawing a random number: ``bernoulli_`` on :data:`RANDOM_NUMBERS` elements, as a dropout mask draws;
* the optimiser's work on a tensor: gradient clipping and an AdamW step as a run takes them (torch's default
  implementation for the device), on tensors of each of :data:`OPTIMIZER_SIZES` elements, each step after a write
  that evicts the caches as a run's forward and backward passes do, in seconds a tensor (its element-wise passes run
  below a copy's bandwidth, and slower where a tensor no longer fits the caches);
* the cost of fresh memory: a :data:`FRESH_BYTES` allocation's first write against a reused buffer's (a CPU maps
  allocations of 32 MiB or more anew each time, and faults their pages in as they are first written);
* power while busy and at idle: the matrix loop and a sleep, each in a window of the energy meter a run on this
  device would use (RAPL or NVML; the labelled CPU estimate where neither can be read, said in ``power_source``).

The profile is kept by :mod:`petlprof.estimate.profiles` (``save_profile``) and read back by ``petlprof estimate
--device cpu`` and by each sweep's predictions.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from petlprof.estimate.profiles import PROFILE_VERSION, Profile, device_name, machine_facts
from petlprof.estimate.roofline import DeviceModel
from petlprof.meters import Window, energy_meter_for, synchronize
from petlprof.results.figures import ENERGY, ENERGY_SOURCE

MATMUL_SIZES = (256, 512, 1024)
COPY_BYTES = 64 * 2**20
RANDOM_NUMBERS = 2**20
MEASURE_S = 1.5  # each measurement repeats its work for at least this long
# tensor sizes (elements) the optimiser is timed at, each as many tensors as make OPTIMIZER_ELEMENTS (at least one):
# a bias or norm, small and middle-sized matrices, a large projection, an embedding's size
OPTIMIZER_SIZES = (256, 2**14, 2**17, 2**20, 2**22, 2**24)
OPTIMIZER_ELEMENTS = 2**23
# written before each timed optimiser step, as a run's forward and backward passes do between its steps: twice the
# largest CPU cache (sysfs), at most this; a step timed again and again on the same tensors found them in a cache
# (this machine's reports 480 MiB) and came out 0.7 times the step inside a run
FLUSH_MAX_BYTES = 2**30
# a fresh allocation this large, timed as its first write (petlprof.estimate.trace.FRESH_PAGES_BYTES: at least that)
FRESH_BYTES = 64 * 2**20
MIN_SAMPLES = 3  # steps timed at each size at least, whatever the time they take
FLUSH_DEFAULT_BYTES = 2**28  # where no cache size can be read (a GPU: its L2 is at most about 100 MB)


def repeat_timed(work: Callable[[], object], device: str, seconds: float) -> tuple[int, float]:
    """(times run, seconds taken) of ``work`` repeated for at least ``seconds``, after one unmeasured run."""
    work()
    synchronize(device)
    count, start = 0, time.perf_counter()
    while True:
        work()
        count += 1
        synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return count, elapsed


def matmul_flops_per_s(device: str, dtype: str, seconds: float = MEASURE_S) -> float:
    """The best achieved FLOP/s of square products of :data:`MATMUL_SIZES` in ``dtype``."""
    best = 0.0
    for n in MATMUL_SIZES:
        a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
        count, elapsed = repeat_timed(lambda: a @ a, device, seconds / len(MATMUL_SIZES))  # noqa: B023
        best = max(best, 2 * n**3 * count / elapsed)
    return best


def bandwidth_bytes_per_s(device: str, seconds: float = MEASURE_S) -> float:
    """Achieved bytes/s of a large copy (each copy reads and writes :data:`COPY_BYTES`)."""
    source = torch.ones(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    count, elapsed = repeat_timed(lambda: target.copy_(source), device, seconds)
    return 2 * COPY_BYTES * count / elapsed


def kernel_overhead_s(device: str, seconds: float = MEASURE_S) -> float:
    """Seconds a tiny kernel costs: dispatch (and launch, on a GPU) with nothing to compute."""
    x = torch.ones(8, device=device)

    def hundred() -> None:
        for _ in range(100):
            x.add_(1.0)

    count, elapsed = repeat_timed(hundred, device, seconds)
    return elapsed / (100 * count)


def random_s_per_number(device: str, seconds: float = MEASURE_S) -> float:
    """Seconds drawing one random number costs: a dropout mask's ``bernoulli_`` at rate 0.1 (keep 0.9), a million at
    a time.  On a CPU the cost depends on the rate: 7.2 ns a number here at 0.9, 6.3 at LoRA's 0.95, 14.8 at 0.5."""
    x = torch.empty(RANDOM_NUMBERS, device=device)
    count, elapsed = repeat_timed(lambda: x.bernoulli_(0.9), device, seconds)
    return elapsed / (RANDOM_NUMBERS * count)


def cache_bytes() -> int | None:
    """The largest CPU cache's size in bytes (Linux's sysfs), None where it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text[:-1].isdigit() and text[-1] in units:
            sizes.append(int(text[:-1]) * units[text[-1]])
    return max(sizes) if sizes else None


def optimizer_seconds(device: str, seconds: float = MEASURE_S) -> tuple[tuple[int, float], ...]:
    """(elements, seconds a tensor) of gradient clipping (by the global norm, as a run clips) and a steady AdamW
    step (its state made by an unmeasured first step) on tensors of each of :data:`OPTIMIZER_SIZES` elements, each
    step timed alone after a write that evicts the caches (:data:`FLUSH_MAX_BYTES`), the median of the steps."""
    cache = cache_bytes() if device == "cpu" else None
    flush = torch.empty(min(2 * cache if cache else FLUSH_DEFAULT_BYTES, FLUSH_MAX_BYTES) // 4, device=device)
    out = []
    for size in OPTIMIZER_SIZES:
        count = max(1, OPTIMIZER_ELEMENTS // size)
        params = [torch.nn.Parameter(torch.full((size,), 0.5, device=device)) for _ in range(count)]
        for p in params:
            p.grad = torch.full_like(p, 0.01)  # the values change no kernel's time; filling is faster than drawing
        optimizer = torch.optim.AdamW(params, lr=1e-3)
        optimizer.step()  # makes the state, as a run's first step does
        times: list[float] = []
        while len(times) < MIN_SAMPLES or sum(times) < seconds / len(OPTIMIZER_SIZES):  # the flushes not counted
            flush.fill_(1.0)
            synchronize(device)
            start = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            synchronize(device)
            times.append(time.perf_counter() - start)
        out.append((size, statistics.median(times) / count))
    return tuple(out)


def fresh_s_per_byte(device: str, seconds: float = MEASURE_S) -> float:
    """Seconds a byte of a fresh :data:`FRESH_BYTES` allocation costs, written once and freed, beyond writing a buffer
    used again (the kernel maps its pages in as they are first written, and out as it is freed), the median of
    repeated pairs; 0 on a GPU, whose caching allocator keeps its blocks."""
    if device != "cpu":
        return 0.0
    kept = torch.empty(FRESH_BYTES // 4)
    kept.fill_(1.0)
    fresh: list[float] = []
    reused: list[float] = []
    began = time.perf_counter()
    while not fresh or time.perf_counter() - began < seconds:
        start = time.perf_counter()
        new = torch.empty(FRESH_BYTES // 4)
        new.fill_(1.0)
        del new  # its pages unmapped: a run frees each such tensor too
        middle = time.perf_counter()
        kept.fill_(1.0)
        fresh.append(middle - start)
        reused.append(time.perf_counter() - middle)
    return max(0.0, (statistics.median(fresh) - statistics.median(reused)) / FRESH_BYTES)


def power_w(device: str, work: Callable[[], object] | None, seconds: float = MEASURE_S) -> tuple[float, str]:
    """(mean W, the energy meter's source) over ``seconds`` of ``work`` repeated (None: asleep)."""
    meter = energy_meter_for(device)
    try:
        with Window([meter], device) as window:
            if work is None:
                time.sleep(seconds)
            else:
                repeat_timed(work, device, seconds)
    finally:
        meter.close()
    energy, window_s = window.reading.value(ENERGY), window.time_s or 0.0
    if energy is None or window_s <= 0:
        raise RuntimeError(f"the {meter.name} meter gave no energy to calibrate power with")
    return energy / window_s, str(window.reading.get(ENERGY_SOURCE))


def calibrate(device: str = "cpu", seconds: float = MEASURE_S) -> Profile:
    """Measure this machine's ``device`` (module docstring) and return its profile (not yet saved)."""
    dtypes = ["float32", "bfloat16"] if device.startswith("cuda") else ["float32"]
    flops = {dtype: matmul_flops_per_s(device, dtype, seconds) for dtype in dtypes}
    n = MATMUL_SIZES[-1]
    a = torch.randn(n, n, device=device)
    busy_w, source = power_w(device, lambda: a @ a, seconds)
    idle_w, _ = power_w(device, None, seconds)
    model = DeviceModel(
        name=device_name(device),
        flops_per_s=flops,
        bytes_per_s=bandwidth_bytes_per_s(device, seconds),
        kernel_overhead_s=kernel_overhead_s(device, seconds),
        busy_w=busy_w,
        idle_w=idle_w,
        calibrated=True,
        source=f"calibrated on {platform.node()} at {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC",
        power_source=source,
        random_s_per_number=random_s_per_number(device, seconds),
        optimizer_s=optimizer_seconds(device, seconds),
        fresh_s_per_byte=fresh_s_per_byte(device, seconds),
    )
    return {"version": PROFILE_VERSION, "device": device.split(":")[0], **machine_facts(), "model": model.to_json()}
