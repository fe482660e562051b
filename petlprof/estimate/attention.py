"""``petlprof estimate --attention eager|sdpa|flash``: which attention implementation the traced step runs.

The memory of attention depends on its implementation far more than on anything else at long lengths:

* ``eager``: transformers' own attention code, the scores and probabilities computed as tensors
  (``batch x heads x length x length`` each) and kept for the backward pass, with the dropout mask
  where attention dropout is on (training);
* ``sdpa`` (the default: a run's, as transformers builds a model by default; an architecture without it
  is built with eager, as a run builds it, and its rows say so): ``F.scaled_dot_product_attention``, whose
  kernel the device picks
  (:mod:`petlprof.estimate.kernels`: on an sm80+ GPU flash attention at fp16/bf16 without a mask, else
  memory-efficient attention, else the math path that keeps the scores);
* ``flash``: the flash-attention kernel forced for every attention call (FlashAttention-2, which
  transformers' ``flash_attention_2`` implementation runs through the ``flash-attn`` package, and
  torch's ``_scaled_dot_product_flash_attention`` on a GPU): it keeps the output and a log-sum-exp per
  query, never the scores.  It is traced as the sdpa path with the flash kernel forced, so it needs
  what that kernel needs: on ``cuda`` fp16 or bf16 (``--precision``), and an architecture without an
  additive attention bias (transformers' own list: T5's relative position bias rules it out).

Each record says which implementation it assumed and which kernels the traced step ran.  This module
imports nothing heavy (the command line reads it for ``--help``).
"""

from __future__ import annotations

from petlprof.errors import UsageError
from petlprof.values import Choice
from petlprof.vocabulary import FP32

EAGER, SDPA, FLASH = "eager", "sdpa", "flash"
ATTENTIONS = (EAGER, SDPA, FLASH)
DEFAULT_ATTENTION = SDPA


def attn_implementation(attention: str) -> dict[str, str | None]:
    """The keyword arguments of ``from_config`` for ``attention``: eager asked for by name; sdpa (and flash, the
    sdpa path with its kernel forced) as transformers builds a model by default and a run builds it: sdpa
    where the architecture has it, else eager, which the record then says (:func:`implementation_of`).  Always
    given: ``from_config`` keeps the implementation it was last given on the config, which later builds share."""
    return {"attn_implementation": EAGER if attention == EAGER else None}


def implementation_of(model) -> str:
    """The attention implementation transformers built ``model`` (or the first transformers model inside it: a
    task model's backbone, wrapped by a method or not) with: ``eager``, ``sdpa``, ..."""
    # transformers: slow to import, loaded only when used
    from transformers import PreTrainedModel

    built = next(m for m in model.modules() if isinstance(m, PreTrainedModel))
    return str(getattr(built.config, "_attn_implementation", None) or EAGER)


def check_attention(attention: str, precision: str, device: str) -> None:
    """``--attention``'s value, and flash's need of a half-precision step on a GPU, in one line (exit 2)."""
    # kept out of petlprof --help's imports
    from petlprof.estimate.autocast import policy_device

    Choice(choices=ATTENTIONS, kind="attention").check("attention", attention)
    if attention == FLASH and policy_device(device) == "cuda" and precision == FP32:
        raise UsageError(
            "--attention flash on cuda needs --precision bf16 or fp16: a GPU's flash attention runs in half "
            "precision only (at fp32 use --attention sdpa, which takes the memory-efficient kernel, or eager)"
        )


def check_flash_support(model, backbone: str) -> None:
    """``--attention flash`` on an architecture transformers runs no flash attention (or no sdpa) for: refused
    up front."""
    if not getattr(model, "_supports_flash_attn", False) or implementation_of(model) != SDPA:
        raise UsageError(
            f"--attention flash: backbone '{backbone}' ({type(model).__name__}) has no flash-attention implementation "
            "in transformers (an additive attention bias such as T5's relative positions); use sdpa or eager"
        )
