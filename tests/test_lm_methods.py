"""Every built-in method on the language-modelling objective, on a causal and a sequence-to-sequence preset.

Per method x preset, on a tiny fixed batch (built here, with -100 on prompt and padding positions): the
loss falls over a few steps; only the intended parameters get gradients (the frozen backbone none where
promised); step 0 gives the plain LM's loss where the method promises identity at init; the LM head only
at the scored positions gives the loss and gradients of the head at every position; greedy decoding
with the backbone's KV cache agrees token for token with decoding that re-reads the whole sequence.
The models run in eval mode (no dropout), so every number is deterministic.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import warnings

import pytest
import torch

from petlprof.errors import UsageError
from petlprof.method_api import MethodConfig, MethodSpec, MethodSpecError, check_objective
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import make_task_model
from petlprof.models.families import DECODER, ENCODER_DECODER
from petlprof.models.language_model import (
    LanguageModel,
    TargetLogits,
    greedy_generate,
    lm_loss,
    target_positions,
    targets_at,
    task_model_of,
)
from petlprof.registry import builtin_method_names, get_method
from petlprof.run.cache import HiddenStateCache

PRESETS = ["tiny-llama", "tiny-t5"]
METHODS = [name for name in builtin_method_names() if "lm" in get_method(name).objectives and name != "zero_shot"]
# small prompts keep the tiny models fast; random init for prompt tuning (its default text is a sentiment prompt)
CONFIGS = {"prompt_tuning": {"num_virtual_tokens": 3, "init": "random"}, "prefix_tuning": {"num_virtual_tokens": 3}}
LR = {"full": 1e-3}  # the rest: 1e-2
IDENTITY_AT_INIT = {"full", "linear_probe", "bitfit", "lora", "ia3", "adapter", "lst", "read"}
# which parameters each method trains under the LM objective, by name in the applied model
TRAINS = {
    "full": lambda name: True,
    "linear_probe": lambda name: name == "untied_head.weight" or name == "backbone.lm_head.weight",
    "bitfit": lambda name: name == "logit_bias" or name.endswith(".bias"),
    "lora": lambda name: "lora_" in name,
    "ia3": lambda name: "ia3_" in name,
    "prompt_tuning": lambda name: "prompt_encoder" in name,
    "prefix_tuning": lambda name: "prompt_encoder" in name,
    "adapter": lambda name: name.startswith("adapters."),
    "lst": lambda name: not name.startswith("classifier."),
    "read": lambda name: not name.startswith("classifier."),
}
CASES = [(m, p, CONFIGS.get(m, {})) for m in METHODS for p in PRESETS] + [
    ("read", "tiny-t5", {"t5_wiring": "encoder_output"})
]


def case_id(case) -> str:
    method, preset, config = case
    extra = "".join(f"-{k}={v}" for k, v in config.items() if k not in CONFIGS.get(method, {}))
    return f"{method}-{preset}{extra}"


@functools.cache
def _backbone(preset: str):
    return load_backbone(preset, lm_head=True)


def language_model(preset: str) -> LanguageModel:
    loaded = _backbone(preset)  # a fresh copy of its weights; the tokenizer is the process's one (never changed)
    backbone = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model), placement={})
    return make_task_model(backbone, "lm", num_labels=0)


def lm_batch(family: str) -> dict[str, torch.Tensor]:
    """Two examples, the second shorter: a decoder's prompt + target left-padded, with -100 on the prompt
    and the padding; an encoder-decoder's prompt (encoder) and -100-padded target (decoder)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0
    if family == ENCODER_DECODER:
        labels = torch.randint(1000, 2000, (2, 4), generator=g)
        labels[1, 3:] = -100
    else:
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :4] = -100  # the prompt
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def apply(method: str, preset: str, config: dict):
    task_model = language_model(preset)
    spec = get_method(method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bitfit's "no bias terms" on LLaMA/T5
        return task_model, spec.build()(task_model, spec.make_config(config)).eval()


def loss_of(model, batch, family):
    return lm_loss(model(**batch), batch["labels"], family)


def every_position(out, rows: int) -> torch.Tensor:
    """``[B, T, V]`` logits from a pass whose every position is scored (all labels real), or that gave them."""
    return out.logits.view(rows, -1, out.logits.shape[-1]) if isinstance(out, TargetLogits) else out


def perturbed(model, method: str, scale: float = 0.05):
    """Every trained piece moved off its no-op start (zero-initialised projections would hide a wrong path)."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad and method != "full":
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * scale)
    return model


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_method_trains_on_the_lm_objective(case):
    method, preset, config = case
    plain = language_model(preset).eval()
    batch = lm_batch(plain.family)
    with torch.no_grad():
        plain_loss = float(loss_of(plain, batch, plain.family))
    task_model, model = apply(method, preset, config)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(TRAINS[method](name) for name in trainable), sorted(trainable)[:5]
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR.get(method, 1e-2))
    losses = []
    for step in range(4):
        loss = loss_of(model, batch, task_model.family)
        losses.append(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if step == 0:
            graded = {name for name, p in model.named_parameters() if p.grad is not None}
            assert graded and graded <= trainable, sorted(graded - trainable)[:5]
        optimizer.step()
    if method in IDENTITY_AT_INIT:
        assert losses[0] == pytest.approx(plain_loss, abs=1e-5)
    assert losses[-1] < losses[0] - 1e-3, losses


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_generation_with_the_kv_cache_equals_generation_without(case):
    method, preset, config = case
    task_model, model = apply(method, preset, config)
    perturbed(model, method)  # move every trained piece off its no-op start, so the test sees it
    batch = lm_batch(task_model.family)
    prompt = {k: batch[k] for k in ("input_ids", "attention_mask")}
    if task_model.family == DECODER:
        prompt = {k: v[:, :4] for k, v in prompt.items()}  # left-padded prompts
    steps = []
    cached = greedy_generate(
        model, **prompt, max_new_tokens=5, eos_token_id=task_model.eos_token_id, on_token=steps.append
    )
    again = greedy_generate(model, **prompt, max_new_tokens=5, eos_token_id=task_model.eos_token_id, use_cache=False)
    assert cached == again
    assert steps == list(range(len(steps))) and 1 <= len(steps) <= 5
    assert all(len(row) <= 5 for row in cached)
    # and the logits themselves, fed the same tokens: the KV-cache path against whole-sequence passes
    fed = torch.randint(1000, 2000, (2, 3), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, state = model.generation_start(**prompt)
        steps = [logits]
        for column in fed.T[:-1]:
            logits, state = model.generation_step(column, state)
            steps.append(logits)
        if task_model.family == DECODER:
            ids = torch.cat([prompt["input_ids"], fed[:, :-1]], dim=1)
            mask = torch.cat([prompt["attention_mask"], torch.ones_like(fed[:, :-1])], dim=1)
            whole = model(ids, mask)[:, -fed.shape[1] :]
        else:
            whole = every_position(model(**prompt, labels=fed), 2)  # every fed token is real: all scored
    torch.testing.assert_close(torch.stack(steps, dim=1), whole, rtol=1e-4, atol=1e-4)


def test_generation_stops_each_row_at_its_eos():
    model = language_model("tiny-llama").eval()
    prompt = lm_batch(DECODER)
    prompt = {k: prompt[k][:, :4] for k in ("input_ids", "attention_mask")}
    free = greedy_generate(model, **prompt, max_new_tokens=4, eos_token_id=None)
    assert all(len(row) == 4 for row in free)
    stop = free[0][1]  # row 0 stops at its second token or before; row 1 where it meets it, if it does
    rows = greedy_generate(model, **prompt, max_new_tokens=4, eos_token_id=stop)
    assert rows == [row[: row.index(stop)] if stop in row else row for row in free]
    assert len(rows[0]) <= 1


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_head_only_where_the_loss_reads_it_gives_the_loss_of_the_head_everywhere(case):
    """Given labels a model puts the LM head only on the positions that predict a target token; its loss and
    gradients are those of the head at every position (``logits_everywhere``, the path before), for a method
    moved off its start, and through the hidden-state cache for the side-tuning methods."""
    method, preset, config = case
    task_model, model = apply(method, preset, config)
    perturbed(model, method)
    batch = lm_batch(task_model.family)
    labels = batch["labels"]
    scored = model(**batch)
    assert isinstance(scored, TargetLogits)
    targets = labels[:, 1:] if task_model.family == DECODER else labels
    assert scored.logits.shape[0] == int((targets != -100).sum()) < labels.numel()
    assert scored.labels.tolist() == targets[targets != -100].tolist()  # row by row, left to right

    def loss_and_grads(everywhere: bool, cache: HiddenStateCache | None = None):
        task_model_of(model).logits_everywhere = everywhere
        try:
            out = model(**batch) if cache is None else cache.logits(model, batch, [0, 1])
            assert isinstance(out, TargetLogits) != everywhere
            loss = lm_loss(out, labels, task_model.family)
            params = [p for p in model.parameters() if p.requires_grad]
            return loss.detach(), torch.autograd.grad(loss, params)
        finally:
            task_model_of(model).logits_everywhere = False

    (before, before_grads), (after, after_grads) = loss_and_grads(True), loss_and_grads(False)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    for new, old in zip(after_grads, before_grads, strict=True):
        torch.testing.assert_close(new, old, rtol=1e-4, atol=1e-6)
    if get_method(method).side_tuning:
        for everywhere in (False, True):  # READ's cache keeps only the scored positions unless everywhere
            cache = HiddenStateCache(budget_bytes=2**20, dtype="float32")
            try:
                task_model_of(model).logits_everywhere = everywhere
                with torch.no_grad():
                    cache.logits(model, batch, [0, 1])  # a miss fills it
                loss, _ = loss_and_grads(everywhere, cache)  # a hit
                assert (cache.hits, cache.misses) == (2, 2)
                torch.testing.assert_close(loss, before, rtol=1e-5, atol=1e-6)
            finally:
                task_model_of(model).logits_everywhere = False
                cache.close()


@pytest.mark.parametrize("method", ["read", "lst"])
@pytest.mark.parametrize("preset", PRESETS)
def test_the_hidden_state_cache_serves_lm_batches(method, preset):
    """Teacher-forced LM batches (inputs with labels) through the cache: a hit gives the logits of a full pass."""
    task_model, model = apply(method, preset, {})
    perturbed(model, method)
    batch = lm_batch(task_model.family)
    cache = HiddenStateCache(budget_bytes=2**20, dtype="float32")
    try:
        first = cache.logits(model, batch, [3, 5])
        second = cache.logits(model, batch, [3, 5])
        assert (cache.hits, cache.misses) == (2, 2)
        with torch.no_grad():
            whole = model(**batch)
        for out in (first, second):
            assert isinstance(out, TargetLogits) and torch.equal(out.labels, whole.labels)
            torch.testing.assert_close(out.logits, whole.logits, rtol=0, atol=1e-5)
        if method == "read" and task_model.family == DECODER:  # READ keeps only the scored positions' states
            kept = sum(int(entry["layers"].shape[0]) for entry in cache._entries.values())
            assert kept == whole.logits.shape[0] < int(batch["attention_mask"].sum())
    finally:
        cache.close()


def test_linear_probe_unties_a_tied_head_and_leaves_the_embeddings_frozen():
    task_model, model = apply("linear_probe", "tiny-t5", {})
    embeddings = task_model.hf_model.get_input_embeddings().weight
    assert task_model.untied_head is not None and task_model.head.weight is not embeddings
    assert not embeddings.requires_grad and task_model.head.weight.requires_grad


def test_a_classification_only_plug_in_is_refused_for_lm():
    spec = MethodSpec(
        name="headonly",
        description="a plug-in from before the LM objective",
        config_cls=MethodConfig,
        apply=lambda classifier, config: classifier.freeze_backbone(),
        default_lr=1e-3,
        lr_source="a test",
    )
    assert spec.objectives == ("classification",)
    check_objective(spec, "classification")
    message = "method 'headonly' does not support the 'lm' objective (it declares 'classification')"
    with pytest.raises(UsageError, match=re.escape(message)):
        check_objective(spec, "lm")
    with pytest.raises(UsageError, match=re.escape(message)):  # the guard on apply, for a caller with no preflight
        spec.build()(language_model("tiny-llama"), spec.make_config({}))
    with pytest.raises(MethodSpecError, match="objectives must be"):
        MethodSpec(**{**spec.__dict__, "objectives": ("generation",)})


def test_an_encoder_has_no_lm_objective():
    with pytest.raises(UsageError, match="'tiny-bert' is an encoder .*no language-modelling head"):
        load_backbone("tiny-bert", lm_head=True)
    with pytest.raises(UsageError, match="without its language-modelling head"):
        make_task_model(load_backbone("tiny-llama"), "lm", 0)


def test_lm_loss_reads_target_tokens_only():
    logits = torch.randn(1, 4, 10)
    labels = torch.tensor([[-100, 3, 5, -100]])
    expected = torch.nn.functional.cross_entropy(logits[0, [0, 1]], torch.tensor([3, 5]))
    torch.testing.assert_close(lm_loss(logits, labels, DECODER), expected)  # logits at t predict t + 1
    expected = torch.nn.functional.cross_entropy(logits[0, [1, 2]], torch.tensor([3, 5]))
    torch.testing.assert_close(lm_loss(logits, labels, ENCODER_DECODER), expected)
    for family, at in ((DECODER, [0, 1]), (ENCODER_DECODER, [1, 2])):  # the scored positions alone
        positions = target_positions(labels, family)
        assert positions[0].nonzero().flatten().tolist() == at
        scored = TargetLogits(logits[positions], targets_at(labels, positions, family))
        assert scored.labels.tolist() == [3, 5]
        torch.testing.assert_close(lm_loss(scored, labels, family), lm_loss(logits, labels, family))


@pytest.mark.parametrize("method", ["lora", "ia3"])
@pytest.mark.parametrize("preset", PRESETS)
def test_merged_weights_give_the_same_logits_and_tokens(method, preset):
    task_model, model = apply(method, preset, {})
    perturbed(model, method, scale=0.1)
    batch = lm_batch(task_model.family)
    prompt = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        before = model(**batch)
        tokens = greedy_generate(model, **prompt, max_new_tokens=3, eos_token_id=None)
        merged = get_method(method).build_merge()(model)
        assert not any("lora_" in n or "ia3_" in n for n, _ in merged.named_parameters())
        after = merged(**batch)
        torch.testing.assert_close(after.logits, before.logits, rtol=1e-4, atol=1e-4)
        assert greedy_generate(merged, **prompt, max_new_tokens=3, eos_token_id=None) == tokens


@pytest.mark.parametrize("preset", PRESETS + ["tiny-gpt2"])
def test_the_architecture_is_found_inside_the_lm_wrapper(preset):
    backbone = _backbone(preset)
    arch = backbone.architecture
    assert arch.blocks and arch.missing_sublayers() is None
    modules = dict(backbone.model.named_modules())
    assert all(name in modules for name in arch.sublayer_outputs())
    assert "lm_head" in modules
