"""A backbone read once per sweep: the warm worker reads it before it forks a run, and the runs forked from it take it.

Each run of a sweep used to read its backbone in its own process: parse the config, build the model, map the
weights, build the tokenizer and compile transformers' weight-renaming patterns (0.4-2 s a run on this CPU for a
1B-parameter folder, more for a backbone whose checkpoint is not memory-mapped).  The warm worker
(:mod:`petlprof.execution.warm`) now reads the backbone of the run it is about to fork (:func:`keep_for`), keeps it,
and forks; the child finds it in its copy of the warm worker's memory (:func:`take`) and builds the run's model on
it.  A fork shares the pages copy-on-write: a method that trains the backbone's weights writes its own copies, as a
fresh process would have its own, and the warm worker's copy is never touched.  The next run of the same backbone
is forked with the same kept copy; a run of another backbone makes the warm worker drop it and read that one.

What is kept, and what is not (the run then reads its backbone itself, as before):

- kept: a one-process CPU run of pretrained weights (a preset's, a model folder's, a hub id's in the local cache,
  a GGUF file's converted copy), keyed by the backbone, its layer count and whether it carries its LM head;
- not kept: random weights (cheap to build, and seeded per run), a quantised backbone (quantising runs kernels, see
  below), a CUDA run (a fork cannot carry a CUDA context: a CUDA run starts in a fresh interpreter and reads its
  weights from the checkpoint, which the operating system's page cache holds after the first run; a GGUF file's
  converted copy is made once per machine, :mod:`petlprof.models.converted`), a run whose objective only its data
  can tell (``--objective auto`` on the user's files), a backbone whose reading draws random numbers (a missing
  weight initialised at load: a fresh run draws them after its seed, the kept copy could not), and one whose
  reading grew the warm worker's memory by more than half of what the machine had left (two copies would not fit).

Figures unchanged: the run's memory baseline is taken as a fresh process takes it, before its backbone exists:
the resident memory the reading added to the warm worker (``VmRSS``: its objects, which a fork's child inherits in
its resident set, and the file pages it touched, the loader's code and the checkpoint's, which the child maps again
before its baseline as it does the libraries' pages, :func:`petlprof.execution.warm.populate`) is taken off the
child's baseline (:func:`inherited_bytes`), so every phase's peak counts the backbone as a fresh reading counts it.
Weights memory-mapped from the checkpoint and not yet touched stay unmapped: the child maps them as it touches
them, as a fresh process does.  The reading's time is the first run's
(it is inside that run's process wall time, which the sweep measures from before the fork request): its record
says ``load.backbone_s`` and where the backbone came from; a later run's ``load.backbone_s`` is what taking it cost.

Fork safety: reading runs with torch at one thread, so no OpenMP team exists in the warm worker (a fork of a process
whose team ran hangs at the child's first parallel region); the thread count is set back before the fork.  The
warm worker's own checks before each fork (one Python thread, no native thread started since the imports) still
stand: a reading that left a thread running makes the fork refuse, and the sweep goes on in fresh interpreters.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from petlprof.meters.memory import status_bytes
from petlprof.models.backbones import Backbone, available_memory_bytes, is_tiny_preset, load_backbone
from petlprof.models.quantization import Quantization
from petlprof.sweep.spec import RunSpec
from petlprof.tasks.labelled import objective_without_data
from petlprof.vocabulary import LM

READ_HERE = "read by the run's own process"
READ_FOR_THIS_RUN = "read once by the sweep's warm worker before this run (charged to this run)"
KEPT = "kept by the sweep's warm worker, read for an earlier run"


@dataclass(frozen=True)
class BackboneKey:
    """What a run's backbone is read by: its name, layer count and whether it carries its LM head."""

    name: str
    num_layers: int | None
    lm_head: bool


@dataclass
class Kept:
    """The warm worker's backbone: what reading it cost, and how many runs were forked with it."""

    key: BackboneKey
    backbone: Backbone
    read_s: float  # wall time of the reading, in the warm worker
    inherited_bytes: int  # resident memory the reading added to the warm worker: a forked run's resident set holds it
    just_read: bool = True  # read for the run now being forked (it is charged the reading), not for an earlier one


