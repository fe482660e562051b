"""The typed read side stays typed (issue 36): a function of ``petlprof/`` that returns a plain ``dict[str, Any]`` (or a
bare ``dict``) is a JSON boundary — a config file read, a spec's or a profile's JSON, a record part keyed by the
figures' declared names — and there are at most :data:`MAX_UNTYPED` of them, none in ``report/``, which reads
records through :class:`petlprof.results.result.RunResult` and writes its page's JSON as TypedDicts.

Between the issue's landing (8) and the next four issues the count drifted to 29 unseen (26 by a grep, which misses
multi-line signatures); this test is what sees it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "petlprof"
MAX_UNTYPED = 15  # the bound (from 60 before it)
NO_UNTYPED = ("report",)  # subpackages where none may remain


def untyped(annotation: ast.expr | None) -> bool:
    """Whether a return annotation is a plain dict of anything: ``dict``, ``Dict``, ``dict[str, Any]``, or one of
    them ``| None``."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return untyped(annotation.left) or untyped(annotation.right)
    if isinstance(annotation, ast.Name):
        return annotation.id in ("dict", "Dict")
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        if annotation.value.id not in ("dict", "Dict") or not isinstance(annotation.slice, ast.Tuple):
            return False
        value = annotation.slice.elts[-1]
        return (isinstance(value, ast.Name) and value.id == "Any") or (
            isinstance(value, ast.Attribute) and value.attr == "Any"
        )
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
        return untyped(ast.parse(annotation.value, mode="eval").body)
    return False


def untyped_returns(root: Path) -> list[str]:
    """``path:line name`` of every function under ``root`` whose return annotation :func:`untyped` calls plain."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and untyped(node.returns):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}")
    return found


@pytest.mark.parametrize(
    "annotation, plain",
    [
        ("dict", True),
        ("Dict", True),
        ("dict[str, Any]", True),
        ("dict[str, Any] | None", True),
        ("'dict[str, Any]'", True),
        ("dict[str, typing.Any]", True),
        ("dict[str, float | None]", False),
        ("dict[str, dict]", False),  # its values are plain; the mapping itself says what it maps
        ("Mapping[str, Any]", False),
        ("PageData", False),
        ("list[dict[str, Any]]", False),
    ],
)
def test_what_counts_as_a_plain_dict(annotation, plain):
    assert untyped(ast.parse(annotation, mode="eval").body) is plain


def test_at_most_fifteen_functions_return_a_plain_dict_and_none_in_the_report():
    found = untyped_returns(PACKAGE)
    listed = "\n".join(found)
    assert len(found) <= MAX_UNTYPED, f"{len(found)} functions return a plain dict (at most {MAX_UNTYPED}):\n{listed}"
    for package in NO_UNTYPED:
        inside = [f for f in found if f.startswith(f"petlprof/{package}/")]
        assert not inside, f"{package}/ returns plain dicts: {inside}"


def test_the_count_sees_a_new_plain_dict(tmp_path):
    """The check itself: a function added with ``-> dict[str, Any]`` is counted, in report/ too."""
    (tmp_path / "petlprof" / "report").mkdir(parents=True)
    (tmp_path / "petlprof" / "report" / "page.py").write_text(
        "from typing import Any\n\ndef data() -> dict[str, Any]:\n    return {}\n\ndef fine() -> dict[str, int]:\n"
        "    return {}\n"
    )
    assert untyped_returns(tmp_path / "petlprof") == ["petlprof/report/page.py:3 data"]
