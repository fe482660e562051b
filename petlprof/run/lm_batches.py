"""Batches of prompt/target pairs for the language-modelling objective, shaped like :class:`petlprof.run.train.Batches`.

:class:`LMBatches` tokenises an LM task's split (:class:`petlprof.tasks.labelled.Split`: prompts in ``texts``,
references in ``targets``) once, and cuts it into dynamically padded batches with Hugging Face's label
conventions (-100: not a target):

* decoder: ``input_ids`` = prompt + target + EOS, right-padded; ``labels`` the same ids with the prompt and
  the padding at -100, so exactly the target tokens and the EOS carry labels;
* encoder-decoder: ``input_ids`` = the prompt (the encoder's input), ``labels`` = target + EOS, right-padded
  with -100.

``labels`` travels in the inputs either way: an encoder-decoder's decoder reads it shifted right, and a
language model given labels puts its LM head only on the positions the loss reads
(:class:`petlprof.models.language_model.TargetLogits`), which :meth:`LMBatches.loss` takes as they come.

Tokenisation: the prompt with the tokenizer's special tokens (a BOS, or BERT's ``[CLS] ... [SEP]``), the
target without them, then the EOS (the tokenizer's EOS, else its SEP token, which the tiny presets' configs
name as EOS).  With ``chat_template`` on and a tokenizer that has one, the prompt is rendered as the user's
turn (or the chat layout's turns) with ``add_generation_prompt=True`` and the target follows as the assistant's
reply, ended by the EOS (the template's end of turn for chat-tuned tokenizers).  Without a template a decoder's
target is joined to its prompt with a space where the tokenizer marks word starts by a space (byte-level BPE:
``"Answer:" + " 12"``), so that the target tokens are those the joined text would have.

Truncation never cuts a target: a decoder's prompt is cut from the left (its leading special tokens kept) to
fit ``max_length`` with the target and EOS; an encoder-decoder's prompt is cut from the left to ``max_length``
and its target kept whole.  ``max_target_length`` (optional) caps the target and EOS first, the only cut a
target ever gets.  A decoder target longer than ``max_length - 1`` is refused, naming the row.

:meth:`LMBatches.prompt_batches` yields the prompts alone for greedy generation: left-padded for a decoder
(the last position of every row is real), right-padded for an encoder-decoder.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import torch

from petlprof.errors import UsageError
from petlprof.models.families import DECODER, ENCODER_DECODER
from petlprof.models.language_model import lm_loss
from petlprof.run.train import batch_indices
from petlprof.vocabulary import IGNORE_INDEX

_PROBE = ("Answer:", "yes")  # a prompt and a target, to learn how the tokenizer joins them


class Row(TypedDict):
    """One tokenised example: its prompt's ids and its target's ids, EOS included, after truncation."""

    prompt: list[int]
    target: list[int]


def eos_id(tokenizer) -> int:
    """The id that ends a target: the tokenizer's EOS, else its SEP (the tiny presets' configs' EOS)."""
    for token_id in (tokenizer.eos_token_id, getattr(tokenizer, "sep_token_id", None)):
        if token_id is not None:
            return int(token_id)
    raise UsageError(f"tokenizer {type(tokenizer).__name__} has no end-of-text token (EOS or SEP) to end a target")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _target_prefix(tokenizer) -> str:
    """``" "`` when the tokenizer marks word starts with a space (byte-level BPE: ``"Answer: yes"`` tokenises as
    ``"Answer:"`` then ``" yes"``), else ``""`` (WordPiece and SentencePiece add the word start themselves)."""
    prompt, target = _PROBE

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    joined = ids(f"{prompt} {target}")
    if ids(prompt) + ids(target) == joined:
        return ""
    return " "


def _leading_specials(ids: list[int], special: set[int]) -> int:
    count = 0
    while count < len(ids) and ids[count] in special:
        count += 1
    return count


