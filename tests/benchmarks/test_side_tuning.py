"""READ and LST against full fine-tuning, side by side on the offline default (issue 3's acceptance).

One shape for every method: the pretrained all-MiniLM-L6-v2 (6 layers, width 384), batch 32,
64 tokens — the defaults of ``petlprof run``.  Printed with ``-s``; asserted:

* training step time, timed in alternation in this process (one thread; the median over rounds of
  each round's ``read/full``): ``read/full <= 0.35``;
* peak training memory ``read/full <= 0.30``, measured the way a run measures it on CPU: each
  method in a fresh process, the RSS high-water mark over training steps minus the process's RSS
  before the backbone was loaded (weights, activations, gradients and optimiser state; see
  :mod:`petlprof.meters.memory`).  The deterministic tensor-byte model of :mod:`petlprof.bench`
  (weights + gradients + AdamW state + saved activations) is printed beside it;
* a READ step served by the hidden-state cache (what every step after epoch 1 is with
  ``--cache-hidden-states``; fp16 states, the default) ``<= 0.10x`` a full step.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import torch

from petlprof.bench import MethodStep, paired_ratio, time_rounds
from petlprof.cache import HiddenStateCache

SHAPE = {"backbone": "minilm", "batch_size": 32, "seq_len": 64}
METHODS = ("read", "lst", "full")

_PEAK_SCRIPT = """
import json, sys
import datasets, pandas, peft, torch, transformers  # the runtime, as in a run, before the baseline
from petlprof.bench import MethodStep
from petlprof.meters import Window, memory_meter_for
from petlprof.meters.memory import release_free_memory, rss_bytes
release_free_memory()
baseline = rss_bytes()
step = MethodStep(sys.argv[1], **json.loads(sys.argv[2]))
step.train_step()  # warm-up, outside the window as in a run
with Window([memory_meter_for("cpu", baseline)], "cpu") as window:
    for _ in range(3):
        step.train_step()
print(json.dumps(window.reading.record()))
"""


def peak_training_memory_bytes(methods: tuple[str, ...]) -> dict[str, int]:
    """The product's CPU figure for a training phase of each method, each in a fresh process of its own.
    The processes run side by side (a process's RSS high-water mark is its own; nothing is timed here)."""
    procs = {
        method: subprocess.Popen(
            [sys.executable, "-c", _PEAK_SCRIPT, method, json.dumps(SHAPE)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for method in methods
    }
    peaks = {}
    for method, proc in procs.items():
        out, err = proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        reading = json.loads(out.strip().splitlines()[-1])
        assert reading["memory_source"] == "rss-hwm", reading  # the peak was reset: nothing earlier mixed in
        peaks[method] = int(reading["peak_memory_bytes"])
    return peaks


def test_read_and_lst_against_full_on_the_offline_default(record_property):
    # one thread: on a CPU shared with other jobs, a second OpenMP thread waits for a core, and that
    # wait falls on the many small operations of a side network far more than on full's large ones
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _compare(record_property)
    finally:
        torch.set_num_threads(threads)


def _compare(record_property):
    steps = {method: MethodStep(method, **SHAPE, lr=1e-3) for method in METHODS}
    read = steps["read"]
    cache = HiddenStateCache(budget_bytes=2**30)
    indices = list(range(SHAPE["batch_size"]))

    def cached_read_step():
        loss = torch.nn.functional.cross_entropy(cache.logits(read.model, read.inputs, indices), read.labels)
        loss.backward()
        read.optimizer.step()
        read.optimizer.zero_grad(set_to_none=True)

    read.model.train()
    cached_read_step()  # epoch 1: fills the cache
    calls = {method: step.train_step for method, step in steps.items()}
    calls["read (cached)"] = cached_read_step
    samples = time_rounds(calls, rounds=6, warmup=1)
    times_s = {name: statistics.median(values) for name, values in samples.items()}
    to_full = {name: paired_ratio(samples, name, "full") for name in samples}
    assert cache.hits >= 7 * SHAPE["batch_size"] and cache.misses == SHAPE["batch_size"]
    cache.close()
    tensor_bytes = {method: step.profile().training_tensor_bytes for method, step in steps.items()}
    steps = read = None  # free the models before the peak-memory runs
    peak_bytes = peak_training_memory_bytes(METHODS)

    full_peak, full_tensor = peak_bytes["full"], tensor_bytes["full"]
    print(
        f"\nminilm (6 layers, width 384), batch {SHAPE['batch_size']}, {SHAPE['seq_len']} tokens, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'method':<14}{'step s':>9}{'/full':>7}{'peak MiB':>10}{'/full':>7}{'tensor MiB':>12}{'/full':>7}")
    for name, seconds in times_s.items():
        method = name.split()[0]
        memory = (
            ""
            if name != method
            else (
                f"{peak_bytes[method] / 2**20:>10.1f}{peak_bytes[method] / full_peak:>7.3f}"
                f"{tensor_bytes[method] / 2**20:>12.1f}{tensor_bytes[method] / full_tensor:>7.3f}"
            )
        )
        print(f"{name:<14}{seconds:>9.4f}{to_full[name]:>7.3f}{memory}")
        record_property(f"{name}/full step time", to_full[name])
    for method in ("read", "lst"):
        record_property(f"{method}/full peak training memory", peak_bytes[method] / full_peak)

    assert to_full["read"] <= 0.35, to_full
    assert peak_bytes["read"] / full_peak <= 0.30
    assert to_full["read (cached)"] <= 0.10, to_full
