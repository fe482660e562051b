"""Cost regression checks for CI: profile one training step of a method and compare against a baseline.

Wall-clock times on shared CI machines are noise, so the checks rest on two kinds of figure:

* **deterministic figures** — trainable parameters, bytes of weights / gradients / optimiser state,
  and the bytes of activations autograd saves for the backward pass (counted exactly through
  ``torch.autograd.graph.saved_tensors_hooks``, each storage once).  A method that starts
  back-propagating through its frozen backbone, or doubles its trainable parameters, changes these
  at once;
* **ratios measured side by side** — e.g. READ's step time over full fine-tuning's, timed in
  alternation in one process, so a slow machine slows both.

Absolute times are reported for information and never asserted.  The baseline is a JSON file with
a tolerance per figure; ``petlprof.bench.plugin`` exposes all this to a user's own pytest suite.

``MethodStep(..., objective="lm", target_len=T)`` profiles the language-modelling objective instead: the
backbone's own LM head (loaded with ``lm_head=True``), a decoder's rows ``seq_len - T`` prompt tokens and
``T`` target tokens (an encoder-decoder's encoder reads ``seq_len`` tokens, its decoder ``T``), the loss
on the target tokens (:func:`petlprof.models.language_model.lm_loss`).
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from petlprof.meters import synchronize
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import make_task_model
from petlprof.models.families import ENCODER_DECODER
from petlprof.models.language_model import lm_loss
from petlprof.models.quantization import parameter_count
from petlprof.registry import get_method
from petlprof.results.figures import TRAINING_TENSORS, Figure
from petlprof.vocabulary import CLASSIFICATION, IGNORE_INDEX, LM


class Diverged(RuntimeError):
    """A profiled method's training loss stopped being a finite number."""


SENTENCE = "the quick brown fox jumps over the lazy dog and keeps running through the field"


@dataclass
class StepProfile:
    """Cost figures of one training step and one inference batch of a method (units in names)."""

    method: str
    backbone: str
    batch_size: int
    seq_len: int
    trainable_params: int
    total_params: int
    weight_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    saved_activation_bytes: int

    @property
    def training_tensor_bytes(self) -> int:
        """A deterministic model of training memory: weights + gradients + AdamW state + saved activations."""
        return self.weight_bytes + self.grad_bytes + self.optimizer_state_bytes + self.saved_activation_bytes

    def figures(self) -> dict[str, int]:
        """Every count of the profile by its name, the derived
        :data:`~petlprof.results.figures.TRAINING_TENSORS` included."""
        return {
            **{k: v for k, v in asdict(self).items() if isinstance(v, int)},
            TRAINING_TENSORS.name: self.training_tensor_bytes,
        }

    def figure(self, figure: Figure) -> int:
        """The value of a declared step figure (:data:`petlprof.results.figures.STEP`); a KeyError for another."""
        figures = self.figures()
        if figure.name not in figures:
            raise KeyError(f"a step profile has no figure {figure.name!r}; it has {', '.join(figures)}")
        return figures[figure.name]


def _lm_batch(backbone, batch_size: int, seq_len: int, target_len: int) -> tuple[dict, torch.Tensor]:
    """A full LM batch of :data:`SENTENCE`'s tokens (repeated): a decoder's rows ``seq_len`` tokens, the last
    ``target_len`` the target (the prompt at -100); an encoder-decoder's prompt ``seq_len`` and target
    ``target_len`` tokens."""
    if not 0 < target_len < seq_len:
        raise ValueError(f"target_len must be between 1 and seq_len - 1 = {seq_len - 1}, got {target_len}")
    words = backbone.tokenizer(SENTENCE, add_special_tokens=False)["input_ids"]

    def tokens(count: int) -> torch.Tensor:
        row = (words * (count // len(words) + 1))[:count]
        return torch.tensor([row] * batch_size)

    if backbone.family == ENCODER_DECODER:
        ids, labels = tokens(seq_len), tokens(target_len)
    else:
        ids = tokens(seq_len)
        labels = ids.clone()
        labels[:, : seq_len - target_len] = IGNORE_INDEX
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}, labels


class MethodStep:
    """A method applied to a backbone, with a fixed batch, ready to time or profile."""

    def __init__(
        self,
        method: str,
        backbone: str = "tiny-bert",
        *,
        batch_size: int = 16,
        seq_len: int = 64,
        num_layers: int | None = None,
        device: str = "cpu",
        method_config: dict | None = None,
        lr: float = 1e-4,
        objective: str = CLASSIFICATION,
        target_len: int = 16,
    ):
        method_spec = get_method(method)
        torch.manual_seed(0)
        lm = objective == LM
        self.backbone = load_backbone(backbone, num_layers=num_layers, lm_head=lm)
        task_model = make_task_model(self.backbone, objective, num_labels=2)
        self.model = method_spec.build()(task_model, method_spec.make_config(method_config or {})).to(device)
        # a plug-in named as ``module:SPEC`` is called by its MethodSpec's name, in messages and baseline keys
        self.method, self.backbone_name, self.device = method_spec.name, backbone, device
        if lm:
            self.backbone_name = f"{backbone}-lm"  # baseline keys tell the objective apart
            inputs, _ = _lm_batch(self.backbone, batch_size, seq_len, target_len)
            self.inputs = {k: v.to(device) for k, v in inputs.items()}
            self.labels = self.inputs["labels"]
            self.loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] = functools.partial(
                lm_loss, family=self.backbone.family
            )
        else:
            batch = self.backbone.tokenizer(
                [SENTENCE] * batch_size, padding="max_length", truncation=True, max_length=seq_len, return_tensors="pt"
            )
            self.inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask")}
            self.labels = torch.arange(batch_size, device=device) % 2
            self.loss_fn = torch.nn.functional.cross_entropy
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr)
        self.batch_size, self.seq_len = batch_size, seq_len
        self.steps = 0

    def train_step(self) -> None:
        """One optimiser step; :class:`Diverged` when its loss is not a finite number (a step on NaN
        or infinite numbers costs something else than a real one, so its figures would mislead)."""
        self.model.train()
        loss = self.loss_fn(self.model(**self.inputs), self.labels)
        self.steps += 1
        if not torch.isfinite(loss.detach()):
            self.optimizer.zero_grad(set_to_none=True)
            raise Diverged(f"{self.method} diverged at training step {self.steps}: the loss was {loss.item()}")
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)

    @torch.no_grad()
    def infer_batch(self) -> None:
        self.model.eval()
        self.model(**self.inputs)
        synchronize(self.device)

    def profile(self) -> StepProfile:
        self.train_step()  # materialise the optimiser state
        trainable = sum(p.numel() for p in self.params)
        state = sum(
            t.numel() * t.element_size()
            for s in self.optimizer.state.values()
            for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0
        )
        return StepProfile(
            method=self.method,
            backbone=self.backbone_name,
            batch_size=self.batch_size,
            seq_len=self.seq_len,
            trainable_params=trainable,
            total_params=parameter_count(self.model),
            weight_bytes=sum(p.numel() * p.element_size() for p in self.model.parameters()),
            grad_bytes=sum(p.numel() * p.element_size() for p in self.params),
            optimizer_state_bytes=state,
            saved_activation_bytes=self.saved_activation_bytes(),
        )

    def saved_activation_bytes(self) -> int:
        """Bytes of the tensors autograd keeps for backward in one training forward, each storage once,
        parameters excluded (they are counted as weights)."""
        param_storages = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        seen: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in param_storages:
                seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
            return tensor

        self.model.train()
        torch.manual_seed(0)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = self.loss_fn(self.model(**self.inputs), self.labels)
        total = sum(seen.values())
        del loss
        return total


