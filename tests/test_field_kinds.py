"""One choice kind and one text kind (petlprof.values.Choice and Text) for run options and method config fields:
the same values refused on both sides, each side with its own wording ("must be ..., got ..." or "... is not
one of ...")."""

from __future__ import annotations

import dataclasses
import math

import pytest

from petlprof import method_api, values
from petlprof.errors import UsageError
from petlprof.method_api import MethodConfig, choice, text
from petlprof.values import Choice, Text

BOOLS = Choice((True, False))
BOOLS_OR_UNSET = Choice((True, False, None))
NUMBERS = Choice((1, 2, 4))
LETTERS = Choice(("a", "b"), kind="letter")
LETTERS_OR_UNSET = Choice(("a", "b"), kind="letter", optional=True)
NON_EMPTY = Text(non_empty=True)
TEXT = Text()
TEXT_OR_UNSET = Text(optional=True)

# (kind, value, the method side's phrase after the field's name, the run side's error after the flag or name)
REFUSED = [
    (BOOLS, 1, "1 is not one of True, False", "--opt 1 is not one of True, False"),
    (BOOLS, 0, "0 is not one of True, False", "--opt 0 is not one of True, False"),
    (BOOLS, None, "None is not one of True, False", "--opt None is not one of True, False"),
    (BOOLS, "true", "'true' is not one of True, False", "--opt 'true' is not one of True, False"),
    (BOOLS, "", "'' is not one of True, False", "--opt '' is not one of True, False"),
    (BOOLS, [], "[] is not one of True, False", "--opt [] is not one of True, False"),
    (BOOLS_OR_UNSET, 1, "1 is not one of True, False, None", "--opt 1 is not one of True, False, None"),
    (BOOLS_OR_UNSET, "None", "'None' is not one of True, False, None", "--opt 'None' is not one of True, False, None"),
    (NUMBERS, True, "True is not one of 1, 2, 4", "--opt True is not one of 1, 2, 4"),
    (NUMBERS, "1", "'1' is not one of 1, 2, 4", "--opt '1' is not one of 1, 2, 4"),
    (NUMBERS, math.nan, "nan is not one of 1, 2, 4", "--opt nan is not one of 1, 2, 4"),
    (NUMBERS, math.inf, "inf is not one of 1, 2, 4", "--opt inf is not one of 1, 2, 4"),
    (NUMBERS, 1.5, "1.5 is not one of 1, 2, 4", "--opt 1.5 is not one of 1, 2, 4"),
    (NUMBERS, [1], "[1] is not one of 1, 2, 4", "--opt [1] is not one of 1, 2, 4"),
    (LETTERS, True, "True is not one of a, b", "option 'opt' must be str, got True"),
    (LETTERS, None, "None is not one of a, b", "option 'opt' must be str, got None"),
    (LETTERS, "", "'' is not one of a, b", "unknown letter ''. Valid choices: a, b."),
    (LETTERS, "  ", "'  ' is not one of a, b", "unknown letter '  '. Valid choices: a, b."),
    (LETTERS, "1", "'1' is not one of a, b", "unknown letter '1'. Valid choices: a, b."),
    (LETTERS, "aa", "'aa' is not one of a, b", "unknown letter 'aa'; did you mean 'a'? Valid choices: a, b."),
    (LETTERS, ["a"], "['a'] is not one of a, b", "option 'opt' must be str, got ['a']"),
    (LETTERS_OR_UNSET, "c", "'c' is not one of a, b, or unset", "unknown letter 'c'. Valid choices: a, b."),
    (NON_EMPTY, "", "must be a non-empty string, got ''", "--opt must be a non-empty string, got ''"),
    (NON_EMPTY, "  ", "must be a non-empty string, got '  '", "--opt must be a non-empty string, got '  '"),
    (NON_EMPTY, None, "must be a non-empty string, got None", "option 'opt' must be str, got None"),
    (NON_EMPTY, True, "must be a non-empty string, got True", "option 'opt' must be str, got True"),
    (TEXT, None, "must be a string, got None", "option 'opt' must be str, got None"),
    (TEXT, 1, "must be a string, got 1", "option 'opt' must be str, got 1"),
    (TEXT, math.nan, "must be a string, got nan", "option 'opt' must be str, got nan"),
    (TEXT, ["a"], "must be a string, got ['a']", "option 'opt' must be str, got ['a']"),
    (TEXT_OR_UNSET, False, "must be a string, or unset, got False", "option 'opt' must be str or unset, got False"),
    (TEXT_OR_UNSET, [], "must be a string, or unset, got []", "option 'opt' must be str or unset, got []"),
]

