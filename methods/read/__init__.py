"""READ — REcurrent ADaptation (Wang et al. 2023, arXiv 2305.15348).

A small recurrent network runs over the *layer index* of the frozen backbone: for every token
position, step ``i`` reads a joiner's projection (LayerNorm + Linear) of layer ``i``'s hidden
state.  A zero-initialised projection maps the RNN's summary back to the model width and the
result is added to the backbone's final hidden state; the task head sits on the corrected state.
The backbone runs once per batch under ``torch.no_grad`` in eval mode, so training never
back-propagates through it, and the same RNN serves every layer, so the trainable parameters do
not grow with depth.  In an encoder-decoder, ``t5_wiring`` chooses how the encoder's correction
reaches the decoder side; the network itself is in :mod:`petlprof.methods.read.model`.

Under the LM objective the corrected final state of every position goes through the frozen LM head
(the authors' captioning code does the same); at generation the backbone keeps its KV cache and the
side network runs once per new token, on that position's per-layer states.
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.method_api import MAX_WIDTH, MethodConfig, MethodSpec, choice, integer
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import OBJECTIVES

CELLS = ("rnn", "gru", "lstm")
INIT_STATES = ("zeros", "embedding")
AGGREGATIONS = ("last", "mean")
T5_WIRINGS = ("side", "encoder_output")


@dataclass
class ReadConfig(MethodConfig):
    hidden_size: int = integer(128, "RNN hidden size (the Pareto knob; the authors used 64-512)", maximum=MAX_WIDTH)
    cell: str = choice("gru", "recurrent cell", CELLS)
    init_state: str = choice("zeros", "initial RNN state: zeros, or a projection of the embedding output", INIT_STATES)
    aggregation: str = choice("last", "summary of the RNN over layers: the last state or the mean of all", AGGREGATIONS)
    t5_wiring: str = choice(
        "side",
        "encoder-decoder only: 'side' (the encoder correction enters the decoder "
        "side network; no backprop through frozen layers) or 'encoder_output' (the "
        "authors' code: the frozen decoder attends to the corrected encoder output)",
        T5_WIRINGS,
    )


def apply(classifier, config: ReadConfig):
    # torch: the spec is listed and checked without it
    from petlprof.methods.read.model import ReadModel
    from petlprof.models.architecture import require

    require("read", classifier.architecture)  # its side network reads every layer's states at one width
    return ReadModel(classifier, config)


SPEC = MethodSpec(
    name="read",
    description="GRU side network over the frozen backbone's per-layer states + task head",
    config_cls=ReadConfig,
    apply="petlprof.methods.read:apply",
    default_lr=1e-3,
    lr_source="side network and head trained from scratch; READ authors' range 1e-4..3e-3",
    lm_lr=1e-3,
    lm_lr_source="chosen by --tune lr on smollm2/arith (reports/smollm2-arith-tuned; 64 validation examples, 1 seed): "
    "the classification default kept (0.09 exact match after 8 steps against 0.02 for 3.16e-3; 0.30 after 3 steps)",
    pareto_knob="hidden_size",
    default_grid=(32, 128, 512),
    side_tuning=True,
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,
)
