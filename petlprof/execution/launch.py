"""The launch of a data-parallel run and the cause of its failure.

:func:`launch` runs torch's elastic launcher (``torchrun --standalone --nproc-per-node N``) inside the worker
process, so the ranks die with the sweep and a failed rank's exit code or signal reaches the record (what a rank
does is :mod:`petlprof.run.distributed`).  A CPU run's ranks are forked from the launcher, which has imported the
run's libraries first (torch elastic's function entrypoint, start method ``fork``), as the warm worker forks a
one-process run (:mod:`petlprof.execution.warm`: the same resident library pages mapped again in each rank, the
same signal handling): each rank starts in about a second instead of re-importing for several.  A CUDA run's
ranks run ``python -m petlprof.execution.worker SPEC OUT`` in fresh interpreters (never fork where CUDA may have
been touched).
A rank whose run failed leaves its own record beside the run's (:func:`rank_record_path`), the launcher the
failed ranks' exit codes (:func:`launch_failures_path`); :func:`failure` names the cause from both.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_args, run

from petlprof.execution.process import die_with_parent
from petlprof.execution.warm import populate, resident_file_pages
from petlprof.results.records import DistributedSummary, LaunchFailure, RunRecord

COMMUNICATION_ERRORS = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
# what a rank's error says when a peer went away under a collective (gloo raises a plain RuntimeError)
COMMUNICATION_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo/transport",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL",
    "ProcessGroupGloo",
)


def rank_record_path(out_path: str | Path, rank: int) -> Path:
    """Where rank ``rank`` of a failed run leaves its own (failed) record, beside the run's record file."""
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}.rank{rank}.json")


def launch_failures_path(out_path: str | Path) -> Path:
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}.launch.json")


def forks_ranks(spec_path: str | Path) -> bool:
    """Whether a run's ranks are forked from its launcher (a CPU run) rather than started fresh (CUDA)."""
    return not json.loads(Path(spec_path).read_text())["spec"]["device"].startswith("cuda")


def launch(nproc: int, spec_path: str, out_path: str, run_job: Callable[[Path, Path], int]) -> int:
    """Run ``spec_path`` on ``nproc`` local ranks with torch's elastic launcher (``torchrun --standalone``) in this
    process, each rank running ``run_job(SPEC, OUT)`` (forked, for a CPU run) or ``python -m
    petlprof.execution.worker SPEC OUT``; when a rank fails, torchrun stops the others and each failed rank's exit
    code and signal go to :func:`launch_failures_path`.  Returns the exit code."""

    os.environ["PETLPROF_PARENT_PID"] = str(os.getpid())  # the ranks' parent: they die with this launcher
    args = parse_args(
        ["--standalone", f"--nproc-per-node={nproc}", "-m", "petlprof.execution.worker", spec_path, out_path]
    )
    try:
        if forks_ranks(spec_path):
            rank = functools.partial(_forked_rank, run_job, resident_file_pages())
            _launch_forked(args, functools.update_wrapper(rank, _forked_rank), spec_path, out_path)  # named
        else:
            run(args)
    except ChildFailedError as error:
        failures = {
            rank: {"exitcode": f.exitcode, "signal": f.signal_name() if f.exitcode < 0 else None, "pid": f.pid}
            for rank, f in error.failures.items()
        }
        launch_failures_path(out_path).write_text(json.dumps(failures))
        return 1
    except SignalException as stop:  # the sweep stopped this run: torchrun has stopped the ranks
        return 128 + int(stop.sigval)
    return 0


def _launch_forked(args, rank: Callable[[str, str], None], spec_path: str, out_path: str) -> None:
    """What ``torchrun --standalone`` does with ``args`` (``torch.distributed.run.run``: a c10d rendezvous on this
    host), with ``rank`` forked as each rank's function instead of a fresh interpreter per rank."""
    args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = config_from_args(args)
    config.start_method = "fork"
    elastic_launch(config=config, entrypoint=rank)(spec_path, out_path)


