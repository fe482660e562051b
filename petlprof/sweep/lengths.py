"""What the tokens of a language-modelling task decide before any run, read as its runs tokenise them
(:mod:`petlprof.models.lm_tokens`): every target within ``--max-length`` (a decoder's), and within the model's
positions every target (an encoder-decoder's) and the tokens generated after every evaluation prompt.  The
preflight (:func:`petlprof.sweep.config.preflight`) calls :func:`check_lm_lengths` once per LM task and backbone."""

from __future__ import annotations

from collections.abc import Callable

from petlprof.errors import UsageError
from petlprof.models.backbones import backbone_config, backbone_tokenizer
from petlprof.models.families import DECODER, family_of
from petlprof.models.lm_tokens import Row, encode, eos_id, generation_room, longest, positions
from petlprof.sweep.options import RunOptions
from petlprof.sweep.resources import GIB, SKIP_MEMORY_CHECK, memory_limit
from petlprof.values import parse_bytes

# a configuration's predicted LM training peak in bytes, or None where it cannot be traced:
# (backbone, --num-layers, method, its config point, (rows, prompt tokens, target tokens), precision, device)
PeakEstimate = Callable[[str, int | None, str, dict, tuple[int, int, int], str, str], int | None]


def check_lm_lengths(
    options: RunOptions, name: str, task, backbone: str, peak: PeakEstimate | None = None, points: dict | None = None
) -> None:
    """What the tokens of LM task ``name`` decide on ``backbone``, read as its runs tokenise them
    (:mod:`petlprof.models.lm_tokens`): every target within --max-length (a decoder's), and within the model's
    positions every target (an encoder-decoder's) and the tokens generated after every evaluation prompt; and with
    ``peak`` (the runs execute here), an encoder-decoder's training peak at its longest target within the memory a
    run can have here, for each method's grid ``points``."""
    config = backbone_config(backbone)
    family = family_of(config)
    tokenizer = backbone_tokenizer(backbone, options.random_init)
    where = f"task '{name}' on backbone '{backbone}'"
    encoded = {}
    for what, split in (("training", task.train), ("evaluation", task.eval)):
        try:
            encoded[what] = encode_split(options, split, tokenizer, family)
        except UsageError as exc:  # a target longer than --max-length (lm_tokens.check_room): which split it is in
            raise UsageError(f"{where}, {what} split: {exc}") from None
    if peak is not None and family != DECODER and not options.skip_memory_check:
        _check_long_targets(options, where, backbone, encoded["training"], peak, points or {})
    limit = positions(config, family)
    if limit is None:
        return
    if family != DECODER:
        for what, rows in encoded.items():
            _check_decoder_room(rows, limit, f"{where}, {what} split")
    new_tokens = options.max_new_tokens or task.max_new_tokens
    if new_tokens is not None:
        _check_new_tokens(options, name, backbone, encoded["evaluation"], family, limit, new_tokens)


def encode_split(options: RunOptions, split, tokenizer, family: str) -> list[Row]:
    """``split``'s rows as the sweep's runs tokenise them (:func:`petlprof.models.lm_tokens.encode`)."""
    chat_template = options.chat_template != "none"
    return encode(split, tokenizer, options.max_length, family, chat_template=chat_template, eos=eos_id(tokenizer))


def longest_rows(options: RunOptions, name: str, task, backbone: str) -> tuple[int, int]:
    """(prompt, target) tokens the longest training batch of LM task ``name`` on ``backbone`` pads its rows to: an
    encoder-decoder's longest prompt and longest target; a decoder's longest target, and the rest of its longest
    prompt + target sequence (it pads the two as one)."""
    config = backbone_config(backbone)
    family = family_of(config)
    rows = encode_split(options, task.train, backbone_tokenizer(backbone, options.random_init), family)
    if not rows:
        raise UsageError(f"task '{name}' has no training rows to price a step at")
    target = longest(rows, "target")[1]
    if family == DECODER:
        return max(1, max(len(row["prompt"]) + len(row["target"]) for row in rows) - target), target
    return max(1, longest(rows, "prompt")[1]), target


def _check_long_targets(
    options: RunOptions, where: str, backbone: str, rows: list[Row], peak: PeakEstimate, points: dict
) -> None:
    """An encoder-decoder's targets have no length limit of their own (they are never cut, and T5 has no position
    limit), so where the longest is longer than --max-length the step's size is the data's: a batch of rows padded
    to that target (their prompts at least its row's), priced by ``peak`` (``petlprof estimate``'s prediction) for
    each configuration and refused where it exceeds what a run can have here (a 25,000-token target asked the
    allocator for 320 GB)."""
    row, length = longest(rows, "target")
    if length <= options.max_length:
        return
    limit = memory_limit(options.device, options.nproc_per_run, parse_bytes(options.max_memory))
    if limit is None:
        return
    batch = (min(options.batch_size, len(rows)), max(len(rows[row]["prompt"]), 1), length)
    device = "cuda" if options.device.startswith("cuda") else "cpu"
    over = []
    for method, configs in points.items():
        for point in configs:
            bytes_ = peak(backbone, options.num_layers, method, point, batch, options.precision, device)
            if bytes_ is not None and bytes_ > limit[0]:
                over.append(f"{method} {bytes_ / GIB:.1f} GiB")
    if over:
        raise UsageError(
            f"{where}: the target of row {row + 1} has {length} tokens with its end-of-text token, and a training "
            f"batch of {batch[0]} rows padded to it (prompts of {batch[1]} tokens or more) peaks at {', '.join(over)} "
            f"(petlprof estimate's prediction), more than {limit[1]}: shorten the targets or lower --batch-size, or "
            f"run anyway with {SKIP_MEMORY_CHECK}"
        )


def _check_decoder_room(rows: list[Row], limit: int, where: str) -> None:
    """An encoder-decoder's every target (its start token shifted in, its EOS out) within its decoder's positions."""
    row, length = longest(rows, "target")
    if length > limit:
        raise UsageError(
            f"{where}: the target of row {row + 1} has {length} tokens with its end-of-text token, more than the "
            f"{limit} positions of the model's decoder (targets are never truncated): shorten the targets, or use a "
            "backbone whose decoder holds more positions"
        )


def _check_new_tokens(
    options: RunOptions, name: str, backbone: str, rows: list[Row], family: str, limit: int, new_tokens: int
) -> None:
    """The tokens generated after every evaluation prompt within the model's ``limit`` positions."""
    room = generation_room(rows, family, limit)
    if new_tokens <= room:
        return
    asked = (
        f"--max-new-tokens {new_tokens}"
        if options.max_new_tokens
        else f"the {new_tokens} new tokens task '{name}' generates by default"
    )
    if family == DECODER:
        row, length = longest(rows, "prompt")
        held, kind = f"the longest evaluation prompt of task '{name}' (row {row + 1}) takes {length}", ""
    else:
        held, kind = "its start token takes one", "decoder "
    raise UsageError(
        f"{asked} does not fit the {limit} {kind}positions of backbone '{backbone}': {held}, and each new token but "
        f"the last one more: use --max-new-tokens {room} or less"
    )
