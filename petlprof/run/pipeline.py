"""The steps of one run, in order: :func:`prepare` -> :class:`RunContext`, :func:`run_phases` ->
:class:`Phases`, :func:`to_record` -> the record's fields.

:func:`petlprof.run.execute.execute` calls them and turns an exception into a failed record.  ``prepare``
joins the ranks' process group (nothing for one process), caps memory, loads the data and the model
with its method applied, and sets up the meters, the hidden-state cache and the budget;
``run_phases`` trains, evaluates, measures inference and evaluates the merged model; ``to_record``
assembles the fields of :class:`petlprof.results.records.RunRecord`, the training recipe's description taken
from the same :class:`~petlprof.run.recipe.TrainRecipe` the loop trained by.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from petlprof.errors import StatusLine, UsageError
from petlprof.meters import (
    contention_meters,
    energy_meter_for,
    extra_meters_for,
    memory_meter_for,
    start_power_timeline,
)
from petlprof.meters.memory import release_free_memory, rss_bytes, static_breakdown, status_bytes
from petlprof.method_api import check_objective, check_quantize
from petlprof.models.backbones import check_shape, load_backbone
from petlprof.models.quantization import Quantization, parameter_count
from petlprof.registry import get_method
from petlprof.results.figures import BREAKDOWN_GRADIENTS, BREAKDOWN_OPTIMIZER_STATE, BREAKDOWN_TOTAL, ENERGY, TIME
from petlprof.results.records import (
    DIVERGED,
    OK,
    Divergence,
    EvalPhase,
    Example,
    Generation,
    Inference,
    Load,
    Phase,
    RunPhases,
    RunRecord,
    TaskInfo,
    Training,
    TrainPhase,
    safetensors_bytes,
)
from petlprof.run import kept
from petlprof.run.budget import make_budget
from petlprof.run.libraries import import_runtime_libraries
from petlprof.run.recipe import TrainRecipe, prepare_model
from petlprof.sweep.spec import RunSpec
from petlprof.vocabulary import ADAMW, CLASSIFICATION, LM, LR

# what prepare imports before it takes the run's memory baseline (the warm worker imports the same)


def _cap_memory(device: str, max_memory_bytes: int) -> None:
    if device.startswith("cuda"):
        # torch: kept off the sweep's driver, which imports this module
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, max_memory_bytes / total), device)
        return

    # torch: kept off the sweep's driver, which imports this module
    import torch

    # start the OpenMP thread pool first: thread stacks are address space, and a pool that cannot
    # start under the cap aborts the process instead of raising
    torch.mm(torch.ones(512, 512), torch.ones(512, 512))
    address_space = status_bytes("VmSize") or 0
    resource.setrlimit(resource.RLIMIT_AS, (address_space + max_memory_bytes, resource.RLIM_INFINITY))


# --- step 1: prepare -------------------------------------------------------------------------------


class MeterFactory:
    """The meters of one phase's window, made fresh for each phase.

    Extra meters come first: a window begins meters in order and ends them in reverse, so CodeCarbon's
    start and stop (and the tensor tracker's) fall outside the energy and memory readings."""

    def __init__(self, spec: RunSpec, key: str, runtime_baseline: int | None, breakdown: dict[str, int], timeline):
        self.spec, self.key, self.runtime_baseline = spec, key, runtime_baseline
        self.breakdown, self.timeline = breakdown, timeline

    def __call__(self, phase: str) -> list:
        # petlprof.meters.idle (numpy): kept off the sweep's driver, which imports this module
        from petlprof.meters.idle import sweep_idle

        spec, breakdown = self.spec, self.breakdown
        resident = breakdown[BREAKDOWN_TOTAL] - breakdown[BREAKDOWN_GRADIENTS]  # tensors alive as a window opens
        resident -= breakdown[BREAKDOWN_OPTIMIZER_STATE] if phase != "train" else 0
        snapshot = f"{spec.memory_snapshot_dir}/{self.key}-{phase}.pickle" if spec.memory_snapshot_dir else None
        return [
            *extra_meters_for(spec.extra_meters, spec.device, country_code=spec.country_code, resident_bytes=resident),
            memory_meter_for(spec.device, self.runtime_baseline, snapshot),
            energy_meter_for(spec.device, spec.energy_meter, self.timeline, idle=sweep_idle()),
            *contention_meters(),  # last: it starts after and stops before the others, around the work alone
        ]


@dataclass
class RunContext:
    """Everything a run's phases need, set up by :func:`prepare`."""

    spec: RunSpec  # with this rank's device
    ranks: Any  # petlprof.run.ranks.OneProcess or RankContext
    backend: str | None  # the process group's, None for one process
    progress: Any  # petlprof.run.train.Progress
    method: Any  # petlprof.registry.MethodSpec
    method_config: Any
    recipe: TrainRecipe
    task: Any
    backbone: Any
    model: Any
    trainable_params: int
    total_params: int
    checkpoint_bytes: int  # taken before training: a merge may fold the trainable tensors away; sizes do not change
    make_batches: Callable
    train_batches: Any
    eval_batches: Any
    breakdown: dict[str, int]
    meters: MeterFactory
    timeline: Any  # petlprof.meters.power.PowerTimeline or None
    timeline_warnings: list[str]
    cache: Any  # petlprof.run.cache.HiddenStateCache or None
    budget: Any  # petlprof.run.budget.Budget or None
    load: Load  # how long the data, backbone and method took to load, and where the backbone came from

    @property
    def label(self) -> str:
        return f"{self.method.name} s{self.spec.seed}"  # the spec's name, also for a plug-in given as module:ATTR

    def io(self, phase: str, meters: list):
        """Where a phase reports: its device, meters, progress bar label and the run's progress."""
        # petlprof.run.train (torch): kept off the sweep's driver, which imports this module
        from petlprof.run.train import PhaseIO

        return PhaseIO(self.spec.device, meters, f"{self.label} {phase}", self.progress)


def prepare(spec: RunSpec, ranks, progress, max_memory_bytes: int | None = None) -> RunContext:
    """Join the ranks' group, cap memory, load the data and the model with its method applied, and set
    up the meters, the hidden-state cache and the budget."""
    # library code is imported before the memory baseline: it is the runtime's memory, not the run's
    import_runtime_libraries()
    # torch: kept off the sweep's driver, which imports this module
    import torch

    spec = dataclasses.replace(spec, device=ranks.device(spec.device))  # each rank on its own device
    backend = ranks.join(spec.device)  # the process group is runtime, not the run
    if spec.device.startswith("cuda:"):  # work and CUDA events with no device named go to the run's GPU, not GPU 0
        torch.cuda.set_device(spec.device)
    release_free_memory()
    # Python + torch/transformers/peft code, before any model or data exists (less a backbone inherited from the warm
    # worker, which a fresh process would read after this point)
    runtime_baseline = rss_bytes()
    runtime_baseline = None if runtime_baseline is None else runtime_baseline - kept.inherited_bytes()
    if max_memory_bytes is not None:
        _cap_memory(spec.device, max_memory_bytes)
    method, method_config, task, backbone, model, load = _load(spec, shown=ranks.is_main)
    timeline, timeline_warnings = _start_timeline(spec)
    breakdown = static_breakdown(model, spec.optimizer != ADAMW)
    make_batches = _batches(spec, task, backbone)

    return RunContext(
        spec=spec,
        ranks=ranks,
        backend=backend,
        progress=progress,
        method=method,
        method_config=method_config,
        recipe=_recipe(spec, method, task.objective),
        task=task,
        backbone=backbone,
        model=model,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        total_params=parameter_count(model),  # a 4-bit weight counted as its weights, not its packed bytes
        checkpoint_bytes=checkpoint_bytes(model),
        make_batches=make_batches,
        train_batches=make_batches(task.train),
        eval_batches=make_batches(task.eval),
        breakdown=breakdown,
        meters=MeterFactory(spec, spec.run_key + ranks.key_suffix(), runtime_baseline, breakdown, timeline),
        timeline=timeline,
        timeline_warnings=timeline_warnings,
        cache=_hidden_state_cache(spec, method, ranks),
        budget=make_budget(spec, task, model, make_batches, _budget_meter(spec, timeline)),  # checks, target, time
        load=load,
    )


def _budget_meter(spec: RunSpec, timeline) -> Callable[[], Any]:
    """What makes the budget's energy meters (around the checks, around the training between them): the same
    kind as the phases'."""

    def make():
        # petlprof.meters.idle (numpy): kept off the sweep's driver, which imports this module
        from petlprof.meters.idle import sweep_idle

        return energy_meter_for(spec.device, spec.energy_meter, timeline, idle=sweep_idle())

    return make


def _recipe(spec: RunSpec, method, objective: str):
    """The run's optimiser settings: its learning rate is the spec's, or the method's default on ``objective``."""
    return TrainRecipe(
        lr=spec.lr if spec.lr is not None else method.lr_for(objective)[0],
        precision=spec.precision,
        optimizer_kind=spec.optimizer,
        accumulation=spec.gradient_accumulation,
    )


def _load(spec: RunSpec, shown: bool = True) -> tuple:
    """(method, its config, task, backbone, model, what loading them took): the data and the backbone with the
    method applied.
    A language-modelling task (``task.objective == "lm"``) loads the backbone with its own LM head and
    applies the method to a :class:`~petlprof.models.classifier.LanguageModel`; any other, a classifier.
    ``shown``: whether the loading's status line is this process's to show (rank 0's of several)."""
    # torch, petlprof.models.classifier, petlprof.tasks.labelled: kept off the sweep's driver, which imports this module
    import torch

    from petlprof.models.classifier import trainable_model
    from petlprof.tasks.labelled import load_task

    start = time.perf_counter()
    method = get_method(spec.method)
    check_quantize(method, spec.quantize)  # `petlprof run` refuses it before any run; this guards a direct caller
    method_config = method.make_config(spec.method_config)
    task = load_task(
        spec.task,
        train_size=spec.train_size,
        eval_size=spec.eval_size,
        val_size=spec.val_size,
        val_file=spec.val_file,
        data_dir=spec.data_dir,
        text_column=spec.text_column,
        text_pair_column=spec.text_pair_column,
        label_column=spec.label_column,
        objective=spec.objective,
        prompt_column=spec.prompt_column,
        target_column=spec.target_column,
        chat_template=spec.chat_template,
    )
    check_objective(method, task.objective if task.objective == LM else CLASSIFICATION)  # regression: a head too
    torch.manual_seed(spec.seed)
    lm = task.objective == LM
    with StatusLine(f"{method.name} s{spec.seed} load: backbone {spec.backbone}", shown=shown):  # one rank's line
        t0 = time.perf_counter()
        taken = kept.take(spec)  # read once by the sweep's warm worker, or by this process now
        backbone = (
            taken.backbone
            if taken is not None
            else load_backbone(
                spec.backbone,
                num_layers=spec.num_layers,
                seed=spec.seed,
                random_init=spec.random_init,
                lm_head=lm,
                quantization=Quantization.of(spec),
                device=spec.device,
            )
        )
        charged_s = 0.0 if taken is None else taken.charged_s  # the warm worker's reading for this run
        backbone_s = time.perf_counter() - t0 + charged_s
        backbone_from = kept.not_kept() if taken is None else taken.source
        check_shape(spec.backbone, backbone.config, max_length=spec.max_length)
        model = trainable_model(backbone, task.objective, task.num_labels, method, method_config).to(spec.device)
        prepare_model(model, spec.weights_dtype, spec.gradient_checkpointing)
    load = Load(time_s=time.perf_counter() - start + charged_s, backbone_s=backbone_s, backbone_from=backbone_from)
    return method, method_config, task, backbone, model, load


def _batches(spec: RunSpec, task, backbone) -> Callable:
    """The batch maker of a run's splits: classification batches, or prompt/target batches for the LM objective."""

    def make_batches(split):
        if task.objective == LM:
            # petlprof.run.lm_batches (torch): kept off the sweep's driver, which imports this module
            from petlprof.run.lm_batches import LMBatches

            return LMBatches.from_split(
                split,
                backbone.tokenizer,
                spec.batch_size,
                spec.max_length,
                backbone.family,
                chat_template=spec.chat_template != "none",
            )
        # petlprof.run.train (torch): kept off the sweep's driver, which imports this module
        from petlprof.run.train import Batches

        return Batches.from_split(split, backbone.tokenizer, spec.batch_size, spec.max_length, task.is_regression)

    return make_batches


def _start_timeline(spec: RunSpec) -> tuple[Any, list[str]]:
    """The GPU power timeline, sampled in its own process (None off CUDA), and a warning if it did not start."""

    try:
        return start_power_timeline(spec.device, spec.energy_meter), []
    except Exception as error:  # the energy counter still measures; only the timeline is missing
        return None, [
            f"the NVML power timeline did not start ({type(error).__name__}: {error}): "
            "energy comes from the counter alone, integrated power is missing"
        ]


def _hidden_state_cache(spec: RunSpec, method, ranks):
    """The side-tuning cache the spec asks for, or None.  ``petlprof run`` refuses these cases before
    any run; this guards a direct caller of :func:`execute` with a spec that would train wrongly."""
    if not spec.cache_hidden_states:
        return None
    # petlprof.run.cache (torch): kept off the sweep's driver, which imports this module
    from petlprof.run.cache import DEFAULT_BUDGET_BYTES, HiddenStateCache

    if not method.side_tuning:
        raise UsageError(f"cache_hidden_states needs a side-tuning method; '{spec.method}' is not one")
    if ranks.several:  # a cached step runs the side network outside DistributedDataParallel
        raise UsageError(f"cache_hidden_states cannot be used with nproc={spec.nproc}: its steps run outside DDP")
    budget = spec.cache_budget_bytes if spec.cache_budget_bytes is not None else DEFAULT_BUDGET_BYTES
    return HiddenStateCache(budget, spec.cache_dir, spec.cache_dtype)


# --- step 2: the phases ----------------------------------------------------------------------------


@dataclass
class Phases:
    """What :func:`run_phases` measured (rank 0 of several: the ranks' train and eval combined)."""

    train: TrainPhase
    eval: EvalPhase | None  # None when training diverged
    preds: Any
    golds: Any
    combined: RunPhases  # train and eval with, for several ranks, their aggregation's nodes and per-rank parts
    inference: Inference | None = None
    generation: Generation | None = None  # the LM objective's generation phase, in place of inference
    merged: EvalPhase | None = None
    generation_merged: Generation | None = None  # the LM objective: generation again on the merged model

    @property
    def diverged(self) -> Divergence | None:
        """Where training diverged (:class:`petlprof.results.records.Divergence`), or None."""
        return self.train.get("diverged_at")

    @property
    def evaluated(self) -> EvalPhase:
        """The evaluation phase, which every run whose training did not diverge has."""
        if self.eval is None:
            raise ValueError("no evaluation phase: training diverged")
        return self.eval


def run_phases(ctx: RunContext) -> Phases | None:
    """Train, evaluate, measure inference and (for a method that merges) evaluate the merged model;
    None on a rank other than rank 0, which alone measures the per-device phases.  A run whose
    training diverged stops after training: nothing is scored or measured further."""
    spec = ctx.spec
    settled = _settle(spec)
    train_meters, eval_meters = ctx.meters("train"), ctx.meters("eval")
    try:
        phases = _train_and_evaluate(ctx, train_meters, eval_meters)
        if phases is not None and settled is not None:  # what the GPU was brought to before training
            phases.train.update(settled.record())
            phases.train["warnings"] = [*phases.train["warnings"], *settled.warnings()]
        if phases is None or phases.eval is None:  # training alone (--train-only), or another rank
            pass
        elif not phases.diverged and ctx.task.objective == LM:
            phases.generation = _generation(ctx, ctx.model, phases.evaluated)
        elif phases is not None and not phases.diverged:
            phases.inference = _inference(ctx, phases.evaluated)
    finally:
        for meter in train_meters + eval_meters:
            meter.close()
        if ctx.cache is not None:
            ctx.cache.close()
    if phases is not None and phases.eval is not None and not phases.diverged and ctx.method.merge:
        phases.merged, merged_model = _evaluate_merged(ctx, phases.preds)
        if merged_model is not None and ctx.task.objective == LM:
            phases.generation_merged = _generation(ctx, merged_model, phases.evaluated, "generation-merged")
    if ctx.timeline is not None:  # on a failure the sampler stops when ``timeline`` is collected
        ctx.timeline.stop()
    if phases is not None:
        ctx.ranks.rank0_phases_done(phases.inference, phases.merged, spec.device)
    return phases


def _settle(spec: RunSpec):
    """With ``--settle`` on a GPU: the GPU loaded until its temperature holds (:mod:`petlprof.meters.settle`)."""
    if not spec.settle or not spec.device.startswith("cuda"):
        return None
    # petlprof.meters.settle (torch, NVML): kept off the sweep's driver, which imports this module
    from petlprof.meters.settle import settle_gpu

    return settle_gpu(spec.device)


def _inference(ctx: RunContext, eval_phase: EvalPhase) -> Inference:
    # petlprof.run.inference (torch): kept off the sweep's driver, which imports this module
    from petlprof.run.inference import measure_inference, target_window_s

    spec = ctx.spec
    return measure_inference(
        ctx.model,
        ctx.eval_batches,
        device=spec.device,
        batch_sizes=[1, spec.batch_size],
        make_meters=lambda size: ctx.meters(f"inference-batch{size}"),
        warmup_steps=spec.warmup_steps,
        min_window_s=target_window_s(eval_phase.get("energy_kind"), spec.inference_window_s),
        progress=ctx.progress,
        precision=spec.precision,
    )


def untrained_phase() -> TrainPhase:
    """The training phase of a model with nothing to train (the zero-shot row): no step ran, so it took
    no time and no energy, exactly; there is no window to measure."""
    # the time and the energy with its source are keyed by their declarations (FIGURE.name): the phase is cast
    return cast(
        TrainPhase,
        {
            TIME.name: 0.0,
            "steps": 0,
            "samples": 0,
            "warmup_steps": 0,
            ENERGY.name: 0.0,  # its energy_kind is the evaluation's, so a sweep's kinds stay comparable
            **({ENERGY.source: "no training step ran (zero-shot)"} if ENERGY.source else {}),  # ENERGY declares one
            "epochs_run": 0.0,
            "first_loss": None,
            "final_loss": None,
            "warnings": [],
        },
    )


def _generation(ctx: RunContext, model, eval_phase: EvalPhase, label: str = "generation") -> Generation:
    """The LM objective's ``generation`` phase: greedy decoding of evaluation prompts at batch 1 and at
    the evaluation batch size (:func:`petlprof.run.generation.measure_generation`), its window as long as
    the inference phase's would be."""
    # petlprof.models.language_model, petlprof.run.generation, .inference (torch): kept off the sweep's driver,
    # which imports this module
    from petlprof.models.language_model import greedy_generate
    from petlprof.run.generation import measure_generation
    from petlprof.run.inference import target_window_s

    spec, batches = ctx.spec, ctx.eval_batches
    return measure_generation(
        model,
        batches,
        generate=greedy_generate,
        device=spec.device,
        batch_sizes=[1, spec.batch_size],
        max_new_tokens=spec.max_new_tokens or ctx.task.max_new_tokens,
        eos_token_id=batches.eos_token_id,
        make_meters=lambda size: ctx.meters(f"{label}-batch{size}"),
        warmup_steps=spec.warmup_steps,
        min_window_s=target_window_s(eval_phase.get("energy_kind"), spec.inference_window_s),
        progress=ctx.progress,
        precision=spec.precision,
        label=ctx.label,
    )


def _train_and_evaluate(ctx: RunContext, train_meters: list, eval_meters: list) -> Phases | None:
    # petlprof.run.train (torch): kept off the sweep's driver, which imports this module
    from petlprof.run.train import Steps, evaluate, train

    spec, ranks, budget = ctx.spec, ctx.ranks, ctx.budget
    if budget is not None:
        budget.start()
    steps = Steps.of(spec)
    if ctx.trainable_params == 0:  # the zero-shot row: the model as it comes, nothing to train
        train_phase = untrained_phase()
    else:
        train_phase = train(
            ranks.wrap(ctx.model, spec.device),
            ctx.train_batches,
            ctx.recipe,
            steps,
            ctx.io("train", train_meters),
            cache=ctx.cache,
            stop=ranks.agreed(budget),
            ranks=ranks,
        )
    phases: RunPhases = {"train": train_phase}
    preds: Any = None  # the LM objective's generated texts and references, or a classifier's predictions and labels
    golds: Any = None
    if spec.train_only:  # a search's trial: its validation checks are its score, the evaluation split stays unseen
        pass
    elif "diverged_at" not in train_phase and ctx.task.objective == LM:
        phases["eval"], preds, golds = _evaluate_lm(ctx, ctx.model, ctx.io("eval", eval_meters))
    elif "diverged_at" not in train_phase:  # every rank agrees on a divergence
        phases["eval"], preds, golds = evaluate(
            ctx.model,
            ctx.eval_batches,
            ctx.io("eval", eval_meters),
            warmup_steps=spec.warmup_steps,
            ranks=ranks,
            precision=spec.precision,
        )
    if ctx.trainable_params == 0 and "eval" in phases:
        train_phase["energy_kind"] = phases["eval"].get("energy_kind")
    measured: list[Phase] = [train_phase, *([phases["eval"]] if "eval" in phases else [])]
    for phase in measured:
        phase["warnings"] = ctx.timeline_warnings + phase["warnings"]
    combined: RunPhases | None = ranks.combine(phases, spec.device)
    if combined is None:
        return None
    if budget is not None:
        combined["train"]["budget"] = budget.summary(combined["train"])
    return Phases(combined["train"], combined.get("eval"), preds, golds, combined)


def _evaluate_lm(ctx: RunContext, model, io) -> tuple[EvalPhase, list[str], list[str]]:
    """(phase, generated texts, references) of a language-modelling run's evaluation (one process)."""
    # petlprof.run.lm_eval, petlprof.models.classifier (torch): kept off the sweep's driver, which imports this module
    from petlprof.models.language_model import greedy_generate
    from petlprof.run.lm_eval import evaluate_lm

    spec = ctx.spec
    return evaluate_lm(
        model,
        ctx.eval_batches,
        io,
        warmup_steps=spec.warmup_steps,
        precision=spec.precision,
        max_new_tokens=spec.max_new_tokens or ctx.task.max_new_tokens,
        generate=greedy_generate,
    )


def _evaluate_merged(ctx: RunContext, preds) -> tuple[EvalPhase, Any]:
    """Phase ``eval_merged``: the same evaluation after the method folds its weights into the backbone,
    and the merged model (None when the merge or its evaluation failed).

    Also records the fraction of predictions equal to the unmerged ones.  A merge that fails is
    recorded as this phase's error; the unmerged results stand.
    """
    # numpy, petlprof.run.train (torch): kept off the sweep's driver, which imports this module
    import numpy as np

    from petlprof.run.train import evaluate

    meters = ctx.meters("eval_merged")
    merged_preds: Any  # the LM objective's generated texts, or a classifier's predictions
    try:
        merged_model = ctx.method.build_merge()(ctx.model)
        if ctx.task.objective == LM:
            phase, merged_preds, _ = _evaluate_lm(ctx, merged_model, ctx.io("eval merged", meters))
        else:
            phase, merged_preds, _ = evaluate(
                merged_model,
                ctx.eval_batches,
                ctx.io("eval merged", meters),
                warmup_steps=ctx.spec.warmup_steps,
                precision=ctx.spec.precision,
            )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}".strip()}, None
    finally:
        for meter in meters:
            meter.close()
    same: Any
    if ctx.task.objective == LM:  # the same text, token for token
        same = [a == b for a, b in zip(merged_preds, preds)]
    else:
        same = np.isclose(merged_preds, preds, rtol=1e-3, atol=1e-4)
    phase["predictions_agree_fraction"] = float(np.mean(same)) if len(same) else None
    return phase, merged_model


