"""The evaluation phase of a language-modelling run, under one meter window:

* the evaluation split's loss on its target tokens, teacher-forced (prompt and padding masked), and
  its perplexity, ``exp`` of the mean loss per target token;
* greedy generation of every evaluation prompt (the backbone's KV cache kept), decoded and scored
  against the references by the task's own metrics (exact match, ROUGE-L).

The first ``warmup_steps`` loss batches run outside the window (they still count towards the loss),
as in :func:`petlprof.run.train.evaluate`.  Each generated prompt batch is one timed step: the phase's
``latency_s`` is the time to generate a batch of responses, ``samples`` the prompts answered.
"""

from __future__ import annotations

import itertools
import math

import torch

from petlprof.meters import Window
from petlprof.meters.energy import WarmUp
from petlprof.meters.latency import StepTimer
from petlprof.results.records import EvalPhase
from petlprof.run.ranks import ONE_PROCESS
from petlprof.run.recipe import autocast
from petlprof.run.train import PhaseIO, phase_summary
from petlprof.vocabulary import IGNORE_INDEX


def _loss_pass(model, batches, io: PhaseIO, precision: str, order, bar) -> tuple[float, int]:
    """(sum of the token losses, target tokens) over the loss batches ``order``."""
    total, tokens = 0.0, 0
    for step, idx in order:
        io.progress.at("eval", step)
        inputs, labels = batches.collate(idx, io.device)
        with autocast(precision, io.device):
            logits = model(**inputs)
            loss = batches.loss(logits, labels)
        count = int((labels != IGNORE_INDEX).sum())
        total, tokens = total + float(loss) * count, tokens + count
        bar.update(1)
    return total, tokens


def generate_texts(
    model, batches, device: str, precision: str, generate, max_new_tokens: int, timer=None, bar=None
) -> list[str]:
    """Every prompt's greedy response of ``batches`` as text, in the split's order; ``timer`` (a
    :class:`~petlprof.meters.latency.StepTimer`) times each prompt batch, ``bar`` counts it."""
    tokenizer = batches.tokenizer
    texts: dict[int, str] = {}
    for inputs, rows in batches.prompt_batches(device):
        if timer is not None:
            timer.start()
        with autocast(precision, device):
            new_ids = generate(
                model,
                inputs["input_ids"],
                inputs["attention_mask"],
                max_new_tokens,
                eos_token_id=batches.eos_token_id,
                use_cache=True,
            )
        if timer is not None:
            timer.stop()
        for row, ids in zip(rows, new_ids):
            texts[int(row)] = tokenizer.decode(ids, skip_special_tokens=True)
        if bar is not None:
            bar.update(1)
    return [texts[i] for i in range(len(texts))]


@torch.no_grad()
def evaluate_lm(
    model, batches, io: PhaseIO, *, warmup_steps: int, precision: str, max_new_tokens: int, generate
) -> tuple[EvalPhase, list[str], list[str]]:
    """Score ``model`` on the evaluation ``batches`` (:class:`petlprof.run.lm_batches.LMBatches`); returns
    (phase summary with ``eval_loss`` and ``perplexity``, generated texts, reference texts).
    ``generate`` is :func:`petlprof.models.language_model.greedy_generate` (a parameter, so a test can pass its own)."""
    model.eval()
    warmup = min(warmup_steps, max(len(batches) - 1, 0))
    timer, window = StepTimer(io.device), Window(io.meters, io.device)
    prompts = math.ceil(len(batches.references) / batches.batch_size)
    order = enumerate(batches.batch_indices())
    with io.bar(len(batches) + prompts, "batch", ONE_PROCESS) as bar:
        with WarmUp(io.meters, io.device, warmup) as warming:
            total, tokens = _loss_pass(model, batches, io, precision, itertools.islice(order, warmup), bar)
        with window:
            rest_total, rest_tokens = _loss_pass(model, batches, io, precision, order, bar)
            texts = generate_texts(model, batches, io.device, precision, generate, max_new_tokens, timer, bar)
    mean = (total + rest_total) / max(tokens + rest_tokens, 1)
    summary: EvalPhase = {
        **phase_summary(window, timer, prompts, len(texts), warming, warmup, warmup_steps),
        "eval_loss": mean,
        "perplexity": math.exp(mean) if mean < 700 else None,  # past e**700 a float overflows
        "target_tokens": tokens + rest_tokens,
    }
    return summary, texts, list(batches.references)
