"""Task metrics: how predictions are scored, and the direction table that drives Pareto fronts.

Every quantity petlprof compares has one direction here: quality metrics are better when higher,
cost figures when lower.  Pareto fronts, "best" markers and relative columns read this table
instead of guessing from names.  :func:`compute` scores predictions with the quality metrics
(scikit-learn and scipy, imported only when called; a run's process has imported scikit-learn's
metrics with its libraries, :data:`petlprof.run.libraries.RUNTIME_LIBRARIES`) and returns plain floats.

Generated text is scored by :func:`score_generations`: ``exact_match`` (the share of answers equal to
their reference after :func:`normalise`, on the part of each text an extraction rule of :data:`ANSWERS`
keeps) and ``rouge_l`` (rouge-score's ROUGE-L F-measure, averaged over the examples).  ``eval_loss``
and ``perplexity`` (the exponential of the mean evaluation loss on target tokens) are worked out by
the pipeline; they are lower-is-better and named here only for their direction.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from petlprof.errors import UsageError
from petlprof.results.figures import HIGHER, LOWER, SEARCH_COSTS, directions

METRIC_DIRECTIONS: dict[str, str] = {
    # task quality
    "accuracy": HIGHER,
    "f1": HIGHER,
    "f1_macro": HIGHER,
    "matthews_correlation": HIGHER,
    "pearson": HIGHER,
    "spearman": HIGHER,
    "exact_match": HIGHER,
    "rouge_l": HIGHER,
    "eval_loss": LOWER,
    "perplexity": LOWER,
    # costs (units in the names): every measured figure's as declared, and the record's other costs
    **directions(),
    "trainable_params": LOWER,
    "latency_p50_s": LOWER,
    "infer_b1_latency_p50_s": LOWER,
    "infer_latency_per_sample_p50_s": LOWER,
    "merged_latency_p50_s": LOWER,
    **{name: LOWER for name in SEARCH_COSTS},
}


# the range a quality metric can take: a confidence interval is drawn only within it
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "accuracy": (0.0, 1.0),
    "f1": (0.0, 1.0),
    "f1_macro": (0.0, 1.0),
    "matthews_correlation": (-1.0, 1.0),
    "pearson": (-1.0, 1.0),
    "spearman": (-1.0, 1.0),
    "exact_match": (0.0, 1.0),
    "rouge_l": (0.0, 1.0),
    "eval_loss": (0.0, math.inf),
    "perplexity": (1.0, math.inf),
}


def direction(metric: str) -> str:
    """``higher`` or ``lower`` for a known metric; a KeyError names the unknown one."""
    try:
        return METRIC_DIRECTIONS[metric]
    except KeyError:
        raise KeyError(f"no direction known for metric '{metric}'; known: {sorted(METRIC_DIRECTIONS)}") from None


def _accuracy(predictions, labels) -> float:
    # sklearn: slow to import, loaded only when used
    from sklearn.metrics import accuracy_score

    return accuracy_score(labels, predictions)


def _f1(predictions, labels) -> float:
    """F1 of the positive class (id 1) of a binary task."""
    # sklearn: slow to import, loaded only when used
    from sklearn.metrics import f1_score

    return f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0)


def _f1_macro(predictions, labels) -> float:
    """Unweighted mean of the per-class F1 over the classes seen in labels or predictions."""
    # sklearn: slow to import, loaded only when used
    from sklearn.metrics import f1_score

    return f1_score(labels, predictions, average="macro", zero_division=0)


def _matthews(predictions, labels) -> float:
    # sklearn: slow to import, loaded only when used
    from sklearn.metrics import matthews_corrcoef

    return matthews_corrcoef(labels, predictions)


def _correlation(function, predictions, labels) -> float:
    """A scipy correlation; 0.0 when either side is constant (there is no relation to measure)."""
    if predictions.min() == predictions.max() or labels.min() == labels.max():
        return 0.0
    return function(predictions.astype(float), labels.astype(float))[0]


def _pearson(predictions, labels) -> float:
    # scipy: slow to import, loaded only when used
    from scipy.stats import pearsonr

    return _correlation(pearsonr, predictions, labels)


def _spearman(predictions, labels) -> float:
    # scipy: slow to import, loaded only when used
    from scipy.stats import spearmanr

    return _correlation(spearmanr, predictions, labels)


METRIC_FUNCTIONS = {
    "accuracy": _accuracy,
    "f1": _f1,
    "f1_macro": _f1_macro,
    "matthews_correlation": _matthews,
    "pearson": _pearson,
    "spearman": _spearman,
}


def compute(metric_names, predictions, labels) -> dict[str, float]:
    """Each named quality metric of ``predictions`` (class ids, or floats for regression) against
    ``labels``, as plain floats keyed by the names in :data:`METRIC_DIRECTIONS`."""
    # numpy: slow to import, loaded only when used
    import numpy as np

    unknown = [name for name in metric_names if name not in METRIC_FUNCTIONS]
    if unknown:
        raise KeyError(f"unknown metrics {unknown}; known: {sorted(METRIC_FUNCTIONS)}")
    predictions, labels = np.asarray(predictions).ravel(), np.asarray(labels).ravel()
    if len(predictions) != len(labels) or len(labels) == 0:
        raise ValueError(
            f"need as many predictions as labels, and at least one; "
            f"got {len(predictions)} predictions for {len(labels)} labels"
        )
    return {name: float(METRIC_FUNCTIONS[name](predictions, labels)) for name in metric_names}


# --- generated text ----------------------------------------------------------------------------------

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_FINAL_MARK = "####"  # GSM8K's mark before the final answer
_PUNCTUATION = " .,;:!?'\"`"


def canonical_number(text: str) -> str | None:
    """``text`` as one finite number in a canonical form (``"12.0"``, ``"+12"``, ``"1,200"``, ``"1.2e3"`` ->
    ``"12"``, ``"12"``, ``"1200"``, ``"1200"``), exact for any number of digits (no rounding to a context's
    precision), or None when it is not one (nan and inf included: they are compared as text)."""
    text = text.strip().replace(",", "")
    if not text or not _NUMBER.fullmatch(text):
        return None
    try:
        value = Decimal(text)  # exact: a Decimal built from text is not rounded
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == 0:
        return "0"
    sign, written, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # a finite Decimal's: 'n', 'N' and 'F' mark NaN, sNaN and infinity
    digits = list(written)
    while digits[-1] == 0:  # trailing zeros into the exponent: 12.0 -> 12, 1200 -> 12E+2
        digits.pop()
        exponent += 1
    value = Decimal((sign, tuple(digits), exponent))
    if abs(value.adjusted()) <= 100:  # positional digits (10**30 stays exact)
        return format(value, "f")
    # beyond, the scientific form (1E+200), never a string of a billion zeros from a generated "1e999999999"
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}E{value.adjusted():+d}"


def normalise(text: str) -> str:
    """A text as exact match compares it: whitespace runs made one space, lower-cased, and a number in its
    canonical form (:func:`canonical_number`); any other text stripped of surrounding punctuation
    (``.,;:!?'"`` and backquotes) too, so ``" 12.0 "`` equals ``"12"`` and ``"Positive."`` equals ``"positive"``."""
    text = " ".join(text.split()).lower()
    for candidate in (text, text.strip(_PUNCTUATION)):
        number = canonical_number(candidate)
        if number is not None:
            return number
    return text.strip(_PUNCTUATION)


def first_line(text: str) -> str:
    """The first non-empty line: a short answer the model may follow with more text."""
    return next((line for line in text.splitlines() if line.strip()), "")


def _last_number(text: str) -> str:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else text


def line_number(text: str) -> str:
    """The last number on the first non-empty line (``"5 - 3 = 2"`` -> ``"2"``), else that line."""
    return _last_number(first_line(text))


def final_answer(text: str) -> str:
    """The final answer of a worked solution: the first number after the last ``####`` (GSM8K's mark) on its
    line, else what follows the mark; without the mark the last number in the text, else the whole text."""
    if _FINAL_MARK in text:
        rest = first_line(text.rsplit(_FINAL_MARK, 1)[1])
        numbers = _NUMBER.findall(rest)
        return numbers[0] if numbers else rest
    return _last_number(text)


# how the answer is taken from a generated text (and from its reference) before exact match compares them
ANSWERS = {"text": lambda text: text, "line": first_line, "number": line_number, "final": final_answer}


def exact_match(predictions: list[str], references: list[str], answer: str = "text") -> float:
    """The share of predictions whose answer (``ANSWERS[answer]``) equals the reference's, both normalised."""
    extract = ANSWERS[answer]
    same = [normalise(extract(p)) == normalise(extract(r)) for p, r in zip(predictions, references, strict=True)]
    return sum(same) / len(same)


def rouge_l(predictions: list[str], references: list[str]) -> float:
    """rouge-score's ROUGE-L F-measure (with stemming) of each prediction against its reference, averaged."""
    # rouge_score: slow to import, loaded only when used
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    scores = [scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references, strict=True)]
    return sum(scores) / len(scores)


