"""Every measured figure, declared once: its record key (unit in the name), unit, direction, how the
ranks of a data-parallel run and the seeds of a configuration combine it, its label and number format in
tables and plots, and the phases that carry it.

A meter keys its reading through these declarations (``Reading({ENERGY: joules})``,
:mod:`petlprof.meters.base`); the rank aggregation (:mod:`petlprof.run.distributed`), the report's columns, the
DataFrame API, the ``petlprof_bench`` fixture's baseline checks and the metric-direction table read them
instead of spelling the keys.  Records stay plain JSON dicts with the keys of schema 1, so every existing
store loads and resumes unchanged.

Adding a figure: declare it here (and in :data:`FIGURES`), and have the meter that measures it declare it
(its ``FIGURES`` or ``MORE_FIGURES``) and put it in its reading under the declaration; aggregation across
ranks, the DataFrame's columns and the direction table follow from the declaration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HIGHER = "higher"
LOWER = "lower"

# how the ranks of one data-parallel run combine a figure (petlprof.run.distributed)
SUM = "sum over ranks"
MAX = "max over ranks (per_rank: each rank's device/process)"
SLOWEST = "slowest rank"  # the maximum, which names the slowest rank
FROM_SLOWEST = "the slowest rank's"  # taken whole from the slowest rank (percentiles do not add up)
RATE = "count over ranks / time of the slowest rank"
DEVICE_ENERGY = "sum over ranks' devices; once per node for a node-wide counter"
CODECARBON_ENERGY = "sum over ranks; once per node when CodeCarbon tracks the machine"
SAME = "the same on every rank, else dropped"
# the generation phase runs on rank 0 alone (petlprof.run.pipeline), the bench fixture in one process
ONE_RANK = "measured by one process (rank 0 of a data-parallel run): nothing to combine"
RANK_RULES = (SUM, MAX, SLOWEST, FROM_SLOWEST, RATE, DEVICE_ENERGY, CODECARBON_ENERGY, SAME, ONE_RANK)

# how the seeds of one configuration combine a figure (petlprof.report.frame)
MEAN_INTERVAL = "mean over seeds ± interval (Student's t or standard error)"

TRAIN, EVAL, INFERENCE, GENERATION = "train", "eval", "inference", "generation"
MEASURED_PHASES = (TRAIN, EVAL)  # the phases every run measures, each under one meter window
STEP = "step"  # one training step profiled by petlprof.bench.profile (the petlprof_bench fixture), not a run's phase

# how the petlprof_bench fixture checks a figure against its committed baseline (petlprof.bench.plugin)
EXACT = "an exact count: a change past the tolerance either way fails"
GROWTH = "may not grow past the tolerance; a drop is an improvement"
BASELINE_RULES = (EXACT, GROWTH)


@dataclass(frozen=True)
class Figure:
    """One measured figure.  ``name`` is its key in a phase of a record (the unit in the name, as
    ``energy_j``); ``scale`` turns the record's value into the ``shown_unit`` of tables and plots,
    printed with ``decimals``.  ``kind`` and ``source`` name the reading keys that say whether the
    value was measured or estimated and by what (the provenance every shown figure carries)."""

    name: str
    unit: str
    better: str | None  # None: no cost or quality to compare (a count: steps, samples, tokens; a share)
    ranks: str
    label: str
    phases: tuple[str, ...]
    shown_unit: str = ""
    scale: float = 1.0
    decimals: int = 1
    seeds: str = MEAN_INTERVAL
    per: Figure | None = None  # a rate's count (RATE): this figure is per.name / time_s
    kind: str | None = None
    source: str | None = None
    per_rank: bool = False  # listed rank by rank in a data-parallel record's per_rank
    column: str | None = None  # its column in the DataFrame API (train; eval_ prefixed for eval), if any
    part: tuple[str, ...] = ()  # the key under ``name`` the column reads (a percentile: ``("p50",)``)
    under: tuple[str, ...] = ()  # the keys of the phase it sits under (the side network's: ``("side_network",)``)
    baseline: str | None = None  # how the petlprof_bench fixture checks it (EXACT, GROWTH), if it does
    grade: str | None = None  # the key of its trust grade, A-D (the rule: petlprof.results.grades), if it has one

    def __post_init__(self) -> None:
        if self.better not in (HIGHER, LOWER, None):
            raise ValueError(f"figure {self.name}: better {self.better!r} is not one of {HIGHER}, {LOWER}, None")
        if self.ranks not in RANK_RULES:
            raise ValueError(f"figure {self.name}: ranks {self.ranks!r} is not one of {', '.join(RANK_RULES)}")
        if (self.ranks == RATE) != (self.per is not None):
            raise ValueError(f"figure {self.name}: a rate (ranks={RATE!r}) and only a rate names its count (per=)")
        if self.baseline not in (*BASELINE_RULES, None):
            raise ValueError(
                f"figure {self.name}: baseline {self.baseline!r} is not one of {', '.join(BASELINE_RULES)}, None"
            )

    @property
    def header(self) -> str:
        """The column title of a table: label and shown unit, as ``train energy (J)``."""
        return f"{self.label} ({self.shown_unit or self.unit})"

    @property
    def path(self) -> tuple[str, ...]:
        """The keys from a phase of a record to the shown value, as ``("per_token_latency_s", "p50")``."""
        return (*self.under, self.name, *self.part)

    def frame_column(self, phase: str = TRAIN) -> str:
        """Its column in the DataFrame API for one measured phase (``eval_`` prefixed for the evaluation);
        a KeyError when it has none there."""
        if self.column is None or phase not in self.phases or phase not in MEASURED_PHASES:
            raise KeyError(f"figure {self.name} has no DataFrame column for the {phase} phase")
        return ("" if phase == TRAIN else f"{phase}_") + self.column

    @property
    def reading_keys(self) -> tuple[str, ...]:
        """The keys a meter of this figure fills in its reading: the figure and its provenance."""
        return tuple(key for key in (self.name, self.kind, self.source) if key is not None)

    def of(self, phase: Mapping[str, Any] | None) -> Any:
        """This figure's value in one phase of a record (None when the phase or the figure is absent)."""
        return phase.get(self.name) if isinstance(phase, Mapping) else None

    def shown(self, value: float | None) -> str | None:
        """``value`` in the shown unit with the declared decimals; None for a missing value."""
        return None if value is None else f"{value * self.scale:.{self.decimals}f}"


