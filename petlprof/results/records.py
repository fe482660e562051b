"""The result record of one run, typed: its fields, its statuses, its schema version and its file name.

A record is a JSON object in the run store (:mod:`petlprof.results.store`); the TypedDicts here name its
fields and what each holds for the side that writes: the runner that builds a record, the store that writes it
and the distributed aggregation that merges the ranks' phases.  Reports and the API read records back typed,
as :class:`petlprof.results.result.RunResult`.  Every
field but the run's identity is optional (``total=False``): a failed run has no phases, an older one
may lack a field added since.  ``SCHEMA_VERSION`` and ``RESULTS_FILE`` are defined here alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from petlprof.results.figures import TIME, WARMUP_ENERGY, WARMUP_TIME
from petlprof.values import known_total

if TYPE_CHECKING:  # shapes declared by the layers that build them, which this one may not import at run time
    from petlprof.meters.idle import IdleBaseline
    from petlprof.models.backbones import BackboneFacts
    from petlprof.models.quantization import QuantizationInfo

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
    """A measured phase (train, eval, merged eval): the fixed figures of its window and the meters' readings
    (``energy_j``, ``peak_memory_bytes``, their ``*_kind``/``*_source`` provenance, ...), which vary with the
    meters.  A reading's figures are keyed by their declarations (``FIGURE.name``, :mod:`petlprof.results.figures`),
    which a TypedDict cannot list without spelling them a second time: a phase is built as a dict and cast to
    its type at the one place where a reading (``Reading.record()``) joins its fixed fields."""

    time_s: float | None
    steps: int
    samples: int
    warmup_steps: int
    # the warm-up steps' device-synchronised wall time, outside the window (part of the run's overhead_s); their
    # energy, metered apart, is keyed by its declaration (figures.WARMUP_ENERGY)
    warmup_time_s: float
    samples_per_s: float | None
    latency_s: Latency
    latency_source: str
    warnings: list[str]
    energy_kind: str | None  # the energy reading's provenance (figures.ENERGY_KIND), which the run itself reads
    # a data-parallel run's train and eval, combined over its ranks (petlprof.run.distributed)
    latency_rank: int  # the slowest rank, whose latency percentiles the phase shows
    per_rank: dict[str, list[Any]]  # rank, host, device and each per-rank figure, rank by rank
    aggregation: dict[str, str]  # figure name -> how the ranks combined it


class Divergence(TypedDict):
    """Where training stopped because its loss (or gradient norm) stopped being a finite number."""

    step: int  # the optimiser step (1-based) whose loss or gradient was not finite; it was not applied
    loss: str  # that step's loss as text ("nan", "inf"): JSON has no non-finite numbers
    grad_norm: str  # that step's gradient norm before clipping, as text
    last_finite_loss: float | None  # the step before's (None when the first step diverged)


class BudgetCheck(TypedDict, total=False):
    """One validation check of a budget (petlprof.run.budget.Budget): the metric on the validation slice after a
    step, and what training had cost by then (a record written before learning curves has no ``train_*``)."""

    step: int
    value: float
    elapsed_s: float  # since training started, the checks included
    train_time_s: float  # since training started (warm-up included), the checks left out
    train_energy_j: float | None  # the same span's energy by the run's energy meter; None unmeasured


class BudgetSummary(TypedDict):
    """The train phase's ``budget`` (petlprof.run.budget.Budget.summary), with a target or a time limit: the
    ``*_to_target`` figures are the phase's own when the target was reached, None otherwise; the
    ``*_without_checks`` ones subtract the checks' own time and energy."""

    target_metric: str | None
    target_value: float | None
    eval_every_steps: int | None  # None: no validation checks (a time limit alone)
    check_eval_size: int | None  # the validation slice's examples (None without checks)
    max_time_s: float | None
    stop_reason: str | None  # target or max_time; None: training ran to its end
    reached: bool | None  # None without a target
    reached_at_step: int | None
    time_to_target_s: float | None
    energy_to_target_j: float | None
    check_time_s: float
    check_energy_j: float | None  # None without an energy meter around the checks
    check_states_reused: bool  # --cache-hidden-states: the checks ran the side network on kept backbone states
    time_to_target_without_checks_s: float | None
    energy_to_target_without_checks_j: float | None
    checks: list[BudgetCheck]


