"""The three architecture families a backbone may be, the transformers class that builds each, and the model a
config builds.

``encoder`` (BERT-like), ``encoder-decoder`` (T5-like) and ``decoder`` (GPT-2/LLaMA-like), told from a
transformers config by the Auto mappings (not a name list).  Both the backbone loader
(:mod:`petlprof.models.backbones`) and the structural description (:mod:`petlprof.models.architecture`) build models by
these rules, so they live below both.  Imports nothing heavy at module level (``petlprof --help`` reads
the presets of :mod:`petlprof.models.backbones`, which imports this module).
"""

from __future__ import annotations

from typing import Any

from petlprof.errors import UsageError

ENCODER, ENCODER_DECODER, DECODER = "encoder", "encoder-decoder", "decoder"
# set on a config whose config.json unties the LM head that its transformers config class ties anyway
SEPARATE_HEAD = "petlprof_separate_lm_head"


def family_of(config: Any) -> str:
    """Architecture family of a transformers config, from the Auto mappings (not a name list)."""
    from transformers.models.auto.modeling_auto import (  # transformers: seconds, not for --help
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False):
        return ENCODER_DECODER
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return ENCODER
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return DECODER
    raise UsageError(
        f"model type '{config.model_type}' is neither an encoder, an encoder-decoder nor a "
        "decoder-only transformers architecture; petlprof cannot classify with it"
    )


def model_class(config: Any, lm_head: bool, spec: str = "this backbone") -> Any:
    """The transformers Auto class that builds ``config``: the headless model, or with ``lm_head`` the model with
    its own language-modelling head (causal for a decoder, sequence-to-sequence for an encoder-decoder; tied
    embeddings stay tied).  An encoder has no language-modelling objective here: refused in one line."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM  # as in family_of

    if not lm_head:
        return AutoModel
    family = family_of(config)
    if family == ENCODER:
        raise UsageError(
            f"backbone '{spec}' is an encoder ({config.model_type}): it has no language-modelling head to generate "
            "with; the LM objective needs a decoder (tiny-llama, tiny-gpt2, smollm2) or an encoder-decoder (tiny-t5)"
        )
    return AutoModelForSeq2SeqLM if family == ENCODER_DECODER else AutoModelForCausalLM


def keep_separate_head(config: Any, values: dict[str, Any]) -> Any:
    """Mark ``config`` (:data:`SEPARATE_HEAD`) where its ``config.json`` ``values`` untie the LM head from the input
    embeddings and the config class ties it anyway; returns ``config``.

    transformers 5's T5 and mT5 config classes set ``tie_word_embeddings`` whatever the file says ("we have to tie
    always"), so a model built from the config of mT5, mT0 or T0 (whose checkpoints hold a head of their own) had no
    head of its own: 3.8 GiB of mt0-xxl's weights were missing from its estimate.  Loading the pretrained weights
    keeps both (they differ in the checkpoint), so :func:`model_from_config` builds what that load gives."""
    if values.get("tie_word_embeddings") is False and getattr(config, "tie_word_embeddings", False):
        setattr(config, SEPARATE_HEAD, True)
    return config


def untie_head(model: Any) -> None:
    """Give ``model`` an LM head of its own (a copy of the embeddings it was tied to, so a random start stays finite),
    the input embeddings of encoder and decoder still shared, as a pretrained load of such a checkpoint leaves them."""
    import torch  # as in family_of

    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and embeddings is not None and head.weight is embeddings.weight:
        head.weight = torch.nn.Parameter(embeddings.weight.detach().clone())


def model_from_config(config: Any, lm_head: bool = False, spec: str = "this backbone", **from_config: Any) -> Any:
    """The model ``config`` builds with random weights (:func:`model_class`'s; ``from_config``: more of its
    arguments, e.g. an attention implementation), on the current device: a run's with ``random_init``, every
    estimate's and every description's of a config (on the meta device).  In float32 whatever a config's
    ``torch_dtype`` says (transformers 5 applies it by default): ``--precision`` decides what the products run
    in, and a bf16 config.json must not change that silently.  A config :func:`keep_separate_head` marked gets its
    LM head of its own."""
    import torch  # as in family_of

    auto_class = model_class(config, lm_head, spec)
    try:
        model = auto_class.from_config(config, dtype=torch.float32, **from_config)
    except ValueError as exc:  # the model's own check of its config, e.g. a width its heads do not divide
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"backbone '{spec}' ({config.model_type}): transformers refuses its config: {first}") from None
    if lm_head and getattr(config, SEPARATE_HEAD, False):
        untie_head(model)
    return model


def check_gradient_checkpointing(config: Any, spec: str = "this backbone") -> None:
    """Refuse, in one line, ``--gradient-checkpointing`` on a backbone whose transformers class has none (its
    ``supports_gradient_checkpointing``); a config no Auto class maps is left to the run's own check
    (:func:`petlprof.run.recipe.checkpointable_modules`)."""
    from transformers import AutoModel  # as in family_of

    cls = AutoModel._model_mapping.get(type(config), None)  # noqa: SLF001 - the Auto class's own table
    if cls is not None and not cls.supports_gradient_checkpointing:
        raise UsageError(
            f"--gradient-checkpointing: backbone '{spec}' ({cls.__name__}) has no gradient checkpointing in "
            "transformers; run it without the option"
        )
