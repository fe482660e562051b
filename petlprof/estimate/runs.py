"""Each run's prediction, made before the sweep runs it and kept in its record beside what it measured.

For every configuration of a sweep (its seeds share one) :func:`predict_runs` prices one training step and one
evaluation batch as ``petlprof estimate`` does — on this machine's calibrated profile of the runs' device, or on a
GPU the bundled table's entry for the GPU's name, uncalibrated — and returns, by run key, the record's ``predicted``
block: the train step's time (s), energy (J) and peak memory (bytes), the evaluation batch's time (s), and what it
was predicted on.  Nothing is predicted where there is no device model (a CPU never calibrated: no torch is even
imported then), or for a configuration the estimate cannot price (the reason is kept).  A classification step is
priced at the heaviest batch the configuration's runs take, in their own order (``row_lengths``: the longest row of
any batch, padded to, and the most real tokens of any, which a side network running on real tokens only holds:
READ's), an upper bound on every batch; without the rows' lengths, every row ``max_length`` tokens, as the estimate
prices it.  A language-modelling step is priced with every row the training split's longest
(prompt, target), as the run tokenises them (``lm_lengths``: its data decides them), an upper bound the same way.
The estimate's generation prediction is not kept: the run generates after evaluation prompts, for
``--max-new-tokens``, at lengths the training rows do not say.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from petlprof.errors import say
from petlprof.estimate.gpus import GPUS
from petlprof.estimate.profiles import device_name, load_profile, profile_path
from petlprof.estimate.roofline import DeviceModel, table_model
from petlprof.models.quantization import Quantization
from petlprof.results.figures import ENERGY, PEAK_MEMORY
from petlprof.vocabulary import CLASSIFICATION, LM, ZERO_SHOT

PRICED = "one step with every row max_length tokens (a run pads each batch to its longest row)"
PRICED_BATCH = (
    "one step at the heaviest training batch its runs take: {rows} rows padded to {length} tokens (the longest row "
    "of any of their batches), {real} of them real tokens (the most of any batch), as the run tokenises them; the "
    "evaluation batch with every row max_length tokens"
)
PRICED_LM = (
    "one step with every row the training split's longest prompt ({prompt} tokens) and target ({target} tokens), as "
    "the run tokenises them (a run pads each batch to its longest row)"
)
LmLengths = Callable[[Any], tuple[int, int]]  # an LM run's spec -> (prompt, target) tokens its step is priced at
# a classification task and backbone and --max-length -> each training row's tokens, as the run tokenises them
RowLengths = Callable[[str, str, int], Sequence[int]]


def training_row_lengths(split, backbone: str, max_length: int, random_init: bool = False) -> tuple[int, ...]:
    """Each row's tokens in a classification ``split`` (its texts and pairs), cut to ``max_length`` as a run tokenises
    them (:func:`petlprof.run.train.encode_texts`) with ``backbone``'s tokenizer: what a sweep's predictions and
    ``petlprof estimate --task`` price a step at."""
    # transformers and the run's tokenisation: only where a step is priced at a task's rows
    from petlprof.models.backbones import backbone_tokenizer
    from petlprof.run.train import encode_texts

    encoded = encode_texts(split, backbone_tokenizer(backbone, random_init), max_length)
    return tuple(len(ids) for ids in encoded["input_ids"])


def heaviest_batch(lengths: Sequence[int], specs: Sequence[Any]) -> tuple[int, int]:
    """(the longest row, the most real tokens) of any training batch the runs of ``specs`` take, their warm-up steps
    among them: each run's batches in its own order (:func:`petlprof.run.train.step_order`, by its seed), over
    ``lengths``, its training rows' tokens."""
    import numpy as np  # the batches' sums over every row of every epoch of every seed: vectorised per batch

    from petlprof.run.train import Rows, Steps, step_order  # torch: not imported where there is no device to predict on

    counts = np.asarray(lengths, dtype=np.int64)
    longest = real = 0
    for spec in specs:
        rows = Rows(range(len(lengths)), spec.batch_size)
        steps = Steps.of(spec)
        micro = steps.micro_batches(len(rows), spec.gradient_accumulation)
        for group in step_order(rows, micro, spec.seed, spec.gradient_accumulation):
            for batch in group:
                tokens = counts[batch]
                longest, real = max(longest, int(tokens.max())), max(real, int(tokens.sum()))
    return longest, real


