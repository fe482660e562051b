"""One run = (backbone, task, method + hyper-parameters, seed): execute it and return its record.

:func:`execute` runs in the current process and never raises for a failure inside the run: the
record says ``failed`` (or ``oom``) with the error text.  :func:`execute_in_subprocess` runs the
same thing in a fresh Python process (the default), so peak-memory figures start clean and a
crash — even a segfault or the kernel's OOM killer — becomes a ``failed`` record instead of
taking the sweep down.  The child's progress bars pass through to the terminal.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from petlprof.spec import BUDGET_FIELDS, RunSpec, spec_identity  # noqa: F401  (re-exported)

SCHEMA_VERSION = 1


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _base_record(spec: RunSpec) -> dict[str, Any]:
    """What every record holds, a failed one too: the run, its method's knob and the fields changed
    from the method's defaults (so a failed configuration reads like its finished seeds)."""
    from petlprof.errors import UsageError
    from petlprof.registry import get_method

    try:
        method = get_method(spec.method)
        name, knob, defaults = method.name, method.pareto_knob, dataclasses.asdict(method.config_cls())
    except UsageError:  # an unknown method: its run fails, and the record says why
        name, knob, defaults = spec.method, None, {}
    config = {**defaults, **spec.method_config}
    return {
        "schema_version": SCHEMA_VERSION,
        "run_key": spec.run_key,
        "status": "failed",
        "error": None,
        "method": name,  # the spec's name, also for a plug-in given as module:ATTR (spec.method says so)
        "method_config": config,
        "method_config_changed": sorted(k for k in config if k not in defaults or config[k] != defaults[k]),
        "pareto_knob": knob,
        "backbone": spec.backbone,
        "task": spec.task,
        "seed": spec.seed,
        "spec": spec.to_dict(),
        "started_at": _now(),
    }


def failed_record(spec: RunSpec, error: str, status: str = "failed", **fields: Any) -> dict[str, Any]:
    """The record of a run that gave no record of its own (its process or node was lost, ...)."""
    record = _base_record(spec)
    record.update(status=status, error=error, finished_at=_now(), **fields)
    return record


def cancelled_record(spec: RunSpec, signal_name: str) -> dict[str, Any]:
    """The record of a run stopped by the user; ``petlprof run`` retries it on resume."""
    return failed_record(spec, f"stopped by {signal_name}; not finished", status="cancelled")


def execute(spec: RunSpec, max_memory_bytes: int | None = None) -> dict[str, Any]:
    """Run one spec in this process; always returns a record (status ``ok``, ``failed`` or ``oom``).

    ``max_memory_bytes`` caps what the run may allocate beyond the imported runtime (CUDA: a
    per-process memory fraction; CPU: the address-space limit of this process, so use it in a
    worker process only).  A KeyboardInterrupt is not caught: the caller records ``cancelled``.
    A run of ``spec.nproc`` > 1 ranks executes here only as one rank started by torchrun (see
    :mod:`petlprof.distributed`), else this raises a UsageError; rank 0's record is the run's.
    """
    from petlprof import distributed
    from petlprof.train import PROGRESS

    ranks = distributed.rank_context(spec.nproc)
    record = _base_record(spec)
    PROGRESS.update(phase="setup", step=None)
    t0 = time.perf_counter()
    try:
        record.update(_execute(spec, max_memory_bytes, ranks))
        record["status"] = "ok"
    except Exception as exc:  # a failed run is a result, not a crash of the sweep
        record["status"] = "oom" if _is_oom(exc) else "failed"
        record["error"] = f"{type(exc).__name__}: {exc}".strip()
        record["traceback"] = traceback.format_exc(limit=20)
        try:
            record["failed_at"] = {**PROGRESS, **_memory_now(spec.device)}
        except Exception:  # the figures at failure are a bonus; the record must come back
            record["failed_at"] = dict(PROGRESS)
    if record["status"] == "ok":  # a failed rank exits without the collective teardown (petlprof.worker)
        distributed.destroy()
    record["finished_at"] = _now()
    record["wall_time_s"] = time.perf_counter() - t0
    from petlprof.envinfo import environment

    try:
        record["env"] = environment(spec.device)
    except Exception as exc:  # provenance must never cost a finished result
        record["env"] = {"error": f"{type(exc).__name__}: {exc}"}
    return record


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text


def _memory_now(device: str) -> dict[str, Any]:
    """Memory figures at the moment of a failure (bytes)."""
    from petlprof.meters.memory import status_bytes

    figures = {"rss_bytes": status_bytes("VmRSS"), "peak_rss_bytes": status_bytes("VmHWM")}
    if device.startswith("cuda"):
        import torch

        figures.update(
            cuda_allocated_bytes=int(torch.cuda.memory_allocated(device)),
            cuda_peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
        )
    return figures


