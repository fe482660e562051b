"""Tests for the generation phase (:mod:`petlprof.run.generation`): greedy decoding of a tiny random LLaMA
under the meters, with an energy counter faked like the hardware (it advances only at its updates).

The decoding loop here is a stand-in with the signature of ``petlprof.models.language_model.greedy_generate``
(left-padded prompts, the KV cache kept, ``on_token`` after each step, EOS not returned); the phase
takes its generate function as a parameter.  One test runs the real one on a READ model, whose side
network the phase times.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from petlprof.meters import Meter, memory_meter_for
from petlprof.meters.base import Provenance, Reading
from petlprof.results import figures
from petlprof.results.figures import ENERGY
from petlprof.run.generation import MIN_BATCHES, chosen_tokens, measure_generation
from petlprof.vocabulary import MEASURED

PAD, EOS, VOCAB = 0, 2, 96
BATCH_FIGURES = (
    "batch_size",
    "batches",
    "responses",
    "generated_tokens",
    "time_s",
    "tokens_per_s",
    "energy_per_token_j",
    "energy_per_response_j",
    "time_to_first_token_s",
    "per_token_latency_s",
    "peak_memory_bytes",
    "energy_j",
    "energy_kind",
    "energy_source",
    "latency_source",
    "warnings",
)


class FakeCounter(Meter):
    """An energy counter that advances ``power_w * update_s`` at each update, like NVML's or RAPL's."""

    name = "fake-counter"
    FIGURES = (ENERGY,)

    def __init__(self, power_w: float = 20.0, update_s: float = 0.005):
        super().__init__("cpu")
        self.power_w, self.update_s = power_w, update_s

    def _count(self) -> float:
        return math.floor(time.perf_counter() / self.update_s) * self.update_s * self.power_w

    def _begin(self) -> None:
        self._start = self._count()

    def _end(self) -> Reading:
        return Reading({ENERGY: self._count() - self._start}, provenance={ENERGY: Provenance(MEASURED, "fake counter")})


def meters(size: int) -> list[Meter]:
    return [memory_meter_for("cpu"), FakeCounter()]


def stand_in_generate(model, input_ids, attention_mask, max_new_tokens, *, eos_token_id, use_cache=True, on_token=None):
    """Greedy decoding with the KV cache, each row's new ids without its EOS."""
    rows = input_ids.shape[0]
    out: list[list[int]] = [[] for _ in range(rows)]
    done = torch.zeros(rows, dtype=torch.bool)
    ids, mask, past = input_ids, attention_mask, None
    for step in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        result = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions[:, -ids.shape[1] :],
            past_key_values=past,
            use_cache=use_cache,
        )
        past, chosen = result.past_key_values, result.logits[:, -1].argmax(-1)
        if on_token is not None:
            on_token(step)
        for row in range(rows):
            if not done[row]:
                done[row] = bool(chosen[row] == eos_token_id)
                out[row] += [] if done[row] else [int(chosen[row])]
        if done.all():
            break
        ids, mask = chosen[:, None], torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return out


class Prompts:
    """Left-padded prompt batches, as ``LMBatches.prompt_batches`` yields them."""

    def __init__(self, count: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.prompts = [torch.randint(3, VOCAB, (3 + i % 4,), generator=generator) for i in range(count)]

    def prompt_batches(self, device, batch_size=None):
        size = batch_size or len(self.prompts)
        for start in range(0, len(self.prompts), size):
            chunk = self.prompts[start : start + size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), PAD)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, prompt in enumerate(chunk):
                ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, 1
            yield (
                {"input_ids": ids.to(device), "attention_mask": mask.to(device)},
                list(range(start, start + len(chunk))),
            )


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    return LlamaForCausalLM(config).eval()


def measure(model, prompts, **overrides):
    settings = dict(
        device="cpu",
        batch_sizes=[1, 4],
        max_new_tokens=6,
        eos_token_id=EOS,
        make_meters=meters,
        min_window_s=0.05,
        warmup_steps=1,
        generate=stand_in_generate,
    )
    return measure_generation(model, prompts, **{**settings, **overrides})


