"""One number kind (petlprof.values.Number) for run options and method config fields: the same edges refused."""

from __future__ import annotations

import dataclasses
import math

import pytest

from petlprof import method_api, values
from petlprof.errors import UsageError
from petlprof.method_api import MethodConfig, integer, number
from petlprof.values import Integer, Number

EDGES = [math.nan, math.inf, -math.inf, 1e308, -1e308, 10**30, -(10**30), "8", "0.5", True, False, [], None]


def test_method_api_uses_the_values_number():
    assert method_api.Number is values.Number


def _config(**fields):
    """A method config class with the given field declarations."""
    return dataclasses.make_dataclass("Config", [(k, float, v) for k, v in fields.items()], bases=(MethodConfig,))


@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_method_fields_refuse_every_edge(value):
    cls = _config(
        rank=integer(8, "a rank", maximum=4096),
        scale=number(1.0, "a scale", minimum=0, above=True, maximum=100),
        dropout=number(0.0, "a dropout", minimum=0, maximum=1, below=True),
    )
    for name in ("rank", "scale", "dropout"):
        with pytest.raises(UsageError, match=rf"^{name} must be .*, got "):
            cls(**{name: value})


@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_run_option_numbers_refuse_every_edge(value):
    for kind in (Number(0.0, maximum=10, what="a positive number"), Integer(1, 100, "steps")):
        if isinstance(value, str):
            continue  # read from text on the command line; checked below as what it reads to
        with pytest.raises(UsageError, match=r"^--opt must be .*, got "):
            kind.check("opt", value)


def test_method_field_messages_name_the_range():
    cls = _config(
        rank=integer(8, "a rank", maximum=4096),
        scale=number(1.0, "a scale", minimum=0, above=True, maximum=100),
        dropout=number(0.0, "a dropout", minimum=0, maximum=1, below=True),
        low=integer(0, "a count", minimum=-1, maximum=10),
    )
    cases = [
        ("rank", 0, "rank must be a positive integer, got 0"),
        ("rank", 10**30, f"rank must be a positive integer of at most 4096, got {10**30}"),
        ("rank", 2.0, "rank must be a positive integer, got 2.0"),
        ("scale", 0, "scale must be a positive number, got 0"),
        ("scale", 1e308, "scale must be a positive number of at most 100, got 1e+308"),
        ("dropout", 1, "dropout must be a number in [0, 1), got 1"),
        ("dropout", math.nan, "dropout must be a number in [0, 1), got nan"),
        ("low", -2, "low must be an integer >= -1, got -2"),
    ]
    for name, value, message in cases:
        with pytest.raises(UsageError) as info:
            cls(**{name: value})
        assert str(info.value) == message


def test_run_option_messages_keep_their_wording():
    kind = Number(0.0, maximum=10, what="a positive number", optional=True)
    assert kind.read("1e-3") == 1e-3 and kind.read("x") == "x"
    with pytest.raises(UsageError, match=r"^--lr must be at most 10, got 1e\+308$"):
        kind.check("lr", kind.read("1e308"))
    with pytest.raises(UsageError, match=r"^--lr must be a positive number, got 0.0$"):
        kind.check("lr", kind.read("0"))
    seeds = Integer(0, 2**63 - 1, "torch's range")
    assert seeds.read("8") == 8
    with pytest.raises(UsageError) as info:
        seeds.check("seeds", 2**63)
    assert str(info.value) == f"--seeds must be at most {2**63 - 1} (torch's range), got {2**63}"
    with pytest.raises(UsageError, match=r"^--seeds must be an integer >= 0, got -1$"):
        seeds.check("seeds", -1)
