"""A stored record read back, typed: :class:`RunResult` and the parts every reader of results uses.

The store holds JSON objects of schema version 1 (:class:`petlprof.results.records.RunRecord` names their
fields for the code that writes them).  A reader — the report, the DataFrame API, ``petlprof run``'s summary —
turns each one into a :class:`RunResult` with :meth:`RunResult.from_json` and reads attributes: ``result.status``,
``result.task_info.majority_rate``, ``result.train[ENERGY]`` (a phase is keyed by its declared
:class:`~petlprof.results.figures.Figure`), ``result.budget.reached``.  ``to_json`` gives back the object as
it was read, so nothing on disk changes.

A record may be incomplete (a failed run has no phases), older (a field added since is absent) or edited by
hand (a number where text belongs): every attribute is then ``None`` (or empty), never an error, and a figure
is a finite number or ``None`` — the report shows ``-`` for it.  ``dict[str, Any]`` stays at this boundary:
``from_json`` is where the JSON object ends.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from petlprof.results.figures import ENERGY, ENERGY_KIND, FIGURES, TIME, WARMUP_ENERGY, Figure
from petlprof.results.grades import Grade, above_idle_grade, grade_of
from petlprof.results.records import OK, warmup_energy_j, warmup_time_s
from petlprof.vocabulary import LR

# a value as JSON holds it (a record's field, a method config's value, a cell of the runs table)
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
BATCH_KEY = re.compile(r"batch_(\d+)")
# the phases measured at each of several batch sizes (batch_<size>: one window each)
BATCHED_PHASES = ("inference", "generation", "generation_merged")
TARGET_FIGURES = (  # the budget's cost-to-target figures (None when not reached; the last three are newer)
    "time_to_target_s",
    "energy_to_target_j",
    "check_time_s",
    "check_energy_j",
    "time_to_target_without_checks_s",
    "energy_to_target_without_checks_j",
)


def finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past float's range (10**400)
        return None
    return number if math.isfinite(number) else None


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (a failed run's missing or null part)."""
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _strings(value: object) -> tuple[str, ...] | None:
    """A list's items as text (None when ``value`` is not a list)."""
    return tuple(str(v) for v in value) if isinstance(value, list) else None


def _at(data: Mapping[str, Any], keys: Iterable[str]) -> Any:
    """``data[k1][k2]...``, or None where a level is missing, null or not a mapping."""
    value: Any = data
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


@dataclass(frozen=True)
class PhaseResult:
    """One measured window of a run (the train or eval phase, the merged evaluation, one batch size of the
    inference or generation phase): its figures keyed by their declarations, how they were obtained, and
    what went wrong in it."""

    data: Mapping[str, Any]

    @classmethod
    def from_json(cls, value: object) -> PhaseResult | None:
        return cls(value) if isinstance(value, Mapping) else None

    def to_json(self) -> Mapping[str, Any]:
        return self.data

    def __getitem__(self, figure: Figure) -> float | None:
        """The figure's value as shown (its declared path: a percentile's ``p50``, the side network's share),
        a finite number or None."""
        return finite(_at(self.data, figure.path))

    @property
    def figures(self) -> dict[Figure, float]:
        """Every declared figure the window holds a number for."""
        return {f: value for f in FIGURES if (value := self[f]) is not None}

    def text(self, key: str) -> str | None:
        """A provenance entry (``energy_kind``, ``energy_source``, ``memory_source``, ``energy_model``,
        ``latency_source``) as text, None when absent."""
        value = self.data.get(key)
        return None if value is None else str(value)

    def raw(self, key: str) -> Any:
        """The entry ``key`` as stored (a value no declaration covers, e.g. a window's ``max_prompts``)."""
        return self.data.get(key)

    @property
    def energy_grade(self) -> Grade | None:
        """How far to trust the window's energy figure (:mod:`petlprof.results.grades`): as recorded, or graded
        now from its keys for a record from before grades; None without an energy figure."""
        return grade_of(self.data)

    @property
    def above_idle_grade(self) -> Grade | None:
        """The grade of the window's energy above idle (its energy grade, capped by the idle baseline's checks)."""
        return above_idle_grade(self.data, self.energy_grade)

    @property
    def warnings(self) -> tuple[str, ...]:
        return _strings(self.data.get("warnings")) or ()

    @property
    def error(self) -> str | None:
        """A merge that failed (the merged evaluation's error; the unmerged results stand)."""
        value = self.data.get("error")
        return str(value) if value else None


