"""The result record of one run, typed: its fields, its statuses, its schema version and its file name.

Records stay plain dicts (JSON objects in the run store, :mod:`petlprof.results.store`); the TypedDicts here
name their fields and what each holds, for the runner that builds them, the store that writes them,
the distributed aggregation that merges the ranks' phases and the reports that read them.  Every
field but the run's identity is optional (``total=False``): a failed run has no phases, an older one
may lack a field added since.  ``SCHEMA_VERSION`` and ``RESULTS_FILE`` are defined here alone.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from petlprof.results.figures import TIME

SCHEMA_VERSION = 1
RESULTS_FILE = "results.jsonl"

# statuses: ``ok`` is the only one with scores; ``diverged`` (the training loss stopped being a finite
# number) is final too, since the same run diverges again, but has no scores and is never plotted
OK, FAILED, OOM, TIMEOUT, CANCELLED, DIVERGED = "ok", "failed", "oom", "timeout", "cancelled", "diverged"
STATUSES = (OK, FAILED, OOM, TIMEOUT, CANCELLED, DIVERGED)
FINAL_STATUSES = frozenset({OK, DIVERGED})  # a resumed sweep does not run these again


class Latency(TypedDict):
    """Percentiles of per-step (per-batch) latency, seconds; None without timed steps."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None


class Phase(TypedDict, total=False):
    """A measured phase (train, eval, merged eval): window figures and the meters' readings (``energy_j``,
    ``peak_memory_bytes``, their ``*_kind``/``*_source`` provenance, ...), which vary with the meters."""

    time_s: float | None
    steps: int
    samples: int
    warmup_steps: int
    samples_per_s: float | None
    latency_s: Latency
    latency_source: str
    warnings: list[str]


class Divergence(TypedDict):
    """Where training stopped because its loss (or gradient norm) stopped being a finite number."""

    step: int  # the optimiser step (1-based) whose loss or gradient was not finite; it was not applied
    loss: str  # that step's loss as text ("nan", "inf"): JSON has no non-finite numbers
    grad_norm: str  # that step's gradient norm before clipping, as text
    last_finite_loss: float | None  # the step before's (None when the first step diverged)


class TrainPhase(Phase, total=False):
    epochs_run: float
    first_loss: float | None
    final_loss: float | None
    overflow_skipped_steps: int  # --precision fp16: steps skipped by the loss scaler (scaled gradients overflowed)
    budget: dict[str, Any]  # petlprof.run.budget.Budget.summary, with a target or a time limit
    diverged_at: Divergence  # only on a run that diverged


class QuantizationInfo(TypedDict, total=False):
    """``--quantize``: how the backbone's linear layers were quantised (petlprof.models.quantization)."""

    method: str  # int8, nf4 or fp4
    library: str  # bitsandbytes and its version
    quantized_layers: int
    quantized_modules: list[str]  # layer indices as *
    kept_in_float: list[str]  # linear layers left in float: the LM head, weights tied to it, T5's wo
    packed_bytes: int  # the quantised weights as stored
    state_bytes: int  # what dequantises them: block scales (and their own, double quantised), int8 row scales
    compute_dtype: str  # 4-bit: the dtype the dequantised weights multiply in
    double_quant: bool  # 4-bit: the block scales quantised too
    blocksize: int  # 4-bit: weights per scale
    cpu_inference_repacking: bool  # 4-bit: bitsandbytes' AVX512-BF16 inference layout (off: one layout throughout)
    inputs: str  # int8: how a product with an 8-bit weight runs on the device (training and evaluation)
    outlier_threshold: float  # int8: input columns with a value beyond it are multiplied in float16


class _TrainingExtras(TypedDict, total=False):
    quantization: QuantizationInfo  # only on a run with --quantize int8, nf4 or fp4


class Training(_TrainingExtras):
    """How the run trained: the run's settings and the recipe's own description (petlprof.run.recipe)."""

    epochs: int
    max_steps: int | None
    batch_size: int
    lr: float
    lr_source: str
    max_length: int
    warmup_steps: int
    device: str
    optimizer: str
    schedule: str
    precision: str


class TaskInfo(TypedDict):
    num_labels: int
    label_names: list[str] | None
    train_samples: int
    eval_samples: int
    description: str
    majority_rate: float | None  # the evaluation split's most common class's share (None for regression)


class FailedAt(TypedDict, total=False):
    """Where a failed run was (phase, step) and its memory then (bytes)."""

    phase: str | None
    step: int | None
    rss_bytes: int | None
    peak_rss_bytes: int | None
    cuda_allocated_bytes: int  # on CUDA
    cuda_peak_allocated_bytes: int


