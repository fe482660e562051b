"""Where the runs of a sweep execute: one after the other on this machine, or as tasks on a Ray cluster.

An executor takes the runs still to do and yields ``(spec, record)`` as each one finishes.  The
sweep process (the *driver*) alone appends records to the store, so resume, the store lock and
"nothing lost" hold the same way whatever the executor.  ``in_flight`` lists the runs started and
not yet yielded, so an interrupted sweep can record them as ``cancelled``; ``cancel()`` stops them.

* ``local``: each run in a process of its own on this machine (:func:`petlprof.execution.child.execute_in_subprocess`:
  forked from the sweep's warm worker, or a fresh interpreter), or in the sweep's own process with ``--in-process``.
* ``ray``: each run becomes a Ray task that asks for the CPUs and GPUs the run declares
  (``--cpus-per-run``; one GPU per rank of a CUDA run) and runs the run in a process of its own on
  the node it lands on, as a local run (forked from the Ray worker's warm worker, or a fresh interpreter), so
  the meters read that node's devices (Ray sets ``CUDA_VISIBLE_DEVICES`` for the task).
  The task adds where it ran to the record and returns it to the driver.  A task whose
  worker or node is lost becomes a ``failed`` record naming the cause, after ``retries`` retries.
  The driver never waits forever: a task that no live node can take any more (its node was lost)
  is recorded ``failed`` after :data:`DRIVER_GRACE_S`, and one that outlives (retries + 1) x
  (``--timeout`` + :data:`DRIVER_GRACE_S`) is cancelled and recorded ``timeout`` (the node's own
  timeout should have ended it).  Cancelling the driver cancels the tasks.

Every record carries ``node``: the executor, host, and for Ray the node id and address, the GPUs Ray
gave the task and the CPUs it asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from petlprof.errors import UsageError
from petlprof.execution.child import charge_warm_start, execute_in_subprocess, release_signals, worker_env
from petlprof.execution.warm import Runtime, WarmWorker, adopt, forks_from_this_process, keep, serves
from petlprof.lookup import Registry
from petlprof.meters.memory import live_objects_unscanned
from petlprof.results.records import add_overhead
from petlprof.run.execute import failed_record
from petlprof.sweep.spec import RunSpec
from petlprof.vocabulary import LOCAL, RAY

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from petlprof.results.records import NodeFields, RayNode, RayTask, RunRecord

DRIVER_GRACE_S = 120.0  # past --timeout, the driver cancels a task its node failed to stop
CHECK_S = 5.0  # while no task finishes, the driver looks for tasks no live node can take this often
POLL_S = 0.25  # Ray's wait raises a signal (SIGTERM, Ctrl-C) only when it returns: it returns this often
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage report to a server these machines cannot reach
    # Ray starts its workers at nice 15 (its worker_niceness), and a run's process inherits it: beside any other
    # work on the node the run then gets a sliver of a core (a tiny-bert run took minutes instead of 6 s beside
    # two busy processes), and its time and energy figures are the scheduler's, not the method's
    "RAY_worker_niceness": "0",
}

OnStart = Callable[[Any], None]


def node_fields(executor: str, **extra: Unpack[RayNode]) -> NodeFields:
    """Where a run executed (the meters measured this host's devices); ``extra``: where on a Ray cluster."""
    return {
        "executor": executor,
        "hostname": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **extra,
    }


class LocalExecutor:
    """Runs one after the other on this machine."""

    name = LOCAL

    def __init__(
        self,
        *,
        in_process: bool = False,
        timeout_s: float | None = None,
        max_memory_bytes: int | None = None,
        warm: bool = True,
    ):
        self.in_process, self.timeout_s, self.max_memory_bytes = in_process, timeout_s, max_memory_bytes
        self.in_flight: list = []
        self.use_warm = warm and not in_process
        self.warm_worker: WarmWorker | None = None
        self._start_charged = False  # whether a run's record carries the wait for the warm worker's imports

    def describe(self) -> str:
        if self.in_process:
            return "this machine, in this process"
        if self.use_warm:
            return "this machine, a process per run (CPU runs: forked from a warm worker that imports once)"
        return "this machine, a fresh process per run"

    def _warm(self, spec) -> WarmWorker | None:
        """The sweep's warm worker, started at the first run it can serve; None for other runs.  One that
        could not start is kept (``broken``), so its imports are not paid again: runs then take fresh
        interpreters, as before."""

        if not self.use_warm or not serves(spec):
            return None
        self.prestart()  # one try per sweep: a broken one sends runs to fresh interpreters
        assert self.warm_worker is not None
        self.warm_worker.wait_ready()  # held by the executor first, so an interrupt here still closes it
        return self.warm_worker

    def prestart(self, fork: bool = False) -> None:
        """Start the warm worker's imports now, beside the driver's own checks, for CPU runs to come (or take the
        one an earlier sweep of this process kept, ready at once).  ``fork``: this process has computed nothing yet,
        so a process that opted in may fork the worker from itself (:class:`petlprof.execution.warm.WarmWorker`)."""
        if self.use_warm and self.warm_worker is None:
            env = worker_env()
            self.warm_worker = adopt(env) or WarmWorker(env, wait=False, fork_with=_fork_runtime() if fork else None)

    def cluster_gpus(self) -> None:
        """None: devices are checked against what torch sees on this machine."""
        return None

    def prepare_idle(self, device: str, energy_meter: str) -> str:
        # petlprof.meters.idle (numpy): slow to import, loaded only when used
        from petlprof.meters.idle import prepare_sweep_idle

        if self.warm_worker is not None:  # idle power is read with no imports running beside it
            self.warm_worker.wait_ready()
        return prepare_sweep_idle(device, energy_meter)

    def results(self, specs: Iterable, on_start: OnStart | None = None) -> Iterator[tuple[Any, RunRecord]]:
        # looked up at each sweep, not bound at import: tests and plug-ins replace petlprof.run.execute.execute
        from petlprof.run.execute import execute

        for spec in specs:
            self.in_flight = [spec]
            if on_start is not None:
                on_start(spec)
            if self.in_process:
                t0 = time.perf_counter()
                with live_objects_unscanned():
                    record = add_overhead(execute(spec, max_memory_bytes=None), time.perf_counter() - t0)
                record["process"] = "the sweep's own process (--in-process)"
            else:
                warm = self._warm(spec)
                record = execute_in_subprocess(
                    spec, timeout_s=self.timeout_s, max_memory_bytes=self.max_memory_bytes, warm=warm
                )
                if warm is not None and not self._start_charged:  # the first CPU run waited: its overhead
                    self._start_charged = True
                    charge_warm_start(record, warm.start_s or 0.0)  # set by _warm's wait
            record["node"] = node_fields(LOCAL)
            self.in_flight = []
            yield spec, record

    def cancel(self) -> None:
        """Nothing to do: an interrupt stops the run's process inside ``execute_in_subprocess``."""
        self.in_flight = []

    def close(self) -> None:
        if self.warm_worker is not None:
            keep(self.warm_worker)  # for a later sweep of this process; closed at exit (a broken one now)
            self.warm_worker = None


def _fork_runtime() -> Runtime | None:
    """What a warm worker forked from this process runs (the worker's ``preload``, ``run_job`` and
    ``KEEPER``), where this process opted in to forking it (the ``petlprof`` command); None elsewhere, without
    importing them (they import torch)."""
    if not forks_from_this_process():
        return None
    # petlprof.execution.worker (torch): imported only by a process about to import the runtime for its fork
    from petlprof.execution.worker import KEEPER, preload, run_job

    return preload, run_job, KEEPER


def _ray_task(spec_dict: dict, timeout_s: float | None, max_memory_bytes: int | None, cpus: float) -> RunRecord:
    """Body of one Ray task: the run in a process of its own on this node, plus where it ran.  A one-process CPU
    run forks from this Ray worker's warm worker (:func:`_node_warm_worker`), as a local sweep's runs do; other
    runs start a fresh interpreter.  A cancelled task (``ray.cancel``: KeyboardInterrupt in the task) stops the
    run's process before it ends, forked or fresh, and the warm worker stays for the next task."""
    # ray: optional (petlprof[ray])
    import ray

    context = ray.get_runtime_context()
    started = time.time()
    spec = RunSpec(**spec_dict)
    threads = os.environ.get("OMP_NUM_THREADS")
    if spec.nproc > 1:  # Ray sets the task's whole CPU count; torchrun keeps a set value for every rank
        os.environ["OMP_NUM_THREADS"] = str(max(1, int(cpus // spec.nproc)))
    warm = None
    try:
        _prepare_node_idle(spec)  # before the warm worker's imports, which would be read as idle power
        warm = _node_warm_worker(spec)
        if warm is not None:  # held before the wait, so a cancel during the imports still closes it (finally)
            warm.wait_ready()  # a broken one (it could not import) sends the run to a fresh interpreter
        record = execute_in_subprocess(spec, timeout_s=timeout_s, max_memory_bytes=max_memory_bytes, warm=warm)
        if warm is not None and warm.start_s:  # this task started the warm worker and waited for its imports
            charge_warm_start(record, warm.start_s)
        record["node"] = ray_node_fields(
            record,
            os.nice(0),
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            gpu_ids=[str(g) for g in ray.get_gpu_ids()],
            cpus=cpus,
            omp_num_threads_per_rank=os.environ.get("OMP_NUM_THREADS"),
            task_started_unix=started,
        )
    finally:  # this worker runs later tasks: leave its environment, signal mask and warm worker for them
        release_signals()  # execute_in_subprocess holds SIGINT/SIGTERM once the run has finished
        if warm is not None:
            keep(warm)  # serving: kept for this Ray worker's next task (closed at exit); otherwise closed now
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads
    return record


def _node_warm_worker(spec) -> WarmWorker | None:
    """The warm worker of this Ray worker process, for a run it can serve (:func:`petlprof.execution.warm.serves`):
    the one an earlier task kept (:func:`petlprof.execution.warm.adopt`, same environment, ready), else a new one
    whose imports the run waits for (its ``start_s``, charged to the run as a local sweep charges its first run).
    Ray keeps its worker processes for later tasks of the same resources, so a node pays the run's imports once per
    worker process, not once per run.  The warm worker dies with this process (Ray's worker, killed with its task
    or its cluster); its forked runs die with it.  None for runs it cannot serve: they start a fresh interpreter."""
    if not serves(spec):
        return None
    env = worker_env()
    return adopt(env) or WarmWorker(env, wait=False)


def ray_node_fields(record: RunRecord, niceness: int, **extra: Unpack[RayTask]) -> NodeFields:
    """Where a Ray task's run executed, its process's ``niceness`` included; a run that ran below normal
    priority (niceness above 0) also gets the warning of what that does to its figures."""
    if niceness > 0:
        record.setdefault("warnings", []).append(niceness_warning(niceness))
    return node_fields(RAY, niceness=niceness, **extra)


def niceness_warning(niceness: int) -> str:
    """What a run's record says when its process ran below normal priority (a Ray worker's niceness)."""
    return (
        f"the run's process ran at nice {niceness} (the Ray cluster's worker_niceness): any other work on the node "
        "took precedence, so its time and energy figures may be stretched; start the cluster with "
        "RAY_worker_niceness=0 (petlprof does so for the Ray instance it starts)"
    )


def _prepare_node_idle(spec) -> None:
    """The idle baseline of a Ray task, measured where it runs: the GPUs Ray gave the task are its
    own, so their power just before the run is their idle power; a CPU package is shared with the
    node's other tasks, so no CPU idle power is taken (the run then reports gross energy only)."""
    # petlprof.meters.idle (numpy): slow to import, loaded only when used
    from petlprof.meters.idle import IDLE_ENV, prepare_sweep_idle

    if spec.device.startswith("cuda"):
        prepare_sweep_idle(spec.device, spec.energy_meter)
    else:
        os.environ[IDLE_ENV] = json.dumps(
            {
                "seconds": 0,
                "notes": ["no CPU idle power on a Ray node: its CPU package is shared with the node's other tasks"],
            }
        )


class RayExecutor:
    """Runs as Ray tasks, at most as many in flight as the cluster has CPUs and GPUs for."""

    name = RAY

    def __init__(
        self,
        *,
        address: str | None = None,
        timeout_s: float | None = None,
        max_memory_bytes: int | None = None,
        cpus_per_run: float = 1.0,
        retries: int = 0,
        init_kwargs: dict | None = None,
    ):
        try:
            # ray: optional (petlprof[ray])
            import ray
        except ImportError:
            raise UsageError(
                "--executor ray needs Ray on this machine and on every node of the cluster: "
                "pip install 'petlprof[ray]' (from a checkout: pip install -e '.[ray]')"
            ) from None
        self._ray = ray
        self.timeout_s, self.max_memory_bytes = timeout_s, max_memory_bytes
        self.cpus_per_run, self.retries = cpus_per_run, retries
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            for key, value in RAY_ENV.items():
                os.environ.setdefault(key, value)
            kwargs = {"include_dashboard": False, **(init_kwargs or {})}
            if address:
                kwargs["address"] = address
            try:
                ray.init(**kwargs)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise UsageError(
                    f"could not connect to the Ray cluster at '{address or 'a new local instance'}': "
                    f"{' '.join(str(exc).split())[:300]}"
                ) from None
        self._task = ray.remote(_ray_task)
        self._refs: dict = {}  # ObjectRef -> (spec, submitted monotonic time)
        self._unplaceable: dict = {}  # ObjectRef -> monotonic time it was first seen to fit no live node

    @property
    def in_flight(self) -> list:
        """Runs submitted and not yet yielded (recorded ``cancelled`` if the sweep is interrupted)."""
        return [spec for spec, _ in self._refs.values()]

    def describe(self) -> str:
        resources = self._ray.cluster_resources()
        return (
            f"Ray cluster of {len(self._ray.nodes())} node(s), {resources.get('CPU', 0):g} CPU(s), "
            f"{resources.get('GPU', 0):g} GPU(s); {self.cpus_per_run:g} CPU(s) per run"
        )

    def cluster_gpus(self) -> float:
        return float(self._ray.cluster_resources().get("GPU", 0))

    def prepare_idle(self, device: str, energy_meter: str) -> str:
        if device.startswith("cuda"):
            return "idle power is measured by each Ray task on its own GPUs for 2 s before its run"
        return "no idle baseline: a Ray node's CPU package is shared by its tasks (gross energy only)"

    def needs(self, spec) -> tuple[float, int]:
        """(CPUs, GPUs) the run's task asks for: ``--cpus-per-run`` and, on CUDA, one GPU per rank."""
        ranks = max(1, spec.nproc)
        return self.cpus_per_run * ranks, ranks if spec.device.startswith("cuda") else 0

    def _live_nodes(self) -> list[dict]:
        return [n.get("Resources", {}) for n in self._ray.nodes() if n.get("Alive")]

    @staticmethod
    def _fits_somewhere(nodes: list[dict], cpus: float, gpus: int) -> bool:
        return any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes)

    def check_fits(self, specs: list) -> None:
        """A run that asks for more than any one node has would wait forever: refuse it up front."""
        nodes = self._live_nodes()
        for spec in specs:
            cpus, gpus = self.needs(spec)
            if not self._fits_somewhere(nodes, cpus, gpus):
                largest = max(((n.get("CPU", 0), n.get("GPU", 0)) for n in nodes), default=(0, 0))
                raise UsageError(
                    f"run '{spec.method}' (seed {spec.seed}) needs {cpus:g} CPU(s) and {gpus} GPU(s) "
                    f"on one node; the largest node of the Ray cluster has {largest[0]:g} CPU(s) and "
                    f"{largest[1]:g} GPU(s) (see --cpus-per-run, --nproc-per-run)"
                )

    def _capacity(self, specs: list) -> int:
        """Runs that fit side by side, node by node: a task waiting in Ray's queue would otherwise
        count as started (progress, ``in_flight``, the driver's timeout)."""
        cpus = max(self.needs(s)[0] for s in specs)
        gpus = max(self.needs(s)[1] for s in specs)
        fits = 0
        for node in self._live_nodes():
            by_gpu = int(node.get("GPU", 0) // gpus) if gpus else len(specs)
            fits += min(int(node.get("CPU", 0) // cpus), by_gpu)
        return max(1, fits)

    def _submit(self, spec) -> None:
        cpus, gpus = self.needs(spec)
        task = self._task.options(
            num_cpus=cpus,
            num_gpus=gpus,
            max_retries=self.retries,
            retry_exceptions=False,
            name=f"petlprof:{spec.method}:{spec.run_key}",
        )
        ref = task.remote(spec.to_dict(), self.timeout_s, self.max_memory_bytes, cpus)
        self._refs[ref] = (spec, time.monotonic())

    def results(self, specs: Iterable, on_start: OnStart | None = None) -> Iterator[tuple[Any, RunRecord]]:
        pending = list(specs)
        if not pending:
            return
        self.check_fits(pending)
        capacity = self._capacity(pending)
        while pending or self._refs:
            while pending and len(self._refs) < capacity:
                spec = pending.pop(0)
                self._submit(spec)
                if on_start is not None:
                    on_start(spec)
            ready = self._wait()
            if ready:
                spec, _ = self._refs.pop(ready[0])
                self._unplaceable.pop(ready[0], None)
                yield spec, self._record(ready[0], spec)
            yield from self._overdue()
            if not ready:
                yield from self._stranded()

    def _wait(self) -> list:
        """The first finished task, or none by the next check: :data:`CHECK_S` from now, or sooner when a
        task reaches the driver's limit.  Ray's wait is called in slices of :data:`POLL_S`, so a SIGTERM or
        Ctrl-C stops the sweep within that (with one 5 s wait, a signal waited for the wait to end)."""
        until = min(time.monotonic() + CHECK_S, self._next_limit())
        with _signals_surface():
            while True:
                left = until - time.monotonic()
                ready = self._ray.wait(list(self._refs), num_returns=1, timeout=max(0.0, min(POLL_S, left)))[0]
                if ready or left <= POLL_S:
                    return ready

    def _limit_s(self) -> float | None:
        """Seconds from submission after which the driver cancels a task: (retries + 1) x (``--timeout`` +
        grace); None without ``--timeout``."""
        return None if self.timeout_s is None else (self.retries + 1) * (self.timeout_s + DRIVER_GRACE_S)

    def _next_limit(self) -> float:
        """The monotonic time the first task in flight passes the driver's limit (infinity without one)."""
        limit = self._limit_s()
        if limit is None or not self._refs:
            return float("inf")
        return min(submitted for _, submitted in self._refs.values()) + limit

    def _drop(self, ref) -> Any:
        self._ray.cancel(ref, force=True)
        self._unplaceable.pop(ref, None)
        return self._refs.pop(ref)[0]

    def _overdue(self) -> Iterator[tuple[Any, RunRecord]]:
        """Tasks past (retries + 1) × (``--timeout`` + grace) since submission: the node did not end
        them (hung, or lost without Ray noticing): cancel and record them."""

        limit = self._limit_s()
        if limit is None:
            return
        now = time.monotonic()
        for ref, (spec, submitted) in list(self._refs.items()):
            if now - submitted > limit:
                self._drop(ref)
                yield (
                    spec,
                    failed_record(
                        spec,
                        f"the Ray task did not return within {limit:g} s ((retries + 1) x "
                        f"(--timeout {self.timeout_s:g} s + {DRIVER_GRACE_S:g} s)) and was cancelled "
                        "by the driver",
                        status="timeout",
                        node=node_fields(RAY, node_id=None, lost=True),
                    ),
                )

    def _stranded(self) -> Iterator[tuple[Any, RunRecord]]:
        """Tasks that no live node can take (their node was lost and none like it is left): after
        :data:`DRIVER_GRACE_S` (time for a node to come back), cancel and record them ``failed``
        instead of waiting forever."""

        nodes = self._live_nodes()
        now = time.monotonic()
        for ref, (spec, _) in list(self._refs.items()):
            cpus, gpus = self.needs(spec)
            if self._fits_somewhere(nodes, cpus, gpus):
                self._unplaceable.pop(ref, None)
                continue
            since = self._unplaceable.setdefault(ref, now)
            if now - since > DRIVER_GRACE_S:
                self._drop(ref)
                yield (
                    spec,
                    failed_record(
                        spec,
                        f"no live node of the Ray cluster has the {cpus:g} CPU(s) and {gpus} "
                        f"GPU(s) this run needs (for {DRIVER_GRACE_S:g} s): the node(s) that had them "
                        "were lost",
                        node=node_fields(RAY, node_id=None, lost=True),
                    ),
                )

    def _record(self, ref, spec) -> RunRecord:

        try:
            with _signals_surface():
                return self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as exc:  # petlprof's task code raised on the node
            cause = exc.cause if exc.cause is not None else exc
            text = f"{type(cause).__name__}: {' '.join(str(cause).split())}"
            return failed_record(
                spec, f"the Ray task raised on its node: {text[:500]}", node=node_fields(RAY, node_id=None)
            )
        except self._ray.exceptions.RayError as exc:  # worker or node lost, task cancelled, ...
            text = " ".join(str(exc).split())
            tried = f" (tried {self.retries + 1} times)" if self.retries else ""
            memory = isinstance(exc, self._ray.exceptions.OutOfMemoryError)  # Ray's memory monitor killed it
            return failed_record(
                spec,
                f"the Ray task was lost{tried}: {type(exc).__name__}: {text[:500]}",
                status="oom" if memory else "failed",
                node=node_fields(RAY, node_id=None, lost=True),
            )

    def cancel(self) -> None:
        """Cancel the tasks in flight; ``force`` kills each task's worker, and the run's process
        dies with it (the worker sets PR_SET_PDEATHSIG)."""
        for ref in list(self._refs):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # an already finished task: nothing to cancel
                pass
        self._refs.clear()
        self._unplaceable.clear()

    def close(self) -> None:
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()


@contextlib.contextmanager
def _signals_surface():
    """A signal handler that raises while Ray's C++ code checks for signals (the sweep's SIGTERM
    handler, Ctrl-C) surfaces as a SystemError whose cause is the real exception: re-raise that, so
    the sweep records the cancel."""
    try:
        yield
    except SystemError as exc:
        if isinstance(exc.__cause__, BaseException) and not isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None
        raise


EXECUTOR_KINDS: Registry[type] = Registry("executor", {LOCAL: LocalExecutor, RAY: RayExecutor})


def make_executor(
    name: str,
    *,
    address: str | None = None,
    in_process: bool = False,
    timeout_s: float | None = None,
    max_memory_bytes: int | None = None,
    retries: int = 0,
    cpus_per_run: float = 1.0,
):
    """The executor ``name`` (one of :data:`petlprof.vocabulary.EXECUTORS`), given the options it takes."""
    cls = EXECUTOR_KINDS.get(name)  # an unknown name: the registry's error, naming the choices
    if cls is RayExecutor:  # a cluster's: where it is, what a run asks of it, how often a lost run is retried
        return RayExecutor(
            address=address,
            timeout_s=timeout_s,
            max_memory_bytes=max_memory_bytes,
            cpus_per_run=cpus_per_run,
            retries=retries,
        )
    return cls(in_process=in_process, timeout_s=timeout_s, max_memory_bytes=max_memory_bytes)