@dataclass(frozen=True)
class Check:
    """One validation check: the optimiser step after which the slice was scored, its score, and the training
    time and energy spent by then (the checks left out; None in a record written before learning curves)."""

    step: int
    value: float
    train_time_s: float | None = None
    train_energy_j: float | None = None


@dataclass(frozen=True)
class BudgetResult:
    """The train phase's ``budget``: the target, why training stopped and what reaching it cost."""

    target_metric: str | None
    target_value: float | None
    stop_reason: str | None
    reached: bool | None
    reached_at_step: float | None
    check_eval_size: int | None
    eval_every_steps: int | None
    costs: Mapping[str, float | None]  # TARGET_FIGURES by name
    checks: tuple[Check, ...]

    @classmethod
    def from_json(cls, value: object) -> BudgetResult | None:
        if not isinstance(value, Mapping):
            return None
        checks = value.get("checks")
        return cls(
            target_metric=_text(value.get("target_metric")),
            target_value=finite(value.get("target_value")),
            stop_reason=None if value.get("stop_reason") is None else str(value.get("stop_reason")),
            reached=value.get("reached") if isinstance(value.get("reached"), bool) else None,
            reached_at_step=finite(value.get("reached_at_step")),
            check_eval_size=_int(value.get("check_eval_size")),
            eval_every_steps=_int(value.get("eval_every_steps")),
            costs={name: finite(value.get(name)) for name in TARGET_FIGURES},
            checks=_checks(checks),
        )


def _checks(value: object) -> tuple[Check, ...]:
    """The validation checks a record lists, each a step and a finite score; an entry that is not one is left out."""
    entries = [mapping(c) for c in (value if isinstance(value, list) else [])]
    checks = [
        Check(step, score, finite(c.get("train_time_s")), finite(c.get("train_energy_j")))
        for c in entries
        if (step := _int(c.get("step"))) is not None and (score := finite(c.get("value"))) is not None
    ]
    return tuple(checks)


@dataclass(frozen=True)
class TuningResult:
    """What a tuned run's search cost and chose (``tuning``, written by ``petlprof run --tune lr`` or ``--tune
    METHOD.KNOB``): the trials (pilot runs, in the output folder's trials.jsonl), their train phases' energy and time,
    the points searched, the chosen point and the validation score that chose it.  A learning-rate search's record
    gives its space and choice as numbers; one with a knob, each point as ``{target: value}``: both read here as
    points (``targets`` in order, each point's values in that order)."""

    targets: tuple[str, ...]
    chosen: tuple[float, ...] | None
    space: tuple[tuple[float, ...], ...]
    trials: int | None
    failed_trials: int | None
    energy_j: float | None  # the trials' train phases, their validation checks included; None: a trial unmeasured
    warmup_energy_j: float | None  # of energy_j, the trials' warm-up steps (None: a search that did not meter them)
    energy_kind: str | None
    time_s: float | None
    wall_time_s: float | None
    metric: str | None
    validation_score: float | None
    strategy: str | None

    @classmethod
    def from_json(cls, value: object) -> TuningResult | None:
        if not isinstance(value, Mapping):
            return None
        target = value.get("target")
        targets = tuple(str(t) for t in target) if isinstance(target, list) else (str(target or LR),)
        space = value.get("space")
        points = [_point(p, targets) for p in (space if isinstance(space, list) else [])]
        return cls(
            targets=targets,
            chosen=_point(value.get("chosen"), targets),
            space=tuple(p for p in points if p is not None),
            trials=_int(value.get("trials")),
            failed_trials=_int(value.get("failed_trials")),
            energy_j=finite(value.get(ENERGY.name)),
            warmup_energy_j=finite(value.get(WARMUP_ENERGY.name)),
            energy_kind=_text(value.get(ENERGY_KIND)),
            time_s=finite(value.get(TIME.name)),
            wall_time_s=finite(value.get("wall_time_s")),
            metric=_text(value.get("metric")),
            validation_score=finite(value.get("validation_score")),
            strategy=_text(value.get("strategy")),
        )

    def text(self, point: tuple[float, ...]) -> str:
        """A point as the report shows it: the learning rate alone as a number, else ``lr 0.002, lora.r 8``."""
        if self.targets == (LR,):
            return f"{point[0]:g}"
        return ", ".join(f"{target} {value:g}" for target, value in zip(self.targets, point))