MIB = 2**20
# the reading keys that say how the energy and the memory figures were obtained (measured or estimated, by what)
ENERGY_KIND, ENERGY_SOURCE = "energy_kind", "energy_source"
MEMORY_KIND, MEMORY_SOURCE = "memory_kind", "memory_source"
ALL = (TRAIN, EVAL, INFERENCE, GENERATION)
TIME = Figure("time_s", "s", LOWER, SLOWEST, "time", ALL, per_rank=True, column="time_s")
SAMPLES = Figure("samples", "count", None, SUM, "samples", (TRAIN, EVAL), decimals=0, per_rank=True)
SAMPLES_PER_S = Figure("samples_per_s", "1/s", HIGHER, RATE, "samples/s", (TRAIN, EVAL, INFERENCE), per=SAMPLES)
TOKENS = Figure("tokens", "count", None, SUM, "tokens", (TRAIN,), decimals=0)
# the training phase's tokens (attention-mask positions trained on) per second; the LM generation phase's
# tokens_per_s counts generated tokens (petlprof.run.generation)
TOKENS_PER_S = Figure(
    "tokens_per_s", "1/s", HIGHER, RATE, "tokens/s", (TRAIN, GENERATION), per=TOKENS, column="tokens_per_s"
)
ENERGY = Figure(
    "energy_j", "J", LOWER, DEVICE_ENERGY, "energy", ALL, "J",
    kind=ENERGY_KIND, source=ENERGY_SOURCE, per_rank=True, column="energy_j", grade="energy_grade",
)  # fmt: skip
# a phase's warm-up steps, calls or repeats, metered by its energy meters alone in a window of their own before the
# measured one (petlprof.meters.energy.WarmUp): what the warm-ups cost, never part of the phase's energy_j
WARMUP_ENERGY = Figure("warmup_energy_j", "J", LOWER, DEVICE_ENERGY, "warm-up energy", ALL)
# the cpu-tensors meter's own figure (petlprof.meters.tensors): a phase's peak of live tensor bytes, as an estimate
# counts them (not a Figure: no rank rule, no column)
PEAK_TENSORS = "peak_tensor_bytes"
WARMUP_TIME = "warmup_time_s"  # the phase's key beside it: the warm-ups' device-synchronised wall time, not a Figure
ENERGY_COUNTER = Figure("energy_counter_j", "J", LOWER, DEVICE_ENERGY, "energy counter", ALL)
ENERGY_INTEGRATED = Figure("energy_integrated_j", "J", LOWER, DEVICE_ENERGY, "integrated power", ALL)
PEAK_MEMORY = Figure(
    "peak_memory_bytes", "B", LOWER, MAX, "peak mem", ALL, "MiB", 1 / MIB,
    kind=MEMORY_KIND, source=MEMORY_SOURCE, per_rank=True, column="peak_memory_bytes",
)  # fmt: skip
PEAK_RESERVED = Figure("peak_reserved_bytes", "B", LOWER, MAX, "peak reserved", ALL, "MiB", 1 / MIB)
ENERGY_WINDOW = Figure("energy_window_s", "s", LOWER, MAX, "energy window", ALL)
STEPS = Figure("steps", "count", None, SAME, "steps", (TRAIN, EVAL), decimals=0, column="steps")
LATENCY = Figure(
    "latency_s", "s", LOWER, FROM_SLOWEST, "p50 latency", (TRAIN, EVAL, INFERENCE), "ms/batch", 1000.0,
    column="latency_p50_s", part=("p50",),
)  # fmt: skip
# the inference phase (petlprof.run.inference), per batch size: each timed batch's latency over its samples
LATENCY_PER_SAMPLE = Figure(
    "latency_per_sample_s", "s", LOWER, ONE_RANK, "p50 latency per sample", (INFERENCE,), "ms/sample", 1000.0, 2,
    part=("p50",),
)  # fmt: skip
ENERGY_ABOVE_IDLE = Figure(
    "energy_above_idle_j", "J", LOWER, DEVICE_ENERGY, "energy above idle", ALL, "J",
    kind=ENERGY_KIND, column="energy_above_idle_j", grade="energy_above_idle_grade",
)  # fmt: skip
IDLE_POWER = Figure("idle_power_w", "W", LOWER, DEVICE_ENERGY, "idle power", ALL)
MEAN_POWER = Figure("mean_power_w", "W", LOWER, DEVICE_ENERGY, "mean power", ALL)
CPU_TIME = Figure("cpu_time_s", "s", LOWER, DEVICE_ENERGY, "CPU time", ALL)
CPU_CORES = Figure("cpu_core_s", "s", LOWER, DEVICE_ENERGY, "CPU core-seconds", ALL)
CODECARBON_ENERGY_J = Figure("codecarbon_energy_j", "J", LOWER, CODECARBON_ENERGY, "CodeCarbon energy", ALL)
CODECARBON_CPU = Figure("codecarbon_cpu_energy_j", "J", LOWER, CODECARBON_ENERGY, "CodeCarbon CPU energy", ALL)
CODECARBON_GPU = Figure("codecarbon_gpu_energy_j", "J", LOWER, CODECARBON_ENERGY, "CodeCarbon GPU energy", ALL)
CODECARBON_RAM = Figure("codecarbon_ram_energy_j", "J", LOWER, CODECARBON_ENERGY, "CodeCarbon RAM energy", ALL)
CO2 = Figure("co2eq_g", "g", LOWER, CODECARBON_ENERGY, "CO2-eq", ALL, "g", 1.0, 3, kind="co2eq_kind", column="co2eq_g")

