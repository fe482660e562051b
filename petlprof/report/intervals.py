"""Intervals around seed means, and around the difference of two configurations' means.

The plots draw one interval kind, chosen once for a report (:data:`INTERVALS`, default
:data:`DEFAULT_INTERVAL`, ``petlprof report --interval``): the 95% confidence interval of the mean
(Student's t with ``n - 1`` degrees of freedom) or ± 1 standard error of the mean.  Two seeds give a
t quantile of 12.7, so a 95% interval over two seeds is 12.7 standard errors wide on each side; the
standard error shows the spread without that factor, and the plot's caption says which is drawn.
:func:`welch_difference` gives the 95% interval of the difference of two means with unequal
variances (Welch's t), which tells whether one configuration's lead is larger than the noise.
With one seed there is no spread over seeds; a score that is a share of the evaluation samples
(:data:`PROPORTIONS`) still has :func:`wilson_interval`, the binomial interval from the number of
samples it was scored on: how far it could move on another draw of evaluation examples, not on
another seed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from statistics import NormalDist

from petlprof.errors import unknown_choice

CONFIDENCE = 0.95
CI95, SE = "ci95", "se"
INTERVALS = {  # kind -> what the plots' bars are (the --interval choices)
    CI95: "95% confidence interval of the mean over seeds (Student's t)",
    SE: "± 1 standard error of the mean over seeds",
}
DEFAULT_INTERVAL = CI95
# the quality metrics that are a share of the evaluation samples (petlprof.tasks.metrics: accuracy, and
# exact_match over generated answers), so each sample is a trial and a binomial interval fits; f1, correlations,
# ROUGE-L, loss and perplexity are not
PROPORTIONS = ("accuracy", "exact_match")


def check_interval(kind: str) -> str:
    """``kind`` if it is one of :data:`INTERVALS`, else a UsageError naming the allowed ones."""
    if kind not in INTERVALS:
        raise unknown_choice("interval", kind, tuple(INTERVALS))
    return kind


def _clean(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def _mean_var(values: list[float]) -> tuple[float, float]:
    """Mean and sample variance (``n - 1`` in the denominator) of at least two values."""
    mean = math.fsum(values) / len(values)
    return mean, math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean (sample sd / sqrt(n)); NaN below two values."""
    clean = _clean(values)
    if len(clean) < 2:
        return math.nan
    return math.sqrt(_mean_var(clean)[1] / len(clean))


@functools.cache
def t_quantile(p: float, dof: float) -> float:
    """The ``p`` quantile of Student's t with ``dof`` degrees of freedom."""
    # scipy: slow to import, loaded only when used
    from scipy import stats

    return float(stats.t.ppf(p, dof))


def ci_half_width(values: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """Half-width of the t-distribution confidence interval of the mean; NaN below two values."""
    clean = _clean(values)
    if len(clean) < 2:
        return math.nan
    return t_quantile((1 + confidence) / 2, len(clean) - 1) * standard_error(clean)


def half_width(values: Sequence[float], kind: str) -> float:
    """The half-width of interval ``kind`` (:data:`INTERVALS`) around the mean of ``values``."""
    return ci_half_width(values) if check_interval(kind) == CI95 else standard_error(values)


def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(mean(a) - mean(b), half-width of its ``confidence`` interval by Welch's t); the half-width is
    NaN when either side has fewer than two values, and 0 when neither side varies."""
    a, b = _clean(a), _clean(b)
    if not a or not b:
        return math.nan, math.nan
    diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    if len(a) < 2 or len(b) < 2:
        return diff, math.nan
    va, vb = _mean_var(a)[1] / len(a), _mean_var(b)[1] / len(b)
    if va + vb == 0:
        return diff, 0.0
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch–Satterthwaite
    return diff, t_quantile((1 + confidence) / 2, dof) * math.sqrt(va + vb)


def wilson_interval(
    proportion: float | None, samples: float | None, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """(low, high) of the Wilson score interval of a binomial ``proportion`` (in [0, 1]) of ``samples``
    trials, within [0, 1]; (NaN, NaN) when either is missing or NaN, ``samples`` is below 1 or the
    proportion is outside [0, 1]."""
    if proportion is None or samples is None or math.isnan(proportion) or math.isnan(samples):
        return math.nan, math.nan
    if samples < 1 or not 0.0 <= proportion <= 1.0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    shrink = 1 + z * z / samples
    centre = (proportion + z * z / (2 * samples)) / shrink
    half = z / shrink * math.sqrt(proportion * (1 - proportion) / samples + z * z / (4 * samples * samples))
    # at 0 and 1 the bound is exactly the proportion (the formula's rounding aside)
    low = 0.0 if proportion == 0.0 else max(0.0, centre - half)
    return low, 1.0 if proportion == 1.0 else min(1.0, centre + half)


def caption(kind: str, seeds: Sequence[int]) -> str:
    """What a plot's bars are, e.g. ``bars: 95% CI over 3 seeds (Student's t)``; ``seeds`` are the
    configurations' seed counts."""
    check_interval(kind)
    several = sorted({int(n) for n in seeds if n > 1})
    if not several:
        return "one seed per point: no bars"
    counts = "/".join(map(str, several))
    text = f"bars: 95% CI over {counts} seeds (Student's t)" if kind == CI95 else f"bars: ± 1 s.e. over {counts} seeds"
    return text + ("; single-seed points have none" if any(n <= 1 for n in seeds) else "")


__all__ = [
    "CI95",
    "DEFAULT_INTERVAL",
    "INTERVALS",
    "PROPORTIONS",
    "SE",
    "caption",
    "check_interval",
    "ci_half_width",
    "half_width",
    "standard_error",
    "welch_difference",
    "wilson_interval",
]
