"""The method contract: what a fine-tuning method gives petlprof, and what it may assume in return.

This module is the stable surface for plug-ins (re-exported by ``petlprof``); built-in methods use
it the same way.  A method is a :class:`MethodSpec`:

* ``name`` — how ``--methods``, ``--method-config NAME.FIELD=...`` and the result records call it
  (letters, digits, ``_`` and ``-``; it must not clash with a built-in method; ``peft:TYPE`` names PEFT's
  tuners, :mod:`petlprof.methods.peft_tuners`, and no plug-in may take that prefix);
* ``config_cls`` — a dataclass subclassing :class:`MethodConfig`, every field declared with one of
  :func:`number`, :func:`integer`, :func:`choice`, :func:`text` or :func:`module_names` (a default,
  a help line shown by ``petlprof list``, and a check), so a bad value — NaN, inf, out of range,
  the wrong type — is refused before any run with one line, the same way for every method;
* ``apply(task_model, config) -> model`` — a callable, or ``"module:function"`` so that listing
  methods imports nothing heavy.  ``task_model`` is one of the two task models below (its
  ``objective`` says which); ``apply`` decides which parameters train (``requires_grad``) and returns
  a ``torch.nn.Module``; the harness moves it to the device, builds the optimiser over its trainable
  parameters and meters training, evaluation and (LM) generation;
* ``objectives`` — the task objectives the method supports: ``"classification"`` and/or ``"lm"``.
  It defaults to ``("classification",)``, so a plug-in written before the LM objective existed is
  refused for ``--objective lm`` up front (:func:`check_objective`) rather than failing mid-run;
* ``quantize`` — the ``--quantize`` values whose backbone the method runs on.  It defaults to ``("none",)``:
  a quantised backbone's linear weights are bitsandbytes' packed integers, frozen, so only a method that
  leaves them so (and never reads them as float weights) may declare ``QUANTIZE_CHOICES``; a plug-in that
  says nothing is refused for ``--quantize int8|nf4|fp4`` up front (:func:`check_quantize`) rather than
  failing mid-run or training what it cannot;
* ``default_lr`` and ``lr_source`` (where that learning rate comes from), optionally ``lm_lr`` and
  ``lm_lr_source``: its default on the LM objective where that differs (a method that says nothing trains
  generative runs at ``default_lr`` too), optionally a
  ``pareto_knob`` (a config field) with a ``default_grid`` of 3-4 values for ``--grid``, and a
  ``merge(model) -> model`` folding trained weights into the backbone for inference;
* ``side_tuning=True`` for a method whose ``apply`` returns a
  :class:`petlprof.side_tuning.SideTunedModel` (never back-propagates through the frozen
  backbone): it then gets the hidden-state cache (``--cache-hidden-states``).  The flag and the
  model class must agree: checked when the MethodSpec is made (where ``apply`` is a class) and on every
  ``apply``.

What a method may assume about **either** task model (``objective`` ``"classification"`` or ``"lm"``):
``task_model.backbone`` (a Hugging Face model; its ``config`` gives ``hidden_size``,
``num_hidden_layers``, ``model_type``; a method may replace it, e.g. by a PEFT wrapper),
``task_model.family`` (``encoder``, ``encoder-decoder`` or ``decoder``), ``task_model.architecture``
(:class:`petlprof.models.architecture.Architecture`, module names relative to ``task_model.backbone``),
``task_model.placement`` (a dict the record shows), ``task_model.freeze_backbone()``,
``task_model.head`` (the module that maps the final hidden state to the output),
``backbone_outputs(...)`` (every layer's hidden states) and ``classify(final_hidden, attention_mask)``
(the head on a corrected final state: what side networks call).

* **classification** (:class:`petlprof.models.classifier.SequenceClassifier`): ``backbone`` is headless;
  ``head`` is a new trainable ``nn.Linear`` on the pooled state, which ``freeze_backbone()`` leaves
  trainable; the model's ``forward(input_ids, attention_mask)`` returns ``[batch, num_labels]`` logits.
* **lm** (:class:`petlprof.models.language_model.LanguageModel`): ``backbone`` is the model *with* its own LM head
  (``AutoModelForCausalLM``/``AutoModelForSeq2SeqLM``; tied embeddings stay tied); ``head`` is that
  pretrained LM head, and ``freeze_backbone()`` freezes it too (nothing trains until the method says
  so); the model's ``forward(input_ids, attention_mask, labels=None)`` returns ``[batch, tokens,
  vocabulary]`` logits with Hugging Face's label conventions (decoder: ``labels`` aligned with
  ``input_ids``, logits at ``t`` predict token ``t + 1``; encoder-decoder: ``input_ids`` feed the
  encoder, ``labels`` are the targets the decoder reads shifted right, logits align with ``labels``),
  and it must work with :func:`petlprof.models.language_model.greedy_generate` (PEFT wrappers of the backbone, forward
  hooks and side networks do; a model of its own needs ``generation_start``/``generation_step``).

A config may define ``validate()`` for rules across fields, and the backbone-shape hooks
``check_width(width, backbone)`` and ``check_depth(depth, backbone)``, called before a sweep starts
(:func:`check_backbone`) with each backbone's hidden size and number of layers; a field declared
``integer(..., depth=True)`` (a count of layers) is refused past the backbone's depth without one.

Every process of a run (the fresh worker, each torchrun rank, a Ray task) finds the MethodSpec by the method
name in the run's spec, through :mod:`petlprof.registry`: a built-in name, an entry point of group
``petlprof.methods``, or ``package.module:ATTR``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from petlprof.errors import UsageError, shown, unknown_choice
from petlprof.lookup import resolve
from petlprof.models.quantization import NONE, QUANTIZE_CHOICES
from petlprof.values import MAX_LR, Choice, Number, Text, is_number
from petlprof.vocabulary import CLASSIFICATION, LM, OBJECTIVES

MAX_WIDTH = 2**14  # no transformer in use is wider (LLaMA-3 405B: 16384): ranks, side widths, RNN sizes
MAX_COUNT = 2**12  # virtual tokens, heads, multipliers: beyond any backbone's positions or memory
PEFT_PREFIX = "peft:"  # the names of PEFT's tuners (peft:vera, ...), resolved by petlprof.registry
NAME_PATTERN = re.compile(rf"({PEFT_PREFIX})?[A-Za-z][A-Za-z0-9_-]*")


class MethodSpecError(UsageError):
    """A malformed :class:`MethodSpec` (raised where it is made)."""


# --- field checks -----------------------------------------------------------------------------------
# A number, choice or text field's check is :class:`petlprof.values.Number`, :class:`~petlprof.values.Choice` or
# :class:`~petlprof.values.Text`, the kinds of the run options too (re-exported here, the names plug-ins and
# petlprof.methods.peft_fields use); the checks below are the method fields' own.


@dataclass(frozen=True)
class ModuleNames:
    """A list of module names (or unset: the method's own default); ``pattern``: or one string, which PEFT
    reads as a regular expression matched against whole module names (or its ``all-linear``)."""

    pattern: bool = False

    def allowed(self) -> str:
        return "a list of module names" + (", a regular expression" if self.pattern else "") + ", or unset"

    def problem(self, value: Any) -> str | None:
        if value is None or (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
            return None
        if self.pattern and isinstance(value, str) and value:
            return None
        return f"must be {self.allowed().removesuffix(', or unset')}, got {shown(value)}"


@dataclass(frozen=True)
class Items:
    """A list whose every item passes ``item`` (``optional``: or unset)."""

    item: Any
    optional: bool = False

    def allowed(self) -> str:
        return f"a list of {self.item.allowed()}" + (", or unset" if self.optional else "")

    def problem(self, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        if not isinstance(value, list):
            return f"must be {self.allowed()}, got {shown(value)}"
        return next((f"item {i} {p}" for i, v in enumerate(value) if (p := _item_problem(self.item, v))), None)


@dataclass(frozen=True)
class Mapping:
    """A table from names to values that each pass ``value`` (``optional``: or unset)."""

    value: Any
    optional: bool = False

    def allowed(self) -> str:
        return f"a table of names to {self.value.allowed()}" + (", or unset" if self.optional else "")

    def problem(self, value: Any) -> str | None:
        if value is None and self.optional:
            return None
        if not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
            return f"must be {self.allowed()}, got {shown(value)}"
        return next((f"entry {shown(k)} {p}" for k, v in value.items() if (p := _item_problem(self.value, v))), None)


@dataclass(frozen=True)
class AnyOf:
    """A value that passes one of ``checks`` (a type annotation's union: an integer or a list of them;
    ``optional``: or unset)."""

    checks: tuple
    optional: bool = False

    def allowed(self) -> str:
        return " or ".join(check.allowed() for check in self.checks) + (", or unset" if self.optional else "")

    def problem(self, value: Any) -> str | None:
        if (value is None and self.optional) or any(check.problem(value) is None for check in self.checks):
            return None
        return f"must be {self.allowed()}, got {shown(value)}"


def _item_problem(check: Any, value: Any) -> str | None:
    """A check's problem with one item, worded to follow "item 2 " (a Choice says "'x' is not one of ...")."""
    problem = check.problem(value)
    if problem is None or problem.startswith("must"):
        return problem
    return f"must be {check.allowed()}, got {shown(value)}"


def _declare(default: Any, help: str, check: Any) -> Any:
    meta = {"help": help, "check": check}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def number(
    default: float | None,
    help: str,
    *,
    minimum: float,
    maximum: float,
    above: bool = False,
    below: bool = False,
    optional: bool = False,
) -> Any:
    """A finite real-valued field in ``[minimum, maximum]`` (both required: a range that makes sense);
    ``above=True`` excludes ``minimum`` itself, ``below=True`` ``maximum``."""
    check = Number(minimum=minimum, maximum=maximum, inclusive=not above, below=below, optional=optional)
    return _declare(default, help, check)


def integer(
    default: int | None,
    help: str,
    *,
    minimum: int = 1,
    maximum: int = MAX_COUNT,
    optional: bool = False,
    depth: bool = False,
) -> Any:
    """An integer field in ``[minimum, maximum]`` (bounded: a count or width no machine can hold is refused);
    ``depth=True`` marks a count of backbone layers, refused before a sweep when it exceeds the backbone's."""
    check = Number(minimum=minimum, maximum=maximum, inclusive=True, integer=True, optional=optional, depth=depth)
    return _declare(default, help, check)


def choice(default: Any, help: str, choices: Iterable[Any]) -> Any:
    """A field taking one of ``choices``."""
    return _declare(default, help, Choice(tuple(choices)))


def text(default: str, help: str, *, non_empty: bool = False) -> Any:
    """A string field."""
    return _declare(default, help, Text(non_empty=non_empty))


def module_names(default: list[str] | None, help: str) -> Any:
    """A list of backbone module names (``None``: the method's default targets)."""
    return _declare(default, help, ModuleNames())


def field_check(f: dataclasses.Field) -> Any:
    """The check a config field was declared with (None for a field declared otherwise)."""
    return f.metadata.get("check")


# --- configs ------------------------------------------------------------------------------------------


@dataclass
class MethodConfig:
    """Base of every method's config dataclass: each field's declared check runs when it is made,
    then :meth:`validate`; a failure is a :class:`UsageError` naming the field and the bad value."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            check = field_check(f)
            if check is None:
                raise UsageError(
                    f"field '{f.name}' of {type(self).__name__} is not declared with number(), integer(), "
                    "choice(), text() or module_names() from petlprof"
                )
            problem = check.problem(getattr(self, f.name))
            if problem:
                raise UsageError(f"{f.name} {problem}")
        self.validate()

    def validate(self) -> None:
        """Rules across fields (override); raise UsageError("FIELD ...") for a bad combination."""

    def check_width(self, width: int, backbone: str) -> None:
        """The backbone-shape hook (override): called before a sweep starts with each backbone's hidden
        size; raise UsageError naming the field, the backbone and what would fit."""

    def check_depth(self, depth: int, backbone: str) -> None:
        """The backbone-depth hook: called before a sweep starts with each backbone's number of layers
        (after ``--num-layers``).  By default it refuses a field declared ``integer(..., depth=True)``
        above ``depth``: ``layers=100`` on a 2-layer model would run as a separate configuration that is
        ``layers=2`` again.  Override for other rules (call ``super().check_depth`` to keep this one)."""
        for f in dataclasses.fields(self):
            check, value = field_check(f), getattr(self, f.name)
            if isinstance(check, Number) and check.depth and isinstance(value, int) and value > depth:
                raise UsageError(
                    f"{f.name} {value} is more than the {depth} layer(s) of backbone '{backbone}'; use at most {depth}"
                )


def check_backbone(method_spec: MethodSpec, config: MethodConfig, width: int, depth: int, backbone: str) -> None:
    """A configuration's backbone-shape checks, before a sweep starts: ``check_width`` (its messages name
    the method themselves) and ``check_depth`` (its message is prefixed with the method's name, as
    :meth:`MethodSpec.make_config` prefixes a field's)."""
    config.check_width(width, backbone)
    try:
        config.check_depth(depth, backbone)
    except UsageError as exc:
        raise UsageError(f"{method_spec.name} {exc}") from None


# --- the MethodSpec -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodSpec:
    """What the harness knows about a method without importing its implementation."""

    name: str
    description: str  # one line: what it trains
    config_cls: type
    apply: str | Callable  # (classifier, config) -> model, or "module:function" naming it
    default_lr: float  # per-method default learning rate, from the method's paper or PEFT examples (0: nothing trains)
    lr_source: str  # where the default learning rate comes from
    pareto_knob: str | None = None  # config field that trades quality for cost
    default_grid: tuple = ()  # 3-4 values of the Pareto knob that ``--grid`` sweeps
    side_tuning: bool = False  # never back-propagates through the frozen backbone
    merge: str | Callable | None = None  # model -> model with the trained weights folded into the backbone
    objectives: tuple[str, ...] = (CLASSIFICATION,)  # task objectives it supports (OBJECTIVES)
    quantize: tuple[str, ...] = (NONE,)  # --quantize values whose backbone it runs on (QUANTIZE_CHOICES)
    # last, so that a spec made with positional fields before them means what it meant
    lm_lr: float | None = None  # its default learning rate on the LM objective (None: default_lr there too)
    lm_lr_source: str | None = None  # where lm_lr comes from

    def __post_init__(self):
        problem = spec_problem(self)
        if problem:
            raise MethodSpecError(f"method spec '{self.name}': {problem}")

    def lr_for(self, objective: str) -> tuple[float, str]:
        """The default learning rate on ``objective`` (``"classification"`` or ``"lm"``) and where it comes from."""
        if objective == LM and self.lm_lr is not None:
            return self.lm_lr, str(self.lm_lr_source)
        return self.default_lr, self.lr_source

    def make_config(self, overrides: dict[str, Any] | None = None):
        """The method's config dataclass from user overrides, rejecting unknown fields and bad values by name."""
        overrides = dict(overrides or {})
        names = {f.name for f in dataclasses.fields(self.config_cls)}
        for key in overrides:
            if not names:
                raise UsageError(f"method '{self.name}' has no options (got {shown(key)})")
            if key not in names:
                raise unknown_choice(f"option of method '{self.name}'", key, names)
        try:
            return self.config_cls(**overrides)
        except UsageError as exc:
            raise UsageError(f"{self.name} {exc}") from None
        except (TypeError, ValueError) as exc:  # raised by a config's own code
            raise UsageError(f"bad option for method '{self.name}': {type(exc).__name__}: {exc}") from None

    def build(self) -> Callable:
        """``apply``, checked: the model it returns agrees with ``side_tuning``."""
        apply = resolve_target(self.apply)

        def checked_apply(task_model, config):
            check_objective(self, getattr(task_model, "objective", CLASSIFICATION))
            return check_model(self, apply(task_model, config))

        return checked_apply

    def build_merge(self) -> Callable | None:
        """The method's merge function (trained model -> model with weights folded in), if any."""
        return resolve_target(self.merge) if self.merge else None

    def grid_configs(self) -> list[dict[str, Any]]:
        """One method-config override per value of the default grid (``[{}]`` without a grid)."""
        if self.pareto_knob is None:  # then the grid is empty too: __post_init__ refuses a grid without a knob
            return [{}]
        return [{self.pareto_knob: value} for value in self.default_grid] or [{}]


def check_objective(method_spec: MethodSpec, objective: str) -> None:
    """Refuse, in one line, a method for an objective it does not declare (before any run, and on ``apply``)."""
    if objective not in OBJECTIVES:
        raise unknown_choice("objective", objective, OBJECTIVES)
    if objective not in method_spec.objectives:
        supported = " and ".join(f"'{o}'" for o in method_spec.objectives)
        raise UsageError(
            f"method '{method_spec.name}' does not support the '{objective}' objective (it declares {supported}); "
            f"choose another method, or declare objectives=(..., '{objective}') in its MethodSpec once its apply "
            "handles that task model"
        )


def check_quantize(method_spec: MethodSpec, quantize: str) -> None:
    """Refuse, in one line, a method on a backbone quantised in a way it does not declare (before any run)."""
    if quantize in method_spec.quantize:
        return
    raise UsageError(
        f"method '{method_spec.name}' ({method_spec.description}) cannot run on a --quantize {quantize} backbone: "
        "bitsandbytes stores the backbone's linear weights as packed integers, which a method can neither train nor "
        "read as float weights, and it does not declare that it runs on them (its MethodSpec has quantize="
        f"{tuple(method_spec.quantize)}); run it with --quantize none, or choose a method that keeps the backbone "
        "frozen (e.g. lora, which on an nf4 backbone is QLoRA)"
    )


def resolve_target(target: str | Callable) -> Any:
    """A callable, or the object ``"module:attr"`` names (a function, or a :class:`MethodSpec` for the registry)."""
    return target if callable(target) else resolve(target)


def check_model(method_spec: MethodSpec, model: Any) -> Any:
    """The model ``apply`` returned, if it agrees with the MethodSpec's ``side_tuning`` flag."""
    from petlprof.side_tuning import SideTunedModel  # torch: a MethodSpec is made, and listed, without it

    side = isinstance(model, SideTunedModel)
    if side != method_spec.side_tuning:
        raise UsageError(_side_mismatch(method_spec, type(model)))
    return model


def _side_mismatch(method_spec: MethodSpec, cls: type) -> str:
    if method_spec.side_tuning:
        return (
            f"method '{method_spec.name}' declares side_tuning=True, but its apply gives a {cls.__name__}, which does "
            "not subclass petlprof.SideTunedModel (the hidden-state cache needs backbone_states, state_masks "
            "and side_forward)"
        )
    return (
        f"method '{method_spec.name}' gives a side-tuning model ({cls.__name__}) but does not declare side_tuning=True"
    )


def _target_problem(label: str, target: Any, optional: bool = False) -> str | None:
    if target is None and optional:
        return None
    if callable(target):
        return None
    if isinstance(target, str) and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", target):
        return None
    return f"{label} must be a callable or 'module:function', got {shown(target)}"


def spec_problem(method_spec: MethodSpec) -> str | None:
    """What is wrong with a MethodSpec, in one phrase (None: nothing)."""
    if not (isinstance(method_spec.name, str) and NAME_PATTERN.fullmatch(method_spec.name)):
        return f"name must be letters, digits, '_' or '-' starting with a letter, got {shown(method_spec.name)}"
    if not (
        isinstance(method_spec.description, str)
        and method_spec.description.strip()
        and "\n" not in method_spec.description
    ):
        return f"description must be one non-empty line, got {shown(method_spec.description)}"
    cls = method_spec.config_cls
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and issubclass(cls, MethodConfig)):
        return f"config_cls must be a dataclass subclassing petlprof.MethodConfig, got {shown(cls)}"
    for label, target, optional in (("apply", method_spec.apply, False), ("merge", method_spec.merge, True)):
        problem = _target_problem(label, target, optional)
        if problem:
            return problem
    lr = method_spec.default_lr
    if not (is_number(lr) and lr >= 0):  # 0: a method that trains nothing (zero_shot)
        return f"default_lr must be a positive finite number, got {shown(lr)}"
    if not (isinstance(method_spec.lr_source, str) and method_spec.lr_source.strip()):
        return f"lr_source must say where default_lr comes from, got {shown(method_spec.lr_source)}"
    if method_spec.lm_lr is None:
        if method_spec.lm_lr_source is not None:
            return f"lm_lr_source is given ({shown(method_spec.lm_lr_source)}) but lm_lr is not"
    else:
        if not (is_number(method_spec.lm_lr) and 0 < method_spec.lm_lr <= MAX_LR):
            return f"lm_lr must be a positive number of at most {MAX_LR:g}, or None, got {shown(method_spec.lm_lr)}"
        if not (isinstance(method_spec.lm_lr_source, str) and method_spec.lm_lr_source.strip()):
            return f"lm_lr_source must say where lm_lr comes from, got {shown(method_spec.lm_lr_source)}"
    objectives = method_spec.objectives
    if not (isinstance(objectives, (tuple, list)) and objectives and all(o in OBJECTIVES for o in objectives)):
        allowed = ", ".join(repr(o) for o in OBJECTIVES)
        return f"objectives must be a non-empty tuple of {allowed}, got {shown(objectives)}"
    if method_spec.lm_lr is not None and LM not in objectives:
        return f"lm_lr is set but objectives {shown(objectives)} do not include '{LM}'"
    quantize = method_spec.quantize
    if not (isinstance(quantize, (tuple, list)) and quantize and all(q in QUANTIZE_CHOICES for q in quantize)):
        allowed = ", ".join(repr(q) for q in QUANTIZE_CHOICES)
        return f"quantize must be a non-empty tuple of {allowed}, got {shown(quantize)}"
    if not isinstance(method_spec.side_tuning, bool):
        return f"side_tuning must be true or false, got {shown(method_spec.side_tuning)}"
    if isinstance(method_spec.apply, type):  # a model class: its kind is known now
        from petlprof.side_tuning import SideTunedModel  # torch: only for a MethodSpec whose apply is a model class

        if issubclass(method_spec.apply, SideTunedModel) != method_spec.side_tuning:
            return _side_mismatch(method_spec, method_spec.apply)
    return _config_problem(method_spec)


def _config_problem(method_spec: MethodSpec) -> str | None:
    """The config's defaults and the default grid must pass the config's own checks."""
    names = [f.name for f in dataclasses.fields(method_spec.config_cls)]
    if method_spec.pareto_knob is not None and method_spec.pareto_knob not in names:
        return f"pareto_knob {shown(method_spec.pareto_knob)} is not a field of {method_spec.config_cls.__name__}"
    if not isinstance(method_spec.default_grid, (tuple, list)):
        return f"default_grid must be a tuple of values, got {shown(method_spec.default_grid)}"
    if method_spec.default_grid and method_spec.pareto_knob is None:
        return "it has a default grid but no Pareto knob"
    points: list[dict[str, Any]] = [{}]
    if method_spec.pareto_knob is not None:
        points += [{method_spec.pareto_knob: value} for value in method_spec.default_grid]
    for point in points:
        try:
            method_spec.config_cls(**point)
        except (UsageError, TypeError, ValueError) as exc:
            where = f"default grid value {point}" if point else "config defaults"
            return f"its {where} fail its own checks: {exc}"
    return None