class CacheSummary(TypedDict, total=False):
    """The hidden-state cache's figures in the train phase (petlprof.run.cache.HiddenStateCache.summary), on a
    run with ``--cache-hidden-states``."""

    cache_bytes: int  # in memory and on disk
    cache_memory_bytes: int
    cache_disk_bytes: int
    cache_budget_bytes: int  # in memory; the rest spills to disk
    cache_dtype: str
    cache_examples: int
    cache_hit_rate: float | None  # examples served from the cache over examples looked up (None before any)


class TrainPhase(Phase, CacheSummary, total=False):
    """The training phase (petlprof.run.train.train), with its tokens and tokens per second keyed by their
    declarations like the readings' figures."""

    epochs_run: float
    first_loss: float | None
    final_loss: float | None
    overflow_skipped_steps: int  # --precision fp16: steps skipped by the loss scaler (scaled gradients overflowed)
    budget: BudgetSummary  # with a target or a time limit
    diverged_at: Divergence  # only on a run that diverged


class Example(TypedDict):
    """A generated evaluation response beside its prompt and reference (the LM objective's first few)."""

    prompt: str
    generated: str
    reference: str


class EvalPhase(Phase, total=False):
    """The evaluation phase (``eval``) and the merged model's (``eval_merged``)."""

    eval_loss: float  # the LM objective: mean loss on the target tokens
    perplexity: float | None  # exp(eval_loss); None past e**700, where a float overflows
    target_tokens: int  # the LM objective: the target tokens the loss covers
    examples: list[Example]  # the LM objective: the first generated responses and their references
    predictions_agree_fraction: float | None  # eval_merged: predictions equal to the unmerged model's
    measured_on: str  # eval_merged of a data-parallel run: rank 0 alone, a per-device figure
    error: str  # eval_merged whose merge or evaluation failed: the phase holds this alone


class InferenceBatch(TypedDict, total=False):
    """The inference phase at one batch size (petlprof.run.inference.measure_inference): one fixed batch repeated
    under the meters.  Beside these, keyed by their declarations: its window's time, latency percentiles per
    batch and per sample, samples per second and the meters' readings."""

    batch_size: int
    warmup_time_s: float  # the warm-up repeats' wall time, outside the window (their energy: figures.WARMUP_ENERGY)
    repeats: int
    latency_source: str
    energy_per_sample_j: float | None
    warnings: list[str]


class Inference(TypedDict, total=False):
    """The ``inference`` phase: its window target and input, and one :class:`InferenceBatch` per batch size under
    ``batch_<size>`` (keys that come from the run's batch sizes, so a TypedDict cannot name them: the phase is
    cast to this type where its batch sizes join it)."""

    target_window_s: float
    input: str
    measured_on: str  # a data-parallel run: rank 0 alone, a per-device figure


class SideNetworkShare(TypedDict, total=False):
    """A side-tuning model's side network, timed with forward hooks over the generation window's first call
    (petlprof.run.generation.side_network_share); its time, the whole call's time and its shares of the call
    and of the per-token steps are keyed by their declarations (figures.SIDE)."""

    module: str  # the side network's class
    calls: int  # its forward calls during the generate call
    how: str


class GenerationBatch(TypedDict, total=False):
    """The generation phase at one batch size (petlprof.run.generation): counts of the window's calls.  Beside
    these, keyed by their declarations: responses, generated tokens, the window's time, tokens and responses per
    second, energy per token and per response, time to first token, per-token latency and the meters' readings."""

    batch_size: int
    warmup_time_s: float  # the warm-up calls' wall time, outside the window (their energy: figures.WARMUP_ENERGY)
    batches: int  # generate calls in the window
    prompt_tokens: int
    response_tokens: int  # the responses' tokens without the EOS that ended them
    decode_steps: int
    latency_source: str
    warnings: list[str]
    side_network: SideNetworkShare  # a side-tuning model


class Generation(TypedDict, total=False):
    """The LM objective's ``generation`` phase (and ``generation_merged``): how it decoded, and one
    :class:`GenerationBatch` per batch size under ``batch_<rows>`` (keys from the run's batch sizes, which a
    TypedDict cannot name: the phase is cast to this type where they join it)."""

    target_window_s: float
    max_prompts: int
    max_new_tokens: int
    decoding: str
    input: str


class _TrainingExtras(TypedDict, total=False):
    quantization: QuantizationInfo  # only on a run with --quantize int8, nf4 or fp4