# --- step 3: the record ----------------------------------------------------------------------------


def to_record(ctx: RunContext, phases: Phases | None) -> RunRecord:
    """The record's fields from a run's context and phases, ``status`` included: ``ok``, or ``diverged``
    without scores (a rank other than rank 0: only its place)."""
    # petlprof.meters.idle (numpy): kept off the sweep's driver, which imports this module
    from petlprof.meters.idle import sweep_idle

    if phases is None:
        return {"status": OK, "distributed": {"rank": ctx.ranks.rank, "world_size": ctx.ranks.world_size}}
    record: RunRecord = {"status": OK, **_described(ctx)}
    if phases.diverged:
        record["status"] = DIVERGED
        record["error"] = _diverged_error(phases.diverged)
        record["diverged_at"] = phases.diverged
    elif phases.eval is None:  # --train-only: no evaluation, no scores; the validation checks are in the budget
        record["metrics"] = {}
    else:
        record["metrics"] = _metrics(ctx.task, phases)
        warnings = [*ctx.task.warnings, *prediction_warnings(phases.preds, ctx.task)]
        if warnings:
            record["warnings"] = warnings
        if ctx.task.objective == LM and constant_output(phases.preds):
            record["constant_output"] = True
    record["train"] = phases.train
    if phases.eval is None:
        pass
    elif not phases.diverged and ctx.task.objective == LM:
        record["eval"] = phases.evaluated
        if phases.generation is not None:  # run_phases measured it after the evaluation
            record["generation"] = phases.generation
        record["eval"]["examples"] = _examples(ctx.task, phases)
    elif not phases.diverged:
        record["eval"] = phases.evaluated
        if phases.inference is not None:  # run_phases measured it after the evaluation
            record["inference"] = phases.inference
    record["memory_breakdown"] = ctx.breakdown
    record["idle_baseline"] = sweep_idle()
    if phases.merged is not None:
        record["eval_merged"] = phases.merged
    if phases.generation_merged is not None:
        record["generation_merged"] = phases.generation_merged
    record.update(ctx.ranks.record_fields(ctx.backend, ctx.spec.batch_size, phases.combined))
    return record


