"""Where this process sits in a run: one object with the same methods for a run of one process
(:class:`OneProcess`, where every collective is the identity) and for one rank of a data-parallel run
(:class:`RankContext`, which does them with the process group of :mod:`petlprof.run.distributed`).

The training loop, the evaluation and the run's steps call these methods and never ask which kind
they hold; :func:`rank_context` picks it from ``RunSpec.nproc`` and torchrun's environment.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from petlprof.errors import UsageError
from petlprof.results.records import EvalPhase, Inference, RankPhases, RankPlace, RunPhases, RunRecord
from petlprof.run.distributed import (
    aggregate_ranks,
    agreed_stop,
    any_rank,
    destroy,
    done,
    gather,
    gather_in_order,
    init,
    my_part,
    sum_over_ranks,
    summary,
    wrap,
)


class OneProcess:
    """The rank context of an ordinary run of one process: no group to join, every collective the identity."""

    rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
    is_main = True
    several = False  # a run of several ranks

    def device(self, requested: str) -> str:
        return requested

    def key_suffix(self) -> str:
        """What distinguishes this rank's files (memory snapshots) from the other ranks'."""
        return ""

    def join(self, device: str) -> str | None:
        """Join the process group; the backend's name (None: no group)."""
        return None

    def wrap(self, model: torch.nn.Module, device: str) -> torch.nn.Module:
        return model

    def part(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        """This rank's examples of a global batch of a training step, and its share of the batch."""
        return batch, 1.0

    def predict_part(self, batch: np.ndarray) -> np.ndarray:
        """This rank's examples of a global batch of an evaluation."""
        return batch

    def sum_over(self, values: list[float]) -> list[float]:
        return values

    def agreed(self, stop: Callable[[int], str | None] | None) -> Callable[[int], str | None] | None:
        return stop

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on some rank."""
        return flag

    def whole_split(
        self, positions: np.ndarray, preds: np.ndarray, golds: np.ndarray, size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        return preds, golds

    def combine(self, phases: RunPhases, device: str) -> RunPhases | None:
        """The run's train and eval phases from every rank's (None on a rank that is not the main one)."""
        return phases

    def record_fields(self, backend: str | None, batch_size: int, combined: RunPhases) -> RunRecord:
        """What the run's record says about its ranks."""
        return {}

    def rank0_phases_done(self, inference: Inference | None, merged: EvalPhase | None, device: str) -> None:
        """After rank 0's per-device phases (inference, merged evaluation): notes on them, and the ranks
        tear the group down together."""

    def release(self) -> None:
        """Leave the group (a finished run)."""


ONE_PROCESS = OneProcess()


@dataclass(frozen=True)
class RankContext:
    """Where this process sits in a run of several ranks, as torchrun's environment says; the same methods
    as :class:`OneProcess`, done with the process group."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    several = True

    @classmethod
    def from_env(cls, environ=os.environ) -> RankContext | None:
        """The context torchrun's variables describe, None outside torchrun."""
        if "RANK" not in environ or "WORLD_SIZE" not in environ:
            return None
        world = int(environ["WORLD_SIZE"])
        return cls(
            rank=int(environ["RANK"]),
            world_size=world,
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world)),
            host=socket.gethostname(),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str) -> str:
        """The device of this rank: ``cuda:LOCAL_RANK`` for a CUDA run, else ``requested``."""
        return f"cuda:{self.local_rank}" if requested.startswith("cuda") else requested

    def describe(self, device: str) -> RankPlace:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "device": device,
            "pid": os.getpid(),
        }

    def key_suffix(self) -> str:
        return f"-rank{self.rank}"

    def join(self, device: str) -> str:
        return init(device)

    def wrap(self, model: torch.nn.Module, device: str) -> torch.nn.Module:
        return wrap(model, device)

    def part(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        """A rank left without examples (a last batch smaller than the world) computes the first one with
        weight 0, so it still takes part in the gradient all-reduce."""
        mine = my_part(batch, self.rank, self.world_size)
        return (mine, len(mine) / len(batch)) if len(mine) else (batch[:1], 0.0)

    def predict_part(self, batch: np.ndarray) -> np.ndarray:
        return my_part(batch, self.rank, self.world_size)

    def sum_over(self, values: list[float]) -> list[float]:
        return sum_over_ranks(values)

    def agreed(self, stop: Callable[[int], str | None] | None) -> Callable[[int], str | None] | None:
        return None if stop is None else agreed_stop(stop)

    def any(self, flag: bool) -> bool:
        return any_rank(flag)

    def whole_split(
        self, positions: np.ndarray, preds: np.ndarray, golds: np.ndarray, size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        return gather_in_order(positions, preds, golds, size)

    def combine(self, phases: RunPhases, device: str) -> RunPhases | None:
        per_rank: list[RankPhases] = gather({**self.describe(device), **phases})
        if not self.is_main:  # rank 0 alone measures the per-device phases and writes the record
            done()
            return None
        return {**aggregate_ranks(per_rank), "per_rank": per_rank}

    def record_fields(self, backend: str | None, batch_size: int, combined: RunPhases) -> RunRecord:
        return {"distributed": summary(self.world_size, backend, batch_size, combined["nodes"], combined["per_rank"])}

    def rank0_phases_done(self, inference: Inference | None, merged: EvalPhase | None, device: str) -> None:
        done()
        if inference is not None:  # None: training diverged
            inference["measured_on"] = f"rank 0 alone ({device}): a per-device figure"
        if merged is not None:
            merged["measured_on"] = f"rank 0 alone ({device}), the whole evaluation split: a per-device figure"

    def release(self) -> None:
        destroy()


def rank_context(nproc: int) -> OneProcess | RankContext:
    """This process's context in a run of ``nproc`` ranks (:data:`ONE_PROCESS` for one rank); a
    UsageError when the run was not started by torchrun with that many ranks (``--in-process``, a
    plain ``execute``)."""
    if nproc == 1:
        return ONE_PROCESS
    ranks = RankContext.from_env()
    if ranks is None:
        raise UsageError(
            f"a run of nproc={nproc} ranks needs one process per rank, started by torchrun "
            "(execute_in_subprocess does that); it cannot run in this process (--in-process)"
        )
    if ranks.world_size != nproc:
        raise UsageError(f"the run asks for nproc={nproc} ranks but torchrun started WORLD_SIZE={ranks.world_size}")
    return ranks