class RecipeDescription(TypedDict):
    """The training recipe as the record states it (petlprof.run.recipe.TrainRecipe.describe)."""

    optimizer: str
    schedule: str
    precision: str  # the parameters' dtype, and for mixed precision the autocast dtype and loss scaling


class Training(_TrainingExtras, RecipeDescription):
    """How the run trained: the run's settings and the recipe's own description (petlprof.run.recipe)."""

    epochs: int
    max_steps: int | None
    batch_size: int
    lr: float
    lr_source: str
    max_length: int
    warmup_steps: int
    device: str


class _TaskInfoExtras(TypedDict, total=False):
    objective: str  # only on a language-modelling task's run (lm): classification records stay as they were


class TaskInfo(_TaskInfoExtras):
    num_labels: int
    label_names: list[str] | None
    train_samples: int
    eval_samples: int
    description: str
    majority_rate: float | None  # the evaluation split's most common class's share (None for regression)


class Load(TypedDict):
    """A run's loading before its first phase (part of its ``overhead_s``): a holder's reading of a kept backbone
    (:mod:`petlprof.run.kept`) is charged to the first run it forked, in both times."""

    time_s: float  # wall time of the loading: data, backbone, method applied
    backbone_s: float  # of it, the backbone's: read here, read for this run by the warm worker, or taken kept
    backbone_from: str  # where the backbone came from, in words


class FailedAt(TypedDict, total=False):
    """Where a failed run was (phase, step) and its memory then (bytes)."""

    phase: str | None
    step: int | None
    rss_bytes: int | None
    peak_rss_bytes: int | None
    cuda_allocated_bytes: int  # on CUDA
    cuda_peak_allocated_bytes: int


class RankPlace(TypedDict):
    """Where one rank of a data-parallel run ran (petlprof.run.ranks.RankContext.describe)."""

    rank: int
    local_rank: int
    host: str
    device: str
    pid: int


class RankPhases(RankPlace, total=False):
    """One rank's own train and eval phases, as rank 0 gathers them (the record's ``distributed.ranks``)."""

    train: TrainPhase
    eval: EvalPhase  # absent when training diverged


class RunPhases(TypedDict, total=False):
    """A run's train and eval phases (petlprof.run.ranks' ``combine``): one process's own, or rank 0's
    aggregation of every rank's (petlprof.run.distributed.aggregate_ranks) with its nodes and the ranks' own."""

    train: TrainPhase
    eval: EvalPhase  # absent when training diverged
    nodes: int  # several ranks: the hosts they ran on
    per_rank: list[RankPhases]  # several ranks: each rank's own phases, in rank order


class DistributedSummary(TypedDict, total=False):
    """The record's ``distributed``: how a data-parallel run was split and how its figures are to be read
    (petlprof.run.distributed.summary), or a rank's place, or a failed run's ranks."""

    world_size: int
    backend: str | None  # gloo or nccl
    nodes: int
    batch: str
    aggregation: str
    not_counted: str
    ranks: list[RankPhases]
    rank: int  # the record of a rank other than rank 0 (not the run's): its place alone
    failed_ranks: dict[str, str | None]  # a failed run (petlprof.execution.launch.failure): rank -> its error or exit


class _FailureCause(TypedDict):
    status: str  # one of STATUSES
    error: str  # names the rank and its error or exit


class LaunchFailure(_FailureCause, total=False):
    """The cause of a failed data-parallel run, as record fields (petlprof.execution.launch.failure)."""

    distributed: DistributedSummary  # world_size and failed_ranks
    traceback: str  # the failed rank's own, when it wrote a record
    failed_at: FailedAt


class RayTask(TypedDict, total=False):
    """Where a Ray task's run executed (petlprof.execution.executors.ray_node_fields)."""

    node_id: str | None  # None: the node is not known (the task was lost, or raised on its node)
    node_ip: str
    gpu_ids: list[str]  # the GPUs Ray gave the task
    cpus: float  # the CPUs the task asked for
    omp_num_threads_per_rank: str | None
    task_started_unix: float


class RayNode(RayTask, total=False):
    niceness: int  # the task's process's; above 0 the run's figures may be stretched
    lost: bool  # the task's worker or node was lost


class NodeFields(RayNode, total=False):
    """The record's ``node``: where the run executed (petlprof.execution.executors.node_fields)."""

    executor: str  # local or ray
    hostname: str
    cuda_visible_devices: str | None


