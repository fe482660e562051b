"""The hidden-state cache: cached and uncached training give the same losses, and the cache spills.

Training here goes through :func:`petlprof.run.train.train` itself (shuffled batches, dynamic
padding), so an example meets different padded lengths and neighbours in every epoch.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from petlprof.errors import UsageError
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import SequenceClassifier
from petlprof.registry import get_method
from petlprof.run.cache import DTYPES, HiddenStateCache
from petlprof.run.recipe import TrainRecipe
from petlprof.run.train import Batches, PhaseIO, Steps, train
from petlprof.sweep.config import build_options, expand
from petlprof.sweep.options import CACHE_DTYPES
from petlprof.sweep.spec import RunSpec

TEXTS = [
    "what a wonderful day",
    "this is terrible and I hate it",
    "love it",
    "worst thing ever made",
    "not bad at all, quite good actually",
    "meh",
    "I would buy this again and again",
    "never again",
    "brilliant",
    "the plot made no sense whatsoever and the ending was worse",
    "fine",
    "great fun",
]
EPOCHS = 3


pytestmark = pytest.mark.usefixtures("one_thread")


def run(preset: str, method: str, config: dict, cache: HiddenStateCache | None, padding_side: str = "right"):
    """Train 3 epochs of batches of 4 over 12 examples; return the phase summary, every step's logits
    (both paths go through ``side_forward``) and the trained model."""
    torch.manual_seed(0)
    backbone = load_backbone(preset)
    if padding_side != backbone.tokenizer.padding_side:  # a copy: the tokenizer is shared in this process
        backbone.tokenizer = copy.deepcopy(backbone.tokenizer)
        backbone.tokenizer.padding_side = padding_side
    spec = get_method(method)
    model = spec.build()(SequenceClassifier(backbone, 2), spec.make_config(config))
    enc = backbone.tokenizer(TEXTS)
    rows = [{k: enc[k][i] for k in ("input_ids", "attention_mask")} for i in range(len(TEXTS))]
    batches = Batches(rows, torch.arange(len(TEXTS)) % 2, 4, backbone.tokenizer)
    logits, side_forward = [], model.side_forward

    def recorded(*args, **kwargs):
        out = side_forward(*args, **kwargs)
        logits.append(out.detach().clone())
        return out

    model.side_forward = recorded
    summary = train(model, batches, TrainRecipe(lr=1e-2), Steps(epochs=EPOCHS), PhaseIO("cpu", [], "test"), cache=cache)
    return summary, logits, model


CASES = [
    ("tiny-bert", "read", {}, "right"),
    ("tiny-gpt2", "read", {}, "left"),
    ("tiny-t5", "read", {"t5_wiring": "side"}, "right"),
    ("tiny-t5", "read", {"t5_wiring": "encoder_output"}, "right"),
    ("tiny-bert", "lst", {}, "right"),
    ("tiny-t5", "lst", {}, "right"),
]


@pytest.mark.parametrize("preset, method, config, padding_side", CASES)
def test_cached_training_matches_uncached_in_fp32(tmp_path, preset, method, config, padding_side):
    plain, plain_logits, plain_model = run(preset, method, config, None, padding_side)
    cache = HiddenStateCache(budget_bytes=2**30, spill_dir=tmp_path, dtype="float32")
    cached, cached_logits, cached_model = run(preset, method, config, cache, padding_side)
    assert len(plain_logits) == len(cached_logits) == EPOCHS * 3
    for step, (a, b) in enumerate(zip(plain_logits, cached_logits)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, step=step: f"step {step}: {m}")
    assert cached["first_loss"] == pytest.approx(plain["first_loss"], rel=1e-5)
    assert cached["final_loss"] == pytest.approx(plain["final_loss"], rel=1e-4)
    for (name, a), b in zip(plain_model.named_parameters(), cached_model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    assert cached["cache_examples"] == len(TEXTS) and cached["cache_disk_bytes"] == 0
    # epoch 1 misses everything and every later epoch hits (T5 too: its decoder reads the unshifted mask)
    assert cached["cache_hit_rate"] == pytest.approx((EPOCHS - 1) / EPOCHS)
    assert "cache_bytes" not in plain
    cache.close()


def test_half_precision_cache_stays_within_its_tolerance(tmp_path):
    """fp16 rounds each state to ~3 significant digits: logits move by about 1e-3 of their scale."""
    plain, plain_logits, _ = run("tiny-bert", "read", {}, None)
    cache = HiddenStateCache(budget_bytes=2**30, spill_dir=tmp_path)
    cached, cached_logits, _ = run("tiny-bert", "read", {}, cache)
    assert cache.dtype == torch.float16
    worst = max(float((b - a).abs().max() / a.abs().max()) for a, b in zip(plain_logits, cached_logits))
    assert worst < 2e-2, worst
    assert cached["final_loss"] == pytest.approx(plain["final_loss"], rel=2e-2)
    tokens = sum(len(ids) for ids in load_backbone("tiny-bert").tokenizer(TEXTS)["input_ids"])
    assert cached["cache_bytes"] == tokens * 3 * 64 * 2  # real tokens x (embeddings + 2 layers) x width x 2 bytes
    cache.close()


@pytest.mark.parametrize("budget_bytes", [0, 20_000])
def test_cache_past_its_budget_spills_to_a_memory_mapped_file(tmp_path, budget_bytes):
    plain, plain_logits, _ = run("tiny-bert", "lst", {}, None)
    cache = HiddenStateCache(budget_bytes=budget_bytes, spill_dir=tmp_path, dtype="float32")
    cached, cached_logits, _ = run("tiny-bert", "lst", {}, cache)
    for a, b in zip(plain_logits, cached_logits):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert cached["cache_memory_bytes"] <= budget_bytes
    assert cached["cache_disk_bytes"] > 0 and (budget_bytes == 0) == (cached["cache_memory_bytes"] == 0)
    assert cache.spill_path.parent == tmp_path and cache.spill_path.stat().st_size == cached["cache_disk_bytes"]
    assert cached["cache_bytes"] == cached["cache_memory_bytes"] + cached["cache_disk_bytes"]
    cache.close()
    assert not cache.spill_path.exists()


def test_cache_dtype_names_agree_between_config_and_cache():
    assert tuple(DTYPES) == CACHE_DTYPES


def test_options_give_the_cache_to_side_tuning_methods_only():
    options = build_options(
        {}, {"methods": "read,lst,full", "backbone": "tiny-bert", "cache_hidden_states": True, "cache_budget": "2MiB"}
    )
    specs = {s.method: s for s in expand(options, "cpu")}
    assert specs["read"].cache_hidden_states and specs["lst"].cache_budget_bytes == 2 * 2**20
    assert not specs["full"].cache_hidden_states and specs["full"].cache_budget_bytes is None
    assert specs["read"].cache_dtype == "float16"


def test_cache_options_are_identity_only_when_the_cache_is_on():
    spec = RunSpec(method="read")
    # without the cache, its options do not enter the key: stores written before it existed resume as before
    assert dataclasses.replace(spec, cache_budget_bytes=5, cache_dtype="float32").run_key == spec.run_key
    cached = dataclasses.replace(spec, cache_hidden_states=True, cache_budget_bytes=1)
    assert cached.run_key != spec.run_key
    # memory or disk, the cache serves the same states: a resume with another budget reruns nothing
    assert dataclasses.replace(cached, cache_budget_bytes=2).run_key == cached.run_key
    assert dataclasses.replace(cached, cache_dir="/elsewhere").run_key == cached.run_key  # where it spills


@pytest.mark.parametrize(
    "values, message",
    [
        ({"cache_budget": "lots"}, "--cache-budget 'lots'"),
        ({"cache_dtype": "int8"}, "int8"),
        ({"cache_hidden_states": "yes"}, "yes"),
    ],
)
def test_bad_cache_options_are_refused_by_name(values, message):
    with pytest.raises(UsageError, match=message):
        build_options({}, {"methods": "read", "backbone": "tiny-bert", **values})