def time_rounds(functions: dict[str, Callable[[], None]], rounds: int = 10, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of each call of each function, called once per round so that drift in the machine's
    speed hits all alike, in a new (seeded) order each round so that none always runs after the same
    one; index ``i`` of every list is round ``i``."""
    for _ in range(warmup):
        for fn in functions.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in functions}
    order = random.Random(0)
    for _ in range(rounds):
        for name in order.sample(list(functions), len(functions)):
            fn = functions[name]
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return samples


def paired_ratio(samples: dict[str, list[float]], name: str, reference: str) -> float:
    """Median over rounds of ``name``'s time over ``reference``'s time in the same round: a slow
    stretch of a shared machine falls on both sides of each ratio instead of on one median."""
    return statistics.median(a / b for a, b in zip(samples[name], samples[reference], strict=True))


@dataclass(frozen=True)
class BaselineEntry:
    """One committed figure: its value (an exact count stays an int) and the relative tolerance it is checked
    with; ``extra`` keeps any other key the file has for it, written back as it was."""

    value: int | float
    rtol: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BaselineEntry:
        value, rtol = data.get("value"), data.get("rtol")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(rtol, (int, float)):
            raise ValueError(f"a baseline entry needs a numeric value and rtol, not {dict(data)!r}")
        return cls(value, float(rtol), {k: v for k, v in data.items() if k not in ("value", "rtol")})

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "rtol": self.rtol, **self.extra}


class Baseline:
    """Committed reference figures with tolerances: ``{"figures": {key: {"value": v, "rtol": r}}}``.

    Time ratios may not grow past ``rtol`` (a drop is an improvement).  Exact counts — parameters,
    tensor bytes — are ``two_sided``: a drop past ``rtol`` fails too, since a method that suddenly
    trains or saves far less has usually stopped working (LoRA targeting nothing, a side network
    cut off).  Refresh with ``--petlprof-update-baseline`` after an intended change.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.extra = {k: v for k, v in data.items() if k != "figures"}  # kept as written (a comment, say)
        self.figures: dict[str, BaselineEntry] = {}
        for key, entry in data.get("figures", {}).items():
            try:
                self.figures[key] = BaselineEntry.from_json(entry)
            except ValueError as exc:
                raise ValueError(f"{self.path}: figure {key!r}: {exc}") from None

    def check(self, key: str, value: float, rtol: float | None = None, two_sided: bool = False) -> str | None:
        """None when within tolerance (or no baseline yet); otherwise the failure message.
        ``rtol`` overrides the stored tolerance."""
        entry = self.figures.get(key)
        if entry is None:
            return None
        rtol = entry.rtol if rtol is None else rtol
        base = entry.value
        if value > base * (1 + rtol):
            return (
                f"{key} = {value:g} exceeds the baseline {base:g} by more than {rtol:.0%} (limit {base * (1 + rtol):g})"
            )
        if two_sided and value < base * (1 - rtol):
            return (
                f"{key} = {value:g} is below the baseline {base:g} by more than {rtol:.0%}: did the method "
                "stop training or saving what it should? Refresh the baseline if the change is intended"
            )
        return None

    def has(self, key: str) -> bool:
        return key in self.figures

    def record(self, key: str, value: float, rtol: float) -> None:
        self.figures[key] = BaselineEntry(value, rtol)

    def save(self) -> None:
        figures = {key: entry.to_json() for key, entry in sorted(self.figures.items())}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.extra, "figures": figures}, indent=2) + "\n")
        tmp.replace(self.path)  # an interrupted update never leaves half a baseline
