"""Entry point of the process a run executes in: ``python -m petlprof.execution.worker SPEC OUT``.

A run of several ranks starts as ``python -m petlprof.execution.worker --nproc N SPEC OUT``: this process becomes
torchrun's launcher (:func:`petlprof.execution.launch.launch`) and every rank runs :func:`run_job` (forked from it
on the CPU, ``petlprof.execution.worker SPEC OUT`` in a fresh interpreter on CUDA); rank 0 writes OUT, and a rank
whose run failed writes its own record beside it and exits with code 1, so torchrun stops the other ranks.

``python -m petlprof.execution.worker --serve FD`` is the sweep's warm worker (:mod:`petlprof.execution.warm`): it
imports the run's libraries once and forks one child per run, which runs :func:`run_job` as a fresh worker does.

The sweep starts this module through :data:`petlprof.execution.process.LAUNCH` with SIGINT ignored, so a
Ctrl-C that lands while Python is still importing (before a run has anything to lose) ends nothing with a
traceback: the sweep stops the process itself; :func:`main` takes Ctrl-C back once the imports are done.
SIGINT and SIGTERM are unblocked first: a signal mask is inherited, and a caller of
:func:`petlprof.execution.child.execute_in_subprocess` holds both once a run has finished, so a worker started
after that would otherwise ignore the sweep's ``terminate()`` and run on.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Hashable, Mapping
from pathlib import Path

from petlprof.execution.process import die_with_parent, exit_now, expected_parent
from petlprof.execution.warm import serve
from petlprof.results.records import FINAL_STATUSES
from petlprof.run import kept
from petlprof.run.execute import execute
from petlprof.run.libraries import import_runtime_libraries
from petlprof.sweep.spec import RunSpec


def main(argv: list[str]) -> int:
    if argv[0] == "--serve":
        die_with_parent(expected_parent())
        return serve(int(argv[1]), run_job, preload, KEEPER)
    if argv[0] == "--nproc":
        # torch's elastic launcher: the launcher's only; a run's libraries load in preload(), in order
        from petlprof.execution.launch import forks_ranks, launch

        if forks_ranks(argv[2]):  # its ranks are forked from this process: they find the imports done
            preload()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        die_with_parent(expected_parent())
        return launch(int(argv[1]), argv[2], argv[3], run_job)
    preload()  # a run (or a fresh rank of one) imports as a warm worker does
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the imports are done: Ctrl-C cancels the run
    die_with_parent(expected_parent())
    return run_job(*(Path(p) for p in argv))


def preload() -> None:
    """A run's imports, in a fresh worker and in the warm worker alike: the libraries
    :func:`petlprof.run.pipeline.prepare` imports before it takes the run's memory baseline, and petlprof's run
    modules (small), nothing more.  The objects they made live as long as the process, so they leave the
    garbage collector's scans (``gc.freeze``): a run collects garbage before each phase
    (:func:`petlprof.meters.memory.release_free_memory`), and each collection walked them all (about 0.25 s
    of CPU after these imports, five times per run)."""
    import_runtime_libraries(freeze=True)


class _Keeper:
    """The warm worker's :class:`petlprof.execution.warm.Keeper`: the backbones of :mod:`petlprof.run.kept`."""

    def key(self, spec_path: Path, cwd: str) -> kept.BackboneKey | None:
        try:
            job = json.loads(spec_path.read_text())
            if job.get("max_memory_bytes") is not None:  # its cap is on the address space a kept backbone is part of
                return None
            return kept.key_of(RunSpec(**job["spec"]), cwd)
        except (OSError, ValueError, KeyError, TypeError):  # the run fails on its spec itself
            return None

    def hold(self, key: Hashable) -> str | None:
        assert isinstance(key, kept.BackboneKey), key  # what key() made
        return kept.hold(key)

    def forked(self) -> None:
        kept.forked()

    def reads_own(self, why: str | None) -> None:
        kept.reads_own(why)


KEEPER = _Keeper()


def run_job(spec_path: Path, out_path: Path) -> int:
    """Run the spec in ``spec_path`` and write its record to ``out_path`` (rank 0's, for several ranks)."""
    # PEFT calls a transformers API that transformers 5 deprecated; the warning is not the user's to act on
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    job = json.loads(spec_path.read_text())
    try:
        record = execute(RunSpec(**job["spec"]), max_memory_bytes=job.get("max_memory_bytes"))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the sweep records the cancel
        return 130
    if record["spec"]["nproc"] > 1:
        # petlprof.run.distributed (torch): after preload(), which imports the run's libraries in their order
        from petlprof.execution.launch import PEER_GONE_GRACE_S, communication_error, rank_record_path

        rank = int(os.environ["RANK"])
        if record["status"] not in FINAL_STATUSES:  # the time orders the ranks' failures: the first is the cause
            _write(rank_record_path(out_path, rank), {**record, "failed_unix_s": time.time()})
            sys.stderr.flush()
            if communication_error(record.get("error")):  # a peer ended: let the launcher see that end first
                time.sleep(PEER_GONE_GRACE_S)
            os._exit(1)  # without tearing down the process group its peers may still block in
        if rank != 0:
            return 0
    _write(out_path, record)
    return 0


def _write(path: Path, record: Mapping[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:  # Ctrl-C before the run started: the sweep records the cancel
        sys.exit(130)
    exit_now(code)  # the record is written: the driver waits for this process's end, not for its teardown
