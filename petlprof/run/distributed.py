"""Data-parallel runs: one configuration fine-tuned on several ranks with torchrun semantics, and the
one record that sums up what every rank measured.

A run of ``nproc`` > 1 ranks (``RunSpec.nproc``) starts with :func:`petlprof.execution.launch.launch`, torch's
elastic launcher (``torchrun --standalone --nproc-per-node N``) run inside the worker process, so the ranks die
with the sweep and a failed rank's exit code or signal reaches the record.  Each rank reads its place from the
environment torchrun sets (:class:`petlprof.run.ranks.RankContext`), joins the process group (gloo on CPU,
nccl on CUDA, rank *i* of a node on ``cuda:LOCAL_RANK``; every collective times out after
:data:`COLLECTIVE_TIMEOUT_S`, so a lost peer ends the run instead of hanging it), and then:

* trains the model wrapped in ``DistributedDataParallel``.  ``batch_size`` stays the *global* batch:
  each optimiser step takes the same batch as a one-rank run and rank *r* computes positions
  ``r::world`` of it (:func:`my_part`); each rank's loss is weighted by its share of the batch, so the
  averaged gradient is the global batch's mean gradient and a 2-rank run is the same optimisation as
  a 1-rank run — only its costs differ.  Reported losses are the global batch's (:func:`sum_over_ranks`).
  Budget checks stop every rank at the same step (:func:`agreed_stop`);
* evaluates its part of every batch; predictions are gathered (:func:`gather_in_order`) so the
  metrics cover the evaluation split exactly once;
* measures with its own meters: its own process's memory and device, its own GPU's energy counter
  (NVML, by UUID), its own process's CPU time for the estimate.

Rank 0 combines the ranks' train and eval phases (:func:`aggregate_ranks`): energy summed over ranks
(their devices), except a meter that reads a node-wide counter (RAPL package/DRAM, CodeCarbon in
machine mode) which counts once per node; peak memory the maximum over ranks, with the per-rank list;
time from the slowest rank; samples summed.  The inference phase and the merged evaluation are
per-device figures, measured on rank 0 alone while the other ranks wait (:func:`done`).  Budget
checks score the held-out slice on every rank (the weights are the same), so their cost is in every
rank's train figures.

The ranks of one run start on one node (``--standalone``); the aggregation also handles ranks on
several nodes.  torchrun gives each rank ``OMP_NUM_THREADS=1`` unless it is set.  The hidden-state
cache is refused (its cached steps run outside DistributedDataParallel).

Not counted: the interconnect (NVLink/NVSwitch, PCIe switches, network cards and switches) beyond
what a GPU's own counter includes; with NVML, the host CPUs and DRAM of every node (as in one-rank GPU
runs); the launcher process; with RAPL, nothing is split per process — a node's counter includes
everything that ran on the node.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from petlprof.results import figures
from petlprof.results.figures import (
    ENERGY,
    ENERGY_COUNTER,
    ENERGY_INTEGRATED,
    ENERGY_WINDOW,
    LATENCY,
    PEAK_MEMORY,
    SAMPLES,
    TIME,
)
from petlprof.results.grades import ABOVE_IDLE_GRADE_KEY, GRADE_KEY, REASONS_KEY, worst
from petlprof.results.records import DistributedSummary, Phase, RankPhases, RunPhases
from petlprof.vocabulary import ESTIMATED, MEASURED

COLLECTIVE_TIMEOUT_S = 600.0
# how long the other ranks wait for rank 0's per-device phases (inference, merged evaluation) before the
# group is torn down together; a rank 0 that dies ends them sooner (torchrun stops them)
RANK0_PHASES_WAIT_S = 6 * 3600.0
_GROUPS: dict[str, Any] = {}
RANK0_ONLY_PHASES = ("inference", "eval_merged")
NODE_WIDE_ENERGY_METERS = frozenset({"rapl"})  # their counter covers the node, not one process or device
ENERGY_FIELDS = figures.combined_by(figures.DEVICE_ENERGY)
CODECARBON_FIELDS = figures.combined_by(figures.CODECARBON_ENERGY)
# the figures the slowest or largest rank gives, and the warm-ups' wall time (ranks warm up side by side)
MAX_FIELDS = (*(f.name for f in figures.FIGURES if f.ranks in (figures.SLOWEST, figures.MAX)), figures.WARMUP_TIME)
KIND_FIELDS = tuple(dict.fromkeys(f.kind for f in figures.FIGURES if f.kind is not None))
PER_RANK_FIELDS = tuple(f.name for f in figures.FIGURES if f.per_rank)


def init(device: str) -> str:
    """Join the process group (gloo on CPU, nccl on CUDA, this rank on ``device``); returns the backend."""
    cuda = device.startswith("cuda")
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, timeout=dt.timedelta(seconds=COLLECTIVE_TIMEOUT_S), device_id=torch.device(device) if cuda else None
    )
    _GROUPS["wait"] = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=RANK0_PHASES_WAIT_S))
    return backend


def done() -> None:
    """Every rank waits here until rank 0 has measured its per-device phases, so that all of them tear
    the group down together (NCCL needs that)."""
    dist.monitored_barrier(group=_GROUPS["wait"], timeout=dt.timedelta(seconds=RANK0_PHASES_WAIT_S))


def destroy() -> None:
    """Leave the process group (after :func:`done`: every rank at the same time)."""
    _GROUPS.clear()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``model`` in DistributedDataParallel; only its trainable parameters are synchronised."""

    device_ids = [torch.device(device).index] if device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=device_ids)