# the generation phase (petlprof.run.generation), per batch size: greedy decoding on rank 0 alone; the per-token
# and per-response figures divide the window's totals, time to first token is the median over its calls
GENERATED_TOKENS = Figure("generated_tokens", "count", None, ONE_RANK, "generated tokens", (GENERATION,), decimals=0)
RESPONSES = Figure("responses", "count", None, ONE_RANK, "responses", (GENERATION,), decimals=0)
RESPONSES_PER_S = Figure("responses_per_s", "1/s", HIGHER, RATE, "responses/s", (GENERATION,), per=RESPONSES)
ENERGY_PER_TOKEN = Figure(
    "energy_per_token_j", "J", LOWER, ONE_RANK, "energy per token", (GENERATION,), "J", decimals=4,
    kind=ENERGY_KIND, source=ENERGY_SOURCE,
)  # fmt: skip
ENERGY_PER_RESPONSE = Figure(
    "energy_per_response_j", "J", LOWER, ONE_RANK, "energy per response", (GENERATION,), "J", decimals=3,
    kind=ENERGY_KIND, source=ENERGY_SOURCE,
)  # fmt: skip
TIME_TO_FIRST_TOKEN = Figure(
    "time_to_first_token_s", "s", LOWER, ONE_RANK, "time to first token", (GENERATION,), "s", decimals=3
)
TIME_TO_FIRST_TOKEN_PERCENTILES = Figure(
    "time_to_first_token_percentiles_s", "s", LOWER, ONE_RANK, "time to first token p50", (GENERATION,), "s",
    decimals=3, part=("p50",),
)  # fmt: skip
PER_TOKEN_LATENCY = Figure(
    "per_token_latency_s", "s", LOWER, ONE_RANK, "per-token latency p50", (GENERATION,), "ms", 1000.0, 1,
    part=("p50",),
)  # fmt: skip
# a side-tuning model's side network, timed over the generation window's first call (petlprof.run.generation)
SIDE = ("side_network",)
SIDE_CALL_TIME = Figure(
    "call_time_s", "s", LOWER, ONE_RANK, "side network's whole call", (GENERATION,), "s", decimals=3, under=SIDE
)
SIDE_SHARE_OF_CALL = Figure(
    "share_of_call", "fraction", None, ONE_RANK, "side network's share of the call", (GENERATION,), "%", 100.0, 0,
    under=SIDE,
)  # fmt: skip
SIDE_SHARE_OF_PER_TOKEN = Figure(
    "share_of_per_token", "fraction", None, ONE_RANK, "side network's share of per-token time", (GENERATION,),
    "%", 100.0, 0, under=SIDE,
)  # fmt: skip