# The record's ``env`` (petlprof.results.environment.environment): package versions (None: not installed),
# interpreter, hardware and the source's commit.  Declared as a call: a package name is not an identifier.
Environment = TypedDict(
    "Environment",
    {
        "petlprof": str | None,
        "torch": str | None,
        "transformers": str | None,
        "peft": str | None,
        "datasets": str | None,
        "nvidia-ml-py": str | None,
        "codecarbon": str | None,
        "python": str,
        "platform": str,
        "device": str,
        "cpu": str,
        "cpu_count": int | None,
        "torch_threads": int,
        "allocator": str,
        "gpu": str | None,
        "cuda": str | None,
        "git_commit": str | None,
        "hostname": str,
        "error": str,  # the only field when the environment could not be read (petlprof.run.execute)
    },
    total=False,
)


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
    backbone_info: BackboneFacts
    task_info: TaskInfo
    primary_metric: str
    training: Training
    trainable_params: int
    total_params: int
    checkpoint_bytes: int  # the trainable state as one safetensors file: what the method must save
    metrics: dict[str, float | None]  # only on a run with status ``ok`` (perplexity None where it overflows)
    warnings: list[str]  # about the result itself, e.g. every evaluation prediction is one class
    constant_output: bool  # LM objective: every generated evaluation response the same text (absent: not so)
    diverged_at: Divergence  # status ``diverged``: the step and its loss (also in ``train``)
    train: TrainPhase
    eval: EvalPhase
    inference: Inference  # classification
    generation: Generation  # the LM objective's, in place of inference
    generation_merged: Generation  # the same on the merged model (methods that merge)
    eval_merged: EvalPhase
    memory_breakdown: dict[str, int]
    idle_baseline: IdleBaseline | None
    distributed: DistributedSummary
    traceback: str
    failed_at: FailedAt
    env: Environment
    load: Load  # its loading before the first phase (part of overhead_s)
    process: str  # what the run executed in: a fresh interpreter, or a child of the sweep's warm worker
    process_wall_time_s: float  # from the start of the run's process (or execute) to its record read back
    overhead_s: float  # process_wall_time_s minus the measured phases (measured_phases_s): the harness's cost
    warm_worker_start_s: float  # the sweep's first warm-forked run: the warm worker's imports, in its wall time
    node: NodeFields
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


def _windows(record: Mapping[str, Any]) -> list[Any]:
    """The run's measured windows: training (target checks included), evaluation, the merged evaluation and the
    inference (or generation) windows at each batch size."""
    phases: list[Any] = [record.get("train"), record.get("eval"), record.get("eval_merged")]
    for repeated in (record.get("inference"), record.get("generation"), record.get("generation_merged")):
        phases += [v for k, v in (repeated or {}).items() if k.startswith("batch_")]
    return [p for p in phases if isinstance(p, dict)]


def measured_phases_s(record: Mapping[str, Any]) -> float:
    """Seconds inside the run's measurement windows (:func:`_windows`)."""
    return sum(p[TIME.name] for p in _windows(record) if isinstance(p.get(TIME.name), (int, float)))


def warmup_time_s(record: Mapping[str, Any]) -> float | None:
    """Seconds of the run's warm-up steps, calls and repeats (``warmup_time_s`` of each window that has them): the
    part of ``overhead_s`` that is unmeasured work of the phases themselves rather than the harness's.  None for a
    record with none timed (written before they were, or failed before its phases)."""
    timed = [p[WARMUP_TIME] for p in _windows(record) if isinstance(p.get(WARMUP_TIME), (int, float))]
    return sum(timed) if timed else None


def warmup_energy_j(record: Mapping[str, Any]) -> float | None:
    """Joules of the run's warm-up steps, calls and repeats, each phase's metered apart by its energy meter
    (:class:`petlprof.meters.energy.WarmUp`).  None unless every window with timed warm-ups has its energy (a record
    written before they were metered, a run without an energy meter)."""
    timed = [p for p in _windows(record) if isinstance(p.get(WARMUP_TIME), (int, float))]
    return known_total(WARMUP_ENERGY.of(p) for p in timed) if timed else None


def add_overhead(record: RunRecord, process_wall_time_s: float) -> RunRecord:
    """Set ``process_wall_time_s`` and ``overhead_s`` (what the harness spent beyond the measured phases)."""
    record["process_wall_time_s"] = process_wall_time_s
    record["overhead_s"] = max(0.0, process_wall_time_s - measured_phases_s(record))
    return record
