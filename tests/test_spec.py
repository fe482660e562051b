"""RunSpec's written fields are the ones the run options declare (issue 24: type checkers see the class), and
a run's identity is what it was."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import petlprof.sweep.spec
from petlprof.sweep.options import ToSpec
from petlprof.sweep.spec import (
    BEGIN,
    END,
    RunSpec,
    declared_fields,
    spec_fields_source,
    spec_type,
    write_fields,
    written_fields_source,
)

SPEC_PY = Path(petlprof.sweep.spec.__file__)
REGENERATE = (
    "RunSpec's fields differ from the options in petlprof/sweep/options.py: run `python -m petlprof.sweep.spec`"
)


def _shape(cls: type) -> list[tuple[str, str, object, object]]:
    return [(f.name, str(f.type), f.default, f.default_factory) for f in dataclasses.fields(cls)]


def test_the_written_fields_are_the_generated_ones():
    assert written_fields_source(SPEC_PY.read_text()) == spec_fields_source(), REGENERATE


def test_the_class_has_the_declared_fields_in_order_with_their_types_and_defaults():
    declared = dataclasses.make_dataclass("RunSpec", declared_fields())
    assert _shape(RunSpec) == _shape(declared), REGENERATE


def test_a_drifted_block_is_rewritten(tmp_path):
    text = SPEC_PY.read_text()
    stale = text.replace("    batch_size: int = 32\n", "    batch_size: int = 8\n    removed_option: str = 'x'\n")
    assert stale != text
    path = tmp_path / "spec.py"
    path.write_text(stale)
    assert written_fields_source(stale) != spec_fields_source()
    assert write_fields(path) is True
    assert path.read_text() == text
    assert write_fields(path) is False


def test_a_file_without_the_block_is_refused(tmp_path):
    path = tmp_path / "spec.py"
    path.write_text(SPEC_PY.read_text().replace(END, "    # the end"))
    assert written_fields_source(path.read_text()) == ""
    try:
        write_fields(path)
    except SystemExit as exc:
        assert BEGIN.strip() in str(exc)
    else:
        raise AssertionError("a file without the generated block was rewritten")


def test_a_field_whose_default_is_none_admits_none():
    # epochs is an int option: a field of it that defaults to None admits None
    assert spec_type("epochs", ToSpec(default=None)) == "int | None"
    assert spec_type("epochs", ToSpec()) == "int"
    assert spec_type("eval_every", ToSpec()) == "int | None"
    assert spec_type("num_layers", ToSpec(default=None)) == "int | None"
    assert spec_type("methods", ToSpec("method", str)) == "str"
    assert spec_type("method_config", ToSpec(type=dict[str, object])) == "dict[str, object]"


def test_identity_and_serialised_forms_are_unchanged():
    spec = RunSpec(method="read")
    assert spec.run_key == "3eaec3a38967b4f0"  # the key of every stored run of this spec
    assert RunSpec.__module__ == "petlprof.sweep.spec"  # pickles (workers, Ray) name the class by it
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec.to_dict() == dataclasses.asdict(spec)
    assert list(spec.to_dict())[:3] == ["method", "backbone", "num_layers"]
    assert "seed" in spec.identity() and "seed" not in spec.identity(include_seed=False)
    assert RunSpec(method="read", extra_meters=["codecarbon"]).run_key == spec.run_key  # never in the key
    assert RunSpec(method="read", batch_size=8).run_key != spec.run_key