GENERATION_METRICS = {"exact_match": exact_match, "rouge_l": rouge_l}


def score_generations(
    metric_names, predictions: list[str], references: list[str], answer: str = "text"
) -> dict[str, float]:
    """Each named generation metric (:data:`GENERATION_METRICS`) of generated texts against reference
    texts, as plain floats; ``answer``: how exact match takes the answer from each text (:data:`ANSWERS`)."""
    unknown = [name for name in metric_names if name not in GENERATION_METRICS]
    if unknown:
        raise KeyError(f"unknown generation metrics {unknown}; known: {sorted(GENERATION_METRICS)}")
    if answer not in ANSWERS:
        raise KeyError(f"unknown answer rule {answer!r}; known: {sorted(ANSWERS)}")
    if len(predictions) != len(references) or not references:
        raise ValueError(
            f"need as many predictions as references, and at least one; "
            f"got {len(predictions)} predictions for {len(references)} references"
        )
    out = {}
    for name in metric_names:
        if name == "exact_match":
            out[name] = float(exact_match(predictions, references, answer))
        else:
            out[name] = float(GENERATION_METRICS[name](predictions, references))
    return out


def check_target(task, name: str, metric: str, value: float) -> None:
    """A target is a metric the task scores, within that metric's range."""

    if metric not in task.metric_names:
        raise UsageError(
            f"target metric '{metric}' is not scored on task '{name}'; it scores {', '.join(task.metric_names)}"
        )
    low, high = METRIC_RANGES[metric]
    if not low <= value <= high:
        raise UsageError(
            f"--target-value {value:g} is outside the range of {metric} on task '{name}', [{low:g}, {high:g}]"
        )
