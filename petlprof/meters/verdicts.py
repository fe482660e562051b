"""A self-test's vocabulary: one check (value, unit, verdict, why) and one meter's list of them."""

from __future__ import annotations

import dataclasses

PASS, WARN, FAIL = "pass", "warn", "fail"
REPEATS = 8  # windows in a spread check
KNOWN_BYTES = 256 * 2**20  # the known allocation of the memory checks


@dataclasses.dataclass
class Check:
    name: str
    value: float | int | str | None
    unit: str | None
    verdict: str
    detail: str


@dataclasses.dataclass
class MeterReport:
    meter: str
    available: bool
    detail: str
    checks: list[Check] = dataclasses.field(default_factory=list)


def graded(value: float, pass_below: float, warn_below: float) -> str:
    """``pass`` under ``pass_below``, ``warn`` under ``warn_below``, else ``fail``."""
    return PASS if value < pass_below else WARN if value < warn_below else FAIL