# one training step profiled by the petlprof_bench fixture (petlprof.bench.profile.StepProfile's fields, by name):
# its static memory (every weight, the gradients of the trainable ones, AdamW's state), not checked against a
# baseline on their own (training_tensor_bytes sums them with the saved activations)
WEIGHTS = Figure("weight_bytes", "B", LOWER, ONE_RANK, "weights", (STEP,), "MiB", 1 / MIB, 3)
GRADIENTS = Figure("grad_bytes", "B", LOWER, ONE_RANK, "gradients", (STEP,), "MiB", 1 / MIB, 3)
OPTIMIZER_STATE = Figure("optimizer_state_bytes", "B", LOWER, ONE_RANK, "optimizer state", (STEP,), "MiB", 1 / MIB, 3)
TRAINABLE_PARAMS = Figure(
    "trainable_params", "count", LOWER, SAME, "trainable params", (STEP,), decimals=0, baseline=EXACT
)
SAVED_ACTIVATIONS = Figure(
    "saved_activation_bytes", "B", LOWER, ONE_RANK, "saved activations", (STEP,), "MiB", 1 / MIB, 3,
    baseline=EXACT,
)  # fmt: skip
TRAINING_TENSORS = Figure(
    "training_tensor_bytes", "B", LOWER, ONE_RANK, "training tensors", (STEP,), "MiB", 1 / MIB, 3,
    baseline=EXACT,
)  # fmt: skip
# a method's step time over a reference's, timed in alternation in one process (petlprof.bench.profile.paired_ratio)
STEP_TIME_RATIO = Figure(
    "step_time_ratio", "ratio", LOWER, ONE_RANK, "step time ratio", (STEP,), decimals=2, baseline=GROWTH
)

# The static memory breakdown of a method's model (petlprof.meters.memory.static_breakdown, a run record's
# memory_breakdown, the estimate's weights): bytes it holds whatever the batch.  Its optimiser state is the
# step figure's key; quantization_state_bytes is there only for a quantised backbone.
BREAKDOWN_FROZEN_WEIGHTS = "frozen_weights_bytes"
BREAKDOWN_TRAINABLE_WEIGHTS = "trainable_weights_bytes"
BREAKDOWN_BUFFERS = "buffers_bytes"
BREAKDOWN_GRADIENTS = "gradients_bytes"
BREAKDOWN_OPTIMIZER_STATE = OPTIMIZER_STATE.name
BREAKDOWN_QUANTIZATION_STATE = "quantization_state_bytes"
BREAKDOWN_TOTAL = "total_bytes"  # the sum of the others
STATIC_BREAKDOWN = (
    BREAKDOWN_FROZEN_WEIGHTS,
    BREAKDOWN_TRAINABLE_WEIGHTS,
    BREAKDOWN_BUFFERS,
    BREAKDOWN_GRADIENTS,
    BREAKDOWN_OPTIMIZER_STATE,
)  # every model's, in this order; then the quantisation state where there is one, then the total

