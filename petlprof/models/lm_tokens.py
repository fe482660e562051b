"""How a language-modelling split becomes token ids, the same for a run and for the sweep's preflight.

:func:`encode` turns a split (prompts in ``texts``, a chat layout's turns in ``messages``, references in
``targets``: :class:`petlprof.tasks.base.Split`) into one :class:`Row` per example, which
:class:`petlprof.run.lm_batches.LMBatches` cuts into batches; the sweep's preflight encodes each LM task the
same way before any run starts, to refuse targets longer than ``--max-length`` and prompts that leave no room
in the model's positions for the tokens generated (:func:`generation_room`).

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

Imports nothing heavy: the tokenizer comes from the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, TypedDict

from petlprof.errors import UsageError
from petlprof.models.families import DECODER

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


def encode(
    split: Any,
    tokenizer,
    max_length: int,
    family: str,
    *,
    chat_template: bool,
    eos: int,
    max_target_length: int | None = None,
) -> list[Row]:
    """Each example of ``split`` as a :class:`Row` within ``max_length`` (module docstring), its target ended by
    the id ``eos``; a decoder target that leaves no room for a prompt is refused (:func:`check_room`)."""
    templated = chat_template and has_chat_template(tokenizer)
    with _quiet_lengths():
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
        check_room(targets, max_length)
    special = set(tokenizer.all_special_ids)
    return [_fit(p, t, max_length, family, special) for p, t in zip(prompts, targets)]


@contextlib.contextmanager
def _quiet_lengths() -> Iterator[None]:
    """Without transformers' warning that a text is longer than the tokenizer's model maximum: lengths are this
    module's to cut (:func:`_fit`) and the preflight's to refuse, each naming the row and the way out."""
    # transformers: slow to import, loaded only when used (the tokenizer passed in has loaded it)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def check_room(targets: list[list[int]], max_length: int) -> None:
    """A decoder row holds at least one prompt token besides its target and EOS."""
    row = max(range(len(targets)), key=lambda i: len(targets[i]), default=None)
    if row is not None and len(targets[row]) > max_length - 1:
        need = len(targets[row]) + 1
        raise UsageError(
            f"the target of row {row + 1} has {len(targets[row])} tokens with its end-of-text token, so "
            f"--max-length {max_length} leaves no room for its prompt (targets are never truncated): raise "
            f"--max-length to at least {need}"
        )


def longest(rows: list[Row], part: Literal["prompt", "target"]) -> tuple[int, int]:
    """(index, length) of the row whose ``part`` is longest (the first of equals); (-1, 0) for no rows."""
    lengths = [len(row[part]) for row in rows]
    index = max(range(len(lengths)), key=lengths.__getitem__, default=-1)
    return index, lengths[index] if lengths else 0


def positions(config, family: str) -> int | None:
    """The positions a model's sequence may take (its decoder's, for an encoder-decoder: LED's
    ``max_decoder_position_embeddings``, else ``max_position_embeddings``; GPT-2's ``n_positions`` reads through it),
    None where the config states no limit (T5's relative positions)."""
    decoder = getattr(config, "max_decoder_position_embeddings", None) if family != DECODER else None
    limit = decoder or getattr(config, "max_position_embeddings", None)
    return int(limit) if limit else None


def generation_room(rows: list[Row], family: str, limit: int) -> int:
    """How many tokens a model of ``limit`` positions may generate after every prompt of ``rows`` (greedy decoding
    never feeds the last new token back): a decoder reads the prompt (as cut) and the new tokens but the last, an
    encoder-decoder's decoder its start token and the new tokens but the last."""
    if family == DECODER:
        return limit - longest(rows, "prompt")[1] + 1
    return limit


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
