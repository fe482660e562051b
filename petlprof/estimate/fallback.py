"""The exact fallback for a step the meta device cannot trace: real tensors at 1 and 2 layers, extrapolated.

Some operation of a method or model may have no meta kernel.  Then the same step runs on real
tensors at the backbone's full width but only one and two layers deep (both stacks of an
encoder-decoder), and every figure (parameters, bytes, FLOPs) is extended linearly in depth:
``f(L) = f(1) + (L - 1) * (f(2) - f(1))``.  For a stack of identical layers that is exact: each
layer adds the same weights, the same saved activations and the same FLOPs.  The record's
``estimate_source`` says this rule was used and why.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

from petlprof.estimate.model import ResolvedBackbone
from petlprof.models.backbones import set_depth

if TYPE_CHECKING:
    from petlprof.estimate.core import TraceFigures

DEPTH_RULE = "real tensors at 1 and 2 layers of full width, extrapolated linearly in depth"


def depth(resolved: ResolvedBackbone) -> int:
    """The backbone's depth; an encoder-decoder's two stacks must be equally deep for one rule to hold."""
    config = resolved.config
    layers = int(config.num_hidden_layers)
    decoder = getattr(config, "num_decoder_layers", None) if getattr(config, "is_encoder_decoder", False) else None
    if decoder is not None and int(decoder) != layers:
        raise ValueError(
            f"the encoder ({layers}) and decoder ({decoder}) stacks differ in depth: one linear rule cannot extend both"
        )
    return layers


def _at_depth(resolved: ResolvedBackbone, layers: int) -> ResolvedBackbone:
    """A copy of ``resolved`` cut to ``layers`` by the run's depth cut (:func:`petlprof.models.backbones.set_depth`)."""
    cut = copy.copy(resolved)
    cut.config = copy.deepcopy(resolved.config)
    set_depth(cut.config, layers)
    return cut


def _extend(one, two, layers: int):
    if isinstance(one, dict):
        return {key: _extend(one[key], two[key], layers) for key in one}
    if isinstance(one, bool) or not isinstance(one, int):
        return one
    return one + (layers - 1) * (two - one)


def extrapolated_figures(
    resolved: ResolvedBackbone, method, config, settings, reason: str, trace: Callable[..., TraceFigures]
) -> TraceFigures:
    """``trace``'s figures (:func:`petlprof.estimate.core.trace_figures`) of the full depth, from real
    steps at depth 1 and 2; ``trace`` is passed in so this module does not import its caller."""
    layers = depth(resolved)
    one, two = (trace(_at_depth(resolved, k), method, config, settings, device="cpu") for k in (1, 2))
    figures: TraceFigures = _extend(one, two, layers)  # the same keys, each count extended
    figures["estimate_source"] = f"{DEPTH_RULE} (the meta-device trace failed: {reason})"
    # time and energy are priced kernel by kernel, and the full depth's kernels were never traced: a shallow step's
    # seconds would be read as the whole model's (and rank it first in a plan)
    figures.pop("predicted", None)
    return figures
