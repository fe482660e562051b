"""Every tuner PEFT registers, by name: ``--methods peft:TYPE`` (``peft:vera``, ``peft:loha``, ``peft:boft``, ...).

``TYPE`` is a ``peft.PeftType`` in lower case, or ``dora`` (LoRA with ``use_dora=True``).  The method's config
is PEFT's own config dataclass, field for field (:mod:`petlprof.methods.peft_fields`), so
``--method-config peft:vera.r=256`` sets ``VeraConfig.r``; PEFT's own checks across fields run with petlprof's
when the config is made (:class:`TunerSpec`), before any run.  Like the built-in PEFT methods
(:mod:`petlprof.methods.peft_common`), the backbone is frozen and wrapped by ``peft.get_peft_model``, and the
task head trains:

* adapter tuners (LoRA's family, orthogonal, Fourier, vector-bank, ... tuners) inject layers into target
  modules: the method config's, else PEFT's per-architecture table for the tuner, else the attention
  projections the architecture description finds (query and value, or the fused projection; layer norms for
  LN tuning); ``peft:lora`` and ``peft:ia3`` pick them as the built-in ``lora`` and ``ia3`` do;
* prompt-learning tuners (prompt tuning, P-tuning, prefix tuning, cartridges) take their shape from the
  architecture description and PEFT's feature-extraction wrapper (sequence-to-sequence for a prefix on T5),
  as the built-in prompt and prefix tuning do;
* AdaLoRA's rank allocation runs after every optimiser step that trains the model (PEFT's
  ``update_and_allocate``), and its orthogonality regulariser's gradient is added before each step
  (PEFT adds the regulariser to a loss its model computes from labels; petlprof's loss is computed outside).

Some tuners cannot run here whatever the backbone (:data:`REFUSED`: they need task ids, trained adapters or
in-context examples petlprof's tasks do not have); others cannot adapt a given backbone (a layer type or
shape the tuner does not support).  :func:`unsupported_reason` applies the tuner to the backbone built on
PyTorch's ``meta`` device (no weights) before any run, and says PEFT's reason; where the tuner's
initialisation reads weight values (an SVD, a sparse mask), a backbone of at most :data:`PROBE_PARAMETERS`
parameters is built with random weights on the CPU instead, and a larger one is checked when its run applies
the method.

``--method-config-file adapter_config.json`` (:mod:`petlprof.methods.peft_files`) runs a configuration PEFT's
``save_pretrained`` wrote: its ``peft_type`` picks the tuner and its fields become the method config.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import json
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import peft
import torch
from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from transformers.utils import logging as hf_logging

from petlprof.errors import UsageError, shown, unknown_choice
from petlprof.method_api import PEFT_PREFIX, MethodSpec
from petlprof.methods.peft_common import prefix_task_type, record_targets, shape_of, targets_for, wrap_backbone
from petlprof.methods.peft_fields import config_class
from petlprof.models.architecture import describe, lora_targets
from petlprof.models.backbones import backbone_config, family_of, model_class
from petlprof.models.quantization import NONE, QUANTIZE_CHOICES
from petlprof.registry import get_method
from petlprof.vocabulary import CLASSIFICATION, LM, OBJECTIVES

# tuners that cannot run in petlprof whatever the backbone, and why
REFUSED = {
    "POLY": "Poly routes every example through its task's skills by a task id (task_ids), and petlprof's tasks "
    "have no task ids",
    "MULTITASK_PROMPT_TUNING": "multitask prompt tuning picks each example's prompt by a task id (task_ids), and "
    "petlprof's tasks have no task ids",
    "XLORA": "X-LoRA mixes LoRA adapters trained before (its adapters field), and a run trains from none",
    "CPT": "CPT learns from in-context examples given as token ids with their masks (cpt_token_ids, cpt_mask, "
    "cpt_tokens_type_mask), which petlprof's tasks do not build",
}
PROMPT_KINDS = {"PROMPT_TUNING": "prompt", "P_TUNING": "prompt", "PREFIX_TUNING": "prefix", "CARTRIDGE": "prefix"}
OWN_TARGETS = {"SHADOW", "TRAINABLE_TOKENS", "ADAPTION_PROMPT"}  # PEFT finds the modules of these itself
NORM_TARGETS = {"LN_TUNING"}  # without a table entry: the backbone's normalisation layers
BUILTIN_RULES = {"LORA": "lora", "IA3": "ia3"}  # targets picked as the built-in methods of these names pick them
# tuners the LM task model cannot drive: it runs the backbone's body itself, which a cartridge's prefix (recognised
# by type: PEFT's prefix tuning only) and Shadow's side network, run by PEFT's own forward, never reach
NOT_LM = {"CARTRIDGE", "SHADOW"}
REQUIRED = {"TRAINABLE_TOKENS": ("token_indices", "the ids of the tokens whose embeddings train, e.g. [5, 17]")}
# initialisations PEFT computes in a separate pass over calibration data, which a run does not make
DATA_INITS = {
    ("init_lora_weights", "eva"): "EVA initialises LoRA from activations of calibration data "
    "(peft.initialize_lora_eva_weights), a pass a run does not make",
    ("init_lora_weights", "corda"): "CorDA initialises LoRA from covariances of calibration data "
    "(peft.tuners.lora.corda.preprocess_corda), a pass a run does not make",
}
ALIASES = {"dora": ("LORA", {"use_dora": True})}  # name -> (PEFT type, defaults beyond PEFT's)
DEFAULTS = {  # where PEFT leaves a value unset that a run needs (the built-in prompt methods' 20 virtual tokens)
    "ADAPTION_PROMPT": {"adapter_len": 10},  # LLaMA-Adapter's prompt length (Zhang et al. 2023)
    **{kind: {"num_virtual_tokens": 20} for kind in PROMPT_KINDS},
}
KNOBS = ("r", "num_virtual_tokens", "n_frequency", "adapter_len")  # the Pareto knob: the first field present
KNOB = {"ADALORA": "target_r"}  # AdaLoRA ignores r: its budget is the average rank it prunes to
# tuners that never wrap a linear layer, so a quantised backbone's stay as bitsandbytes made them
NO_LINEAR_LAYERS = {*PROMPT_KINDS, "LN_TUNING", "TRAINABLE_TOKENS"}
PROBE_PARAMETERS = 2**25  # a backbone this small is built with weights for the preflight when meta cannot tell


def peft_types() -> dict[str, str]:
    """``peft:TYPE`` name -> PEFT type, for every tuner PEFT registers (and the aliases)."""
    names = {f"{PEFT_PREFIX}{t.value.lower()}": t.value for t in PEFT_TYPE_TO_CONFIG_MAPPING}
    names.update({f"{PEFT_PREFIX}{alias}": peft_type for alias, (peft_type, _) in ALIASES.items()})
    return dict(sorted(names.items()))


@dataclass(frozen=True)
class Tuner:
    name: str  # peft:vera
    peft_type: str  # VERA

    @property
    def peft_cls(self) -> type:
        return PEFT_TYPE_TO_CONFIG_MAPPING[peft.PeftType(self.peft_type)]

    @property
    def model_cls(self) -> type | None:
        return PEFT_TYPE_TO_TUNER_MAPPING.get(peft.PeftType(self.peft_type))

    @property
    def kind(self) -> str:
        return PROMPT_KINDS.get(self.peft_type, "adapter")

    @property
    def defaults(self) -> dict[str, Any]:
        alias = ALIASES.get(self.name.removeprefix(PEFT_PREFIX))
        return {**DEFAULTS.get(self.peft_type, {}), **(alias[1] if alias else {})}


def tuner_of(name: str) -> Tuner:
    """The tuner ``peft:TYPE`` names; an unknown one is one line listing them all."""
    known = peft_types()
    if name not in known:
        raise unknown_choice("PEFT tuner", name, known, f"(PEFT {peft_version()}'s tuners)")
    return Tuner(name, known[name])


def peft_version() -> str:
    """The installed PEFT's version (its tuners are what `peft:TYPE` names)."""
    return peft.__version__


