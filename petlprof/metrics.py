"""Task metrics: how predictions are scored, and the direction table that drives Pareto fronts.

Every quantity petlprof compares has one direction here: quality metrics are better when higher,
cost figures when lower.  Pareto fronts, "best" markers and relative columns read this table
instead of guessing from names.  :func:`compute` scores predictions with the quality metrics
(scikit-learn and scipy, imported only when called) and returns plain floats.
"""

from __future__ import annotations

HIGHER = "higher"
LOWER = "lower"

METRIC_DIRECTIONS: dict[str, str] = {
    # task quality
    "accuracy": HIGHER,
    "f1": HIGHER,
    "f1_macro": HIGHER,
    "matthews_correlation": HIGHER,
    "pearson": HIGHER,
    "spearman": HIGHER,
    # costs (units in the names)
    "energy_j": LOWER,
    "peak_memory_bytes": LOWER,
    "time_s": LOWER,
    "trainable_params": LOWER,
    "energy_above_idle_j": LOWER,
    "co2eq_g": LOWER,
    "latency_p50_s": LOWER,
    "infer_b1_latency_p50_s": LOWER,
    "infer_latency_per_sample_p50_s": LOWER,
    "merged_latency_p50_s": LOWER,
}


# the range a quality metric can take: a confidence interval is drawn only within it
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "accuracy": (0.0, 1.0),
    "f1": (0.0, 1.0),
    "f1_macro": (0.0, 1.0),
    "matthews_correlation": (-1.0, 1.0),
    "pearson": (-1.0, 1.0),
    "spearman": (-1.0, 1.0),
}


def direction(metric: str) -> str:
    """``higher`` or ``lower`` for a known metric; a KeyError names the unknown one."""
    try:
        return METRIC_DIRECTIONS[metric]
    except KeyError:
        raise KeyError(f"no direction known for metric '{metric}'; known: {sorted(METRIC_DIRECTIONS)}") from None


def _accuracy(predictions, labels) -> float:
    from sklearn.metrics import accuracy_score

    return accuracy_score(labels, predictions)


def _f1(predictions, labels) -> float:
    """F1 of the positive class (id 1) of a binary task."""
    from sklearn.metrics import f1_score

    return f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0)


def _f1_macro(predictions, labels) -> float:
    """Unweighted mean of the per-class F1 over the classes seen in labels or predictions."""
    from sklearn.metrics import f1_score

    return f1_score(labels, predictions, average="macro", zero_division=0)


def _matthews(predictions, labels) -> float:
    from sklearn.metrics import matthews_corrcoef

    return matthews_corrcoef(labels, predictions)


def _correlation(function, predictions, labels) -> float:
    """A scipy correlation; 0.0 when either side is constant (there is no relation to measure)."""
    if predictions.min() == predictions.max() or labels.min() == labels.max():
        return 0.0
    return function(predictions.astype(float), labels.astype(float))[0]


def _pearson(predictions, labels) -> float:
    from scipy.stats import pearsonr

    return _correlation(pearsonr, predictions, labels)


def _spearman(predictions, labels) -> float:
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
