"""A backbone read once per sweep: a holder process reads it, and the runs of that backbone are forked from it.

Each run of a sweep used to read its backbone in its own process: parse the config, build the model, map the
weights, build the tokenizer and compile transformers' weight-renaming patterns (0.2-2 s a run on this CPU for a
1B-parameter folder, more for a backbone whose checkpoint is not memory-mapped).  Now the warm worker
(:mod:`petlprof.execution.warm`) forks a *holder* for the backbone of the run it is about to start: the holder reads
it (:func:`hold`) and forks that run and every later run of the same backbone; each finds it in its copy of the
holder's memory (:func:`take`) and builds the run's model on it.  A fork shares the pages copy-on-write: a method
that trains the backbone's weights writes its own copies, as a fresh process would have its own, and the holder's
copy is never touched.  A run of another backbone ends the holder (its memory back) and starts the next one, again
from the warm worker, which itself never reads a backbone: every holder starts from the same runtime alone.

What is kept, and what is not (the run then reads its backbone itself, as before):

- kept: a one-process CPU run of pretrained weights (a preset's, a model folder's, a hub id's in the local cache,
  a GGUF file's converted copy), keyed by the backbone, its layer count and whether it carries its LM head;
- not kept: random weights (cheap to build, and seeded per run), a quantised backbone (quantising runs kernels, see
  below), a CUDA run (a fork cannot carry a CUDA context: a CUDA run starts in a fresh interpreter and reads its
  weights from the checkpoint, which the operating system's page cache holds after the first run; a GGUF file's
  converted copy is made once per machine, :mod:`petlprof.models.converted`), a run whose objective only its data
  can tell (``--objective auto`` on the user's files), a backbone whose reading draws random numbers (a missing
  weight initialised at load: a fresh run draws them after its seed, the kept copy could not), and one whose
  reading grew the holder's memory by more than half of what the machine had left (two copies would not fit).

Figures unchanged: the run's memory baseline is taken as a fresh process takes it, before its backbone exists:
the resident memory the reading added to the holder (``VmRSS``: the backbone's objects and the modules the reading
imported, which a fork's child inherits in its resident set; the file pages the reading touched, the loader's code
and the checkpoint's, which the child maps again before its baseline as it does the libraries' pages,
:func:`petlprof.execution.warm.populate`) is taken off the child's baseline (:func:`inherited_bytes`), so every
phase's peak counts the backbone as a fresh reading counts it.  Weights memory-mapped from the checkpoint and not
yet touched stay unmapped: the child maps them as it touches them, as a fresh process does.  (A warm worker that
read the backbones itself would carry each reading's leftovers into the next backbone's runs: 20 MiB of MiniLM's
reading stayed resident after it was dropped, and the next reading, of a small Llama, then grew by 2.4 MiB instead
of the 11.5 MiB it grows in a fresh process.)

Fork safety: reading runs with torch at one thread, so no OpenMP team exists in the holder (a fork of a process
whose team ran hangs at the child's first parallel region); the thread count is set back before the fork.  The
holder makes the warm worker's own checks before each fork (one Python thread, no native thread started since the
reading): a reading that left a thread running makes it refuse, and that backbone's runs read their own.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from petlprof.meters.memory import release_free_memory, status_bytes
from petlprof.models.backbones import Backbone, available_memory_bytes, is_tiny_preset, load_backbone
from petlprof.models.quantization import Quantization
from petlprof.sweep.spec import RunSpec
from petlprof.tasks.labelled import objective_without_data
from petlprof.vocabulary import LM

READ_HERE = "read by the run's own process"
# a run's load.backbone_from
READ_FOR_THIS_RUN = "read once for the sweep by a holder forked from the warm worker, before this run (charged to it)"
KEPT = "kept by a holder forked from the sweep's warm worker, read for an earlier run"


@dataclass(frozen=True)
class BackboneKey:
    """What a run's backbone is read by: its name, layer count and whether it carries its LM head; for a local
    folder or file, where it resolves and each of its files' name, size and modification time (a folder whose
    weights changed since the holder read them is read again)."""

    name: str
    num_layers: int | None
    lm_head: bool
    where: str = ""
    files: tuple[tuple[str, int, int], ...] = ()


def _local(name: str, cwd: str) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    """A local backbone's resolved path and its files' (name, size, mtime in ns); ("", ()) for a preset or hub id."""
    path = Path(cwd, name)
    if not path.exists():
        return "", ()
    files = [path] if path.is_file() else sorted(f for f in path.iterdir() if f.is_file())
    return str(path.resolve()), tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)


@dataclass
class Kept:
    """The holder's backbone: what reading it cost, and whether the run being forked is its first."""

    key: BackboneKey
    backbone: Backbone
    read_s: float  # wall time of the reading, in the holder
    inherited_bytes: int  # resident memory the reading added to the holder: a forked run's resident set holds it
    just_read: bool = True  # read for the run now being forked (it is charged the reading), not for an earlier one


