"""What every task is made of: the records a task loader returns.

:mod:`petlprof.tasks.labelled` (labelled tasks, and :func:`~petlprof.tasks.labelled.load_task` for every kind) and
:mod:`petlprof.tasks.generative` (tasks for the language-modelling objective) both build these records; they stand
here, below both, so that ``labelled`` may call ``generative`` without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from petlprof.tasks import metrics
from petlprof.vocabulary import CLASSIFICATION, LM, REGRESSION


@dataclass
class Split:
    """One side of a task, row-aligned: texts, optional second texts of a pair, and labels; for the LM
    objective the texts are the prompts and ``targets`` the reference texts (``labels`` then holds the
    class ids of a verbalised labelled task, else nothing), and ``messages`` a chat layout's prompt turns
    (lists of ``{"role", "content"}``, for the tokenizer's chat template; the texts render them as plain text)."""

    texts: list[str]
    pairs: list[str] | None
    labels: list
    targets: list[str] | None = None
    messages: list[list[dict[str, str]]] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def head(self, size: int) -> Split:
        """The first ``size`` rows."""

        def cut(values):
            return None if values is None else values[:size]

        return Split(self.texts[:size], cut(self.pairs), self.labels[:size], cut(self.targets), cut(self.messages))


def sizes_text(train: Split, val: Split | None, evaluation: Split) -> str:
    """The sizes a task's description states: ``train N, eval M``, with ``val K`` between them when it has one."""
    return f"train {len(train)}, " + (f"val {len(val)}, " if val is not None else "") + f"eval {len(evaluation)}"


@dataclass
class TaskData:
    """A loaded task: the data of its splits and how to score predictions on it.  ``val``, when a run asks for
    one (``val_size``), is disjoint from both ``train`` and ``eval``.

    ``objective``: ``classification``, ``regression`` (worked out from ``num_labels`` when not given) or
    ``lm``.  An LM task has ``num_labels`` 0 (no classification head: the backbone's own LM head), is scored
    on generated text by :meth:`score_generations` (``answer``: how exact match takes the answer from a text,
    :data:`petlprof.tasks.metrics.ANSWERS`), and generates ``max_new_tokens`` per evaluation prompt unless the run
    says otherwise; its ``label_names`` are the label words of a verbalised labelled task, else None."""

    name: str
    train: Split
    eval: Split
    num_labels: int
    label_names: list[str] | None
    metric_names: tuple[str, ...]
    description: str
    warnings: list[str] = field(default_factory=list)  # about the data itself, e.g. a text that gives its label away
    objective: str = ""  # "": worked out from num_labels (regression for one, else classification)
    answer: str = "text"
    max_new_tokens: int | None = None
    val: Split | None = None  # the validation split, carved from the training pool: what every decision reads

    def checked_split(self) -> Split:
        """The split a run's decisions (target checks, learning curves, tuning) score: validation, never the
        evaluation split the run is reported on."""
        if self.val is None:
            raise ValueError(f"task '{self.name}' was loaded without a validation split (val_size)")
        return self.val

    def __post_init__(self) -> None:
        if not self.objective:
            self.objective = REGRESSION if self.num_labels == 1 else CLASSIFICATION

    @property
    def primary_metric(self) -> str:
        return self.metric_names[0]

    @property
    def is_regression(self) -> bool:
        return self.objective == REGRESSION

    def majority_rate(self) -> float | None:
        """The share of the evaluation split's most common class: the accuracy of always answering it
        (None for regression and for LM tasks)."""
        if self.objective != CLASSIFICATION or len(self.eval) == 0:
            return None
        labels = np.asarray(self.eval.labels).astype(int)
        counts = np.bincount(labels[labels >= 0])
        if counts.sum() == 0:
            return None
        return float(counts.max() / counts.sum())

    def compute_metrics(self, predictions, labels) -> dict[str, float]:
        """Score predicted class ids (floats for regression) against the true labels; class ids
        may come as floats (as a float tensor gathered from the model holds them)."""
        if self.objective == LM:
            raise ValueError(f"task '{self.name}' is scored on generated text: use score_generations")
        if not self.is_regression:
            predictions, labels = np.asarray(predictions).astype(int), np.asarray(labels).astype(int)
        return metrics.compute(self.metric_names, predictions, labels)

    def score_generations(self, predictions: list[str], references: list[str]) -> dict[str, float]:
        """Score generated texts against the reference targets with the task's metrics (exact match of
        the answer ``answer`` takes from each, normalised; ROUGE-L for free text)."""
        if self.objective != LM:
            raise ValueError(f"task '{self.name}' is scored on class predictions: use compute_metrics")
        return metrics.score_generations(self.metric_names, predictions, references, self.answer)