def my_part(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s positions of a global batch: ``rank::world_size``."""
    return indices[rank::world_size]


def _tensor(values, dtype) -> torch.Tensor:
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    return torch.tensor(values, dtype=dtype, device=device)


def sum_over_ranks(values: list[float]) -> list[float]:
    """Element-wise sum of every rank's ``values`` (the same length on every rank)."""
    total = _tensor(values, torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.cpu().tolist()


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on some rank (an all-reduce MAX)."""
    total = _tensor([flag], torch.int32)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return bool(total.item())


def agree(reason: str | None) -> str | None:
    """The same stop decision on every rank: stop if any rank would (an all-reduce MAX of the flag
    each check); the reason is the lowest such rank's."""
    flag = _tensor([reason is not None], torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not flag.item():
        return None
    return next(r for r in gather(reason) if r is not None)


def agreed_stop(stop: Callable[[int], str | None]) -> Callable[[int], str | None]:
    """``stop`` (a :class:`petlprof.run.budget.Budget`) answered the same on every rank; a rank stopped by
    another's decision records that reason as its own."""

    def check(step: int) -> str | None:
        mine = stop(step)
        reason = agree(mine)
        if reason is not None and mine is None and hasattr(stop, "stop_reason"):
            stop.stop_reason = reason
        return reason

    return check


def gather_in_order(
    positions: np.ndarray, preds: np.ndarray, golds: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's predictions and labels of its ``positions`` of a split of ``size`` examples, as
    whole-split arrays in split order; each example must come from exactly one rank."""
    parts = gather((positions, preds, golds))
    where = np.concatenate([p[0] for p in parts]).astype(int)
    if not np.array_equal(np.sort(where), np.arange(size)):
        raise RuntimeError(f"the ranks scored {len(where)} positions of a {size}-example split, not each once")
    order = np.argsort(where)
    return np.concatenate([p[1] for p in parts])[order], np.concatenate([p[2] for p in parts])[order]


def summary(
    world_size: int, backend: str | None, batch_size: int, nodes: int, per_rank: list[RankPhases]
) -> DistributedSummary:
    """The record's ``distributed`` entry: how the run was split and how its figures are to be read."""
    return {
        "world_size": world_size,
        "backend": backend,
        "nodes": nodes,
        "batch": f"batch_size {batch_size} is the global batch: at each step rank r computes positions "
        f"r::{world_size} of it",
        "aggregation": "train/eval: energy summed over ranks (a node-wide meter such as RAPL once per node), peak "
        "memory the max over ranks, time the slowest rank's, samples summed; "
        f"{' and '.join(RANK0_ONLY_PHASES)} measured on rank 0 alone",
        "not_counted": "the interconnect (NVLink, PCIe/network switches) beyond each GPU's own counter; with NVML, "
        "the nodes' CPUs and DRAM; the launcher process",
        "ranks": per_rank,
    }


# --- aggregation at rank 0 -------------------------------------------------------------------------


_P = TypeVar("_P", bound=Phase)  # the train phase aggregates to a train phase, the evaluation to an evaluation


def aggregate_ranks(records: list[RankPhases]) -> RunPhases:
    """One figure per phase from every rank's own: ``records`` holds, per rank, ``rank``, ``host``,
    ``device`` and its ``train``/``eval`` phase dicts; returns ``{"train": ..., "eval": ..., "nodes": n}``.

    Per phase: energy (``energy_j`` and its companions) summed over ranks, or once per node for a
    node-wide meter (RAPL; CodeCarbon in machine mode), from the rank whose window was longest;
    ``peak_memory_bytes`` the maximum, with ``per_rank`` lists; ``time_s`` the slowest rank's;
    ``samples`` summed and ``samples_per_s`` = samples / slowest time; latency percentiles from the
    slowest rank; a kind ``estimated`` if any rank's was; warnings merged, each naming its ranks.
    Other fields are kept where every rank has the same value and left to the per-rank dicts otherwise.
    """
    records = sorted(records, key=lambda r: r["rank"])
    hosts, ranks = [r["host"] for r in records], [r["rank"] for r in records]
    devices = [r.get("device") for r in records]
    out: RunPhases = {"nodes": len(set(hosts))}
    if all(isinstance(r.get("train"), dict) for r in records):
        out["train"] = _aggregate_phase([r["train"] for r in records], ranks, hosts, devices)
    if all(isinstance(r.get("eval"), dict) for r in records):
        out["eval"] = _aggregate_phase([r["eval"] for r in records], ranks, hosts, devices)
    return out


def _aggregate_phase(ranked: Sequence[_P], ranks: list[int], hosts: list[str], devices: list) -> _P:
    """One phase of the run from the ranks' (a :class:`~petlprof.results.records.Phase` with every meter's figures,
    which the aggregation reads by the figures' declared names)."""
    phases: Sequence[Mapping[str, Any]] = ranked  # read by the figures' declared names, not by the TypedDict's keys
    warnings: list[str] = []
    out: dict[str, Any] = {
        key: phases[0][key]
        for key in dict.fromkeys(k for p in phases for k in p)
        if key != "warnings" and all(key in p and p[key] == phases[0][key] for p in phases)
    }
    times = [TIME.of(p) for p in phases]
    slowest = max(range(len(phases)), key=lambda i: times[i] if times[i] is not None else -1.0)
    for key in MAX_FIELDS:
        out.pop(key, None)
        if any(key in p for p in phases):
            out[key] = _total([p.get(key) for p in phases], ranks, key, max, warnings)
    for key in figures.combined_by(figures.SUM):
        if any(key in p for p in phases):
            out[key] = _total([p.get(key) for p in phases], ranks, key, sum, warnings)
    for rate in figures.rates():
        if rate.per is not None and rate.per.name in out:  # every rate is per a figure
            out[rate.name] = figures.rate(out[rate.per.name], out.get(TIME.name))
    out[LATENCY.name] = LATENCY.of(phases[slowest])
    out["latency_rank"] = ranks[slowest]
    node_wide = phases[0].get("energy_meter") in NODE_WIDE_ENERGY_METERS
    _energy(out, phases, ranks, hosts, ENERGY_FIELDS, node_wide, warnings)
    _energy(
        out, phases, ranks, hosts, CODECARBON_FIELDS, phases[0].get("codecarbon_tracking_mode") == "machine", warnings
    )
    for key in KIND_FIELDS:
        kinds = [p.get(key) for p in phases]
        if any(k is not None for k in kinds):
            out[key] = ESTIMATED if ESTIMATED in kinds else MEASURED if all(k == MEASURED for k in kinds) else None
    for flag in ("energy_low_confidence", "energy_sources_disagree"):  # one rank's doubt is the total's
        if any(flag in p for p in phases):
            out[flag] = any(p.get(flag) for p in phases)
    for key in (GRADE_KEY, ABOVE_IDLE_GRADE_KEY):  # the total is as trustworthy as its worst rank's part
        if any(key in p for p in phases):
            out[key] = worst(p.get(key) for p in phases)
    if any(REASONS_KEY in p for p in phases):
        out[REASONS_KEY] = list(dict.fromkeys(r for p in phases for r in p.get(REASONS_KEY) or []))
    if any("energy_integrated_vs_counter" in p for p in phases):  # the cross-check of the totals
        counter, integrated = ENERGY_COUNTER.of(out), ENERGY_INTEGRATED.of(out)
        out["energy_integrated_vs_counter"] = integrated / counter if counter and integrated is not None else None
    out["per_rank"] = {
        "rank": ranks,
        "host": hosts,
        "device": devices,
        **{key: [p.get(key) for p in phases] for key in PER_RANK_FIELDS},
    }
    out["aggregation"] = {
        ENERGY.name: (
            f"once per node ({phases[0].get('energy_meter')} reads a node-wide counter), summed over nodes"
            if node_wide
            else "sum over ranks (each rank's own devices/process)"
        ),
        PEAK_MEMORY.name: PEAK_MEMORY.ranks,
        TIME.name: TIME.ranks,
        SAMPLES.name: SAMPLES.ranks,
        LATENCY.name: f"rank {ranks[slowest]}, the slowest",
    }
    out["warnings"] = warnings + _merge_warnings([p.get("warnings") or [] for p in phases], ranks)
    return cast(_P, out)  # the figures' keys come from their declarations: the phase is cast to its type


def _total(values: list, ranks: list[int], key: str, how, warnings: list[str]):
    """``how`` (sum or max) of the ranks' values; None, with a warning, when a rank has none."""
    missing = [r for r, v in zip(ranks, values) if v is None]
    if missing:
        warnings.append(f"{key} is missing on rank(s) {', '.join(map(str, missing))}: no figure over all ranks")
        return None
    return how(values)


def _energy(
    out: dict[str, Any],
    phases: Sequence[Mapping[str, Any]],
    ranks: list[int],
    hosts: list[str],
    fields: tuple[str, ...],
    node_wide: bool,
    warnings: list[str],
) -> None:
    """Sum ``fields`` over ranks, or for a node-wide source over nodes, each node's figure from its
    rank with the longest energy window."""
    chosen = list(range(len(phases)))
    if node_wide:
        best: dict[str, int] = {}
        for i, host in enumerate(hosts):
            if host not in best or (ENERGY_WINDOW.of(phases[i]) or 0) > (ENERGY_WINDOW.of(phases[best[host]]) or 0):
                best[host] = i
        chosen = sorted(best.values())
    for key in fields:
        out.pop(key, None)
        if any(key in p for p in phases):
            out[key] = _total([phases[i].get(key) for i in chosen], [ranks[i] for i in chosen], key, sum, warnings)


def _merge_warnings(lists: list[list[str]], ranks: list[int]) -> list[str]:
    """Each distinct warning once, prefixed with the ranks that gave it."""
    seen: dict[str, list[int]] = {}
    for rank, texts in zip(ranks, lists):
        for text in texts:
            seen.setdefault(text, []).append(rank)
    merged = []
    for text, where in seen.items():
        who = "all ranks" if where == ranks else ("rank " if len(where) == 1 else "ranks ") + ", ".join(map(str, where))
        merged.append(f"{who}: {text}")
    return merged