def _forked_rank(run_job: Callable[[Path, Path], int], resident: list, spec_path: str, out_path: str) -> None:
    """A forked rank: the launcher's signal handlers (torchrun's) replaced by a fresh worker's, dies with the
    launcher, the library pages the launcher had resident mapped again (as a warm worker's child does), then the
    run; an exit code other than 0 ends the process with it (torch elastic reads only exit codes)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(os.getppid())
    populate(resident)
    code = run_job(Path(spec_path), Path(out_path))
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# a rank whose collective failed because a peer ended waits this long before it exits, so that the launcher, which
# reports the first rank it sees end, sees the peer (killed, say) first: the cause, not its echo
PEER_GONE_GRACE_S = 2.0


def communication_error(error: str | None) -> bool:
    """Whether a rank's error is a collective that failed because a peer is gone (an echo of another rank's end)."""
    text = error or ""
    return text.split(":")[0] in COMMUNICATION_ERRORS or any(m in text for m in COMMUNICATION_MARKERS)


def read_failure(out_path: str | Path, world_size: int) -> LaunchFailure | None:
    """:func:`failure` of the run whose record was to be ``out_path``, from the files its ranks and
    launcher left beside it."""
    records = {
        rank: json.loads(path.read_text())
        for rank in range(world_size)
        if (path := rank_record_path(out_path, rank)).exists()
    }
    launched_path = launch_failures_path(out_path)
    launched = (
        {int(r): info for r, info in json.loads(launched_path.read_text()).items()} if launched_path.exists() else {}
    )
    return failure(world_size, records, launched)


def failure(world_size: int, rank_records: dict[int, RunRecord], launched: dict[int, dict]) -> LaunchFailure | None:
    """The cause of a failed multi-rank run, as record fields (``status``, ``error`` naming the rank, its
    traceback and ``failed_at``, ``distributed``), from the failed ranks' own records and the launcher's
    exit codes; None when neither names a failure.

    The cause is, in this order: an error a rank raised that is not a communication error (a peer gone
    under a collective), the earliest by the ranks' ``failed_unix_s``; a rank ended by a signal other
    than the SIGTERM with which torchrun stops the survivors (SIGKILL: status ``oom``, as for a one-rank
    run the kernel killed); a communication error; any other exit."""

    def own(rank: int) -> bool:
        return rank in rank_records

    def communication(rank: int) -> bool:
        return communication_error(rank_records[rank].get("error"))

    def first(ranks) -> list[int]:
        return sorted(ranks, key=lambda r: (rank_records[r].get("failed_unix_s", float("inf")), r))

    def ended(rank: int) -> str:
        info = launched[rank]
        if info.get("signal"):
            return f"killed by {info['signal']} (exit code {info['exitcode']})"
        return f"ended with exit code {info['exitcode']} and no error of its own"

    summary = {
        **{r: rec.get("error") for r, rec in rank_records.items()},
        **{r: ended(r) for r in launched if not own(r)},
    }
    if not summary:
        return None
    raised = first(r for r in rank_records if not communication(r))
    signalled = sorted(r for r in launched if not own(r) and launched[r].get("signal") not in (None, "SIGTERM"))
    talking = first(r for r in rank_records if communication(r))
    rest = sorted(r for r in launched if not own(r))
    rank = (raised or signalled or talking or rest)[0]
    failed_ranks = {str(r): summary[r] for r in sorted(summary)}  # string keys, as the record's JSON has them
    distributed: DistributedSummary = {"world_size": world_size, "failed_ranks": failed_ranks}
    if not own(rank):
        killed = launched[rank].get("signal") == "SIGKILL"
        return {
            "distributed": distributed,
            "status": "oom" if killed else "failed",
            "error": f"rank {rank} of {world_size} {summary[rank]}" + ("; out of memory?" if killed else ""),
        }
    record = rank_records[rank]
    fields: LaunchFailure = {
        "distributed": distributed,
        "status": record.get("status", "failed"),
        "error": f"rank {rank} of {world_size}: {record.get('error')}",
    }
    if "traceback" in record:
        fields["traceback"] = record["traceback"]
    if "failed_at" in record:
        fields["failed_at"] = record["failed_at"]
    return fields
