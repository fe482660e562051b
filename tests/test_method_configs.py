"""Every method's config refuses what no run can use — NaN, inf, out-of-range, mistyped and unlisted
values — the same way (the shared checks of petlprof.method_api), one short line naming the method, the
field and the value; on the command line and in sweep files that is exit 2 before anything is written.

The tables are built from the registered methods' own field declarations, so a field added later is
checked without a new line here.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from petlprof.cli import main
from petlprof.errors import UsageError, shown
from petlprof.method_api import Choice, MethodConfig, MethodSpec, Number, check_backbone, field_check, integer
from petlprof.registry import builtin_method_names, get_method

METHODS = builtin_method_names()  # plug-ins installed here bring their own tests


def fields_checked_by(kind: type) -> list[tuple[str, str, object]]:
    return [
        (method, f.name, field_check(f))
        for method in METHODS
        for f in dataclasses.fields(get_method(method).config_cls)
        if isinstance(field_check(f), kind)
    ]


NUMBERS = fields_checked_by(Number)
CHOICES = fields_checked_by(Choice)


def field_id(case) -> str:
    return f"{case[0]}.{case[1]}"


def refused_numbers(check: Number) -> list:
    """Non-finite, mistyped and past either bound (by the smallest step the type allows)."""
    values = [math.nan, math.inf, -math.inf, True, "1", None if not check.optional else "none", 10**400, -(10**400)]
    low, high = check.minimum, check.maximum
    if check.integer:
        values += [2.5, 1e308, float(low), low - 1, high + 1, 10**30]
    else:
        values += [1e308, -1e308, math.nextafter(low, -math.inf) if check.inclusive else low]
        values += [high if check.below else math.nextafter(high, math.inf)]
    return values


def accepted_numbers(check: Number) -> list:
    low, high = check.minimum, check.maximum
    if check.integer:
        return [low, high] + ([None] if check.optional else [])
    return [
        low if check.inclusive else math.nextafter(low, math.inf),
        math.nextafter(high, -math.inf) if check.below else high,
    ]


def test_every_numeric_field_is_checked_and_bounded_on_both_sides():
    """A numeric field without a declared range would let 1e308 or 10**30 through to a run."""
    for method in METHODS:
        for f in dataclasses.fields(get_method(method).config_cls):
            if "int" in str(f.type) or "float" in str(f.type):
                check = field_check(f)
                assert isinstance(check, Number), f"{method}.{f.name}"
                assert check.minimum is not None and check.maximum is not None, f"{method}.{f.name}"
    assert len(NUMBERS) >= 10  # lora r/alpha/dropout, lst x4, read, adapter, prefix x2, prompt


@pytest.mark.parametrize("method, name, check", NUMBERS, ids=[field_id(c) for c in NUMBERS])
def test_numeric_fields_refuse_nan_inf_and_out_of_range_values(method, name, check):
    spec = get_method(method)
    for value in refused_numbers(check):
        with pytest.raises(UsageError) as info:
            spec.make_config({name: value})
        message = str(info.value)
        assert message.startswith(f"{method} {name} must be "), message
        assert "\n" not in message and len(message) < 160, message  # 10**400 is not echoed in full
    for value in accepted_numbers(check):
        assert getattr(spec.make_config({name: value}), name) == value


@pytest.mark.parametrize("method, name, check", CHOICES, ids=[field_id(c) for c in CHOICES])
def test_choice_fields_take_only_their_choices(method, name, check):
    spec = get_method(method)
    for value in ("no-such-choice", 1, None, math.nan):
        with pytest.raises(UsageError, match=f"^{method} {name} .* is not one of {', '.join(check.choices)}$"):
            spec.make_config({name: value})
    for value in check.choices:
        assert getattr(spec.make_config({name: value}), name) == value


def test_every_builtin_config_uses_the_shared_base():
    for method in METHODS:
        assert issubclass(get_method(method).config_cls, MethodConfig), method


# --- the command line and sweep files (issue 19's cases): exit 2, one line, no folder ------------------

CLI_CASES = [
    (["--method-config", "lora.alpha=.nan"], "lora alpha must be a positive number, got nan"),
    (["--method-config", "lora.alpha=.inf"], "lora alpha must be a positive number, got inf"),
    (["--method-config", "lora.alpha=-.inf"], "lora alpha must be a positive number, got -inf"),
    (["--method-config", "lora.alpha=1.0e+308"], "lora alpha must be a positive number of at most 10000, got 1e+308"),
    (["--method-config", "lora.dropout=.nan"], "lora dropout must be a number in [0, 1), got nan"),
    (["--method-grid", "lora.alpha=.nan,.inf"], "lora alpha must be a positive number, got nan"),
    (["--method-config", "lst.gate_temperature=.inf"], "lst gate_temperature must be a positive number, got inf"),
    (["--method-config", "lst.gate_temperature=.nan"], "lst gate_temperature must be a positive number, got nan"),
    (
        ["--method-config", f"read.hidden_size={10**30}"],
        f"read hidden_size must be a positive integer of at most 16384, got {10**30}",
    ),
    (
        ["--method-config", f"prefix_tuning.num_virtual_tokens={10**12}"],
        f"prefix_tuning num_virtual_tokens must be a positive integer of at most 4096, got {10**12}",
    ),
    (["--method-config", f"lora.r={10**400}"], "lora r must be a positive integer of at most 16384, got 1000"),
]


@pytest.mark.parametrize("extra, message", CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_bad_method_values_on_the_command_line_stop_before_any_run(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    methods = extra[1].split(".")[0]
    assert main(["run", "--methods", methods, *extra, "--backbone", "tiny-bert", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"petlprof: error: {message}") and err.count("\n") == 1 and len(err) < 200, err
    assert not out.exists()


FILE_CASES = [
    ("sweep.toml", "methods = ['lora']\n[method_config.lora]\nalpha = nan\n", "lora alpha must be a positive number"),
    ("sweep.toml", "methods = ['lora']\n[method_config.lora]\nalpha = 1e308\n", "lora alpha must be a positive number"),
    ("sweep.toml", "methods = ['lst']\n[method_grid.lst]\ngate_temperature = [0.1, inf]\n", "lst gate_temperature"),
    (
        "sweep.yaml",
        "methods: [lora]\nmethod_config:\n  lora:\n    alpha: .nan\n",
        "lora alpha must be a positive number",
    ),
    (
        "sweep.yaml",
        "methods: [read]\nmethod_config:\n  read:\n    hidden_size: 1000000000000000000000000000000\n",
        "of at most",
    ),
]


@pytest.mark.parametrize("name, text, message", FILE_CASES, ids=[c[1].split("\n")[-2].strip() for c in FILE_CASES])
def test_bad_method_values_in_sweep_files_stop_before_any_run(tmp_path, capsys, name, text, message):
    config, out = tmp_path / name, tmp_path / "out"
    config.write_text(text)
    assert main(["run", "--config", str(config), "--backbone", "tiny-bert", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize("value", ["x" * 5000, 10**400, ["y" * 80]], ids=["5000-char text", "400-digit int", "list"])
def test_a_long_field_value_is_echoed_as_a_run_option_echoes_it(value):
    """One way to shorten an echoed value (petlprof.errors.shown), for run options and method fields alike."""
    with pytest.raises(UsageError) as refused:
        get_method("lora").make_config({"alpha": value})
    assert str(refused.value).endswith(f", got {shown(value)}"), str(refused.value)


@dataclasses.dataclass
class LastLayersConfig(MethodConfig):
    layers: int = integer(2, "train the last N layers", depth=True)
    heads: int = integer(4, "not a depth: never compared with the layers")


DEPTH_CASES = [
    # (id, overrides, backbone depth, error or None)
    ("within the depth", {"layers": 2}, 2, None),
    ("past the depth", {"layers": 100}, 2, "lastlayers layers 100 is more than the 2 layer(s) of backbone 'minilm'"),
    ("an unmarked field is not a depth", {"heads": 100}, 2, None),
]


@pytest.mark.parametrize("overrides, depth, error", [c[1:] for c in DEPTH_CASES], ids=[c[0] for c in DEPTH_CASES])
def test_a_depth_field_is_bounded_by_the_backbone_depth(overrides, depth, error):
    spec = MethodSpec("lastlayers", "the last layers", LastLayersConfig, lambda c, cfg: c, 1e-3, "untuned")
    config = spec.make_config(overrides)
    if error is None:
        check_backbone(spec, config, width=384, depth=depth, backbone="minilm")
        return
    with pytest.raises(UsageError) as raised:
        check_backbone(spec, config, width=384, depth=depth, backbone="minilm")
    assert str(raised.value) == f"{error}; use at most {depth}"
