"""The names every layer shares, each declared once: objectives, the zero-shot row, executors, chat
templates, precisions and the label of a position that is not a target.

A leaf: it imports nothing, so the option declarations (``petlprof --help``), the task loaders, the run and
the report can all name these without importing each other (or torch, pandas or Ray).
"""

from __future__ import annotations

# what a task model is trained for: a classification head on the pooled state, or the backbone's own LM head
# (causal-LM loss on the target tokens, or seq2seq), scored on generated text
CLASSIFICATION, LM = "classification", "lm"
OBJECTIVES = (CLASSIFICATION, LM)
REGRESSION = "regression"  # a labelled task whose label is a number (a one-output head), never an objective
AUTO = "auto"  # --objective auto: the task's own (lm for a prompt/target task, else classification)
OBJECTIVE_CHOICES = (AUTO, *OBJECTIVES)  # what --objective takes

# the method of a generative sweep's row before any tuning (petlprof.methods.zero_shot): a reference score at
# no training cost, added to a sweep on the LM objective and shown as a line, never a point on a frontier
ZERO_SHOT = "zero_shot"

LOCAL, RAY = "local", "ray"
EXECUTORS = (LOCAL, RAY)  # --executor: where the runs of a sweep execute (petlprof.execution.executors)

CHAT_TEMPLATES = (AUTO, "none")  # --chat-template: the tokenizer's own where it has one, or plain text

FP32, BF16, FP16 = "fp32", "bf16", "fp16"
PRECISIONS = (FP32, BF16, FP16)  # --precision (petlprof.run.recipe)

# --weights-dtype: the dtype every weight of the task model is held in (petlprof.run.recipe); no float16, whose
# pure training overflows the gradient norm and underflows small gradients with no loss scaler able to unscale it
FLOAT32, BFLOAT16 = "float32", "bfloat16"
WEIGHT_DTYPES = (FLOAT32, BFLOAT16)

# --optimizer: torch's AdamW, or bitsandbytes' 8-bit AdamW (block-wise quantised state), paged or not
ADAMW, ADAMW_8BIT, PAGED_ADAMW_8BIT = "adamw", "adamw8bit", "paged_adamw8bit"
OPTIMIZERS = (ADAMW, ADAMW_8BIT, PAGED_ADAMW_8BIT)

IGNORE_INDEX = -100  # Hugging Face's label of a position that is not a target

# how a figure was obtained (its ``*_kind`` provenance key): read from a counter or sensor, or computed by a model
MEASURED, ESTIMATED = "measured", "estimated"

# what ``--tune`` may search (petlprof.sweep.tuning): the learning rate
LR = "lr"
TUNE_TARGETS = (LR,)