@dataclass(frozen=True)
class TunerSpec(MethodSpec):
    """A PEFT tuner's spec: making its config also runs PEFT's own checks across fields, and refuses a tuner
    that cannot run here (:data:`REFUSED`) or lacks a value it needs (:data:`REQUIRED`)."""

    peft_type: str = ""

    def make_config(self, overrides: dict[str, Any] | None = None):
        config = super().make_config(overrides)
        if self.peft_type in REFUSED:
            raise UsageError(f"{self.name} cannot run in petlprof: {REFUSED[self.peft_type]}")
        needed, what = REQUIRED.get(self.peft_type, (None, ""))
        if needed and not getattr(config, needed):
            raise UsageError(f"{self.name} {needed} must be given: {what} (got {shown(getattr(config, needed))})")
        for (field, value), why in DATA_INITS.items():
            if getattr(config, field, None) == value:
                raise UsageError(f"{self.name} {field}={value} cannot run in petlprof: {why}")
        try:
            peft_config(Tuner(self.name, self.peft_type), config, {})
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{self.name}: PEFT refuses this configuration: {first_line(exc)}") from None
        return config


@functools.cache
def tuner_spec(name: str) -> TunerSpec:
    """The method spec of tuner ``peft:TYPE`` (made once per process)."""
    tuner = tuner_of(name)
    class_name = "Peft" + "".join(part.title() for part in name.removeprefix(PEFT_PREFIX).split("_")) + "Config"
    config_cls = config_class(tuner.peft_cls, class_name, tuner.defaults)
    config_cls.tuner_name = name
    fields = {f.name for f in dataclasses.fields(config_cls)}
    like = {"prompt": "prompt_tuning", "prefix": "prefix_tuning"}.get(tuner.kind, "lora")
    objectives = (CLASSIFICATION,) if tuner.peft_type in NOT_LM else OBJECTIVES
    lm_lr, lm_lr_source = _lm_lr(like, objectives)
    what = {"prompt": "trained virtual tokens before the input", "prefix": "trained key/value prefixes"}
    return TunerSpec(
        name=name,
        description=f"PEFT's {tuner.peft_cls.__name__.removesuffix('Config')} tuner "
        f"({what.get(tuner.kind, 'layers in the targeted modules')}) + task head",
        config_cls=config_cls,
        apply=apply,
        default_lr=get_method(like).default_lr,
        lr_source=f"not tuned for this tuner: the built-in {like}'s default (see `petlprof list`); give --lr for "
        "the tuner's own recipe",
        pareto_knob=KNOB.get(tuner.peft_type) or next((knob for knob in KNOBS if knob in fields), None),
        objectives=objectives,
        quantize=QUANTIZE_CHOICES if _runs_quantized(tuner) else (NONE,),
        peft_type=tuner.peft_type,
        lm_lr=lm_lr,
        lm_lr_source=lm_lr_source,
    )


