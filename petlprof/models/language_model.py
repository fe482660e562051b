"""The language-modelling task model: the backbone with its own LM head, trained on target tokens.

:class:`LanguageModel` wraps a backbone loaded with ``load_backbone(..., lm_head=True)`` (an
``AutoModelForCausalLM`` or ``AutoModelForSeq2SeqLM``; tied embeddings stay tied).  It runs the
headless body of that model itself and puts the LM head on the final hidden state
(:meth:`LanguageModel.lm_logits`, which reproduces the model's own head: T5's rescaling of tied
outputs, BART's ``final_logits_bias``, Gemma's soft-capping — checked against the model's own logits
when built), so a side network (READ, LST) can correct the final state of every position before the
frozen head, and a linear probe can train an untied copy of the head.

Label conventions are Hugging Face's (``-100``: not a target):

* decoder: ``input_ids`` is prompt + target (+ padding, left or right), ``labels`` the same ids with the
  prompt and the padding at -100; ``logits[:, t]`` predicts token ``t + 1`` (:func:`lm_loss` shifts);
* encoder-decoder: ``input_ids`` is the prompt (the encoder reads it), ``labels`` the target ids
  (right-padded with -100), which the decoder reads shifted right; logits align with ``labels``.

Logits only where they are scored: given ``labels``, ``forward`` puts the LM head only on the positions that
predict a target token (a decoder's ``t`` with ``labels[t + 1] != -100``; an encoder-decoder's ``t`` with
``labels[t] != -100``) and returns :class:`TargetLogits` (those logits ``[N, V]`` and the targets they
predict ``[N]``), which :func:`lm_loss` reads as it is: the vocabulary projection and its backward, most of a
frozen-backbone step on a 49k vocabulary, then cost the target's positions, not the prompt's.  The loss is
today's to float tolerance.  Without ``labels`` (a decoder's generation, the estimator's full pass) it
returns the logits of every position ``[B, T, V]``.  ``logits_everywhere = True`` on the model restores the
head at every position even with labels (the path before; kept for comparisons and tests).

Positions of a decoder count from each row's first real token, so left padding (what batched
generation needs) changes nothing.  PEFT's prompt-learning methods are driven here rather than through
PEFT's own forward (which drops position ids and re-injects its prompt at every call, so it cannot
decode with a KV cache by hand): prompt tuning's virtual tokens go before the input embeddings (the
encoder's, for T5) at positions ``0..V-1`` and the real tokens count from ``V``; prefix tuning's keys
and values start the KV cache (the decoder's self-attention, for T5) and positions count from ``V``, as
PEFT does.  LoRA and IA3 are layers PEFT put inside the model, so the model runs as it is.

:func:`greedy_generate` decodes a batch of prompts greedily, with the backbone's KV cache (only the new
token goes through the backbone) or without it (the whole sequence again at every step); the two agree
token for token.  A model takes part through ``generation_start``/``generation_step`` (this class and
:class:`petlprof.side_tuning.SideTunedModel` have them).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple, Protocol, TypedDict

import torch
from torch import nn
from torch.nn import functional as F

from petlprof.errors import UsageError
from petlprof.models.backbones import Backbone
from petlprof.models.families import DECODER, ENCODER, ENCODER_DECODER
from petlprof.vocabulary import IGNORE_INDEX, LM


class TargetLogits(NamedTuple):
    """The LM head's logits at the positions that predict a target token ``[N, V]`` (row by row, left to
    right), and the target token each predicts ``[N]``: what :func:`lm_loss` reads."""

    logits: torch.Tensor
    labels: torch.Tensor


def target_positions(labels: torch.Tensor, family: str) -> torch.Tensor:
    """``[B, T]`` bool: the positions whose logits predict a target token (a decoder's ``t`` with
    ``labels[t + 1] != -100``, an encoder-decoder's ``t`` with ``labels[t] != -100``)."""
    scored = labels != IGNORE_INDEX
    if family != DECODER:
        return scored
    positions = torch.zeros_like(scored)
    positions[:, :-1] = scored[:, 1:]
    return positions


def targets_at(labels: torch.Tensor, positions: torch.Tensor, family: str) -> torch.Tensor:
    """``[N]``: the target token each of ``positions`` predicts (:func:`target_positions`)."""
    if family != DECODER:
        return labels[positions]
    following = torch.full_like(labels, IGNORE_INDEX)
    following[:, :-1] = labels[:, 1:]
    return following[positions]


def last_logits(out: torch.Tensor | TargetLogits, rows: int) -> torch.Tensor:
    """The last position's logits ``[B, V]`` of a whole-sequence pass: from every position's ``[B, T, V]``,
    or from :class:`TargetLogits` where every position was scored (an encoder-decoder fed the targets
    generated so far, all real tokens, reads them in order)."""
    if isinstance(out, TargetLogits):
        return out.logits.view(rows, -1, out.logits.shape[-1])[:, -1]
    return out[:, -1]


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids counted from each row's first real token (left padding is harmless)."""
    return (mask.long().cumsum(1) - 1).clamp(min=0)


def decoder_input_ids(labels: torch.Tensor, start_id: int, pad_id: int) -> torch.Tensor:
    """The encoder-decoder's decoder input: the targets shifted right behind the start token, -100 as padding."""
    ids = labels.masked_fill(labels == IGNORE_INDEX, pad_id)
    shifted = ids.new_full(ids.shape, start_id)
    shifted[:, 1:] = ids[:, :-1]
    return shifted


class _CacheUse(TypedDict):
    use_cache: bool


class CacheArguments(_CacheUse, total=False):
    """The KV cache argument of a forward pass, under the name ``forward`` takes (:func:`_cache_kwargs`): one of
    the two, the cache transformers made (or PEFT's prefix) or None."""

    cache: object  # transformers 5.2x
    past_key_values: object  # before


def _cache_kwargs(module: nn.Module, cache, use_cache: bool) -> CacheArguments:
    """The KV cache argument under the name ``module.forward`` takes (transformers 5.2x: ``cache``; before:
    ``past_key_values``)."""
    if "cache" in inspect.signature(type(module).forward).parameters:
        return {"cache": cache, "use_cache": use_cache}
    return {"past_key_values": cache, "use_cache": use_cache}


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _is_peft(model) -> bool:
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


class LMHead(Protocol):
    """What :meth:`LanguageModel.lm_logits` needs of an LM head: an ``nn.Linear``, or a PEFT layer that wraps one
    and passes its weight through."""

    @property
    def weight(self) -> torch.Tensor: ...

    @property
    def out_features(self) -> int: ...

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


class LanguageModel(nn.Module):
    """A backbone with its own LM head: ``forward(input_ids, attention_mask)`` -> ``[B, T, V]`` logits;
    ``forward(input_ids, attention_mask, labels)`` -> :class:`TargetLogits` (the scored positions' alone)."""

    objective = LM
    logits_everywhere = False  # True: the head at every position even given labels (the path before; comparisons)

    def __init__(self, backbone: Backbone):
        super().__init__()
        if backbone.family == ENCODER:
            raise UsageError(
                f"backbone '{backbone.name}' is an encoder: it has no language-modelling head; the LM objective "
                "needs a decoder or an encoder-decoder"
            )
        model = backbone.model
        get_head = getattr(model, "get_output_embeddings", None)
        if get_head is None or get_head() is None:
            raise UsageError(
                f"backbone '{backbone.name}' was loaded without its language-modelling head: "
                "load_backbone(..., lm_head=True)"
            )
        self.backbone = model
        self.family = backbone.family
        self.architecture = backbone.architecture  # described before any method wraps the backbone
        self.placement = backbone.placement  # where the method put its trainable pieces (the record shows it)
        tokenizer = backbone.tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.config.eos_token_id
        self.tokenizer_path = getattr(tokenizer, "name_or_path", None)  # for prompt init from text
        self.virtual_tokens = 0  # set by prompt tuning (the number of trained embeddings before the input)
        self.untied_head: nn.Linear | None = None  # set by linear_probe where the head is tied to the embeddings
        self.logit_bias: nn.Parameter | None = None  # set by bitfit: a trained bias on the logits
        config = model.config
        start = getattr(config, "decoder_start_token_id", None)
        self.decoder_start_token_id = self.pad_token_id if start is None else start
        scaled = getattr(config, "scale_decoder_outputs", None)
        if scaled is None:  # older T5 configs: tied outputs are rescaled
            scaled = config.model_type in ("t5", "mt5", "umt5") and getattr(config, "tie_word_embeddings", True)
        self.output_scale = float(config.d_model) ** -0.5 if self.family == ENCODER_DECODER and scaled else None
        self.softcap = getattr(config.get_text_config(decoder=True), "final_logit_softcapping", None)
        self._check_head()

    # --- the model under any PEFT wrapper, and its head ------------------------------------------------

    @property
    def hf_model(self):
        """The transformers model (with its LM head) under any PEFT wrapper a method put around it."""
        return self.backbone.get_base_model() if _is_peft(self.backbone) else self.backbone

    @property
    def head(self) -> LMHead:
        """The LM head on the final hidden state: the backbone's own, or linear_probe's untied copy."""
        return self.untied_head if self.untied_head is not None else self.hf_model.get_output_embeddings()

    def head_is_tied(self) -> bool:
        hf = self.hf_model
        return hf.get_output_embeddings().weight is hf.get_input_embeddings().weight

    def freeze_backbone(self) -> LanguageModel:
        """No backbone weight trains, the pretrained LM head included (what every parameter-efficient method
        starts from; a method then frees what it trains)."""
        for param in self.parameters():
            param.requires_grad_(False)
        return self

    def train_head(self) -> LanguageModel:
        """Make the LM head trainable without training the input embeddings: where the head is tied to them,
        a trainable copy of it (``untied_head``, starting equal, so step 0 is the plain LM) takes its place."""
        hf = self.hf_model
        own = hf.get_output_embeddings()
        if self.head_is_tied():
            copy = nn.Linear(own.in_features, own.out_features, bias=own.bias is not None)
            copy = copy.to(device=own.weight.device, dtype=own.weight.dtype)
            with torch.no_grad():
                copy.weight.copy_(own.weight)
                if own.bias is not None:
                    copy.bias.copy_(own.bias)
            self.untied_head = copy
        for param in self.head.parameters():
            param.requires_grad_(True)
        return self

    def add_logit_bias(self) -> nn.Parameter:
        """A trainable bias on the logits, starting at zero (BitFit's bias term for a head that has none)."""
        head = self.head
        self.logit_bias = nn.Parameter(
            torch.zeros(head.out_features, dtype=head.weight.dtype, device=head.weight.device)
        )
        return self.logit_bias

    def lm_logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """``[..., width]`` final hidden states -> ``[..., vocabulary]`` logits, as the model's own head makes them."""
        head = self.head
        if self.output_scale is not None:
            final_hidden = final_hidden * self.output_scale
        logits = head(final_hidden.to(head.weight.dtype))
        bias = getattr(self.hf_model, "final_logits_bias", None)
        if isinstance(bias, torch.Tensor):
            logits = logits + bias.to(logits.dtype)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.logit_bias is not None:
            logits = logits + self.logit_bias
        return logits

    def scored_positions(self, labels: torch.Tensor | None) -> torch.Tensor | None:
        """``[B, T]`` bool: the positions whose logits the loss reads (:func:`target_positions`); None without
        labels or with :attr:`logits_everywhere` (then every position gets the head)."""
        if labels is None or self.logits_everywhere:
            return None
        return target_positions(labels, self.family)

    def score(self, final_hidden: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> TargetLogits:
        """The head on the final states ``[N, W]`` of ``positions`` only (:meth:`scored_positions`), with the
        targets they predict: what a side network that corrects only those positions calls."""
        return TargetLogits(self.lm_logits(final_hidden), targets_at(labels, positions, self.family))

    def classify(
        self, final_hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> torch.Tensor | TargetLogits:
        """The head on a (corrected) final state ``[B, T, W]``: what side networks call.  Without ``labels``
        the logits of every position ``[B, T, V]``; with them only the scored positions' (:class:`TargetLogits`)."""
        positions = self.scored_positions(labels)
        if positions is None or labels is None:  # no labels: no scored positions
            return self.lm_logits(final_hidden)
        return self.score(final_hidden[positions], labels, positions)

    @torch.no_grad()
    def _check_head(self) -> None:
        """Refuse a model whose LM head :meth:`lm_logits` does not reproduce (an architecture-specific head)."""
        hf = self.hf_model
        param = next(hf.parameters(), None)
        if param is None or param.device.type == "meta":
            return
        ids = torch.full((1, 2), self.pad_token_id if self.pad_token_id is not None else 0, device=param.device)
        ids[0, 0] = self.eos_token_id if isinstance(self.eos_token_id, int) else 1
        mask = torch.ones_like(ids)
        labels = ids if self.family == ENCODER_DECODER else None
        was_training = hf.training
        hf.eval()
        try:
            kwargs = {"decoder_input_ids": decoder_input_ids(ids, self.decoder_start_token_id, self.pad_token_id)}
            reference = hf(input_ids=ids, attention_mask=mask, **(kwargs if labels is not None else {})).logits
            ours = self.lm_logits(self.backbone_outputs(ids, mask, labels).last_hidden_state)
        finally:
            hf.train(was_training)
        if not torch.allclose(ours.float(), reference.float(), atol=1e-4, rtol=1e-3):
            raise UsageError(
                f"the {hf.config.model_type} model's LM head is not one petlprof reproduces (its logits differ from "
                "the model's own); the LM objective cannot use this backbone"
            )

    # --- the backbone's passes ----------------------------------------------------------------------------

    def _prompt_learning(self) -> tuple[str | None, int]:
        """('prompt' or 'prefix', virtual tokens) of a PEFT prompt-learning wrapper; (None, 0) otherwise."""
        if not _is_peft(self.backbone):
            return None, 0
        config = self.backbone.active_peft_config
        if not config.is_prompt_learning:
            return None, 0
        kind = "prefix" if str(getattr(config.peft_type, "value", config.peft_type)) == "PREFIX_TUNING" else "prompt"
        return kind, int(config.num_virtual_tokens)

    def _with_prompt(self, input_ids, attention_mask):
        """(inputs_embeds or None, attention mask, virtual tokens put in front) for a fresh pass."""
        kind, virtual = self._prompt_learning()
        if kind != "prompt":
            return None, attention_mask, 0
        batch = input_ids.shape[0]
        embeds = self.hf_model.get_input_embeddings()(input_ids)
        prompts = self.backbone.get_prompt(batch_size=batch)[:, :virtual].to(embeds.dtype)
        mask = torch.cat([attention_mask.new_ones(batch, virtual), attention_mask], dim=1)
        return torch.cat([prompts, embeds], dim=1), mask, virtual

    def _decoder_pass(self, input_ids, attention_mask, *, past=None, use_cache=False, output_hidden_states=False):
        """One pass of a decoder-only body over ``input_ids``; ``attention_mask`` covers every position so far
        (those in ``past`` and these).  Returns (final hidden [B, T, W], hidden states or None, cache)."""
        kind, virtual = self._prompt_learning()
        tokens = input_ids.shape[1]
        positions = _positions(attention_mask)[:, -tokens:] + virtual
        mask, embeds, lead = attention_mask, None, 0
        if kind is not None:
            mask = torch.cat([attention_mask.new_ones(attention_mask.shape[0], virtual), attention_mask], dim=1)
        if kind == "prompt" and past is None:
            embeds, mask, lead = self._with_prompt(input_ids, attention_mask)
            leading = torch.arange(virtual, device=input_ids.device).expand(input_ids.shape[0], virtual)
            positions = torch.cat([leading, positions], dim=1)
        if kind == "prefix" and past is None:
            past = self.backbone.get_prompt(batch_size=input_ids.shape[0])
        body = self.hf_model.base_model
        out = body(
            input_ids=None if embeds is not None else input_ids,
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **_cache_kwargs(body, past, use_cache),
        )
        states = tuple(h[:, lead:] for h in out.hidden_states) if output_hidden_states else None
        return out.last_hidden_state[:, lead:], states, (_cache_of(out) if use_cache else None)

    def _encode(self, input_ids, attention_mask, output_hidden_states=False):
        """(encoder output, the mask the decoder's cross-attention reads, virtual tokens in front)."""
        embeds, mask, lead = self._with_prompt(input_ids, attention_mask)
        out = self.hf_model.get_encoder()(
            input_ids=None if embeds is not None else input_ids,
            inputs_embeds=embeds,
            attention_mask=mask,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        return out, mask, lead

    def _decode(
        self, decoder_ids, encoder_hidden, encoder_mask, *, past=None, use_cache=False, output_hidden_states=False
    ):
        """One pass of an encoder-decoder's decoder stack over ``decoder_ids`` (after those in ``past``)."""
        kind, _ = self._prompt_learning()
        if kind == "prefix" and past is None:
            past = self.backbone.get_prompt(batch_size=decoder_ids.shape[0])
        decoder = self.hf_model.get_decoder()
        out = decoder(
            input_ids=decoder_ids,
            encoder_hidden_states=encoder_hidden,
            encoder_attention_mask=encoder_mask,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **_cache_kwargs(decoder, past, use_cache),
        )
        states = out.hidden_states if output_hidden_states else None
        return out.last_hidden_state, states, (_cache_of(out) if use_cache else None)

    def _targets(self, labels):
        if labels is None:
            raise ValueError("an encoder-decoder language model needs labels (the targets its decoder reads)")
        return decoder_input_ids(labels, self.decoder_start_token_id, self.pad_token_id)

    def backbone_outputs(self, input_ids, attention_mask, labels=None, output_hidden_states: bool = False):
        """The body's outputs, teacher-forced: ``last_hidden_state`` (the final state of every position, before
        the head), and with ``output_hidden_states`` every layer's states (embedding output first):
        ``hidden_states`` for a decoder, ``encoder_hidden_states`` and ``decoder_hidden_states`` for an
        encoder-decoder.  Virtual tokens of prompt tuning are dropped, so positions are the input's."""
        if self.family == DECODER:
            final, states, _ = self._decoder_pass(input_ids, attention_mask, output_hidden_states=output_hidden_states)
            return SimpleNamespace(last_hidden_state=final, hidden_states=states)
        encoded, mask, lead = self._encode(input_ids, attention_mask, output_hidden_states)
        final, states, _ = self._decode(
            self._targets(labels), encoded.last_hidden_state, mask, output_hidden_states=output_hidden_states
        )
        encoder_states = tuple(h[:, lead:] for h in encoded.hidden_states) if output_hidden_states else None
        return SimpleNamespace(
            last_hidden_state=final,
            encoder_last_hidden_state=encoded.last_hidden_state[:, lead:],
            encoder_hidden_states=encoder_states,
            decoder_hidden_states=states,
        )

    def decoder_mask(self, attention_mask, labels=None):
        """Real positions of an encoder-decoder's decoder states: the target positions (labels != -100)."""
        if labels is None:
            raise ValueError("an encoder-decoder language model needs labels (the targets its decoder reads)")
        return labels != IGNORE_INDEX

    def decoder_states(self, encoder_hidden, input_ids, attention_mask, labels=None) -> tuple:
        """Every decoder layer's states when the decoder reads ``encoder_hidden`` (READ's ``encoder_output``
        wiring: a corrected encoder output), with autograd."""
        _, states, _ = self._decode(self._targets(labels), encoder_hidden, attention_mask, output_hidden_states=True)
        return states

    def forward(self, input_ids, attention_mask, labels=None) -> torch.Tensor | TargetLogits:
        """Without ``labels``: the logits of every position ``[B, T, V]``.  With them (training, the
        teacher-forced evaluation loss): :class:`TargetLogits`, the head only where the loss reads it."""
        final = self.backbone_outputs(input_ids, attention_mask, labels).last_hidden_state
        return self.classify(final, attention_mask, labels)

    # --- incremental decoding (the backbone keeps its KV cache) --------------------------------------------

    def prefill(self, input_ids, attention_mask, *, output_hidden_states=False, encoder_hidden=None):
        """Read the prompts and the first decoding position, filling the KV cache: (states, cache).

        ``states["final"]`` is the final hidden state of the newest position ``[B, W]``; with
        ``output_hidden_states`` also every layer's states of the positions read, ``[B, n, layers + 1, W]``:
        ``"layers"`` (every prompt position) for a decoder, ``"encoder"`` (the prompt) and ``"decoder"``
        (the start position) for an encoder-decoder.  ``encoder_hidden``: an encoder output to decode from
        instead of running the encoder (READ's ``encoder_output`` wiring)."""
        if self.family == DECODER:
            if not bool(attention_mask[:, -1].all()):
                raise ValueError("decoder prompts must be left-padded for generation (the last position real)")
            final, layers, past = self._decoder_pass(
                input_ids, attention_mask, use_cache=True, output_hidden_states=output_hidden_states
            )
            states = {"final": final[:, -1]}
            if output_hidden_states:
                states["layers"] = torch.stack(layers, dim=2)
            return states, {"past": past, "attention_mask": attention_mask}
        states = {}
        if encoder_hidden is None:
            encoded, mask, lead = self._encode(input_ids, attention_mask, output_hidden_states)
            encoder_hidden = encoded.last_hidden_state
            if output_hidden_states:
                states["encoder"] = torch.stack([h[:, lead:] for h in encoded.hidden_states], dim=2)
        else:
            mask = attention_mask
        start = input_ids.new_full((input_ids.shape[0], 1), self.decoder_start_token_id)
        cache = {"encoder_hidden": encoder_hidden, "encoder_mask": mask}
        return self._extend_decoder(start, cache, states, output_hidden_states)

    def extend(self, token, cache, *, output_hidden_states=False):
        """Feed one new token per row ``[B]`` through the backbone with its KV cache: (states of that position
        only, cache), the states as :meth:`prefill` gives them (``"layers"`` or ``"decoder"``, one position)."""
        token = token[:, None]
        if self.family == DECODER:
            mask = torch.cat([cache["attention_mask"], cache["attention_mask"].new_ones(token.shape)], dim=1)
            final, layers, past = self._decoder_pass(
                token, mask, past=cache["past"], use_cache=True, output_hidden_states=output_hidden_states
            )
            states = {"final": final[:, -1]}
            if output_hidden_states:
                states["layers"] = torch.stack(layers, dim=2)
            return states, {"past": past, "attention_mask": mask}
        return self._extend_decoder(token, cache, {}, output_hidden_states)

    def _extend_decoder(self, ids, cache, states, output_hidden_states):
        final, layers, past = self._decode(
            ids,
            cache["encoder_hidden"],
            cache["encoder_mask"],
            past=cache.get("past"),
            use_cache=True,
            output_hidden_states=output_hidden_states,
        )
        states["final"] = final[:, -1]
        if output_hidden_states:
            states["decoder"] = torch.stack(layers, dim=2)
        return states, {**cache, "past": past}

    def generation_start(self, input_ids, attention_mask):
        """(logits of the first new token [B, V], generation state) after reading the prompts."""
        states, cache = self.prefill(input_ids, attention_mask)
        return self.lm_logits(states["final"]), cache

    def generation_step(self, token, state):
        """(logits of the next token [B, V], generation state) after feeding ``token`` [B]."""
        states, cache = self.extend(token, state)
        return self.lm_logits(states["final"]), cache


def lm_loss(logits: torch.Tensor | TargetLogits, labels: torch.Tensor, family: str) -> torch.Tensor:
    """Mean cross-entropy over the target tokens (``labels != -100``).  ``logits``: a model's output given
    labels (:class:`TargetLogits`, the scored positions' logits and their targets), or the logits of every
    position ``[B, T, V]`` (a decoder's at ``t`` predict token ``t + 1``, so they are shifted; an
    encoder-decoder's align with ``labels``)."""
    if isinstance(logits, TargetLogits):
        total = F.cross_entropy(logits.logits.float(), logits.labels, ignore_index=IGNORE_INDEX, reduction="sum")
        return total / (logits.labels != IGNORE_INDEX).sum().clamp(min=1)
    if family == DECODER:
        logits, labels = logits[:, :-1], labels[:, 1:]
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / (labels != IGNORE_INDEX).sum().clamp(min=1)


def task_model_of(model) -> LanguageModel:
    """The :class:`LanguageModel` a method's model is built on (itself, or a side-tuning model's)."""
    for candidate in (model, getattr(model, "classifier", None), getattr(model, "module", None)):
        if isinstance(candidate, LanguageModel):
            return candidate
    raise UsageError(f"{type(model).__name__} is not built on a petlprof LanguageModel: it cannot generate")


@torch.no_grad()
def greedy_generate(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_token_id: int | Iterable[int] | None,
    use_cache: bool = True,
    on_token: Callable[[int], Any] | None = None,
) -> list[list[int]]:
    """Greedy decoding of a batch of prompts: each row's new token ids, up to and excluding its EOS.

    Decoder prompts are left-padded; an encoder-decoder reads the prompt in its encoder.  With
    ``use_cache`` the backbone keeps its KV cache and only the new token goes through it
    (``model.generation_start``/``generation_step``); without, the whole sequence runs again at every
    step through ``model(...)``.  ``on_token(step)`` is called once each new token of the batch is chosen.
    A row that has stopped is fed EOS until every row has stopped; the model runs in eval mode (its mode
    is restored afterwards)."""
    task = task_model_of(model)
    stops = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    filler = next(iter(stops)) if stops else task.pad_token_id
    rows = input_ids.shape[0]
    generated: list[list[int]] = [[] for _ in range(rows)]
    if max_new_tokens <= 0:
        return generated
    if use_cache and not hasattr(model, "generation_start"):
        raise UsageError(f"{type(model).__name__} cannot decode with a KV cache (no generation_start/generation_step)")
    was_training = model.training
    model.eval()
    try:
        seq2seq = task.family == ENCODER_DECODER
        targets = input_ids.new_full((rows, 1), task.pad_token_id)  # the encoder-decoder's next target, a placeholder

        def next_logits(ids, mask, labels=None):
            """The last position's logits [B, V] from a pass over the whole sequence."""
            return last_logits(model(ids, mask) if labels is None else model(ids, mask, labels), rows)

        if use_cache:
            logits, state = model.generation_start(input_ids, attention_mask)
        else:
            logits = next_logits(input_ids, attention_mask, targets if seq2seq else None)
        finished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
        for step in range(max_new_tokens):
            token = logits.argmax(dim=-1).masked_fill(finished, filler)
            if on_token is not None:
                on_token(step)
            for row, value in enumerate(token.tolist()):
                if finished[row]:
                    continue
                if value in stops:
                    finished[row] = True
                else:
                    generated[row].append(value)
            if bool(finished.all()) or step == max_new_tokens - 1:
                break
            if use_cache:
                logits, state = model.generation_step(token, state)
            elif seq2seq:
                targets = torch.cat([targets[:, :-1], token[:, None], targets[:, -1:]], dim=1)
                logits = next_logits(input_ids, attention_mask, targets)
            else:
                input_ids = torch.cat([input_ids, token[:, None]], dim=1)
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones(rows, 1)], dim=1)
                logits = next_logits(input_ids, attention_mask)
    finally:
        model.train(was_training)
    return generated