def _metrics(task, phases: Phases) -> dict[str, float | None]:
    """The task's quality metrics; for the LM objective, of the generated texts, with the evaluation
    loss on the target tokens and its perplexity."""
    if task.objective != LM:
        return task.compute_metrics(phases.preds, phases.golds)
    scores = task.score_generations(phases.preds, phases.golds)
    evaluation = phases.evaluated
    return {**scores, "eval_loss": evaluation["eval_loss"], "perplexity": evaluation["perplexity"]}


TUNED_LR = "searched on the validation split (--tune lr)"  # a tuned run's lr_source, its trials' too


def _lr_source(spec: RunSpec, method, objective: str, lr: float) -> str:
    """Where the run's learning rate comes from: the search, the method's default on the objective, or the user."""
    if LR in spec.tune:
        return TUNED_LR
    default, source = method.lr_for(objective)
    return source if lr == default else "user"


EXAMPLES_KEPT = 3  # generated responses kept in the record beside their references, so a reader sees what scored


def _examples(task, phases: Phases) -> list[Example]:
    prompts = task.eval.texts
    return [
        {"prompt": prompts[i], "generated": phases.preds[i], "reference": phases.golds[i]}
        for i in range(min(EXAMPLES_KEPT, len(phases.preds)))
    ]


def _described(ctx: RunContext) -> RunRecord:
    """What ran: the method's config, backbone, task, training settings and recipe, parameter counts."""
    spec, method, task, lr = ctx.spec, ctx.method, ctx.task, ctx.recipe.lr
    task_info: TaskInfo = {
        "num_labels": task.num_labels,
        "label_names": task.label_names,
        "train_samples": len(task.train),
        "eval_samples": len(task.eval),
        "description": task.description,
        "majority_rate": task.majority_rate(),
    }
    if task.objective == LM:  # classification records stay as they were
        task_info["objective"] = LM
    training: Training = {
        "epochs": spec.epochs,
        "max_steps": spec.max_steps,
        "batch_size": spec.batch_size,
        "lr": lr,
        "lr_source": _lr_source(spec, method, task.objective, lr),
        "max_length": spec.max_length,
        "warmup_steps": spec.warmup_steps,
        "device": spec.device,
        **ctx.recipe.describe(ctx.model),
    }
    if ctx.backbone.quantization:
        training["quantization"] = ctx.backbone.quantization
    return {
        "method_config": dataclasses.asdict(ctx.method_config),
        "backbone_info": ctx.backbone.info(),
        "task_info": task_info,
        "primary_metric": task.primary_metric,
        "training": training,
        "trainable_params": ctx.trainable_params,
        "total_params": ctx.total_params,
        "checkpoint_bytes": ctx.checkpoint_bytes,
        "load": ctx.load,
    }