def numbers(value):
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def test_every_figure_at_batch_1_and_the_evaluation_batch_with_consistent_units(lm):
    phase = measure(lm, Prompts(6))
    assert {"batch_1", "batch_4"} <= set(phase) and phase["max_new_tokens"] == 6
    for key, size in (("batch_1", 1), ("batch_4", 4)):
        figures = phase[key]
        assert set(BATCH_FIGURES) <= set(figures), set(BATCH_FIGURES) - set(figures)
        assert figures["batch_size"] == size and figures["batches"] >= MIN_BATCHES
        assert figures["responses"] == size * figures["batches"]
        assert figures["tokens_per_s"] * figures["time_s"] == pytest.approx(figures["generated_tokens"])
        assert figures["energy_per_token_j"] * figures["generated_tokens"] == pytest.approx(figures["energy_j"])
        assert figures["energy_per_response_j"] * figures["responses"] == pytest.approx(figures["energy_j"])
        assert 0 < figures["time_to_first_token_s"] <= figures["time_s"]
        latency = figures["per_token_latency_s"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= figures["time_s"]
        assert figures["response_tokens"] <= figures["generated_tokens"] <= 6 * figures["responses"]
        assert figures["energy_kind"] == MEASURED and figures["peak_memory_bytes"] >= 0
        assert all(n >= 0 and math.isfinite(n) for n in numbers(figures)), figures
        assert "side_network" not in figures


# the figures declared for the generation phase alone: a window holds each at its declared path (the side
# network's only for a side-tuning model)
GENERATION_ONLY = [f for f in figures.FIGURES if f.phases == (figures.GENERATION,)]
WINDOW_FIGURES = [f for f in GENERATION_ONLY if f.under != figures.SIDE]
SIDE_FIGURES = [f for f in GENERATION_ONLY if f.under == figures.SIDE]


def at(window: dict, figure: figures.Figure):
    value = window
    for key in figure.path:
        value = value[key]
    return value


def test_every_figure_declared_for_the_generation_phase_is_in_each_window(lm):
    assert WINDOW_FIGURES and SIDE_FIGURES
    phase = measure(lm, Prompts(6))
    for window in (phase["batch_1"], phase["batch_4"]):
        shown = {f.name: at(window, f) for f in WINDOW_FIGURES}
        assert all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in shown.values()), shown


def test_the_window_is_capped_at_max_prompts_and_says_so(lm):
    phase = measure(lm, Prompts(5), batch_sizes=[1, 8], max_prompts=2, min_window_s=60.0, warmup_steps=0)
    one = phase["batch_1"]
    assert one["batches"] == 2 and one["time_s"] < 60.0
    assert any("capped at 2 prompt(s)" in w for w in one["warnings"])
    assert set(phase) >= {"batch_1", "batch_5"} and phase["batch_5"]["batches"] == 1  # fewer prompts than asked


def scripted(lengths, steps):
    """A generate that answers rows of the given lengths in ``steps`` steps, calling on_token each step."""

    def generate(model, input_ids, attention_mask, max_new_tokens, *, eos_token_id, use_cache=True, on_token=None):
        for step in range(steps):
            if on_token is not None:
                on_token(step)
        return [[5] * n for n in lengths[: input_ids.shape[0]]]

    return generate


@pytest.mark.parametrize(
    "lengths, steps, tokens",
    [
        ([4, 4], 4, 8),  # both rows ran to max_new_tokens: no EOS was chosen
        ([1, 4], 4, 2 + 4),  # the first row's EOS was chosen at step 2
        ([0, 0], 1, 2),  # both chose EOS first
        ([2, 3], 0, 3 + 3),  # a generate that never called on_token: the longest row ran to the end
    ],
)
def test_chosen_tokens_count_each_stopping_eos(lengths, steps, tokens):
    assert chosen_tokens([[7] * n for n in lengths], steps) == tokens


def test_a_generate_without_token_callbacks_leaves_time_to_first_token_missing():
    model = torch.nn.Linear(1, 1)
    phase = measure(model, Prompts(2), batch_sizes=[2], generate=scripted([3, 1], 0), min_window_s=0.0)
    figures = phase["batch_2"]
    assert figures["time_to_first_token_s"] is None and figures["per_token_latency_s"]["p50"] is None
    assert figures["generated_tokens"] == 3 * (3 + 2)


def test_no_token_generated_is_a_warning_not_a_division_by_zero():
    phase = measure(torch.nn.Linear(1, 1), Prompts(1), batch_sizes=[1], generate=scripted([0], 0), min_window_s=0.0)
    figures = phase["batch_1"]
    assert figures["generated_tokens"] == 0 and figures["energy_per_token_j"] is None
    assert any("no token was generated" in w for w in figures["warnings"])


def test_the_real_generate_on_a_read_model_times_its_side_network_once_per_token():
    from petlprof.models.backbones import load_backbone
    from petlprof.models.language_model import LanguageModel, greedy_generate
    from petlprof.registry import get_method

    read = get_method("read")
    model = read.build()(LanguageModel(load_backbone("tiny-llama", lm_head=True, seed=0)), read.make_config({}))
    settings = dict(batch_sizes=[2], max_new_tokens=4, eos_token_id=None, warmup_steps=1, min_window_s=0.0)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[1].shape[0])
        return greedy_generate(*args, **kwargs)

    phase = measure(model, Prompts(4), generate=counted, **settings)
    figures = phase["batch_2"]
    assert figures["generated_tokens"] == figures["batches"] * 2 * 4  # no EOS: every row runs to max_new_tokens
    # timed over the window's first call: no call beyond the warm-up and the window's (one more cost a READ run on
    # smollm2 about 2.9 s outside its measured phases)
    assert len(calls) == 1 + figures["batches"]
    assert figures["side_network"]["calls"] == 4  # the prompt's, then once per further token (not over time)
    assert 0 < figures["side_network"]["share_of_per_token"] < 1
    assert all(0 < at(figures, f) for f in SIDE_FIGURES)  # the whole call's time and the side network's shares