def _lm_lr(like: str, objectives: tuple[str, ...]) -> tuple[float | None, str | None]:
    """A tuner's LM default and its source: the built-in ``like``'s, where it has one and the tuner runs on LM."""
    lm_lr = get_method(like).lm_lr
    if lm_lr is None or LM not in objectives:
        return None, None
    return (
        lm_lr,
        f"not tuned for this tuner: the built-in {like}'s LM default (see `petlprof list`); give --lr for its own",
    )


def _runs_quantized(tuner: Tuner) -> bool:
    """Whether the tuner runs on a ``--quantize``-d backbone: it wraps no linear layer, or PEFT has bitsandbytes
    layers for it (``peft.tuners.<tuner>.bnb``: LoRA and DoRA, AdaLoRA, IA3, ...); the rest are refused up front."""
    if tuner.peft_type in NO_LINEAR_LAYERS:
        return True
    package = tuner.model_cls.__module__.rpartition(".")[0] if tuner.model_cls else ""
    return bool(package) and importlib.util.find_spec(f"{package}.bnb") is not None


def peft_config(tuner: Tuner, config, extra: dict[str, Any]):
    """PEFT's config of ``tuner`` from a method config, with ``extra`` fields (targets, shape, task type)."""
    return tuner.peft_cls(**{**dataclasses.asdict(config), **extra})


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type where it has none): one line for an error."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# --- applying a tuner --------------------------------------------------------------------------------------