_kept: Kept | None = None  # the holder's; in a forked run, the copy it inherited until it takes it
_why_not: str | None = None  # why the run being forked reads its own backbone, where the warm worker tried to keep it


def key_of(spec: RunSpec, cwd: str | None = None) -> BackboneKey | None:
    """The key of the backbone ``spec`` runs on, a relative path resolved in ``cwd`` (default: this process's
    working directory), None where it is not kept (see the module's list)."""
    quantized = Quantization.of(spec) is not None
    if spec.device != "cpu" or spec.nproc != 1 or spec.random_init or is_tiny_preset(spec.backbone) or quantized:
        return None
    objective = objective_without_data(spec.task, spec.objective, spec.prompt_column)
    if objective is None:
        return None
    where, files = _local(spec.backbone, cwd or os.getcwd())
    return BackboneKey(spec.backbone, spec.num_layers, objective == LM, where, files)


def hold(key: BackboneKey) -> str | None:
    """In the holder, just forked from the warm worker: read ``key``'s backbone and keep it for the runs the holder
    forks.  Returns why it cannot be kept (those runs then read their own), None when it is."""
    global _kept
    try:
        _kept, why = _read(key)
    except Exception as exc:  # the run reads it itself, and fails there with its own error if it must
        _kept, why = None, f"{type(exc).__name__}: {exc}"
    return why if _kept is None else None


def forked() -> None:
    """In the holder, after it forked a run: the reading is that first run's, the later runs take it kept."""
    if _kept is not None:
        _kept.just_read = False


def reads_own(why: str | None) -> None:
    """In the warm worker, before it forks a run that reads its own backbone: why the backbone was not kept (None:
    it was not one to keep), for the run's record (:func:`not_kept`)."""
    global _why_not
    _why_not = why


def not_kept() -> str:
    """What a run that read its own backbone says of it: read here, and why the warm worker did not keep it."""
    return READ_HERE if _why_not is None else f"{READ_HERE} (the warm worker did not keep it: {_why_not})"


def _read(key: BackboneKey) -> tuple[Kept | None, str]:
    # torch, transformers: the warm worker imported them (its runtime) before it forked the holder
    import torch
    from transformers.utils import logging as hf_logging

    threads, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    torch.set_num_threads(1)  # no OpenMP team in the holder (module docstring)
    hf_logging.disable_progress_bar()  # a tqdm bar starts tqdm's monitor thread, and a fork must find none
    try:
        torch.manual_seed(0)
        rng = torch.get_rng_state()
        release_free_memory()  # as the run does before its baseline: what is freed is not counted as the reading's
        resident, t0 = status_bytes("VmRSS"), time.perf_counter()
        backbone = load_backbone(key.name, num_layers=key.num_layers, lm_head=key.lm_head)
        read_s = time.perf_counter() - t0
        release_free_memory()
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
    """In a forked run: the resident memory the reading of the backbone it inherited added to its holder (0 where it
    inherited none), which a fresh process would not hold before its memory baseline."""
    return _kept.inherited_bytes if _kept is not None else 0


@dataclass(frozen=True)
class Taken:
    backbone: Backbone
    charged_s: float  # the holder's reading, before this run's process existed: the first run's, else 0
    source: str


def take(spec: RunSpec) -> Taken | None:
    """In a forked run: the backbone its holder kept for it, None where the run must read its own.  Taken once:
    a later load in this process reads again (nothing here is shared with another run's state)."""
    global _kept
    kept, _kept = _kept, None
    if kept is None or key_of(spec) != kept.key:
        return None
    if kept.just_read:
        return Taken(kept.backbone, kept.read_s, READ_FOR_THIS_RUN)
    return Taken(kept.backbone, 0.0, KEPT)