def _point(value: object, targets: tuple[str, ...]) -> tuple[float, ...] | None:
    """A point of a search's record: a number (a learning-rate search) or ``{target: value}``; None if unreadable."""
    values = [value] if not isinstance(value, Mapping) else [value.get(t) for t in targets]
    numbers = [finite(v) for v in values]
    if len(numbers) != len(targets) or any(n is None for n in numbers):
        return None
    return tuple(float(n) for n in numbers if n is not None)


@dataclass(frozen=True)
class BackboneInfo:
    """What the record says of its backbone (``backbone_info``)."""

    family: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    random_init: bool = False  # random weights (--random-init, the tiny presets): the score is meaningless

    @classmethod
    def from_json(cls, value: object) -> BackboneInfo:
        info = mapping(value)
        family = info.get("family")
        return cls(
            family=str(family) if family else None,
            num_layers=_int(info.get("num_layers")),
            hidden_size=_int(info.get("hidden_size")),
            random_init=info.get("random_init") is True,
        )


@dataclass(frozen=True)
class TaskInfo:
    """What the record says of its task (``task_info``)."""

    num_labels: int | None = None
    label_names: tuple[str, ...] | None = None
    train_samples: int | None = None
    eval_samples: int | None = None
    description: str | None = None
    majority_rate: float | None = None  # the evaluation split's most common class's share

    @classmethod
    def from_json(cls, value: object) -> TaskInfo:
        info = mapping(value)
        description = info.get("description")
        return cls(
            num_labels=_int(info.get("num_labels")),
            label_names=_strings(info.get("label_names")),
            train_samples=_int(info.get("train_samples")),
            eval_samples=_int(info.get("eval_samples")),
            description=str(description) if description else None,
            majority_rate=finite(info.get("majority_rate")),
        )


@dataclass(frozen=True)
class Where:
    """Where the run executed: the executor, the host, and how many ranks it had."""

    executor: str | None = None
    hostname: str | None = None
    world_size: int | None = None

    @classmethod
    def from_json(cls, node: object, env: object, distributed: object) -> Where:
        host = mapping(node).get("hostname") or mapping(env).get("hostname")
        return cls(
            executor=_text(mapping(node).get("executor")) or None,
            hostname=str(host) if host else None,
            world_size=_int(mapping(distributed).get("world_size")),
        )