def apply(task_model, config):
    """Freeze the backbone, wrap it with the tuner (PEFT decides what trains), keep the head trainable."""
    tuner = tuner_of(type(config).tuner_name)
    arch = task_model.architecture
    if tuner.kind == "adapter":
        extra, source = _targets(tuner, config, task_model)
    else:
        extra = _prompt_fields(tuner, config, task_model)
    if tuner.peft_type == "ADAPTION_PROMPT" and config.adapter_layers is None:
        extra["adapter_layers"] = arch.layers  # every layer (PEFT counts them from the top)
    wrap_backbone(task_model, peft_config(tuner, config, extra), tuner.name)
    if tuner.kind == "adapter":
        record_targets(task_model, tuner.name, source)
    else:
        shape = shape_of(arch, tuner.kind)
        task_model.placement.update(method=tuner.name, shape_from=f"architecture description ({arch.path})", **shape)
    if tuner.kind == "prompt":
        task_model.virtual_tokens = config.num_virtual_tokens
    if not any(p.requires_grad for p in task_model.backbone.parameters()):
        raise UsageError(f"{tuner.name} cannot adapt this backbone: PEFT made none of its parameters trainable")
    if tuner.peft_type == "ADALORA" and not isinstance(task_model, _Probe):
        _schedule_adalora(task_model.backbone, config)
        task_model.placement["schedule"] = (
            f"rank allocation after every optimiser step over total_step={config.total_step} (PEFT's "
            "update_and_allocate); the orthogonality regulariser's gradient added before every step"
        )
    return task_model


def _targets(tuner: Tuner, config, task_model) -> tuple[dict[str, Any], str]:
    """(the target fields of PEFT's config, where they come from) for an adapter tuner."""
    if not hasattr(config, "target_modules") or tuner.peft_type in OWN_TARGETS:
        return {}, "PEFT's own choice"
    arch = task_model.architecture
    if tuner.peft_type in BUILTIN_RULES:
        method = BUILTIN_RULES[tuner.peft_type]
        feedforward = getattr(config, "feedforward_modules", None)
        targets, feedforward, source = targets_for(arch, method, config.target_modules, feedforward)
        return {"target_modules": targets, **({"feedforward_modules": feedforward} if method == "ia3" else {})}, source
    if config.target_modules is not None:
        return {}, "method config"
    if arch.model_type in (getattr(tuner.model_cls, "target_module_mapping", None) or {}):
        return {}, f"PEFT's table ({arch.model_type})"
    source = f"architecture description ({arch.path}): PEFT has no {tuner.name} entry for '{arch.model_type}'"
    if tuner.peft_type in NORM_TARGETS:
        targets, what = _norm_layers(task_model.backbone), "normalisation layers"
    else:
        targets, what = lora_targets(arch), "query and value projections"
    if not targets:
        raise UsageError(
            f"{tuner.name} cannot adapt this backbone: PEFT has no {tuner.name} targets for '{arch.model_type}' and "
            f"no {what} were found; give target_modules"
        )
    return {"target_modules": targets}, source


def _norm_layers(model) -> list[str]:
    return [name for name, module in model.named_modules() if type(module).__name__.endswith(("LayerNorm", "RMSNorm"))]


def _prompt_fields(tuner: Tuner, config, task_model) -> dict[str, Any]:
    """A prompt-learning tuner's shape (from the architecture description) and PEFT wrapper."""
    task_type = prefix_task_type(task_model) if tuner.kind == "prefix" else "FEATURE_EXTRACTION"
    extra = {"task_type": task_type, **shape_of(task_model.architecture, tuner.kind)}
    if tuner.peft_type == "PROMPT_TUNING" and config.prompt_tuning_init == "TEXT":
        extra["tokenizer_name_or_path"] = task_model.tokenizer_path
    return extra


# --- AdaLoRA's schedule ----------------------------------------------------------------------------------


