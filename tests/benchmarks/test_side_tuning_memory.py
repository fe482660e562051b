"""READ's and LST's peak training memory against full fine-tuning's on the offline default (issue 3's
acceptance; the step times are in ``test_side_tuning.py``).

The shape of ``test_side_tuning.py``: the pretrained all-MiniLM-L6-v2, batch 32, 64 tokens.  Asserted:
peak training memory ``read/full <= 0.30``, measured the way a run measures it on CPU: each method in a
process of its own, forked from one that imported the runtime (as the sweep's warm worker forks a run), the
RSS high-water mark over training steps minus the process's RSS before the backbone was
loaded (weights, activations, gradients and optimiser state; see :mod:`petlprof.meters.memory`).  The
deterministic tensor-byte model of :mod:`petlprof.bench.profile` (weights + gradients + AdamW state + saved
activations) is printed beside it.  Nothing here is timed: ``.ci/run`` runs this file beside a timed group,
on the other core.
"""

from __future__ import annotations

import json
import subprocess
import sys

from test_side_tuning import METHODS, SHAPE

from petlprof.bench.profile import MethodStep

_PEAK_SCRIPT = """
import json, os, sys, traceback
from petlprof.run.libraries import import_runtime_libraries
import_runtime_libraries()  # the runtime, as in a run, before the baseline
from petlprof.bench.profile import MethodStep
from petlprof.meters import Window, memory_meter_for
from petlprof.meters.memory import release_free_memory, rss_bytes
from petlprof.execution.warm import populate, resident_file_pages
resident = resident_file_pages()
shape = json.loads(sys.argv[1])
for method in sys.argv[2:]:  # one child at a time, forked as a run is from the warm worker
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into this loop: any failure is its exit code
        code = 1
        try:
            populate(resident)
            release_free_memory()
            baseline = rss_bytes()
            step = MethodStep(method, **shape)
            step.train_step()  # warm-up, outside the window as in a run
            with Window([memory_meter_for("cpu", baseline)], "cpu") as window:
                for _ in range(3):
                    step.train_step()
            print(json.dumps({"method": method, **window.reading.record()}), flush=True)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (method, status)
"""


def peak_training_memory_bytes(methods: tuple[str, ...]) -> dict[str, int]:
    """The product's CPU figure for a training phase of each method, each in a process of its own, forked
    (as a run is from the sweep's warm worker, :mod:`petlprof.execution.warm`) from one that imported the runtime
    once: three fresh interpreters took 34 s of one core here, their imports 15 s of it."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, json.dumps(SHAPE), *methods], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            reading = json.loads(line)
            assert reading["memory_source"] == "rss-hwm", reading  # the peak was reset: nothing earlier mixed in
            peaks[reading["method"]] = int(reading["peak_memory_bytes"])
    assert sorted(peaks) == sorted(methods), done.stdout[-3000:]
    return peaks


def test_read_and_lst_peak_training_memory_against_full(record_property):
    peak_bytes = peak_training_memory_bytes(METHODS)
    tensor_bytes = {method: MethodStep(method, **SHAPE, lr=1e-3).profile().training_tensor_bytes for method in METHODS}
    full_peak, full_tensor = peak_bytes["full"], tensor_bytes["full"]
    print(f"\nminilm (6 layers, width 384), batch {SHAPE['batch_size']}, {SHAPE['seq_len']} tokens")
    print("peak: RSS high-water mark over 3 steps above the baseline, measured; tensor: weights + gradients + AdamW")
    print("state + saved activations, counted from the tensors")
    print(f"{'method':<14}{'peak MiB':>10}{'/full':>7}{'tensor MiB':>12}{'/full':>7}")
    for method in METHODS:
        print(
            f"{method:<14}{peak_bytes[method] / 2**20:>10.1f}{peak_bytes[method] / full_peak:>7.3f}"
            f"{tensor_bytes[method] / 2**20:>12.1f}{tensor_bytes[method] / full_tensor:>7.3f}"
        )
    for method in ("read", "lst"):
        record_property(f"{method}/full peak training memory", peak_bytes[method] / full_peak)
    assert peak_bytes["read"] / full_peak <= 0.30