# Declaration order is the order of the keys petlprof.run.distributed writes and of the DataFrame's phase
# columns (petlprof.report.frame), so a new figure goes where it should appear in both.
FIGURES: tuple[Figure, ...] = (
    TIME,
    SAMPLES,
    SAMPLES_PER_S,
    TOKENS,
    TOKENS_PER_S,
    ENERGY,
    ENERGY_COUNTER,
    ENERGY_INTEGRATED,
    PEAK_MEMORY,
    PEAK_RESERVED,
    ENERGY_WINDOW,
    STEPS,
    LATENCY,
    LATENCY_PER_SAMPLE,
    ENERGY_ABOVE_IDLE,
    IDLE_POWER,
    MEAN_POWER,
    CPU_TIME,
    CPU_CORES,
    WARMUP_ENERGY,
    CODECARBON_ENERGY_J,
    CODECARBON_CPU,
    CODECARBON_GPU,
    CODECARBON_RAM,
    CO2,
    GENERATED_TOKENS,
    RESPONSES,
    RESPONSES_PER_S,
    ENERGY_PER_TOKEN,
    ENERGY_PER_RESPONSE,
    TIME_TO_FIRST_TOKEN,
    TIME_TO_FIRST_TOKEN_PERCENTILES,
    PER_TOKEN_LATENCY,
    SIDE_CALL_TIME,
    SIDE_SHARE_OF_CALL,
    SIDE_SHARE_OF_PER_TOKEN,
    WEIGHTS,
    GRADIENTS,
    OPTIMIZER_STATE,
    TRAINABLE_PARAMS,
    SAVED_ACTIVATIONS,
    TRAINING_TENSORS,
    STEP_TIME_RATIO,
)
BY_NAME: dict[str, Figure] = {f.name: f for f in FIGURES}


def figure(name: str) -> Figure:
    """The declaration named ``name``; a KeyError naming the declared ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no figure named {name!r}; declared: {', '.join(BY_NAME)}") from None


def combined_by(rule: str) -> tuple[str, ...]:
    """The names of the figures the ranks combine by ``rule`` (one of :data:`RANK_RULES`), in declaration order."""
    return tuple(f.name for f in FIGURES if f.ranks == rule)


def checked_against_baseline(rule: str) -> tuple[Figure, ...]:
    """The figures the petlprof_bench fixture checks by ``rule`` (one of :data:`BASELINE_RULES`), in order."""
    if rule not in BASELINE_RULES:
        raise ValueError(f"baseline rule {rule!r} is not one of {', '.join(BASELINE_RULES)}")
    return tuple(f for f in FIGURES if f.baseline == rule)


def rates() -> tuple[Figure, ...]:
    """The figures worked out as a count over the phase's time (``RATE``)."""
    return tuple(f for f in FIGURES if f.per is not None)


def rate(count: float | None, time_s: float | None) -> float | None:
    """A count per second; None without a count or a positive time."""
    return count / time_s if count is not None and time_s else None


def provenance_keys() -> tuple[str, ...]:
    """The reading keys that say how the figures were obtained (``energy_kind``, ``memory_source``, ...)."""
    keys = (key for f in FIGURES for key in (f.kind, f.source) if key is not None)
    return tuple(dict.fromkeys(keys))


def frame_columns(phase: str) -> dict[str, Figure]:
    """The DataFrame API's columns for one measured phase: column name (``eval_`` prefixed for the
    evaluation) -> the figure it shows (its value at the figure's ``path`` under the phase)."""
    return {f.frame_column(phase): f for f in FIGURES if f.column is not None and phase in f.phases}


def directions() -> dict[str, str]:
    """Figure name -> ``higher``/``lower`` is better, for the metric-direction table."""
    return {f.name: f.better for f in FIGURES if f.better is not None}


# a tuned run's learning-rate search (--tune lr; the record's ``tuning``): what the search cost, and the run's train
# phase with it; columns of the report's runs table, costs (lower is better)
SEARCH_ENERGY, SEARCH_TIME = "search_energy_j", "search_time_s"
ENERGY_WITH_SEARCH, TIME_WITH_SEARCH = "energy_with_search_j", "time_with_search_s"
SEARCH_TRIALS = "search_trials"
SEARCH_COSTS = (SEARCH_ENERGY, SEARCH_TIME, ENERGY_WITH_SEARCH, TIME_WITH_SEARCH, SEARCH_TRIALS)
