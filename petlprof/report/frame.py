"""Result records as pandas tables: one row per run, one row per configuration, and the frontier.

:func:`runs_frame` flattens records into one row per run with the cost figures under the names of
the metric-direction table (``energy_j``, ``peak_memory_bytes``, ``time_s``, ``trainable_params``
for the train phase; ``eval_*`` for the eval phase), each quality metric under its own name, and the
generation phases' figures under their record paths (``generation.batch_1.tokens_per_s``), and what
the report needs to know of each run besides (``random_init``, ``majority_rate``, ``eval_samples``, and per
phase whether other processes kept the CPUs busy during it: ``contended``, ``eval_contended``, ...).  The report
builds this table once and every table and plot of results reads it.
:func:`summarise` merges a configuration's seeds into one row: the mean of every figure, the
half-width of its 95% confidence interval (Student's t, ``n - 1`` degrees of freedom) and its
standard error (NaN for one seed).  :func:`frontier` marks the configurations no other one
dominates on a quality metric and a cost, per task and backbone, from the seed means;
:func:`relative_to` adds the READ paper's columns against a reference method (``full``).  Missing
figures are NaN, never an error.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from petlprof.report.intervals import ci_half_width, standard_error
from petlprof.report.pareto import pareto_front
from petlprof.report.records import (
    config_key,
    config_label,
    is_random_init,
    is_zero_shot,
    text,
)
from petlprof.results.figures import (
    ENERGY,
    ENERGY_KIND,
    ENERGY_PER_RESPONSE,
    ENERGY_PER_TOKEN,
    ENERGY_SOURCE,
    ENERGY_WITH_SEARCH,
    LATENCY,
    LATENCY_PER_SAMPLE,
    MEASURED_PHASES,
    MEMORY_SOURCE,
    PEAK_MEMORY,
    PER_TOKEN_LATENCY,
    SEARCH_COSTS,
    SEARCH_ENERGY,
    SEARCH_TIME,
    SEARCH_TRIALS,
    SIDE_SHARE_OF_PER_TOKEN,
    TIME,
    TIME_TO_FIRST_TOKEN,
    TIME_WITH_SEARCH,
    TOKENS_PER_S,
    Figure,
    frame_columns,
)
from petlprof.results.grades import ABOVE_IDLE_GRADE_KEY, GRADE_KEY, worst
from petlprof.results.result import TARGET_FIGURES, JSONValue, RunResult, mapping, results_of
from petlprof.tasks.metrics import METRIC_DIRECTIONS, direction
from petlprof.vocabulary import ESTIMATED, LOCAL, ZERO_SHOT

Row = dict[str, JSONValue]  # one run's row of the runs table: a column name -> its cell
GROUP = ["task", "backbone"]  # a frontier is drawn within one task and backbone
CONFIG = GROUP + ["method", "config", "config_key"]  # what identifies a configuration across seeds
PHASE_FIGURES = {phase: frame_columns(phase) for phase in MEASURED_PHASES}  # column -> the figure it shows
PHASE_TEXT = (ENERGY_KIND, ENERGY_SOURCE, "energy_model", MEMORY_SOURCE)
COSTS = (ENERGY.name, PEAK_MEMORY.name, TIME.name, "trainable_params")
GENERATION_PHASES = ("generation", "generation_merged")  # the model as tuned, and merged (methods that merge)
GENERATION_FIGURES = (  # per batch size of a generation phase, columns named by the record's dotted path below it
    TOKENS_PER_S,
    ENERGY_PER_TOKEN,
    ENERGY_PER_RESPONSE,
    TIME_TO_FIRST_TOKEN,
    PER_TOKEN_LATENCY,
    PEAK_MEMORY,
    SIDE_SHARE_OF_PER_TOKEN,
)
# a window measured while other processes kept the machine's CPUs busy (its ``contended`` flag), per phase: its time,
# energy and latency may be inflated; a batched phase's column says whether any of its batch sizes' windows was
CONTENDED = {
    phase: "contended" if phase == "train" else f"{phase}_contended"
    for phase in ("train", "eval", "eval_merged", "inference", *GENERATION_PHASES)
}
# what serving a request costs once tuned (serving_figures): energy per request at batch 1 and at the largest batch
# measured, as tuned and merged; the batch; the requests' kind and mean prompt and response lengths (tokens)
REQUEST_B1, REQUEST_BATCH = "request_j_b1", "request_j_batch"
REQUEST_B1_MERGED, REQUEST_BATCH_MERGED = "request_j_b1_merged", "request_j_batch_merged"
SERVING_BATCH, REQUEST_KIND, REQUEST_ENERGY_KIND = "serving_batch", "request_kind", "request_energy_kind"
REQUEST_PROMPT_TOKENS, REQUEST_RESPONSE_TOKENS = "request_prompt_tokens", "request_response_tokens"
REQUEST_ENERGY = (REQUEST_B1, REQUEST_BATCH, REQUEST_B1_MERGED, REQUEST_BATCH_MERGED)
SERVING = (
    *REQUEST_ENERGY,
    SERVING_BATCH,
    REQUEST_KIND,
    REQUEST_ENERGY_KIND,
    REQUEST_PROMPT_TOKENS,
    REQUEST_RESPONSE_TOKENS,
)
# what a run is, not a figure to average over seeds
RUN_FACTS = ("random_init", "constant_output", "majority_rate", "eval_samples", *CONTENDED.values())
GENERATION_COLUMN = re.compile(r"^(generation(?:_merged)?)\.batch_(\d+)\.(.+)$")


def objective_direction(name: str) -> str:
    """``higher``/``lower`` for a column: the direction table's entry, or that of the figure an
    ``eval_``-prefixed column names (``eval_energy_j`` is energy)."""
    return direction(name if name in METRIC_DIRECTIONS else name.removeprefix("eval_"))


def _typed(value: Any, kind: type) -> Any:
    """``value`` when it is a ``kind``, else None (a hand-edited record's odd value is no figure)."""
    return value if isinstance(value, kind) else None


def _row(record: RunResult) -> Row:
    budget = record.budget
    row: Row = {
        "run_key": record.run_key,
        "status": record.status,
        "error": record.error,
        "task": record.task,
        "backbone": record.backbone,
        "method": record.method,
        "config": config_label(record, width=1000),
        "config_key": config_key(record),
        "seed": record.seed,
        "pareto_knob": record.pareto_knob,
        "knob_value": record.knob_value,
        "primary_metric": record.primary_metric,
        "random_init": is_random_init(record),  # on random weights (--random-init): its score is meaningless
        "constant_output": record.constant_output,  # one text for every prompt: its score is not the method's
        "majority_rate": record.task_info.majority_rate,
        "eval_samples": record.task_info.eval_samples,  # what a share-of-samples metric was scored on
        "trainable_params": record.trainable_params,
        "total_params": record.total_params,
        "checkpoint_bytes": record.checkpoint_bytes,
        "power_limit_w": record.power_limit_w,  # --power-limit, None at the GPU's own
        "config_at_any_limit": config_label(record, width=1000, power_limit=False),  # one line across the limits
        "stop_reason": None if budget is None else budget.stop_reason,
        "target_reached": None if budget is None else budget.reached,
        "steps_to_target": None if budget is None else budget.reached_at_step,
        **{name: None if budget is None else budget.costs[name] for name in TARGET_FIGURES},
        "target_metric": None if budget is None else budget.target_metric,
        "target_value": None if budget is None else budget.target_value,
        "diverged_at_step": record.diverged_at_step,
        **_search_figures(record),
        "warnings": "; ".join(record.warnings) if record.warnings is not None else None,
    }
    batch = _typed(mapping(record.spec).get("batch_size"), int)
    inference, merged = record.windows("inference"), record.eval_merged
    row.update(
        {  # inference phase (batch 1 and the training batch) and the merged model's evaluation
            "infer_b1_latency_p50_s": inference["batch_1"][LATENCY] if "batch_1" in inference else None,
            "infer_latency_per_sample_p50_s": (
                inference[f"batch_{batch}"][LATENCY_PER_SAMPLE] if f"batch_{batch}" in inference else None
            ),
            "merged_latency_p50_s": None if merged is None else merged[LATENCY],
        }
    )
    row.update(
        {  # where it ran: its meters read this host's devices (petlprof.execution.executors)
            "executor": record.where.executor or LOCAL,
            "hostname": record.where.hostname,
            "world_size": record.where.world_size or 1,
        }
    )
    row.update(_generation_figures(record))
    row.update(serving_figures(record))
    for window_of, column in CONTENDED.items():  # None where no window recorded the flag (no contention meter)
        one = record.phase(window_of) if window_of in ("train", "eval", "eval_merged") else None
        windows = [one] if one is not None else list(record.windows(window_of).values())
        flags = [w.raw("contended") for w in windows if w.raw("contended") is not None]
        row[column] = any(f is True for f in flags) if flags else None
    for name, value in record.metrics.items():
        row[name] = value
    if (primary := record.primary_metric) is not None and primary in record.metrics:
        row["quality"] = record.metrics[primary]
    for phase_name, columns in PHASE_FIGURES.items():
        phase = record.phase(phase_name)
        for column, figure in columns.items():
            row[column] = None if phase is None else phase[figure]
        prefix = "" if phase_name == "train" else f"{phase_name}_"
        for column in PHASE_TEXT:
            row[prefix + column] = None if phase is None else phase.raw(column)
        grade = None if phase is None or (phase_name == "train" and is_zero_shot(record)) else phase.energy_grade
        row[prefix + GRADE_KEY] = None if grade is None else grade.letter  # the zero-shot row trained: exactly 0 J
        above = None if grade is None or phase is None else phase.above_idle_grade
        row[prefix + ABOVE_IDLE_GRADE_KEY] = None if above is None else above.letter
    return row


def _search_figures(record: RunResult) -> Row:
    """A tuned run's search (``--tune lr``): its energy and time, and the run's train phase plus its search."""
    tuning, train = record.tuning, record.train
    search_j = None if tuning is None else tuning.energy_j
    search_s = None if tuning is None else tuning.time_s
    train_j = None if train is None else train[ENERGY]
    train_s = None if train is None else train[TIME]
    return {
        SEARCH_ENERGY: search_j,
        SEARCH_TIME: search_s,
        ENERGY_WITH_SEARCH: None if search_j is None or train_j is None else train_j + search_j,
        TIME_WITH_SEARCH: None if search_s is None or train_s is None else train_s + search_s,
        SEARCH_TRIALS: None if tuning is None else tuning.trials,
    }


def _generation_figures(record: RunResult) -> Row:
    """``generation.batch_<n>.<figure>`` (and ``generation_merged...``) for every batch size a generation
    phase recorded, named by the record's own path; ``generation_energy_kind`` from its first batch."""
    row: Row = {}
    for phase in GENERATION_PHASES:
        for key, window in record.windows(phase).items():
            for figure in GENERATION_FIGURES:
                row[generation_column(phase, key, figure)] = window[figure]
            grade = window.energy_grade
            row[generation_grade_column(phase, key)] = None if grade is None else grade.letter
            if phase == "generation" and "generation_energy_kind" not in row:
                row["generation_energy_kind"] = window.raw(ENERGY_KIND)
    return row


def _per_request(window: Any, phase: str) -> float | None:
    """A window's energy per request: per generated response, or per classified sample (inference)."""
    if window is None:
        return None
    value = window[ENERGY_PER_RESPONSE] if phase.startswith("generation") else window.raw("energy_per_sample_j")
    return _typed(value, float)


def _batch_sizes(windows: Mapping[str, Any]) -> list[int]:
    return sorted(int(key.removeprefix("batch_")) for key in windows if key.removeprefix("batch_").isdigit())


def serving_figures(record: RunResult) -> Row:
    """What one request costs to serve once tuned (columns :data:`SERVING`): the energy per generated response (LM
    objective) or per classified sample (inference phase), at batch 1 and at the largest batch measured, as tuned
    and merged where the method merges (generation only: a classifier's inference phase measures the model as tuned,
    and its merged evaluation, which also scores, is no like-for-like figure); the requests' mean prompt and
    response tokens where generated."""
    generating = bool(record.windows("generation"))
    phase = "generation" if generating else "inference"
    windows = record.windows(phase)
    merged = record.windows("generation_merged") if generating else {}
    sizes = _batch_sizes(windows)
    batch = max((s for s in sizes if s > 1), default=None)
    row: Row = {name: None for name in SERVING}
    row[SERVING_BATCH] = batch
    row[REQUEST_KIND] = None if not sizes else ("response" if generating else "sample")
    row[REQUEST_B1] = _per_request(windows.get("batch_1"), phase)
    row[REQUEST_ENERGY_KIND] = next((w.raw(ENERGY_KIND) for w in windows.values() if w.raw(ENERGY_KIND)), None)
    row[REQUEST_BATCH] = None if batch is None else _per_request(windows.get(f"batch_{batch}"), phase)
    row[REQUEST_B1_MERGED] = _per_request(merged.get("batch_1"), phase)
    row[REQUEST_BATCH_MERGED] = None if batch is None else _per_request(merged.get(f"batch_{batch}"), phase)
    first = windows.get("batch_1") if generating else None
    responses = None if first is None else _typed(first.raw("responses"), int)
    if first is not None and responses:
        prompt, response = _typed(first.raw("prompt_tokens"), int), _typed(first.raw("response_tokens"), int)
        row[REQUEST_PROMPT_TOKENS] = None if prompt is None else prompt / responses
        row[REQUEST_RESPONSE_TOKENS] = None if response is None else response / responses
    return row


def generation_column(phase: str, batch: str, figure: Figure) -> str:
    """The column of one generation figure at one batch size (``batch``: ``batch_<n>``), as
    ``generation.batch_1.per_token_latency_s.p50``."""
    return ".".join((phase, batch, *figure.path))


def generation_grade_column(phase: str, batch: str) -> str:
    """The column of one generation window's energy grade, as ``generation.batch_1.energy_grade``."""
    return ".".join((phase, batch, GRADE_KEY))


def generation_batches(frame: pd.DataFrame, phase: str = "generation") -> list[int]:
    """The batch sizes some row of ``frame`` has generation figures for, ascending."""
    sizes = {int(m[2]) for c in frame.columns if (m := GENERATION_COLUMN.match(c)) and m[1] == phase}
    return sorted(s for s in sizes if frame[generation_column(phase, f"batch_{s}", TOKENS_PER_S)].notna().any())


def runs_frame(records: Sequence[RunResult | Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run (every status), columns as the module docstring says; ``records`` are
    :class:`~petlprof.results.result.RunResult` objects (or stored JSON objects, read as such)."""
    results = results_of(records)
    frame = pd.DataFrame([_row(r) for r in results])
    if frame.empty:
        frame = pd.DataFrame(columns=list(_row(RunResult.from_json({}))))
    for name in ("quality", *COSTS):
        if name not in frame:
            frame[name] = math.nan
    metrics = {name for r in results for name in r.metrics}
    numeric = {
        "quality",
        "trainable_params",
        "total_params",
        "checkpoint_bytes",
        "majority_rate",
        "steps_to_target",
        *TARGET_FIGURES,
        "target_value",
        "diverged_at_step",
        *SEARCH_COSTS,
        *REQUEST_ENERGY,
        REQUEST_PROMPT_TOKENS,
        REQUEST_RESPONSE_TOKENS,
        *metrics,
        *(column for columns in PHASE_FIGURES.values() for column in columns),
        *(column for column in frame.columns if GENERATION_COLUMN.match(column) and not column.endswith(GRADE_KEY)),
    }
    for name in numeric & set(frame.columns):  # all-missing figures stay numeric (NaN), not objects
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype(float)
    return frame


def of_task(runs: pd.DataFrame, task: Any, backbone: Any) -> pd.DataFrame:
    """The rows of one task and backbone, told apart as the tables show them (:func:`text`)."""
    return runs[(runs["task"].map(text) == text(task)) & (runs["backbone"].map(text) == text(backbone))]


def majority_rate(runs: pd.DataFrame) -> float | None:
    """The share of the eval set's most common class (the records' ``task_info.majority_rate``: the accuracy
    of always answering that class) when the runs that record one agree on it; None when none does or they
    differ."""
    rates = runs["majority_rate"].dropna().unique()
    return float(rates[0]) if len(rates) == 1 else None


def _numeric_columns(frame: pd.DataFrame) -> list[str]:
    skip = set(CONFIG) | {"seed", "knob_value", "target_reached", "target_value", "diverged_at_step", *RUN_FACTS}
    return [c for c in frame.columns if c not in skip and pd.api.types.is_numeric_dtype(frame[c])]


def summarise(runs: pd.DataFrame, ok_only: bool = True) -> pd.DataFrame:
    """One row per configuration: ``n_seeds``, ``seeds``, each figure's mean under its own name and
    its 95% CI half-width as ``<name>_ci95``; ``energy_kind`` is ``estimated`` when any seed's is, a phase's
    ``contended`` flag True when any seed's window was, ``eval_samples`` the seeds' common count."""
    if "n_seeds" in runs.columns:
        return runs  # already one row per configuration
    key = _fingerprint(runs, ok_only)
    if key is not None and key in _SUMMARIES:
        return _SUMMARIES[key].copy()
    configs = _summarise(runs, ok_only)
    if key is not None:
        _SUMMARIES[key] = configs.copy()
        while len(_SUMMARIES) > SUMMARIES_KEPT:
            _SUMMARIES.pop(next(iter(_SUMMARIES)))
    return configs


SUMMARIES_KEPT = 16  # a report summarises the same runs (and a few subsets) a dozen times: 0.8 s each at 500 runs
_SUMMARIES: dict[tuple, pd.DataFrame] = {}


def _fingerprint(runs: pd.DataFrame, ok_only: bool) -> tuple | None:
    """A key for ``runs``' contents (columns, index and every cell); None when a cell cannot be hashed."""
    try:
        cells = pd.util.hash_pandas_object(runs.astype(str), index=True).to_numpy()
    except (TypeError, ValueError):
        return None
    digest = hashlib.blake2b(cells.tobytes(), digest_size=16).hexdigest()
    return (ok_only, tuple(map(str, runs.columns)), tuple(map(str, runs.dtypes)), digest)


def _summarise(runs: pd.DataFrame, ok_only: bool) -> pd.DataFrame:
    frame = runs[runs["status"] == "ok"] if ok_only else runs
    if frame.empty:
        return pd.DataFrame(columns=[*CONFIG, "n_seeds", "quality", *COSTS])
    numeric = _numeric_columns(frame)
    rows = []
    for keys, group in frame.groupby(CONFIG, sort=False, dropna=False):
        row = dict(zip(CONFIG, keys))
        reached = group["target_reached"].dropna()
        row.update(
            n_seeds=len(group),
            seeds=sorted(int(s) for s in group["seed"].dropna()),
            target_reached=f"{int(reached.sum())}/{len(reached)}" if len(reached) else None,
            pareto_knob=group["pareto_knob"].iloc[0],
            config_at_any_limit=group["config_at_any_limit"].iloc[0] if "config_at_any_limit" in group else None,
            knob_value=group["knob_value"].iloc[0],
            primary_metric=group["primary_metric"].iloc[0],
            target_metric=group["target_metric"].iloc[0],
            target_value=group["target_value"].iloc[0],
            constant_output=int(group["constant_output"].astype(bool).sum()) if "constant_output" in group else 0,
            random_init=bool(group["random_init"].fillna(False).astype(bool).any())
            if "random_init" in group
            else False,
            eval_samples=_agreed(group["eval_samples"]) if "eval_samples" in group else None,
        )
        for column in CONTENDED.values():  # any seed's window contended
            row[column] = bool(group[column].map(lambda v: v is True).any()) if column in group else False
        # one conversion per configuration, not one per figure
        block = group[numeric].to_numpy(dtype=float, na_value=np.nan)
        for column, values in zip(numeric, block.T):
            values = values[~np.isnan(values)]
            row[column] = float(values.sum() / len(values)) if len(values) else math.nan  # as pandas' mean
            row[f"{column}_ci95"] = ci_half_width(values.tolist())
            row[f"{column}_se"] = standard_error(values.tolist())
        graded = [c for c in group.columns if c.endswith((GRADE_KEY, ABOVE_IDLE_GRADE_KEY))]
        for column in graded:  # a configuration is as trustworthy as its worst seed
            row[column] = worst(group[column])
        for column in ("energy_kind", "eval_energy_kind", "generation_energy_kind", REQUEST_ENERGY_KIND):
            kinds = set(group[column].dropna()) if column in group else set()
            row[column] = ESTIMATED if ESTIMATED in kinds else (kinds.pop() if len(kinds) == 1 else None)
        for column in (ENERGY_SOURCE, "energy_model", MEMORY_SOURCE):
            if column in group:
                row[column] = ", ".join(sorted({str(v) for v in group[column].dropna()})) or None
        rows.append(row)
    return pd.DataFrame(rows)


def _agreed(values: pd.Series) -> int | None:
    """The one number of evaluation samples a configuration's seeds agree on, None when they differ or none says."""
    numbers = {int(v) for v in pd.to_numeric(values, errors="coerce").dropna()}
    return numbers.pop() if len(numbers) == 1 else None


def frontier(frame: pd.DataFrame, x: str = ENERGY.name, y: str = "quality", by: Sequence[str] = GROUP) -> pd.DataFrame:
    """Per-configuration rows (seeds merged by :func:`summarise`) with an ``on_front`` column: True where
    no configuration of the same ``by`` group is at least as good on both ``x`` and ``y`` (seed means)
    and strictly better on one.  Equal configurations are both on the front; a configuration missing
    either figure is never on it, nor is the zero-shot row (the model before tuning: a reference, not a
    choice of tuning; the report draws it as a line), nor a configuration with a seed whose generated responses
    were all one text (``constant_output``: the model ignored its prompts, so its score is no result).
    ``y="quality"`` means each run's primary metric."""
    objective_direction(x)  # a KeyError naming the known ones, before any work
    configs = summarise(frame).copy()
    for name in (x, y):
        if name not in configs.columns:
            raise KeyError(f"no column '{name}' in the results; figures: {sorted(_numeric_columns(frame))}")
    configs["on_front"] = False
    if configs.empty:
        return configs
    names = [_objective_name(configs, y), x]
    for _, group in configs.groupby(list(by), sort=False, dropna=False):
        points = [
            {
                names[0]: None if row.get("constant_output") else _nan_none(row[y]),
                names[1]: None if row["method"] == ZERO_SHOT else _nan_none(row[x]),
            }
            for _, row in group.iterrows()
        ]
        front = _front(points, names)
        configs.loc[group.index[front], "on_front"] = True
    return configs


def _objective_name(configs: pd.DataFrame, column: str) -> str:
    """The direction-table name of a quality column: ``quality`` stands for the primary metric."""
    if column != "quality":
        return column
    metrics = list(configs["primary_metric"].dropna().unique())
    if not metrics:
        return "accuracy"
    directions = {direction(m) for m in metrics}
    if len(directions) > 1:
        raise ValueError(f"'quality' mixes metrics with different directions: {metrics}; pick one metric")
    return metrics[0]


def _front(points: list[dict[str, float | None]], names: list[str]) -> list[int]:
    """Indices on the front; ``eval_`` columns take the direction of the figure they name."""
    keys = [n if n in METRIC_DIRECTIONS else n.removeprefix("eval_") for n in names]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a frontier needs two different figures, got {names}")
    return pareto_front([{key: _none_nan(point[name]) for key, name in zip(keys, names)} for point in points], keys)


def _none_nan(value: float | None) -> float:
    """A missing figure as NaN, which is on no front and removes no point (:mod:`petlprof.report.pareto`)."""
    return math.nan if value is None else value


def _nan_none(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def relative_to(configs: pd.DataFrame, reference: str = "full", costs: Sequence[str] = COSTS) -> pd.DataFrame:
    """Add ``<cost>_vs_<reference>_pct`` (percent change of the mean, e.g. -72.0) and
    ``quality_vs_<reference>`` (difference of the primary metric) against the reference method's
    configuration in the same task and backbone (its first configuration when it has several); NaN
    where there is no reference (and on the zero-shot row, which trained nothing)."""
    configs = configs.copy()
    columns = [f"{c}_vs_{reference}_pct" for c in costs] + [f"quality_vs_{reference}"]
    for column in columns:
        configs[column] = math.nan
    for _, group in configs.groupby(GROUP, sort=False, dropna=False):
        refs = group[group["method"] == reference]
        if refs.empty:
            continue
        ref = refs.iloc[0]
        index = group.index[group["method"] != ZERO_SHOT]
        for cost in costs:
            if ref[cost] and not math.isnan(ref[cost]):
                configs.loc[index, f"{cost}_vs_{reference}_pct"] = (group.loc[index, cost] / ref[cost] - 1.0) * 100.0
        configs.loc[index, f"quality_vs_{reference}"] = group.loc[index, "quality"] - ref["quality"]
    return configs


def knob_sort_value(value: Any) -> tuple:
    """Order a method's grid points by their knob value (numbers by value, others as text)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(float(value)):
        return (0, float(value), "")
    return (1, 0.0, json.dumps(value, default=str))


__all__ = [
    "frontier",
    "generation_batches",
    "knob_sort_value",
    "objective_direction",
    "relative_to",
    "runs_frame",
    "summarise",
]
