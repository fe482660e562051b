"""The kinds of value a run option takes: how a value from the command line or a config file is read,
and the range it must lie in.

Each kind is one small object with ``read`` (a config-file value or a command-line string -> the
option's value: numeric text such as YAML's ``1e-3`` becomes a number) and ``check`` (raise a
one-line :class:`~petlprof.errors.UsageError` naming the flag and the bad value, shortened).  The
option declarations in :mod:`petlprof.sweep.options` pick one per option; nothing here imports torch.

:class:`Number`, :class:`Text` and :class:`Choice` are the method config fields' kinds too (re-exported by
:mod:`petlprof.method_api`): there they answer ``problem`` (what is wrong with a value, as the phrase after
the field's name) and ``allowed`` (what ``petlprof list`` shows), each idea declared once for both sides.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from petlprof.errors import UsageError, shown, unknown_choice

MAX_NAME_CHARS = 255  # a file name's limit on common file systems; a longer backbone or task name is refused
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
MAX_BYTES = 2**60  # 1 EiB: no machine holds more memory than that
MAX_WATTS = 10_000.0  # no single accelerator's power limit comes near 10 kW
J_PER_KWH = 3.6e6
_INT = re.compile(r"\s*[-+]?[0-9]+\s*")
_FLOAT = re.compile(r"\s*[-+]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|inf(inity)?|nan)\s*", re.IGNORECASE)


def flag(name: str) -> str:
    """The command-line flag of an option: ``train_size`` -> ``--train-size``."""
    return f"--{name.replace('_', '-')}"


_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def check_file(path: str | Path, what: str, folder: bool = False) -> None:
    """Refuse ``path`` when it exists but is not a regular file (nor, with ``folder``, a folder): reading a
    FIFO waits for a writer forever and a device may never end.  A missing path is the caller's to name."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, unreadable, or a name with a NUL byte
        return
    if stat.S_ISREG(mode) or folder and stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "a special file")
    expected = "a regular file or a folder" if folder else "a regular file"
    raise UsageError(f"{what} {shown(str(path))} is {kind}, not {expected}")


MAX_LR = 10.0  # the largest learning rate --lr or a method's default may give (AdamW diverges far below it)