@dataclass(frozen=True)
class RunResult:
    """One run's record, read back (see the module docstring)."""

    data: Mapping[str, Any]  # the JSON object as stored
    run_key: str | None = None
    status: str | None = None
    error: str | None = None
    method: str | None = None
    backbone: str | None = None
    task: str | None = None
    seed: int | None = None
    primary_metric: str | None = None
    pareto_knob: str | None = None
    method_config: Mapping[str, Any] = field(default_factory=dict)
    method_config_changed: tuple[str, ...] | None = None  # None: an older record, which did not say
    spec: Mapping[str, Any] | None = None
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    warnings: tuple[str, ...] | None = None  # about the result itself (None: the record has no list)
    constant_output: bool = False  # every generated evaluation response the same text: a non-result
    trainable_params: float | None = None
    total_params: float | None = None
    checkpoint_bytes: float | None = None
    backbone_info: BackboneInfo = BackboneInfo()
    task_info: TaskInfo = TaskInfo()
    training: Mapping[str, Any] = field(default_factory=dict)  # the settings, shown as key=value
    train: PhaseResult | None = None
    eval: PhaseResult | None = None
    eval_merged: PhaseResult | None = None
    batched: Mapping[str, Mapping[str, PhaseResult]] = field(default_factory=dict)  # BATCHED_PHASES' windows
    budget: BudgetResult | None = None
    tuning: TuningResult | None = None  # the learning-rate search that chose this run's lr (--tune lr)
    diverged_at_step: float | None = None
    where: Where = Where()
    env: Mapping[str, Any] | None = None
    overhead_s: float | None = None
    process_wall_time_s: float | None = None
    warmup_time_s: float | None = None  # of overhead_s, the phases' warm-up steps (None: a record without them timed)
    warmup_energy_j: float | None = None  # their energy, metered apart (None: not metered, or no energy meter)
    predicted: Mapping[str, Any] = field(default_factory=dict)  # what the sweep predicted of it before it ran

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunResult:
        """The typed view of one stored record (a JSON object of schema 1)."""
        metrics = mapping(data.get("metrics"))
        train = PhaseResult.from_json(data.get("train"))
        env = data.get("env")
        return cls(
            data=data,
            run_key=_text(data.get("run_key")),
            status=_text(data.get("status")),
            error=None if data.get("error") is None else str(data.get("error")),
            method=_text(data.get("method")),
            backbone=_text(data.get("backbone")),
            task=_text(data.get("task")),
            seed=_int(data.get("seed")),
            primary_metric=_text(data.get("primary_metric")),
            pareto_knob=_text(data.get("pareto_knob")),
            method_config=mapping(data.get("method_config")),
            method_config_changed=_strings(data.get("method_config_changed")),
            spec=data["spec"] if isinstance(data.get("spec"), Mapping) else None,
            metrics={str(name): finite(value) for name, value in metrics.items()},
            warnings=_strings(data.get("warnings")),
            constant_output=data.get("constant_output") is True,
            trainable_params=finite(data.get("trainable_params")),
            total_params=finite(data.get("total_params")),
            checkpoint_bytes=finite(data.get("checkpoint_bytes")),
            backbone_info=BackboneInfo.from_json(data.get("backbone_info")),
            task_info=TaskInfo.from_json(data.get("task_info")),
            training=mapping(data.get("training")),
            train=train,
            eval=PhaseResult.from_json(data.get("eval")),
            eval_merged=PhaseResult.from_json(data.get("eval_merged")),
            batched={phase: _windows(data.get(phase)) for phase in BATCHED_PHASES},
            budget=BudgetResult.from_json(train.raw("budget")) if train is not None else None,
            predicted=mapping(data.get("predicted")),
            tuning=TuningResult.from_json(data.get("tuning")),
            diverged_at_step=finite(mapping(data.get("diverged_at")).get("step")),
            where=Where.from_json(data.get("node"), env, data.get("distributed")),
            env=env if isinstance(env, Mapping) else None,
            overhead_s=finite(data.get("overhead_s")),
            process_wall_time_s=finite(data.get("process_wall_time_s")),
            warmup_time_s=finite(warmup_time_s(data)),
            warmup_energy_j=finite(warmup_energy_j(data)),
        )

    @classmethod
    def of(cls, record: RunResult | Mapping[str, Any]) -> RunResult:
        """``record`` itself when it is read already, else its typed view."""
        return record if isinstance(record, RunResult) else cls.from_json(record)

    def to_json(self) -> Mapping[str, Any]:
        """The record as stored (schema 1, unchanged)."""
        return self.data

    @property
    def ok(self) -> bool:
        """A run that finished (status ``ok``): the only status with scores."""
        return self.status == OK

    def phase(self, name: str) -> PhaseResult | None:
        """A measured phase by its record key: ``train``, ``eval`` or ``eval_merged``."""
        return {"train": self.train, "eval": self.eval, "eval_merged": self.eval_merged}[name]

    def windows(self, phase: str) -> Mapping[str, PhaseResult]:
        """The ``batch_<size>`` windows of a batched phase (``inference``, ``generation``, ``generation_merged``)."""
        return self.batched.get(phase, {})

    @property
    def knob_value(self) -> Any:
        """The value of the method's Pareto knob in its configuration (None without one)."""
        return self.method_config.get(self.pareto_knob) if self.pareto_knob else None

    @property
    def precision(self) -> str | None:
        value = self.training.get("precision")
        return value if isinstance(value, str) else None

    @property
    def power_limit_w(self) -> float | None:
        """The GPUs' power limit the run was set to (``--power-limit``), None where it ran at the GPU's own."""
        value = (self.spec or {}).get("power_limit_w")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def quantization_method(self) -> str | None:
        """The backbone's quantisation (``nf4``, ``int8``; ``training.quantization.method``), None unquantised."""
        method = mapping(self.training.get("quantization")).get("method")
        return str(method) if method else None


def energy_kinds(phases: Iterable[PhaseResult | None]) -> str | None:
    """How the phases' energy figures were obtained: ``measured``, ``estimated`` or both joined by ``/`` (sorted);
    None where no phase says."""
    kinds = {kind for phase in phases if phase is not None and (kind := phase.text(ENERGY_KIND))}
    return "/".join(sorted(kinds)) or None


def _windows(value: object) -> dict[str, PhaseResult]:
    """A batched phase's ``batch_<size>`` windows, in the record's order."""
    return {
        str(key): window
        for key, entry in mapping(value).items()
        if BATCH_KEY.fullmatch(str(key)) and (window := PhaseResult.from_json(entry)) is not None
    }


def results_of(records: Iterable[RunResult | Mapping[str, Any]]) -> list[RunResult]:
    """Typed views of records, whether read already or still JSON objects."""
    return [RunResult.of(r) for r in records]