def _cap_memory(device: str, max_memory_bytes: int) -> None:
    if device.startswith("cuda"):
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, max_memory_bytes / total), device)
        return
    import resource

    import torch

    from petlprof.meters.memory import status_bytes

    # start the OpenMP thread pool first: thread stacks are address space, and a pool that cannot
    # start under the cap aborts the process instead of raising
    torch.mm(torch.ones(512, 512), torch.ones(512, 512))
    address_space = status_bytes("VmSize") or 0
    resource.setrlimit(resource.RLIMIT_AS, (address_space + max_memory_bytes, resource.RLIM_INFINITY))


def _execute(spec: RunSpec, max_memory_bytes: int | None, ranks=None) -> dict[str, Any]:
    """The run's record fields; ``ranks``: this process's :class:`~petlprof.distributed.RankContext` in
    a run of several ranks (rank 0 returns the aggregated record, the others only their own part)."""
    # library code is imported before the memory baseline: it is the runtime's memory, not the run's
    import datasets  # noqa: F401
    import pandas  # noqa: F401
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401

    from petlprof import distributed
    from petlprof.backbones import check_shape, load_backbone
    from petlprof.budget import make_budget
    from petlprof.errors import UsageError
    from petlprof.inference import measure_inference, target_window_s
    from petlprof.meters import energy_meter_for, extra_meters_for, memory_meter_for, start_power_timeline
    from petlprof.meters.idle import sweep_idle
    from petlprof.meters.memory import release_free_memory, rss_bytes, static_breakdown
    from petlprof.modeling import SequenceClassifier
    from petlprof.registry import get_method
    from petlprof.tasks import load_task
    from petlprof.train import Batches, evaluate, train

    key = spec.run_key + (f"-rank{ranks.rank}" if ranks is not None else "")
    if ranks is not None:  # each rank on its own device; the process group is runtime, not the run
        spec = dataclasses.replace(spec, device=ranks.device(spec.device))
        backend = distributed.init(spec.device)
    release_free_memory()
    runtime_baseline = rss_bytes()  # Python + torch/transformers/peft code, before any model or data exists
    if max_memory_bytes is not None:
        _cap_memory(spec.device, max_memory_bytes)
    method = get_method(spec.method)
    method_config = method.make_config(spec.method_config)
    lr = spec.lr if spec.lr is not None else method.default_lr
    task = load_task(
        spec.task,
        train_size=spec.train_size,
        eval_size=spec.eval_size,
        data_dir=spec.data_dir,
        text_column=spec.text_column,
        text_pair_column=spec.text_pair_column,
        label_column=spec.label_column,
    )
    torch.manual_seed(spec.seed)
    backbone = load_backbone(spec.backbone, num_layers=spec.num_layers, seed=spec.seed)
    check_shape(spec.backbone, backbone.config, max_length=spec.max_length)
    classifier = SequenceClassifier(backbone, task.num_labels)
    model = method.build()(classifier, method_config).to(spec.device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())

    def make(split):
        return Batches.from_split(
            split,
            backbone.tokenizer,
            spec.batch_size,
            spec.max_length,
            task.is_regression,
        )

    train_batches, eval_batches = make(task.train), make(task.eval)
    timeline_warnings = []
    try:  # GPU power sampled in its own process; None off CUDA
        timeline = start_power_timeline(spec.device, spec.energy_meter)
    except Exception as error:  # the energy counter still measures; only the timeline is missing
        timeline = None
        timeline_warnings.append(
            f"the NVML power timeline did not start ({type(error).__name__}: {error}): "
            "energy comes from the counter alone, integrated power is missing"
        )
    breakdown = static_breakdown(model)

    def meters(phase: str) -> list:
        """Extra meters first: a window begins meters in order and ends them in reverse, so CodeCarbon's
        start and stop (and the tensor tracker's) fall outside the energy and memory readings."""
        resident = breakdown["total_bytes"] - breakdown["gradients_bytes"]  # tensors alive as a window opens
        resident -= breakdown["optimizer_state_bytes"] if phase != "train" else 0
        snapshot = f"{spec.memory_snapshot_dir}/{key}-{phase}.pickle" if spec.memory_snapshot_dir else None
        return [
            *extra_meters_for(spec.extra_meters, spec.device, country_code=spec.country_code, resident_bytes=resident),
            memory_meter_for(spec.device, runtime_baseline, snapshot),
            energy_meter_for(spec.device, spec.energy_meter, timeline, idle=sweep_idle()),
        ]

    label = f"{spec.method} s{spec.seed}"
    train_meters, eval_meters = meters("train"), meters("eval")
    cache = None
    if spec.cache_hidden_states:
        from petlprof.cache import DEFAULT_BUDGET_BYTES, HiddenStateCache

        if not method.side_tuning:
            raise UsageError(
                f"--cache-hidden-states needs a side-tuning method; '{spec.method}' back-propagates "
                "through its backbone"
            )
        if ranks is not None:
            raise UsageError(
                f"--cache-hidden-states cannot be used with --nproc-per-run {spec.nproc}: a cached step "
                "runs the side network outside DistributedDataParallel, so its gradients would not be "
                "averaged over the ranks"
            )
        cache = HiddenStateCache(
            spec.cache_budget_bytes if spec.cache_budget_bytes is not None else DEFAULT_BUDGET_BYTES,
            spec.cache_dir,
            spec.cache_dtype,
        )
    budget = make_budget(spec, task, model, make)  # stop at a target metric value or a maximum time
    stop = distributed.agreed_stop(budget) if ranks is not None and budget is not None else budget
    try:
        if budget is not None:
            budget.start()
        train_phase = train(
            model if ranks is None else distributed.wrap(model, spec.device),
            train_batches,
            epochs=spec.epochs,
            max_steps=spec.max_steps,
            lr=lr,
            seed=spec.seed,
            device=spec.device,
            meters=train_meters,
            warmup_steps=spec.warmup_steps,
            desc=f"{label} train",
            cache=cache,
            stop=stop,
            ranks=ranks,
        )
        eval_phase, preds, golds = evaluate(
            model,
            eval_batches,
            device=spec.device,
            meters=eval_meters,
            warmup_steps=spec.warmup_steps,
            desc=f"{label} eval",
            ranks=ranks,
        )
        for phase in (train_phase, eval_phase):
            phase["warnings"] = timeline_warnings + phase["warnings"]
        if ranks is not None:
            per_rank = distributed.gather({**ranks.describe(spec.device), "train": train_phase, "eval": eval_phase})
            if not ranks.is_main:  # rank 0 alone measures the per-device phases and writes the record
                distributed.done()
                return {"distributed": {"rank": ranks.rank, "world_size": ranks.world_size}}
            aggregated = distributed.aggregate_ranks(per_rank)
            train_phase, eval_phase = aggregated["train"], aggregated["eval"]
        if budget is not None:
            train_phase["budget"] = budget.summary(train_phase)
        inference_phase = measure_inference(
            model,
            eval_batches,
            device=spec.device,
            batch_sizes=[1, spec.batch_size],
            make_meters=lambda size: meters(f"inference-batch{size}"),
            warmup_steps=spec.warmup_steps,
            min_window_s=target_window_s(eval_phase.get("energy_kind"), spec.inference_window_s),
        )
    finally:
        for meter in train_meters + eval_meters:
            meter.close()
        if cache is not None:
            cache.close()
        if timeline is not None and ranks is not None and not ranks.is_main:
            timeline.stop()
    merged = (
        _evaluate_merged(method, model, eval_batches, preds, spec, meters("eval_merged"), label)
        if method.merge
        else None
    )
    if timeline is not None:  # on a failure the sampler stops when ``timeline`` is collected
        timeline.stop()
    if ranks is not None:
        distributed.done()
        inference_phase["measured_on"] = f"rank 0 alone ({spec.device}): a per-device figure"
        if merged is not None:
            merged["measured_on"] = f"rank 0 alone ({spec.device}), the whole evaluation split: a per-device figure"
    return {
        "method_config": dataclasses.asdict(method_config),
        "backbone_info": backbone.info(),
        "task_info": {
            "num_labels": task.num_labels,
            "label_names": task.label_names,
            "train_samples": len(task.train),
            "eval_samples": len(task.eval),
            "description": task.description,
        },
        "primary_metric": task.primary_metric,
        "training": {
            "epochs": spec.epochs,
            "max_steps": spec.max_steps,
            "batch_size": spec.batch_size,
            "lr": lr,
            "lr_source": method.lr_source if lr == method.default_lr else "user",
            "max_length": spec.max_length,
            "warmup_steps": spec.warmup_steps,
            "device": spec.device,
            "optimizer": "AdamW(weight_decay=0.01 on matrices, 0 on biases/norms)",
            "schedule": "linear, 6% warm-up",
            "precision": str(next(model.parameters()).dtype).removeprefix("torch."),
        },
        "trainable_params": trainable,
        "total_params": total,
        "metrics": task.compute_metrics(preds, golds),
        "train": train_phase,
        "eval": eval_phase,
        "inference": inference_phase,
        "memory_breakdown": breakdown,
        "idle_baseline": sweep_idle() or None,
        **({"eval_merged": merged} if merged is not None else {}),
        **(
            {"distributed": distributed.summary(ranks, backend, spec.batch_size, aggregated["nodes"], per_rank)}
            if ranks is not None
            else {}
        ),
    }


