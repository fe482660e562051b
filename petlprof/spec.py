"""A run's specification: everything that defines one run, and the part of it that is the run's identity.

Owned here so the option declarations (:mod:`petlprof.config`), the executors and the runner read one
definition; :func:`spec_identity` decides which fields enter a run's key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

MEASUREMENT_FIELDS = ("extra_meters", "country_code", "memory_snapshot_dir", "inference_window_s")
BUDGET_FIELDS = ("target_value", "target_metric", "eval_every", "target_eval_size", "max_train_time_s")


@dataclass
class RunSpec:
    """Everything that defines one run; its JSON form is the run's identity (``run_key``)."""

    method: str
    backbone: str = "minilm"
    task: str = "tweets"
    seed: int = 0
    method_config: dict[str, Any] = field(default_factory=dict)
    num_layers: int | None = None
    data_dir: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    epochs: int = 1
    max_steps: int | None = None
    train_size: int | None = 2000
    eval_size: int | None = 1000
    batch_size: int = 32
    lr: float | None = None  # None: the method's default
    max_length: int = 64
    warmup_steps: int = 2
    device: str = "cpu"
    energy_meter: str = "auto"
    nproc: int = 1  # data-parallel ranks of this one run (torchrun semantics; petlprof.distributed)
    # measurement options (petlprof.meters): what is measured alongside, not part of the identity
    extra_meters: list[str] = field(default_factory=list)  # codecarbon, cpu-tensors
    country_code: str | None = None  # for codecarbon's carbon intensity
    memory_snapshot_dir: str | None = None  # CUDA memory snapshots of each phase go here
    inference_window_s: float | None = None  # None: 5 s with a measured energy meter, else 0.5 s
    cache_hidden_states: bool = False  # side-tuning fast path (petlprof.cache)
    cache_budget_bytes: int | None = None  # in memory; past it the cache spills to cache_dir
    cache_dtype: str = "float16"
    cache_dir: str | None = None  # where the cache spills (the output folder); not part of the identity
    # budget (petlprof.budget): stop at a target value of a metric (None: the task's primary metric),
    # checked every eval_every steps on the first target_eval_size eval examples (None: all), or after
    # max_train_time_s seconds of training
    target_value: float | None = None
    target_metric: str | None = None
    eval_every: int | None = None
    target_eval_size: int | None = None
    max_train_time_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self, include_seed: bool = True) -> dict[str, Any]:
        return spec_identity(self.to_dict(), include_seed)

    @property
    def run_key(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def spec_identity(spec: dict[str, Any], include_seed: bool = True) -> dict[str, Any]:
    """What defines a run (its ``run_key``), from a spec's dict; without the seed it names the
    configuration a report averages over seeds.  Fields added after the first release enter only
    when set, so earlier runs keep their keys."""
    identity = dict(spec)
    identity.pop("cache_dir", None)  # where the cache spills, not what runs
    identity.pop("cache_budget_bytes", None)  # memory or disk for the cache: same states, same steps
    for name in MEASUREMENT_FIELDS:  # measured alongside; their cost is a warning in the record
        identity.pop(name, None)
    if identity.get("nproc", 1) == 1:
        identity.pop("nproc", None)
    if not identity.get("cache_hidden_states"):
        for name in ("cache_hidden_states", "cache_dtype"):
            identity.pop(name, None)
    for name in BUDGET_FIELDS:
        if identity.get(name) is None:
            identity.pop(name, None)
    if not include_seed:
        identity.pop("seed", None)
    return identity