_kept: Kept | None = None  # the warm worker's; in a forked run, the copy it inherited until it takes it
_refused: dict[BackboneKey, str] = {}  # backbones found not to keep, and why (not read again to find out again)
_why_not: str | None = None  # why the run being forked reads its own backbone, where the warm worker tried to keep it


def key_of(spec: RunSpec) -> BackboneKey | None:
    """The key of the backbone ``spec`` runs on, None where it is not kept (see the module's list)."""
    quantized = Quantization.of(spec) is not None
    if spec.device != "cpu" or spec.nproc != 1 or spec.random_init or is_tiny_preset(spec.backbone) or quantized:
        return None
    objective = objective_without_data(spec.task, spec.objective, spec.prompt_column)
    if objective is None:
        return None
    return BackboneKey(spec.backbone, spec.num_layers, objective == LM)


def keep_for(spec: RunSpec) -> bool:
    """In the warm worker, before it forks ``spec``'s run: keep that run's backbone (read now unless already kept).
    Where it cannot be kept, the run reads its own and its record says why (:func:`not_kept`).  Returns whether a
    backbone was read now (the warm worker's resident file pages changed: the forked run maps them again)."""
    global _kept, _why_not
    _why_not = None
    key = key_of(spec)
    if key is None:
        return False
    if _kept is not None and _kept.key == key:
        _kept.just_read = False
        return False
    _kept = None
    if key in _refused:
        _why_not = _refused[key]
        return False
    gc.collect()  # the other backbone's memory back before this one is read
    try:
        _kept, why = _read(key)
    except Exception as exc:  # the run reads it itself, and fails there with its own error if it must
        _kept, why = None, f"{type(exc).__name__}: {exc}"
    if _kept is None:
        _refused[key] = _why_not = why
        gc.collect()
    return True


def not_kept() -> str:
    """What a run that read its own backbone says of it: read here, and why the warm worker did not keep it."""
    return READ_HERE if _why_not is None else f"{READ_HERE} (the warm worker did not keep it: {_why_not})"


def _read(key: BackboneKey) -> tuple[Kept | None, str]:
    # torch, transformers: the warm worker has imported them (its runtime) before it serves
    import torch
    from transformers.utils import logging as hf_logging

    threads, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(1)  # no OpenMP team in the warm worker (module docstring)
    hf_logging.disable_progress_bar()  # a tqdm bar starts tqdm's monitor thread, and a fork must find none
    try:
        torch.manual_seed(0)
        rng = torch.get_rng_state()
        resident, t0 = status_bytes("VmRSS"), time.perf_counter()
        backbone = load_backbone(key.name, num_layers=key.num_layers, lm_head=key.lm_head)
        read_s = time.perf_counter() - t0
        grown = max(0, (status_bytes("VmRSS") or 0) - (resident or 0))
        drew = not torch.equal(rng, torch.get_rng_state())
    finally:
        torch.set_num_threads(threads)
        if bars:
            hf_logging.enable_progress_bar()
    if drew:
        return None, "reading it draws random numbers (a weight initialised at load), which each run must draw itself"
    available = available_memory_bytes()
    if available is not None and grown > available / 2:
        return None, f"reading it took {grown / 2**30:.1f} GiB of the {available / 2**30:.1f} GiB left: no room for two"
    return Kept(key, backbone, read_s, grown), ""


def inherited_bytes() -> int:
    """In a forked run: the anonymous memory of the backbone it inherited (0 where it inherited none), which a
    fresh process would not hold before its memory baseline."""
    return _kept.inherited_bytes if _kept is not None else 0


@dataclass(frozen=True)
class Taken:
    backbone: Backbone
    charged_s: float  # the warm worker's reading, before this run's process existed: the first run's, else 0
    source: str


def take(spec: RunSpec) -> Taken | None:
    """In a forked run: the backbone its warm worker kept for it, None where the run must read its own.  Taken once:
    a later load in this process reads again (nothing here is shared with another run's state)."""
    global _kept
    kept, _kept = _kept, None
    if kept is None or key_of(spec) != kept.key:
        return None
    if kept.just_read:
        return Taken(kept.backbone, kept.read_s, READ_FOR_THIS_RUN)
    return Taken(kept.backbone, 0.0, KEPT)
