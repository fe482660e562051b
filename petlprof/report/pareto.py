"""Pareto fronts over any number of objectives, oriented by the metric-direction table.

A point is a mapping from objective name to value (an accuracy and a training energy, say).
Whether an objective is better higher or lower comes from :func:`petlprof.tasks.metrics.direction`,
never from its name.  A point is on the front when no other point is at least as good in every
objective and strictly better in one; equal points therefore do not remove each other.  A point
with a missing, ``None`` or NaN objective is never on the front and removes no other point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from petlprof.results.figures import HIGHER
from petlprof.tasks.metrics import direction


def _oriented(
    point: Mapping[str, float], objectives: Sequence[str], signs: Sequence[float]
) -> tuple[float, ...] | None:
    """The point's objective values turned so that larger is better, or None when one is missing."""
    values = []
    for name, sign in zip(objectives, signs):
        value = point.get(name)
        if value is None or math.isnan(float(value)):
            return None
        values.append(sign * float(value))
    return tuple(values)


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """True when ``a`` is at least as good as ``b`` everywhere and strictly better somewhere."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def pareto_front(points: Sequence[Mapping[str, float]], objectives: Sequence[str]) -> list[int]:
    """Indices (ascending) of the points no other point dominates on ``objectives``.

    Raises ValueError without objectives and KeyError for an objective with no known direction.
    """
    if not objectives:
        raise ValueError("pareto_front needs at least one objective")
    signs = [1.0 if direction(name) == HIGHER else -1.0 for name in objectives]
    oriented = [(i, _oriented(point, objectives, signs)) for i, point in enumerate(points)]
    valid = [(i, values) for i, values in oriented if values is not None]
    return [i for i, values in valid if not any(_dominates(other, values) for _, other in valid)]