def table_gpu(name: str) -> str | None:
    """The GPU table's entry for a device's name (``NVIDIA A100-SXM4-80GB`` -> ``a100-80gb``, ``NVIDIA H200`` ->
    ``h200-141gb``), None where the table has none."""
    words = re.sub(r"[^a-z0-9]+", " ", name.lower()).replace("rtx ", "rtx").split()
    found = [key for key in GPUS if key.split("-")[0] in words]
    sized = [key for key in found if key.split("-")[1] in words]
    return (sized or found)[0] if found else None


class RunPrediction(TypedDict, total=False):
    """A run record's ``predicted`` block: the step its configuration's estimate priced, or why there is none."""

    kind: str  # "predicted": never a measurement
    error: str  # why there is no prediction (the rest is then absent)
    device: str
    calibrated: bool
    model: str  # where the device model came from
    priced: str  # the batch the step was priced at, in words
    train: dict[str, float | int]  # step_time_s, energy (J a step) and peak memory (bytes), keyed by their figures
    eval: dict[str, float]  # batch_time_s


def device_model(device: str) -> DeviceModel | None:
    """What a run on ``device`` is predicted on: this machine's profile, else (a GPU) the table's entry, else None."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if kind == "cpu" and not profile_path("cpu").exists():
        return None
    model, _ = load_profile(kind)
    if model is None and kind == "cuda":
        gpu = table_gpu(device_name(device))
        return None if gpu is None else table_model(GPUS[gpu])
    return model


def predict_runs(
    specs: Sequence[Any],
    num_labels: Callable[[str], int],
    lm_lengths: LmLengths | None = None,
    objective_of: Callable[[Any], str] | None = None,
    row_lengths: RowLengths | None = None,
) -> dict[str, RunPrediction]:
    """Run key -> the ``predicted`` block of its record (module docstring), one estimate per configuration;
    ``lm_lengths`` prices the language-modelling runs (none without it: their record says why); ``objective_of``: a
    run's objective as its task resolves it (``--objective auto``: a generative task's runs train their LM head),
    else the spec's; ``row_lengths``: a classification step is priced at the heaviest batch its runs take
    (:func:`heaviest_batch`) instead of every row ``max_length`` tokens."""
    if not specs:
        return {}
    model = device_model(specs[0].device)
    if model is None:
        return {}
    # the estimate (torch, transformers): imported only once there is a device to predict on
    from petlprof.estimate.core import Settings, estimate
    from petlprof.estimate.model import resolve_backbone

    configs = len({spec.config_key for spec in specs})
    say(f"petlprof: predicting {configs} configuration(s) on {model.name} before the runs (a traced step each)")
    grouped: dict[str, list] = {}
    for spec in specs:
        grouped.setdefault(spec.config_key, []).append(spec)
    out: dict[str, RunPrediction] = {}
    heaviest: dict[tuple, tuple[int, int] | str] = {}  # configurations batched alike (methods apart) share theirs
    for group in grouped.values():
        spec = group[0]
        objective = objective_of(spec) if objective_of is not None else spec.objective
        batch = None
        if objective != LM and row_lengths is not None:
            key = (spec.task, spec.backbone, spec.max_length, *map(_batching, group))
            if key not in heaviest:
                heaviest[key] = _heaviest(group, row_lengths)
            batch = heaviest[key]
        predicted = _predicted(
            spec, objective, model, num_labels, lm_lengths, Settings, estimate, resolve_backbone, batch
        )
        out.update((each.run_key, predicted) for each in group)
    return out


def _batching(spec: Any) -> tuple:
    """What a run's training batches depend on besides its rows (:func:`heaviest_batch`)."""
    from petlprof.run.train import Steps  # torch: imported only where a step is priced at a task's rows

    return (spec.batch_size, spec.gradient_accumulation, Steps.of(spec))


