"""Errors a user can cause and fix: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UsageError(ValueError):
    """Bad input from the user (unknown name, malformed config, negative size, ...)."""


def unknown_choice(kind: str, value: str, choices: Iterable[str], extra: str = "") -> UsageError:
    """Build the standard error for an unknown name: the bad value, a "did you mean", the choices."""
    choices = sorted(choices)
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "."
    listed = ", ".join(choices)
    tail = f" {extra}" if extra else ""
    return UsageError(f"unknown {kind} '{value}'{hint} Valid choices: {listed}.{tail}")