ACCEPTED = [
    (BOOLS, True),
    (BOOLS, False),
    (BOOLS_OR_UNSET, None),
    (NUMBERS, 1),
    (NUMBERS, 4),
    (LETTERS, "a"),
    (LETTERS_OR_UNSET, None),
    (NON_EMPTY, "x"),
    (NON_EMPTY, "1"),
    (TEXT, ""),
    (TEXT, "  "),
    (TEXT_OR_UNSET, None),
    (TEXT_OR_UNSET, "x"),
]


def case_id(case) -> str:
    return f"{case[0].allowed()}-{case[1]!r}"


def _config(check):
    """A method config class with one field ``opt`` checked by ``check``."""
    meta = {"help": "a field", "check": check}
    return dataclasses.make_dataclass(
        "Config", [("opt", object, dataclasses.field(default=None, metadata=meta))], bases=(MethodConfig,)
    )


def test_method_api_uses_the_values_kinds():
    assert method_api.Choice is values.Choice and method_api.Text is values.Text
    assert method_api.Number is values.Number


@pytest.mark.parametrize("case", REFUSED, ids=case_id)
def test_both_sides_refuse_the_same_values(case):
    kind, value, method_phrase, run_error = case
    assert kind.problem(value) == method_phrase
    with pytest.raises(UsageError) as info:
        _config(kind)(opt=value)
    assert str(info.value) == f"opt {method_phrase}"
    with pytest.raises(UsageError) as info:
        kind.check("opt", value)
    assert str(info.value) == run_error


@pytest.mark.parametrize("case", ACCEPTED, ids=case_id)
def test_both_sides_accept_the_same_values(case):
    kind, value = case
    assert kind.problem(value) is None
    assert _config(kind)(opt=value).opt == value
    kind.check("opt", value)


def test_a_choice_takes_a_prefix_on_both_sides():
    devices = Choice(("cpu", "cuda"), kind="device", prefix="cuda:")
    assert devices.problem("cuda:1") is None
    devices.check("device", "cuda:1")
    assert devices.problem("tpu") == "'tpu' is not one of cpu, cuda"
    with pytest.raises(UsageError, match=r"^unknown device 'tpu'"):
        devices.check("device", "tpu")


def test_the_declaring_helpers_build_the_values_kinds():
    cls = dataclasses.make_dataclass(
        "Config",
        [
            ("flag", bool, choice(True, "a flag", (True, False))),
            ("words", str, text("hello", "a prompt", non_empty=True)),
        ],
        bases=(MethodConfig,),
    )
    checks = {f.name: method_api.field_check(f) for f in dataclasses.fields(cls)}
    assert checks == {"flag": Choice((True, False)), "words": Text(non_empty=True)}
    assert [c.allowed() for c in checks.values()] == ["one of True, False", "a non-empty string"]
    with pytest.raises(UsageError, match=r"^flag 1 is not one of True, False$"):
        cls(flag=1)
    with pytest.raises(UsageError, match=r"^words must be a non-empty string, got ' '$"):
        cls(words=" ")
    assert cls(words="x" * 1000).words == "x" * 1000  # a prompt may be longer than a run option's name


def test_run_option_text_keeps_its_limits():
    with pytest.raises(
        UsageError, match=r"^--opt 'x+\.\.\.x+' \(\d+ characters\) is too long: at most 255 characters a name$"
    ):
        TEXT.check("opt", "x" * 256)
    with pytest.raises(UsageError, match="and 4096 a path"):
        Text(path=True).check("opt", "a/" + "x" * 256)
    Text(path=True).check("opt", "a/" * 100)