class RunRecord(TypedDict, total=False):
    """One line of ``results.jsonl``."""

    schema_version: int
    run_key: str
    status: str  # one of STATUSES
    error: str | None
    method: str
    method_config: dict[str, Any]
    method_config_changed: list[str]
    pareto_knob: str | None
    backbone: str
    task: str
    seed: int
    spec: dict[str, Any]
    started_at: str
    finished_at: str
    wall_time_s: float
    backbone_info: dict[str, Any]
    task_info: TaskInfo
    primary_metric: str
    training: Training
    trainable_params: int
    total_params: int
    checkpoint_bytes: int  # the trainable state as one safetensors file: what the method must save
    metrics: dict[str, float]  # only on a run with status ``ok``
    warnings: list[str]  # about the result itself, e.g. every evaluation prediction is one class
    diverged_at: Divergence  # status ``diverged``: the step and its loss (also in ``train``)
    train: TrainPhase
    eval: Phase
    inference: dict[str, Any]  # target_window_s, input, batch_<size>: Phase with per-sample figures
    generation: dict[str, Any]  # the LM objective's, in place of inference: batch_<size>: per-token figures
    generation_merged: dict[str, Any]  # the same on the merged model (methods that merge)
    eval_merged: Phase
    memory_breakdown: dict[str, int]
    idle_baseline: dict[str, Any] | None
    distributed: dict[str, Any]
    traceback: str
    failed_at: FailedAt
    env: dict[str, Any]
    process: str  # what the run executed in: a fresh interpreter, or a child of the sweep's warm worker
    process_wall_time_s: float  # from the start of the run's process (or execute) to its record read back
    overhead_s: float  # process_wall_time_s minus the measured phases (measured_phases_s): the harness's cost
    warm_worker_start_s: float  # the sweep's first warm-forked run: the warm worker's imports, in its wall time
    node: dict[str, Any]  # where the run executed (petlprof.execution.executors.node_fields)
    stderr_tail: str  # a run whose process wrote no record: the last lines it wrote to stderr
    failed_unix_s: float  # a failed rank's own record (beside rank 0's): when it failed, to order the ranks


# safetensors writes tensors by dtype, widest first, then by name (its Rust ``Dtype`` order)
_SAFETENSORS_DTYPES: tuple[str, ...] = (
    "BOOL",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
)
_SAFETENSORS_DTYPES += ("F64", "I64", "U64")
_SAFETENSORS_NAMES = {  # torch's dtypes by name (no torch import here), as safetensors names them
    "torch.bool": "BOOL",
    "torch.uint8": "U8",
    "torch.int8": "I8",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.int16": "I16",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int32": "I32",
    "torch.float32": "F32",
    "torch.float64": "F64",
    "torch.int64": "I64",
}


def safetensors_bytes(tensors: dict[str, Any]) -> int:
    """The size of the file ``safetensors.torch.save_file(tensors)`` writes (no metadata), from the
    tensors' names, dtypes and shapes alone: 8 bytes of header length, the JSON header padded with
    spaces to a multiple of 8, then the raw data.  Computed rather than written, so no copy of the
    weights is made inside a run (tests compare it with the real file)."""
    entries = sorted(
        (
            (_SAFETENSORS_NAMES[str(t.dtype)], key, list(t.shape), t.numel() * t.element_size())
            for key, t in tensors.items()
        ),
        key=lambda e: (-_SAFETENSORS_DTYPES.index(e[0]), e[1]),
    )
    header, offset = {}, 0
    for dtype, key, shape, size in entries:
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if not header:
        return 0
    text = len(json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode())
    return 8 + text + (-text % 8) + offset


def measured_phases_s(record: RunRecord) -> float:
    """Seconds inside the run's measurement windows: training (target checks included), evaluation,
    the inference (or generation) windows at each batch size and the merged evaluation."""
    phases: list[Any] = [record.get("train"), record.get("eval"), record.get("eval_merged")]
    for repeated in (record.get("inference"), record.get("generation"), record.get("generation_merged")):
        phases += [v for k, v in (repeated or {}).items() if k.startswith("batch_")]
    return sum(p[TIME.name] for p in phases if isinstance(p, dict) and isinstance(p.get(TIME.name), (int, float)))


def add_overhead(record: RunRecord, process_wall_time_s: float) -> RunRecord:
    """Set ``process_wall_time_s`` and ``overhead_s`` (what the harness spent beyond the measured phases)."""
    record["process_wall_time_s"] = process_wall_time_s
    record["overhead_s"] = max(0.0, process_wall_time_s - measured_phases_s(record))
    return record


def overhead_line(records: Sequence[Mapping[str, Any]]) -> str | None:
    """How much of the runs' wall time the harness spent outside the measured phases, as one sentence
    (None when no record carries ``overhead_s``)."""
    pairs = [
        (r["overhead_s"], r["process_wall_time_s"])
        for r in records
        if isinstance(r.get("overhead_s"), (int, float)) and isinstance(r.get("process_wall_time_s"), (int, float))
    ]
    wall = sum(w for _, w in pairs)
    if not pairs or wall <= 0:
        return None
    overhead = sum(o for o, _ in pairs)
    median = statistics.median(o for o, _ in pairs)
    return (
        f"harness overhead: {overhead:,.1f} s of the {len(pairs)} runs' {wall:,.1f} s of wall time "
        f"({overhead / wall:.0%}, measured) fell outside the measured phases, median {median:.1f} s a run: "
        "process start, imports, loading the model and data, warm-up steps, writing the record"
    )