def _schedule_adalora(peft_model, config) -> None:
    """PEFT's AdaLoRA recipe (``optimizer.step(); model.base_model.update_and_allocate(step)``) run by whichever
    optimiser steps this model's parameters, through torch's global optimiser hooks (those of models gone are
    removed when the next is scheduled: torch iterates the hooks while it calls them); before each step, the
    gradient of ``orth_reg_weight`` x the mean of ||P P^T - I||_F over the singular-vector matrices (A: rows,
    B: columns), as PEFT's model adds that regulariser to a loss it computes."""
    for gone in [entry for entry in _SCHEDULED if entry[0]() is None]:
        _SCHEDULED.remove(gone)
        for handle in gone[1]:
            handle.remove()
    model = weakref.ref(peft_model)
    factors = [p for n, p in peft_model.named_parameters() if p.requires_grad and ("lora_A" in n or "lora_B" in n)]
    marker = weakref.ref(factors[0])
    del factors
    steps = [0]

    def ours(optimizer) -> bool:
        return model() is not None and any(p is marker() for group in optimizer.param_groups for p in group["params"])

    def before(optimizer, args, kwargs):
        if not ours(optimizer) or config.orth_reg_weight == 0:
            return
        names = [(n, p) for n, p in model().named_parameters() if p.requires_grad and ("lora_A" in n or "lora_B" in n)]
        with torch.enable_grad():
            gaps = [_orthogonality_gap(p, "lora_A" in n) for n, p in names]
            grads = torch.autograd.grad(config.orth_reg_weight * torch.stack(gaps).mean(), [p for _, p in names])
        for (_, p), grad in zip(names, grads):
            p.grad = grad if p.grad is None else p.grad + grad

    def after(optimizer, args, kwargs):
        if ours(optimizer):
            model().base_model.update_and_allocate(steps[0])
            steps[0] += 1

    _SCHEDULED.append((model, [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]))


_SCHEDULED: list = []  # (the model, its hooks' handles) of every AdaLoRA model scheduled in this process


def _orthogonality_gap(factor, rows: bool):
    gram = factor @ factor.T if rows else factor.T @ factor
    return torch.linalg.matrix_norm(gram - torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device))


# --- the preflight ---------------------------------------------------------------------------------------


class _Probe:
    """What :func:`apply` reads of a task model, over a backbone built for the preflight (classification)."""

    objective = CLASSIFICATION

    def __init__(self, model, arch, family: str):
        self.backbone, self.architecture, self.family = model, arch, family
        self.placement: dict[str, Any] = {}
        self.tokenizer_path, self.virtual_tokens = None, 0

    def freeze_backbone(self):
        for param in self.backbone.parameters():
            param.requires_grad_(False)
        return self


class _MetaOnly(Exception):
    """The tuner's initialisation read weight values, which the meta device does not have."""


def unsupported_reason(name: str, backbone, method_config: dict[str, Any] | None = None) -> str | None:
    """One line on why tuner ``name`` cannot adapt ``backbone`` (a ``--backbone`` value or a transformers config)
    with ``method_config``, or None: PEFT's own reason, from applying the tuner to the backbone without weights."""
    key = json.dumps(method_config or {}, sort_keys=True, default=str)
    if isinstance(backbone, str):
        return _cached_reason(name, backbone, key)
    with torch.device("meta"):
        model = _build(backbone)
    return _reason(name, backbone, model, key)


@functools.lru_cache(maxsize=256)
def _cached_reason(name: str, backbone: str, key: str) -> str | None:
    return _reason(name, *_meta_backbone(backbone), key)


@functools.lru_cache(maxsize=8)
def _meta_backbone(backbone: str) -> tuple[Any, torch.nn.Module]:
    """(config, headless model on the meta device) of a ``--backbone`` value, built once; probes copy the model."""
    config = backbone_config(backbone)
    with torch.device("meta"):
        return config, _build(config)


def _reason(name: str, config, meta_model, key: str) -> str | None:
    settings = tuner_spec(name).make_config(json.loads(key))
    try:
        return _probe(name, settings, config, meta_model)
    except _MetaOnly:
        size = sum(p.numel() for p in meta_model.parameters())
        return _probe(name, settings, config, None) if size <= PROBE_PARAMETERS else None


def _build(config):
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return model_class(config, False).from_config(config)
    finally:
        hf_logging.set_verbosity(verbosity)


def _probe(name: str, settings, config, meta_model) -> str | None:
    """The reason ``apply`` refuses with on a copy of ``meta_model``, or (None) on the model built with random
    weights on the CPU."""
    prefix = f"{name} cannot adapt this backbone: "
    device = "meta" if meta_model is not None else "cpu"
    with torch.random.fork_rng(), torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = copy.deepcopy(meta_model) if meta_model is not None else _build(config)
        try:
            apply(_Probe(model, describe(model), family_of(config)), settings)
        except Exception as exc:  # noqa: BLE001 - whatever PEFT raises is the reason the run would fail with
            text = str(exc) if isinstance(exc, UsageError) else f"{type(exc).__name__}: {first_line(exc)}"
            if device == "meta" and "meta" in text.lower():
                raise _MetaOnly from None
            return text.removeprefix(prefix)
    return None
