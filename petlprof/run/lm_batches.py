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

Tokenisation and truncation are :mod:`petlprof.models.lm_tokens`' (shared with the sweep's preflight, which
refuses what they would refuse before any run): a target is never cut, a prompt is cut from the left, and a
decoder target longer than ``max_length - 1`` is refused, naming the row.

:meth:`LMBatches.prompt_batches` yields the prompts alone for greedy generation: left-padded for a decoder
(the last position of every row is real), right-padded for an encoder-decoder.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from petlprof.errors import UsageError
from petlprof.models.families import DECODER, ENCODER_DECODER
from petlprof.models.language_model import lm_loss
from petlprof.models.lm_tokens import Row, encode, eos_id
from petlprof.run.train import CutIntoBatches
from petlprof.vocabulary import IGNORE_INDEX


@dataclass
class LMBatches(CutIntoBatches):
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
        """Tokenise ``split`` (:func:`petlprof.models.lm_tokens.encode`); ``eos_token_id`` overrides
        :func:`~petlprof.models.lm_tokens.eos_id`."""
        if family not in (DECODER, ENCODER_DECODER):
            raise UsageError(f"the LM objective needs a decoder or an encoder-decoder backbone, not an {family}")
        if split.targets is None:
            raise ValueError("the split has no targets: it is not a language-modelling task's split")
        eos = eos_id(tokenizer) if eos_token_id is None else int(eos_token_id)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        rows = encode(
            split,
            tokenizer,
            max_length,
            family,
            chat_template=chat_template,
            eos=eos,
            max_target_length=max_target_length,
        )
        return cls(rows, list(split.targets), batch_size, tokenizer, family, int(pad), eos)

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