def _evaluate_merged(method, model, eval_batches, preds, spec: RunSpec, meters: list, label: str) -> dict[str, Any]:
    """Phase ``eval_merged``: the same evaluation after the method folds its weights into the backbone.

    Also records the fraction of predictions equal to the unmerged ones.  A merge that fails is
    recorded as this phase's error; the unmerged results stand.
    """
    import numpy as np

    from petlprof.train import evaluate

    try:
        merged_model = method.build_merge()(model)
        phase, merged_preds, _ = evaluate(
            merged_model,
            eval_batches,
            device=spec.device,
            meters=meters,
            warmup_steps=spec.warmup_steps,
            desc=f"{label} eval merged",
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}".strip()}
    finally:
        for meter in meters:
            meter.close()
    phase["predictions_agree_fraction"] = float(np.isclose(merged_preds, preds, rtol=1e-3, atol=1e-4).mean())
    return phase


def execute_in_subprocess(
    spec: RunSpec, *, timeout_s: float | None = None, max_memory_bytes: int | None = None
) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter and return its record.

    A crash becomes ``failed`` (``oom`` when the kernel killed it), a run past ``timeout_s`` is
    killed and recorded ``timeout``.  If this process is interrupted (KeyboardInterrupt, or the
    exception a SIGTERM handler raises), the child is stopped before the exception propagates; the
    child also dies with this process if it is killed outright.  A run of ``spec.nproc`` > 1 ranks
    runs under torchrun (:func:`petlprof.distributed.launch`); when a rank fails, the record names the
    rank and its cause.
    """
    with tempfile.TemporaryDirectory(prefix="petlprof-run-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "record.json"
        spec_path.write_text(json.dumps({"spec": spec.to_dict(), "max_memory_bytes": max_memory_bytes}))
        ranks = ["--nproc", str(spec.nproc)] if spec.nproc > 1 else []
        cmd = [sys.executable, "-m", "petlprof.worker", *ranks, str(spec_path), str(out_path)]
        t0 = time.perf_counter()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PETLPROF_PARENT_PID": str(os.getpid())}
        proc, tail = None, bytearray()
        try:
            proc = subprocess.Popen(cmd, stdout=None, stderr=subprocess.PIPE, env=env)
            pump = threading.Thread(target=_forward, args=(proc.stderr, tail), daemon=True)
            pump.start()
            returncode = proc.wait(timeout=timeout_s)
            hold_signals()  # the run is finished: a Ctrl-C now must not cost its record
        except subprocess.TimeoutExpired:
            _stop(proc)
            pump.join(5)
            return failed_record(
                spec,
                f"run exceeded --timeout {timeout_s:g} s and was killed",
                status="timeout",
                wall_time_s=time.perf_counter() - t0,
            )
        except BaseException:
            if proc is not None:
                _stop(proc)
            raise
        pump.join(5)
        if out_path.exists():
            return json.loads(out_path.read_text())
        text = tail.decode(errors="replace").strip().splitlines()
        if spec.nproc > 1:  # a failed rank left its record, or torchrun its exit code
            from petlprof.distributed import read_failure

            if (fields := read_failure(out_path, spec.nproc)) is not None:
                return failed_record(
                    spec,
                    fields.pop("error"),
                    fields.pop("status"),
                    **fields,
                    stderr_tail="\n".join(text[-30:]),
                    wall_time_s=time.perf_counter() - t0,
                )
        killed = returncode in (-9, 137) or (max_memory_bytes is not None and _memory_words(text))
        reason = f"worker ended with code {returncode}" + (" (out of memory?)" if killed else "")
        return failed_record(
            spec,
            f"{reason}: {text[-1] if text else 'no output'}",
            status="oom" if killed else "failed",
            stderr_tail="\n".join(text[-30:]),
            wall_time_s=time.perf_counter() - t0,
        )


_HELD = {signal.SIGINT, signal.SIGTERM}


def hold_signals() -> None:
    """Defer SIGINT/SIGTERM (main thread only) until :func:`release_signals`, e.g. while a finished
    run's record is being stored."""
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)


def release_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


def _memory_words(lines: list[str]) -> bool:
    """The last lines of a dead worker speak of memory or of resources the memory cap denied."""
    text = " ".join(lines[-5:]).lower()
    return any(w in text for w in ("memory", "resource temporarily unavailable", "cannot allocate"))


def _forward(stream, tail: bytearray) -> None:
    """Copy the child's stderr (progress bars) to ours, keeping the last 8 kB for error records."""
    raw = getattr(sys.stderr, "buffer", None)  # notebooks' stderr takes text only
    while chunk := stream.read1(4096):
        if raw is not None:
            raw.write(chunk)
        else:
            sys.stderr.write(chunk.decode(errors="replace"))
        sys.stderr.flush()
        tail[:] = (tail + chunk)[-8000:]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
