"""What the PEFT-backed methods share: wrapping the backbone, and folding trained weights back in.

Every PEFT method here freezes the whole backbone, lets PEFT add its trainable pieces, and keeps
the task head trainable.  PEFT's prompt-learning methods need a task-specific wrapper; the
headless backbones petlprof classifies with are served by PEFT's feature-extraction wrapper.
"""

from __future__ import annotations

from petlprof.errors import UsageError


def wrap_backbone(classifier, peft_config, method: str):
    """Freeze the backbone, wrap it with ``peft_config`` (PEFT decides what trains) and free the head."""
    import peft

    classifier.freeze_backbone()
    try:
        classifier.backbone = peft.get_peft_model(classifier.backbone, peft_config)
    except ValueError as exc:
        raise UsageError(f"{method} cannot adapt this backbone: {exc}") from None
    return classifier


def merge(model):
    """Fold a LoRA/IA3 backbone's trained weights into its base weights (in place) and drop PEFT's layers.

    The merged model computes the same function without the adapter's extra matrix products, so
    inference latency can be compared merged and unmerged.
    """
    model.backbone = model.backbone.merge_and_unload()
    return model