def checkpoint_bytes(model) -> int:
    """What the method must save: the size of its trainable tensors as one safetensors file
    (:func:`petlprof.results.records.safetensors_bytes`; a tensor shared by two names, as tied embeddings, once).
    0 when nothing trains."""

    return safetensors_bytes({name: p for name, p in model.named_parameters() if p.requires_grad})


def _diverged_error(diverged: Divergence) -> str:
    last = diverged.get("last_finite_loss")
    before = f"; the step before, it was {last:.4g}" if last is not None else "; it was the first step"
    return (
        f"training diverged at step {diverged['step']}: the loss was {diverged['loss']} and the gradient norm "
        f"{diverged['grad_norm']}{before}. The run is not scored (a smaller --lr or other method settings may help)"
    )


def prediction_warnings(preds, task) -> list[str]:
    """A warning when a classifier's evaluation predictions are all one class: its scores are then those
    of always answering that class (the majority rate), not of a learned model."""
    # numpy: kept off the sweep's driver, which imports this module
    import numpy as np

    if task.objective == LM:
        return _generation_warnings(preds)
    if task.is_regression or len(preds) < 2:
        return []
    classes = np.unique(preds)
    if len(classes) != 1:
        return []
    names = task.label_names
    label = int(classes[0])
    shown = f"'{names[label]}' ({label})" if names and 0 <= label < len(names) else str(label)
    return [
        f"every one of the {len(preds)} evaluation predictions is class {shown}: the model answers one class "
        f"whatever the input, so its {task.primary_metric} is that class's share, not a sign of learning"
    ]


def constant_output(texts: list[str]) -> bool:
    """Every generated evaluation response is the same text: the model answers the same whatever the prompt, so
    its score is not the method's (the record's ``constant_output``; the report keeps it off every frontier)."""
    return len(texts) >= 2 and len(set(texts)) == 1


def _generation_warnings(texts: list[str]) -> list[str]:
    """A warning when every generated response is the same text (the model ignores its prompt)."""
    if not constant_output(texts):
        return []
    return [
        f"every one of the {len(texts)} generated evaluation responses is the same text ({texts[0][:40]!r}): "
        "the model answers the same whatever the prompt"
    ]
