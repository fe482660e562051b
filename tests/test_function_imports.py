"""Function-level imports only with their reason (issue 24).

An ``import`` inside a function hides a dependency from the reader and from the import graph's first look, so the
package keeps one only where it must: to keep ``petlprof --help`` (``import petlprof.cli``) from loading torch and
the other heavy libraries, to break an import cycle, or to import an optional library only when it is used.  Each
one carries that reason as a comment, on the import statement's first line or on the line just above it; a comment
line directly above the first import of a block of consecutive imports covers the whole block.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "petlprof", REPO / "methods")

# Modules whose function-level imports are not yet reviewed, left for later: the test skips them.  Remove a module
# from here once each of its function-level imports is moved to the top or carries its reason.
UNREVIEWED: set[str] = set()


def _comment_lines(source: str) -> dict[int, bool]:
    """Line -> True for a line holding only a comment, False for a line with code and a trailing comment."""
    lines: dict[int, bool] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.setdefault(token.start[0], True)
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    return {line: line not in code_lines for line in lines}


def _function_import_blocks(tree: ast.AST) -> list[list[ast.stmt]]:
    """The imports inside functions, in blocks of consecutive import statements of one body."""
    blocks: list[list[ast.stmt]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            block: list[ast.stmt] = []
            for statement in body:
                if isinstance(statement, (ast.Import, ast.ImportFrom)):
                    block.append(statement)
                    continue
                if block and inside:
                    blocks.append(block)
                block = []
            if block and inside:
                blocks.append(block)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return blocks


def imports_without_reason(source: str) -> list[int]:
    """The lines of the function-level imports in ``source`` that carry no comment giving their reason."""
    comments = _comment_lines(source)
    missing: list[int] = []
    for block in _function_import_blocks(ast.parse(source)):
        first = block[0].lineno
        if comments.get(first - 1) is True:  # a comment line above the block covers it
            continue
        for statement in block:
            line = statement.lineno
            if line not in comments and comments.get(line - 1) is not True:
                missing.append(line)
    return missing


def _modules() -> list[Path]:
    return [path for root in ROOTS for path in sorted(root.rglob("*.py")) if ".venv" not in path.parts]


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


CASES = [
    ("bare", "def f():\n    import torch\n", [2]),
    ("trailing comment", "def f():\n    import torch  # torch: slow to import\n", []),
    ("comment above", "def f():\n    # torch: slow to import\n    import torch\n", []),
    ("block under one comment", "def f():\n    # heavy\n    import torch\n    from a import b\n    x = 1\n", []),
    ("comment not directly above", "def f():\n    # heavy\n\n    import torch\n", [4]),
    ("second block needs its own", "def f():\n    # heavy\n    import torch\n    x = 1\n    import numpy\n", [5]),
    ("nested body", "def f():\n    if x:\n        from a import b\n", [3]),
    ("method", "class C:\n    def m(self):\n        import torch\n", [3]),
    ("module level is free", "import torch\nif x:\n    import numpy\n", []),
    ("code line above is no reason", "def f():\n    x = 1  # note\n    import torch\n", [3]),
    ("multi-line import, comment on first line", "def f():\n    from a import (  # cycle\n        b,\n    )\n", []),
]


@pytest.mark.parametrize(("source", "expected"), [(s, e) for _, s, e in CASES], ids=[n for n, _, _ in CASES])
def test_checker_flags_imports_without_reason(source: str, expected: list[int]) -> None:
    assert imports_without_reason(source) == expected


def test_unreviewed_modules_exist() -> None:
    names = {_relative(path) for path in _modules()}
    assert UNREVIEWED <= names, f"not a module any more, remove from UNREVIEWED: {sorted(UNREVIEWED - names)}"


def test_every_function_level_import_has_its_reason() -> None:
    missing = [
        f"{_relative(path)}:{line}"
        for path in _modules()
        if _relative(path) not in UNREVIEWED
        for line in imports_without_reason(path.read_text())
    ]
    assert not missing, (
        "imports inside functions without their reason (move each to the module's top, or say in a comment why it "
        "must stay: petlprof --help speed, an import cycle, an optional library):\n" + "\n".join(missing)
    )