def _heaviest(specs: Sequence[Any], row_lengths: RowLengths) -> tuple[int, int] | str:
    """(longest row, real tokens) of the heaviest batch the runs of one configuration take, or why there is none."""
    spec = specs[0]
    try:
        return heaviest_batch(row_lengths(spec.task, spec.backbone, spec.max_length), specs)
    except Exception as error:  # a prediction never stops the sweep: its record says why it has none
        return f"{type(error).__name__}: {error}"


def _predicted(
    spec,
    objective_name: str,
    model: DeviceModel,
    num_labels,
    lm_lengths,
    settings_class,
    estimate,
    resolve_backbone,
    batch: tuple[int, int] | str | None = None,
) -> RunPrediction:
    """One configuration's ``predicted`` block (or why there is none), on the run's resolved ``objective_name``;
    ``batch``: a classification step's (longest row, real tokens), or why they could not be read."""
    if spec.method == ZERO_SHOT:
        return {"kind": "predicted", "error": "zero-shot trains nothing: no training step to predict"}
    if isinstance(batch, str):
        return {"kind": "predicted", "error": f"the training batches' lengths could not be read: {batch}"}
    priced, objective = PRICED, {"max_length": spec.max_length, "objective": CLASSIFICATION}
    if batch is not None:
        length, real = batch
        priced = PRICED_BATCH.format(rows=spec.batch_size, length=length, real=real)
        objective = {**objective, "train_rows": (length, real)}
    try:
        if objective_name == LM:
            if lm_lengths is None:
                return {"kind": "predicted", "error": "no token lengths to price the language-modelling step at"}
            prompt, target = lm_lengths(spec)
            priced = PRICED_LM.format(prompt=prompt, target=target)
            objective = {"max_length": prompt, "objective": LM, "target_length": target}
        else:
            objective["num_labels"] = num_labels(spec.task)
    except Exception as error:  # a prediction never stops the sweep: its record says why it has none
        return {"kind": "predicted", "error": f"{type(error).__name__}: {error}"}
    settings = settings_class(
        batch_size=spec.batch_size,
        precision=spec.precision,
        device="cuda" if spec.device.startswith("cuda") else "cpu",
        device_model=model,
        train_size=None,  # a run's record has its own length: the step is what is compared
        **objective,
        weights_dtype=spec.weights_dtype,
        gradient_checkpointing=spec.gradient_checkpointing,
        gradient_accumulation=spec.gradient_accumulation,
        optimizer=spec.optimizer,
        quantization=Quantization.of(spec),
    )
    try:
        record = estimate(resolve_backbone(spec.backbone, spec.num_layers), spec.method, spec.method_config, settings)
    except Exception as error:  # a prediction never stops the sweep: its record says why it has none
        return {"kind": "predicted", "error": f"{type(error).__name__}: {error}"}
    predicted = record.get("predicted") if record.get("status") == "ok" else None
    if not predicted:
        return {"kind": "predicted", "error": record.get("error") or "the estimate gave no prediction"}
    return {
        "kind": "predicted",
        "device": predicted["device"],
        "calibrated": predicted["calibrated"],
        "model": predicted["model"],
        "priced": priced,
        "train": {
            "step_time_s": predicted["train_step_s"],
            ENERGY.name: predicted["train_step_energy_j"],  # per step
            PEAK_MEMORY.name: record["memory"]["peak_train_bytes"],
        },
        "eval": {"batch_time_s": predicted["inference_batch_s"]},
    }
