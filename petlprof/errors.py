"""Errors a user can cause and fix: the CLI prints them as one line and exits with code 2; and the status lines
petlprof writes on stderr (:func:`say`, :class:`StatusLine`)."""

from __future__ import annotations

import difflib
import re
import sys
import time
from collections.abc import Iterable
from typing import TextIO

ECHO_CHARS = 60  # an echoed value longer than this is cut, so a 5 MB value is not a 5 MB error line
# C0 and C1 controls, DEL, and the line separators and bidirectional overrides that reorder what follows
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class UsageError(ValueError):
    """Bad input from the user (unknown name, malformed config, negative size, ...)."""


def printable(text: str) -> str:
    """``text`` with every control character written as its escape (``\\x1b``, ``\\n``), so a value
    echoed to a terminal cannot move the cursor, change its colours, clear it or ring its bell."""
    return _CONTROL.sub(lambda match: ascii(match.group())[1:-1], text)


def say(line: str) -> None:
    """A status line on stderr, with the control characters of the values it echoes escaped."""
    print(printable(line), file=sys.stderr)


class StatusLine:
    """One line on a terminal for long work that has no progress bar (loading a backbone, generating): ``what``
    and the time since it began, rewritten in place by :meth:`update` (what is happening now, how far) and
    ended by the context's exit with the time it took; nothing at all where stderr is not a terminal (a log
    file, CI), so logs keep only the lines that say something once, nor with ``shown=False`` (a rank of several
    but the first, whose terminal is the first's)."""

    def __init__(self, what: str, stream: TextIO | None = None, shown: bool = True) -> None:
        self.what, self.stream = printable(what), stream if stream is not None else sys.stderr
        self.shown = shown and bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self.width = 0

    def __enter__(self) -> StatusLine:
        self._write(f"{self.what} ...")
        return self

    def update(self, detail: str) -> None:
        """Say what is happening now (``detail``), with the time so far."""
        self._write(f"{self.what}: {printable(detail)} ({time.perf_counter() - self.start:.0f} s so far)")

    def __exit__(self, kind, error, trace) -> None:
        if self.shown:
            ended = "done" if kind is None else "stopped"
            self._write(f"{self.what}: {ended} in {time.perf_counter() - self.start:.1f} s")
            self.stream.write("\n")
            self.stream.flush()

    def _write(self, text: str) -> None:
        if not self.shown:
            return
        self.stream.write("\r" + text.ljust(self.width))  # a shorter line covers the longer one before it
        self.stream.flush()
        self.width = len(text)


def shown(value: object, quote: bool = True, limit: int = ECHO_CHARS) -> str:
    """``value`` as an error message echoes it (its repr, or ``str`` without ``quote``, control
    characters escaped), cut to ``limit`` characters with its full length said."""
    text = repr(value) if quote else printable(str(value))
    if len(text) <= limit:
        return text
    return f"{text[: limit - 10]}...{text[-6:]} ({len(text)} characters)"


def unknown_choice(kind: str, value: str, choices: Iterable[str], extra: str = "") -> UsageError:
    """Build the standard error for an unknown name: the bad value, a "did you mean", the choices."""
    choices = sorted(choices)
    text = str(value)
    close = difflib.get_close_matches(text, choices, n=1, cutoff=0.6) if len(text) <= 255 else []
    hint = f"; did you mean '{close[0]}'?" if close else "."
    listed = ", ".join(choices)
    tail = f" {extra}" if extra else ""
    return UsageError(f"unknown {kind} '{shown(value, quote=False)}'{hint} Valid choices: {listed}.{tail}")
