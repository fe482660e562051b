"""READ and LST against full fine-tuning, side by side on the offline default (issue 3's acceptance).

One shape for every method: the pretrained all-MiniLM-L6-v2 (6 layers, width 384), batch 32,
64 tokens — the defaults of ``petlprof run``.  Printed with ``-s``; asserted:

* training step time, timed in alternation in this process (one thread; the median over rounds of
  each round's ``read/full``): ``read/full <= 0.35``;
* a READ step served by the hidden-state cache (what every step after epoch 1 is with
  ``--cache-hidden-states``; fp16 states, the default) ``<= 0.10x`` a full step.

Peak training memory, which needs no quiet core, is checked in ``test_side_tuning_memory.py``.
"""

from __future__ import annotations

import statistics

import torch

from petlprof.bench.profile import MethodStep, paired_ratio, time_rounds
from petlprof.run.cache import HiddenStateCache

SHAPE = {"backbone": "minilm", "batch_size": 32, "seq_len": 64}
METHODS = ("read", "lst", "full")


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
    print(
        f"\nminilm (6 layers, width 384), batch {SHAPE['batch_size']}, {SHAPE['seq_len']} tokens, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'method':<14}{'step s':>9}{'/full':>7}")
    for name, seconds in times_s.items():
        print(f"{name:<14}{seconds:>9.4f}{to_full[name]:>7.3f}")
        record_property(f"{name}/full step time", to_full[name])

    assert to_full["read"] <= 0.35, to_full
    assert to_full["read (cached)"] <= 0.10, to_full
