"""The install declaration in pyproject.toml covers every package and data file of the source tree.

``[tool.setuptools] packages`` is an explicit list, so a new sub-package (``petlprof.meters.devices``) or data
folder is left out of a non-editable ``pip install .`` unless it is named there; the editable install the
tests run from does not notice.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _source_packages() -> dict[str, Path]:
    """Every package of the source tree, by the name it installs as, mapped through package-dir."""
    found = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            parts = init.parent.relative_to(base).parts
            found[".".join((name, *parts))] = init.parent
    return found


@pytest.mark.parametrize("package", sorted(_source_packages()))
def test_every_package_is_declared(package):
    assert package in SETUPTOOLS["packages"], f"{package} is not in pyproject.toml's [tool.setuptools] packages"


def _data_files() -> list[tuple[str, Path]]:
    """Non-Python files of the source tree, each with the package it belongs to: the nearest folder above it
    that is a package (``petlprof/models/shapes/t5-small.json`` is ``petlprof.models``')."""
    packages = {folder: name for name, folder in _source_packages().items()}
    files = []
    for folder in packages:
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts:
                owner = next(p for p in path.parents if p in packages)
                if owner == folder:
                    files.append((packages[owner], path))
    return files


@pytest.mark.parametrize(("package", "path"), _data_files(), ids=lambda v: str(v))
def test_every_data_file_is_declared(package, path):
    folder = _source_packages()[package]
    relative = path.relative_to(folder)
    patterns = SETUPTOOLS.get("package-data", {}).get(package, [])
    assert any(relative.match(p) for p in patterns), f"{relative} of {package} is not in package-data"


def test_the_tests_handed_out_one_by_one_share_no_wider_fixture():
    """tests/conftest.py hands out the tests of EACH_TEST_APART one by one under pytest -n: a module- or
    class-scoped fixture there would be set up again on every worker that gets one of its tests."""
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("tests_conftest", root / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)  # by its path: under tests/, "conftest" may be tests/benchmarks' own
    apart = conftest.EACH_TEST_APART
    assert apart and all((root / path).is_file() for path in apart)
    for path in sorted(apart):
        text = (root / path).read_text()
        assert not any(f'scope="{scope}"' in text for scope in ("module", "class", "package")), path