def is_number(value: Any) -> bool:
    """A real, finite number: not a bool, not inf, not nan (any int, even one too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def known_total(values: Iterable[Any]) -> float | None:
    """The sum of ``values`` where every one is a finite number (:func:`is_number`) and so is the sum, else None: a
    total with a part unknown (not recorded, not measured) is unknown, never the sum of the parts that are there."""
    parts = list(values)
    if not all(is_number(v) for v in parts):
        return None
    total = float(sum(parts))
    return total if math.isfinite(total) else None  # finite parts may overflow a float (1e308 + 1e308)


@dataclass(frozen=True, kw_only=True)
class Kind:
    """Any value of ``types`` (``None`` allowed with ``optional``); subclasses narrow it."""

    types: ClassVar[tuple[type, ...]] = (object,)
    optional: bool = False

    def read(self, value: Any) -> Any:
        return value

    def check(self, name: str, value: Any) -> None:
        if value is None and self.optional:
            return
        if isinstance(value, bool) and bool not in self.types or not isinstance(value, self.types):
            expected = " or ".join(t.__name__ for t in self.types) + (" or unset" if self.optional else "")
            raise UsageError(f"option '{name}' must be {expected}, got {shown(value)}")


@dataclass(frozen=True)
class Table(Kind):
    """A table (``method_config``, ``method_grid``); its entries are checked against the methods."""

    types: ClassVar[tuple[type, ...]] = (dict,)


@dataclass(frozen=True)
class Flag(Kind):
    types: ClassVar[tuple[type, ...]] = (bool,)

    def check(self, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise UsageError(f"option '{name}' must be bool (true or false), got {shown(value)}")


@dataclass(frozen=True)
class Integer(Kind):
    """An integer in ``minimum..maximum``; ``why`` says where the maximum comes from (read and checked by
    its :attr:`number`, worded "must be an integer >= MINIMUM")."""

    minimum: int = 0
    maximum: int | None = None
    why: str = ""

    @property
    def number(self) -> Number:
        """The :class:`Number` that reads and checks it."""
        what = f"an integer >= {self.minimum}"
        return Number(minimum=self.minimum, maximum=self.maximum, inclusive=True, integer=True, what=what, why=self.why)

    def read(self, value: Any) -> Any:
        return self.number.read(value)

    def check(self, name: str, value: Any) -> None:
        if value is None and self.optional:
            return
        self.number.check(name, value)


@dataclass(frozen=True)
class Examples(Integer):
    """A number of examples, or ``all`` (every example of the split: None once read)."""

    minimum: int = 1
    maximum: int | None = 10**9
    why: str = "examples"

    def read(self, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("all", "none"):
            return None
        return super().read(value)

    def check(self, name: str, value: Any) -> None:
        if value is None or isinstance(value, int) and not isinstance(value, bool):
            super().check(name, value)
        else:
            allowed = f"a number of examples >= {self.minimum} or 'all'"
            raise UsageError(f"{flag(name)} must be {allowed}, got {shown(value)}")


@dataclass(frozen=True)
class Number(Kind):
    """A finite number (``integer``: an integer) with ``minimum < value`` (``<=`` with ``inclusive``) and
    ``value <= maximum`` (``<`` with ``below``); either bound may be left out.  ``what`` completes
    "must be ..." for a value below the range (``finite``: for one that is not a finite number), and then a
    value above it is told "must be at most ..."; without ``what`` both are worded from the bounds ("a
    positive integer of at most 4096", "a number in [0, 1)").  ``depth``: a method-config field counting
    backbone layers, at most the backbone's depth too (:meth:`petlprof.method_api.MethodConfig.check_depth`).

    The one number kind of both the run options (``check``: a one-line error naming the flag) and the method
    config fields (``problem``: the phrase after the field's name; :func:`petlprof.method_api.number`)."""

    minimum: float | None = None
    maximum: float | None = None
    inclusive: bool = False
    below: bool = False
    integer: bool = False
    what: str = ""
    finite: str = ""
    why: str = ""  # where the maximum comes from, told with "must be at most ..." (with ``what``)
    depth: bool = False

    def read(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if self.integer:
            return int(value) if _INT.fullmatch(value) else value
        return float(value) if _FLOAT.fullmatch(value) else value

    def _words(self) -> tuple[str, str]:
        """(what a value of the wrong kind or below the range is told, the whole range)."""
        low, high = self.minimum, self.maximum
        upper = "" if high is None else f" {'below' if self.below else 'of at most'} {high:g}"
        if self.what:
            return self.what, self.what + upper
        if low is None:
            lower = "an integer" if self.integer else "a number"
        elif self.integer:
            named: dict[float, str] = {1: "a positive integer", 0: "a non-negative integer"}
            least = math.ceil(low) if self.inclusive else math.floor(low) + 1  # the least integer allowed
            lower = named.get(least, f"an integer >= {least:g}")
        elif low == 0 and not self.inclusive:
            lower = "a positive number"
        elif high is not None:  # both bounds at once: "a number in [0, 1)"
            whole = f"a number in {'[' if self.inclusive else '('}{low:g}, {high:g}{')' if self.below else ']'}"
            return whole, whole
        else:
            lower = f"a number {'>=' if self.inclusive else '>'} {low:g}"
        return lower, lower + upper

    def allowed(self) -> str:
        """The whole range, in words (what ``petlprof list`` and a method-config error show)."""
        depth = ", and at most the backbone's layers" if self.depth else ""
        return self._words()[1] + depth + (", or unset" if self.optional else "")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value``, as "must be ..., got VALUE" (None: nothing)."""
        if value is None and self.optional:
            return None
        lower, whole = self._words()
        if not is_number(value) or self.integer and not isinstance(value, int):
            return f"must be {self.finite or lower}, got {shown(value)}"
        low = self.minimum
        if low is not None and (value < low if self.inclusive else value <= low):
            return f"must be {lower}, got {shown(value)}"
        high = self.maximum
        if high is not None and (value >= high if self.below else value > high):
            if self.what:
                limit = high if isinstance(high, int) or not high.is_integer() else int(high)
                why = f" ({self.why})" if self.why else ""
                return f"must be {'below' if self.below else 'at most'} {limit}{why}, got {shown(value)}"
            return f"must be {whole}, got {shown(value)}"
        return None

    def check(self, name: str, value: Any) -> None:
        problem = self.problem(value)
        if problem:
            raise UsageError(f"{flag(name)} {problem}")


@dataclass(frozen=True, kw_only=True)
class Text(Kind):
    """A string (``non_empty``: with something besides white space; ``optional``: or unset).

    The one text kind of both the run options (``check``: a one-line error naming the flag; the string is at
    most ``max_chars`` characters, with ``path`` a file or folder each part of which is at most
    :data:`MAX_NAME_CHARS` long, a longer one being an ``OSError: File name too long`` later, and ``known``
    refuses a name it does not know) and the method config fields (``problem``: the phrase after the field's
    name, and ``allowed``; :func:`petlprof.method_api.text`).  The limits on length and names are the run
    options': a method's text (a prompt) may be longer."""

    types: ClassVar[tuple[type, ...]] = (str,)
    non_empty: bool = False
    max_chars: int = MAX_NAME_CHARS
    path: bool = False
    known: Callable[[str], None] | None = None  # raises a UsageError for a name it does not know

    def allowed(self) -> str:
        """What it takes, in words (what ``petlprof list`` and a method-config error show)."""
        return ("a non-empty string" if self.non_empty else "a string") + (", or unset" if self.optional else "")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value``, as "must be ..., got VALUE" (None: nothing)."""
        if (isinstance(value, str) and (value.strip() or not self.non_empty)) or (value is None and self.optional):
            return None
        return f"must be {self.allowed()}, got {shown(value)}"

    def check(self, name: str, value: Any) -> None:
        super().check(name, value)
        if value is None:
            return
        if self.non_empty and not value.strip():
            raise UsageError(f"{flag(name)} must be {self.allowed()}, got {shown(value)}")
        parts = Path(value).parts if self.path and len(value) <= MAX_PATH_CHARS else [value]
        if len(value) > (MAX_PATH_CHARS if self.path else self.max_chars) or any(
            len(p) > MAX_NAME_CHARS for p in parts
        ):
            raise UsageError(
                f"{flag(name)} {shown(value)} is too long: at most {MAX_NAME_CHARS} characters a name"
                + (f" and {MAX_PATH_CHARS} a path" if self.path else "")
            )
        if self.known is not None:
            self.known(value)


@dataclass(frozen=True)
class Choice(Text):
    """One of ``choices`` (or, with ``prefix``, a string starting with it, e.g. ``cuda:``); ``kind`` names
    what is chosen in a run option's error ("unknown device ...").

    The one choice kind of both the run options (``check``) and the method config fields (``problem`` and
    ``allowed``; :func:`petlprof.method_api.choice`).  A method field's choices may be other than strings
    (``True``, ``False``, ``None``, numbers): a value is one of them only as the same kind of value, so ``1``
    is no ``True`` and ``0`` no ``False``; such a choice's ``check`` words its error as ``problem`` does."""

    choices: Sequence[Any] = ()
    kind: str = "value"
    prefix: str = ""

    def chosen(self, value: Any) -> bool:
        """Whether ``value`` is one of the choices (a bool only as a bool) or starts with the prefix."""
        if any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in self.choices):
            return True
        return bool(self.prefix) and isinstance(value, str) and value.startswith(self.prefix)

    def allowed(self) -> str:
        return f"one of {', '.join(str(c) for c in self.choices)}" + (", or unset" if self.optional else "")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value``, as "VALUE is not one of ..." (None: nothing)."""
        if (value is None and self.optional) or self.chosen(value):
            return None
        return f"{shown(value)} is not {self.allowed()}"

    def check(self, name: str, value: Any) -> None:
        if not all(isinstance(c, str) for c in self.choices):  # a method field's True/False/None or numbers
            problem = self.problem(value)
            if problem:
                raise UsageError(f"{flag(name)} {problem}")
            return
        super().check(name, value)
        if value is not None and not self.chosen(value):
            raise unknown_choice(self.kind, value, self.choices)


@dataclass(frozen=True)
class Names(Kind):
    """A list of items of ``item`` kind: a comma list on the command line, a list or comma text in a file."""

    types: ClassVar[tuple[type, ...]] = (list,)
    item: Kind = Text(path=True)

    def read(self, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, tuple):
            value = list(value)
        elif not isinstance(value, list):
            value = [value]
        return [self.item.read(v) for v in value]

    def check(self, name: str, value: Any) -> None:
        super().check(name, value)
        for item in value:
            if isinstance(self.item, Text) and not isinstance(item, str):
                raise UsageError(f"option '{name}' must name strings, got {shown(item)}")
            self.item.check(name, item)


@dataclass(frozen=True)
class Bytes(Kind):
    """A size with its unit, such as ``2GiB`` or ``500MB``, at least ``minimum`` bytes (``why`` says
    where that floor comes from) and at most :data:`MAX_BYTES`."""

    types: ClassVar[tuple[type, ...]] = (str, int, float)
    minimum: int = 1
    why: str = ""

    def check(self, name: str, value: Any) -> None:
        if value is None and self.optional:
            return
        parse_bytes(value, option=flag(name), minimum=self.minimum, why=self.why)


_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*")  # 2GiB, 1.5e3MB, 2 g
_EXAMPLE = "give a number with its unit, e.g. 2GiB or 500MB (units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB, k, m, g, t)"


def parse_bytes(value: str | int | None, option: str = "--max-memory", minimum: int = 1, why: str = "") -> int | None:
    """``"2GiB"``, ``"500MB"``, ``"1.5g"``, ``"1e3MB"`` -> bytes; None stays None.  A number without
    its unit is refused (is ``40`` bytes or gigabytes?), and so is a size under ``minimum`` bytes."""
    if value is None:
        return None
    text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
    match = _SIZE.fullmatch(text) if len(text) <= 100 else re.fullmatch(r"\s*([0-9]+)([a-zA-Z]*)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"{option} {shown(text or value)} is not a positive size; {_EXAMPLE}")
    number, unit = match.groups()
    if not unit:
        raise UsageError(f"{option} {shown(text or value)} has no unit; {_EXAMPLE}")
    if unit.lower() not in _UNITS:
        raise UsageError(f"{option} {shown(text)} has an unknown unit {shown(unit)}; {_EXAMPLE}")
    size = float(number) * _UNITS[unit.lower()] if len(number) <= 100 else math.inf  # a 400-digit number
    if size > MAX_BYTES:
        raise UsageError(f"{option} {shown(text)} is more than {MAX_BYTES} bytes (1 EiB); {_EXAMPLE}")
    if int(size) < minimum:
        raise UsageError(f"{option} {shown(text)} is less than {_bytes_text(minimum)}{f' ({why})' if why else ''}")
    return int(size)


@dataclass(frozen=True)
class Watts(Kind):
    """A power with its unit, such as ``300W`` or ``0.3kW``: more than 0 and at most :data:`MAX_WATTS`."""

    types: ClassVar[tuple[type, ...]] = (str, int, float)

    def check(self, name: str, value: Any) -> None:
        if value is None and self.optional:
            return
        parse_watts(value, option=flag(name))


@dataclass(frozen=True)
class Quantity:
    """A physical quantity read with its unit (``300W``, ``5kWh``, ``10h``): ``units`` maps each unit, lower case, to
    its factor to the base unit; more than 0 and at most ``maximum`` (in the base unit, said as ``maximum_text``)."""

    what: str
    units: dict[str, float]
    unit_names: str
    maximum: float
    maximum_text: str
    example: str

    def parse(self, value: Any, option: str) -> float | None:
        """``value`` in the base unit; None stays None; a number without its unit, or outside (0, maximum], is one
        line naming ``option``."""
        if value is None:
            return None
        text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
        match = _SIZE.fullmatch(text) if len(text) <= 100 else None
        if not match or not math.isfinite(float(match.group(1))) or float(match.group(1)) <= 0:
            raise UsageError(f"{option} {shown(text or value)} is not a positive {self.what}; {self.example}")
        number, unit = match.groups()
        if not unit:
            raise UsageError(f"{option} {shown(text)} has no unit; {self.example}")
        if unit.lower() not in self.units:
            raise UsageError(
                f"{option} {shown(text)} has an unknown unit {shown(unit)} ({self.unit_names}); {self.example}"
            )
        amount = float(number) * self.units[unit.lower()]
        if amount > self.maximum:
            raise UsageError(f"{option} {shown(text)} is more than {self.maximum_text}; {self.example}")
        return amount


POWER_UNITS = Quantity(
    "power", {"w": 1.0, "kw": 1000.0, "mw": 1e-3}, "W, kW or mW", MAX_WATTS, f"{MAX_WATTS:,.0f} W",
    "give a power with its unit, e.g. 300W or 0.45kW",
)  # fmt: skip
ENERGY_UNITS = Quantity(
    "energy", {"j": 1.0, "kj": 1e3, "wh": 3600.0, "kwh": J_PER_KWH}, "J, kJ, Wh or kWh", 3.6e12, "1 GWh",
    "give an energy with its unit, e.g. 5kWh or 900kJ",
)  # fmt: skip
DURATION_UNITS = Quantity(
    "duration", {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}, "s, min, h or d", 3.2e8, "10 years",
    "give a duration with its unit, e.g. 12h or 90min",
)  # fmt: skip


def parse_watts(value: str | int | float | None, option: str = "--power-limit") -> float | None:
    """``"300W"``, ``"0.45kW"``, ``"300 w"`` -> watts; None stays None.  A number without its unit is refused (the
    NVML API counts milliwatts, nvidia-smi watts), and so is anything not above 0 W or past :data:`MAX_WATTS`."""
    return POWER_UNITS.parse(value, option)


def _bytes_text(count: int) -> str:
    """``1`` -> ``one byte``, ``2**29`` -> ``512 MiB``."""
    if count >= 2**20 and count % 2**20 == 0:
        return f"{count // 2**20} MiB"
    return "one byte" if count == 1 else f"{count} bytes"