@dataclass
class LMBatches:
    """A tokenised LM split (``encodings``: per row its ``prompt`` ids and ``target`` ids, EOS included, after
    truncation), cut into dynamically padded batches; ``references`` are the target texts."""

    encodings: list[Row]
    references: list[str]
    batch_size: int
    tokenizer: Any
    family: str
    pad_token_id: int
    eos_token_id: int

    @classmethod
    def from_split(
        cls,
        split,
        tokenizer,
        batch_size: int,
        max_length: int,
        family: str,
        *,
        chat_template: bool,
        max_target_length: int | None = None,
        eos_token_id: int | None = None,
    ) -> LMBatches:
        """Tokenise ``split`` (module docstring); ``eos_token_id`` overrides :func:`eos_id`."""
        if family not in (DECODER, ENCODER_DECODER):
            raise UsageError(f"the LM objective needs a decoder or an encoder-decoder backbone, not an {family}")
        if split.targets is None:
            raise ValueError("the split has no targets: it is not a language-modelling task's split")
        eos = eos_id(tokenizer) if eos_token_id is None else int(eos_token_id)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        templated = chat_template and has_chat_template(tokenizer)
        prompts = _prompt_ids(split, tokenizer, templated)
        prefix = "" if templated or family != DECODER else _target_prefix(tokenizer)
        texts = [
            prefix + target if prefix and not prompt[-1:].isspace() and not target[:1].isspace() else target
            for prompt, target in zip(split.texts, split.targets)
        ]
        targets = [ids + [eos] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        if max_target_length is not None:
            if max_target_length < 1:
                raise ValueError(f"max_target_length must be at least 1, got {max_target_length}")
            targets = [target[:max_target_length] for target in targets]
        if family == DECODER:
            _check_room(targets, max_length)
        special = set(tokenizer.all_special_ids)
        rows = [_fit(p, t, max_length, family, special) for p, t in zip(prompts, targets)]
        return cls(rows, list(split.targets), batch_size, tokenizer, family, int(pad), eos)

    def __len__(self) -> int:
        return math.ceil(len(self.encodings) / self.batch_size)

    @property
    def longest_target(self) -> int:
        """The most target tokens (EOS included) of a row: what generation needs to reproduce any reference."""
        return max((len(row["target"]) for row in self.encodings), default=0)

    def head(self, size: int) -> LMBatches:
        """The first ``size`` rows, as one batch."""
        size = min(size, len(self.encodings))
        return LMBatches(
            self.encodings[:size],
            self.references[:size],
            size,
            self.tokenizer,
            self.family,
            self.pad_token_id,
            self.eos_token_id,
        )

    def batch_indices(self, shuffle_seed: int | None = None) -> Iterator[np.ndarray]:
        """The examples' indices in the split, per batch (in the classification batches' order)."""
        return batch_indices(len(self.encodings), self.batch_size, shuffle_seed)

    def collate(self, idx: np.ndarray, device: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(inputs, labels) of the examples ``idx``, right-padded to the longest of them."""
        rows = [self.encodings[int(i)] for i in idx]
        if self.family == DECODER:
            ids = [row["prompt"] + row["target"] for row in rows]
            marks = [[IGNORE_INDEX] * len(row["prompt"]) + row["target"] for row in rows]
            input_ids, mask = self._pad(ids, left=False)
            labels, _ = _padded(marks, IGNORE_INDEX, left=False)
        else:
            input_ids, mask = self._pad([row["prompt"] for row in rows], left=False)
            labels, _ = _padded([row["target"] for row in rows], IGNORE_INDEX, left=False)
        inputs = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
        inputs = {key: value.to(device) for key, value in inputs.items()}
        return inputs, inputs["labels"]

    def iterate(self, device: str, shuffle_seed: int | None = None) -> Iterator[tuple[dict, torch.Tensor]]:
        """(inputs, labels) per batch."""
        for idx in self.batch_indices(shuffle_seed):
            yield self.collate(idx, device)

    def loss(self, logits, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the target tokens (:func:`petlprof.models.language_model.lm_loss`): ``logits``
        is the model's output given the labels (:class:`petlprof.models.language_model.TargetLogits`) or every
        position's logits."""

        return lm_loss(logits, labels, self.family)

    def prompt_batches(
        self, device: str, batch_size: int | None = None
    ) -> Iterator[tuple[dict[str, torch.Tensor], np.ndarray]]:
        """(inputs, row indices) of the prompts alone, in the split's order, ``batch_size`` rows each (default
        the batches' own): left-padded for a decoder, right-padded for an encoder-decoder."""
        size = batch_size or self.batch_size
        for start in range(0, len(self.encodings), size):
            idx = np.arange(start, min(start + size, len(self.encodings)))
            input_ids, mask = self._pad([self.encodings[i]["prompt"] for i in idx], left=self.family == DECODER)
            yield {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}, idx

    def _pad(self, ids: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return _padded(ids, self.pad_token_id, left)


def _padded(ids: list[list[int]], value: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded with ``value`` to the longest, and the attention mask (1 on real positions)."""
    width = max(len(row) for row in ids)
    out = torch.full((len(ids), width), value, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        out[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return out, mask


def _prompt_ids(split, tokenizer, templated: bool) -> list[list[int]]:
    """Each prompt's ids: rendered by the chat template (the chat layout's turns, else one user turn) and
    tokenised as it is, or tokenised with the tokenizer's special tokens."""
    if not templated:
        return tokenizer(list(split.texts), add_special_tokens=True)["input_ids"]
    chats = split.messages or [[{"role": "user", "content": text}] for text in split.texts]
    texts = [tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True) for turns in chats]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _fit(prompt: list[int], target: list[int], max_length: int, family: str, special: set[int]) -> Row:
    """A row within ``max_length``: the prompt cut from the left (its leading special tokens kept); for a
    decoder the room the target leaves, for an encoder-decoder ``max_length`` itself."""
    room = max_length - len(target) if family == DECODER else max_length
    if len(prompt) > room >= 1:
        keep = min(_leading_specials(prompt, special), room - 1)
        prompt = prompt[:keep] + prompt[len(prompt) - (room - keep) :]
    return {"prompt": list(prompt), "target": list(target)}


def _check_room(targets: list[list[int]], max_length: int) -> None:
    """A decoder row holds at least one prompt token besides its target and EOS."""
    longest = max(range(len(targets)), key=lambda i: len(targets[i]), default=None)
    if longest is not None and len(targets[longest]) > max_length - 1:
        need = len(targets[longest]) + 1
        raise UsageError(
            f"the target of row {longest + 1} has {len(targets[longest])} tokens with its end-of-text token, so "
            f"--max-length {max_length} leaves no room for its prompt (targets are never truncated): raise "
            f"--max-length to at least {need}"
        )
