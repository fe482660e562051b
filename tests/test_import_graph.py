"""The package's layers, tested: each layer imports only the layers it stands on, and no import cycle.

The layers, lowest first (a layer may import its own modules and those of the layers :data:`MAY_IMPORT` names):

=========  =====================================================  ==========================================
layer      modules                                                may import
=========  =====================================================  ==========================================
base       errors, values, vocabulary, lookup (the Registry)       nothing
results    results/ (figures, records, store, environment)         base
tasks      tasks/                                                  base, results
models     models/                                                 base
meters     meters/                                                 base, results, models
framework  method_api, side_tuning, registry (the method contract) base, models
methods    petlprof.methods (the top-level methods/ folder)        base, models, framework
sweep      sweep/                                                  base, results, tasks, models, meters, framework
run        run/                                                    the above but methods
execution  execution/                                              base, results, meters, framework, sweep, run
estimate   estimate/                                               the above but methods and execution
report     report/                                                 base, results, tasks, sweep
bench      bench/                                                  base, results, models, meters, framework, run
front      petlprof (the package), cli, api                       every layer but methods
=========  =====================================================  ==========================================

So a sweep is decided without the run (``sweep`` never imports ``run``), what a run leaves behind never depends on
how it ran (``results`` never imports ``run`` or ``execution``), a backbone never knows the methods, and the report
reads records without the run's machinery.  Nothing outside ``petlprof.methods`` imports from it: the registry
names the built-in methods as text (``"petlprof.methods.lora:SPEC"``), the way an entry point names a plug-in.

The graph is read from the source with :mod:`ast`: every ``import``/``from ... import`` of one of the package's
modules, at module level and inside functions (the imports that hide a cycle), but not those under
``if TYPE_CHECKING:`` (they never run).  ``from petlprof.methods import lora`` counts as an import of
``petlprof.methods.lora``; a submodule's implicit import of its parent package does not count (every module
would then import ``petlprof``).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

from petlprof.method_api import MethodSpec, resolve_target
from petlprof.registry import BUILTIN_METHODS, builtin_method_names

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"petlprof": REPO / "petlprof", "petlprof.methods": REPO / "methods"}
METHODS = "petlprof.methods"

# layer -> the modules (or packages) that make it up
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("petlprof.errors", "petlprof.values", "petlprof.vocabulary", "petlprof.lookup"),
    "results": ("petlprof.results",),
    "tasks": ("petlprof.tasks",),
    "models": ("petlprof.models",),
    "meters": ("petlprof.meters",),
    "framework": ("petlprof.method_api", "petlprof.side_tuning", "petlprof.registry"),
    "methods": (METHODS,),
    "sweep": ("petlprof.sweep",),
    "run": ("petlprof.run",),
    "execution": ("petlprof.execution",),
    "estimate": ("petlprof.estimate",),
    "report": ("petlprof.report",),
    "bench": ("petlprof.bench",),
    "front": ("petlprof", "petlprof.cli", "petlprof.api"),
}
_BELOW_RUN = ("base", "results", "tasks", "models", "meters", "framework", "sweep")
# layer -> the other layers it may import
MAY_IMPORT: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "results": frozenset({"base"}),
    "tasks": frozenset({"base", "results"}),
    "models": frozenset({"base"}),
    "meters": frozenset({"base", "results", "models"}),
    "framework": frozenset({"base", "models"}),
    "methods": frozenset({"base", "models", "framework"}),
    "sweep": frozenset({"base", "results", "tasks", "models", "meters", "framework"}),
    "run": frozenset(_BELOW_RUN),
    "execution": frozenset({"base", "results", "meters", "framework", "sweep", "run"}),
    "estimate": frozenset({*_BELOW_RUN, "run"}),
    "report": frozenset({"base", "results", "tasks", "sweep"}),
    "bench": frozenset({"base", "results", "models", "meters", "framework", "run"}),
    "front": frozenset(set(LAYERS) - {"methods", "front"}),
}

# Imports that still close a cycle, each left to the owner of its module: the test fails on any other cycle,
# and on an entry here that no longer exists (remove it then).
KNOWN_BACK_EDGES: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # path:line of the import statement


def module_name(package: str, root: Path, path: Path) -> str:
    parts = [part for part in path.relative_to(root).with_suffix("").parts if part != "__init__"]
    return ".".join([package, *parts])


@functools.cache
def package_modules() -> dict[str, Path]:
    """Every module of the package (``methods/`` installed as ``petlprof.methods``) -> its file."""
    return {
        module_name(package, root, path): path
        for package, root in ROOTS.items()
        for path in sorted(root.rglob("*.py"))
        if ".venv" not in path.parts
    }


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(dotted name, line) of each name an import statement reaches, at any depth: ``from a import b`` gives
    ``a`` and ``a.b`` (``b`` may be a submodule); relative imports are resolved against ``module``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for statement in node.orelse:
                visit(statement)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.append((base, node.lineno))
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


@functools.cache
def module_edges(name: str, source: str) -> tuple[Edge, ...]:
    """The edges from module ``name`` whose text is ``source`` to the package's other modules."""
    modules = package_modules()
    path = modules[name]
    found = imported_names(source, name, path.name == "__init__.py")
    where = path.relative_to(REPO)
    return tuple(
        Edge(name, target, f"{where}:{line}") for target, line in found if target in modules and target != name
    )


def import_edges(sources: dict[str, str] | None = None) -> list[Edge]:
    """One edge per import of one package module by another (``sources``: text to use instead of a file's)."""
    sources = sources or {}
    return [
        e for name, path in package_modules().items() for e in module_edges(name, sources.get(name) or path.read_text())
    ]


def layer_of(module: str) -> str:
    """The layer a module belongs to: the one naming it or the longest package above it."""
    best = max(
        (
            (layer, name)
            for layer, names in LAYERS.items()
            for name in names
            if module == name or module.startswith(name + ".")
        ),
        key=lambda pair: len(pair[1]),
        default=None,
    )
    if best is None:
        raise KeyError(f"module {module} is in no layer: add it to LAYERS in tests/test_import_graph.py")
    return best[0]


def layer_breaks(edges: list[Edge]) -> list[Edge]:
    """The imports of a layer that its row of :data:`MAY_IMPORT` does not allow."""
    return [
        e
        for e in edges
        if (source := layer_of(e.source)) != (target := layer_of(e.target))
        and target not in MAY_IMPORT[source]
        and not _is_parent_package(e)
    ]


def _is_parent_package(e: Edge) -> bool:
    """``from petlprof.results import figures`` reaches ``petlprof.results`` too, whose ``__init__`` is only its
    docstring: the submodule import is the edge that counts.  A package whose ``__init__`` holds code
    (``petlprof.meters``, ``petlprof.report``) is a module like any other, and importing from it counts."""
    return package_modules()[e.target].name == "__init__.py" and _docstring_only(e.target)


@functools.cache
def _docstring_only(package: str) -> bool:
    body = ast.parse(package_modules()[package].read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def upward_imports(edges: list[Edge]) -> list[Edge]:
    """Imports of ``petlprof.methods.*`` by a module outside it (the contract and registry stand below)."""
    return [e for e in edges if not e.source.startswith(METHODS) and e.target.startswith(METHODS)]


def find_cycle(edges: list[Edge], ignored: set[tuple[str, str]]) -> list[Edge] | None:
    """The edges of one import cycle, or None (depth-first search over the graph less ``ignored``)."""
    graph: dict[str, list[Edge]] = {}
    for e in edges:
        if (e.source, e.target) not in ignored:
            graph.setdefault(e.source, []).append(e)
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def search(node: str, path: list[Edge]) -> list[Edge] | None:
        state[node] = "open"
        for e in graph.get(node, []):
            if state.get(e.target) == "open":
                start = next(i for i, p in enumerate(path + [e]) if p.source == e.target)
                return (path + [e])[start:]
            if e.target not in state and (cycle := search(e.target, path + [e])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := search(node, [])):
            return cycle
    return None


def shown_edges(edges: list[Edge]) -> str:
    return "; ".join(f"{e.source} -> {e.target} ({e.where})" for e in edges)


def test_no_module_outside_methods_imports_from_it():
    upward = upward_imports(import_edges())
    assert not upward, f"the contract and the registry stand below the methods: {shown_edges(upward)}"


def test_every_module_is_in_a_layer():
    for name in package_modules():
        layer_of(name)
    assert set(MAY_IMPORT) == set(LAYERS)


def test_each_layer_imports_only_the_layers_it_stands_on():
    broken = layer_breaks(import_edges())
    shown = "; ".join(
        f"{e.source} ({layer_of(e.source)}) -> {e.target} ({layer_of(e.target)}) at {e.where}" for e in broken
    )
    assert not broken, f"imports across the layer rules (tests/test_import_graph.py's MAY_IMPORT): {shown}"


def test_no_import_cycle_but_the_known_ones():
    edges = import_edges()
    cycle = find_cycle(edges, KNOWN_BACK_EDGES)
    assert cycle is None, f"import cycle: {shown_edges(cycle)}"
    present = {(e.source, e.target) for e in edges}
    assert not KNOWN_BACK_EDGES - present, f"gone, take them off KNOWN_BACK_EDGES: {KNOWN_BACK_EDGES - present}"


# (module given more source, that source, whether it is an upward import, whether it closes a cycle)
REGRESSIONS = [
    ("petlprof.method_api", "def check(model):\n    from petlprof.methods.read import ReadConfig\n", True, True),
    (
        "petlprof.method_api",
        "def check(model):\n    from petlprof.methods.read.model import SideNetwork\n",
        True,
        False,
    ),
    ("petlprof.registry", "from petlprof.methods import lora\n", True, False),
    ("petlprof.registry", "def tuner(name):\n    from petlprof.methods.peft_tuners import tuner_spec\n", True, True),
    (
        "petlprof.sweep.config",
        "def read(path):\n    from ..methods.peft_files import read_adapter_config\n",
        True,
        False,
    ),
    ("petlprof.method_api", "def spec():\n    from petlprof.registry import get_method\n", False, True),
    ("petlprof.side_tuning", "import petlprof.methods.read.model\n", True, True),
    ("petlprof.methods.lst.model", "from petlprof.methods.lst import check_heads\n", False, True),
]


# (module given more source, that source): each breaks a layer rule
LAYER_REGRESSIONS = [
    ("petlprof.sweep.config", "def run(spec):\n    from petlprof.run.execute import execute\n"),
    ("petlprof.results.store", "from petlprof.execution.process import command\n"),
    ("petlprof.results.records", "import petlprof.run.train\n"),
    ("petlprof.models.backbones", "from petlprof.methods import lora\n"),
    ("petlprof.report.table", "def f():\n    from petlprof.run.pipeline import prepare\n"),
    ("petlprof.tasks.labelled", "from petlprof.models.backbones import load_backbone\n"),
    ("petlprof.values", "from petlprof.results.figures import TIME\n"),
    ("petlprof.models.backbones", "from petlprof.meters import Window\n"),  # through a package with code
    ("petlprof.run.train", "def f():\n    from petlprof.report import write_report\n"),
]


@pytest.mark.parametrize(("module", "source"), LAYER_REGRESSIONS)
def test_the_layer_rules_catch_a_bad_import(module, source):
    assert not layer_breaks(import_edges())
    edges = import_edges({module: package_modules()[module].read_text() + "\n" + source})
    assert [e.source for e in layer_breaks(edges)] == [module]


@pytest.mark.parametrize(("module", "source", "upward", "cycle"), REGRESSIONS)
def test_the_checks_catch_a_readded_import(module, source, upward, cycle):
    edges = import_edges({module: package_modules()[module].read_text() + "\n" + source})
    assert bool(upward_imports(edges)) == upward
    found = find_cycle(edges, KNOWN_BACK_EDGES)
    assert (found is not None and any(e.source == module for e in found)) == cycle


TYPE_ONLY = """
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from petlprof.models.architecture import Architecture
else:
    import petlprof.errors
"""


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import petlprof.registry as r\n", "petlprof.sweep.config", False, {"petlprof.registry"}),
        ("def f():\n    from petlprof import registry\n", "petlprof.cli", False, {"petlprof", "petlprof.registry"}),
        ("class A:\n    def f(self):\n        import torch\n", "petlprof.x", False, {"torch"}),
        ("from . import model\n", "petlprof.methods.lst", True, {"petlprof.methods.lst", "petlprof.methods.lst.model"}),
        ("from ..peft_common import wrap_backbone\n", "petlprof.methods.read.model", False,
         {"petlprof.methods.peft_common", "petlprof.methods.peft_common.wrap_backbone"}),
        (TYPE_ONLY, "petlprof.models.backbones", False, {"typing", "typing.TYPE_CHECKING", "petlprof.errors"}),
        ("import importlib\nimportlib.import_module('petlprof.methods.lora')\n", "petlprof.registry", False,
         {"importlib"}),
    ],
)  # fmt: skip
def test_imports_are_read_at_every_depth(source, module, is_package, expected):
    assert {name for name, _ in imported_names(source, module, is_package)} == expected


def test_every_builtin_method_module_is_listed_and_gives_its_spec():
    modules = package_modules()
    with_spec = {
        name
        for name, path in modules.items()
        if name.startswith(METHODS)
        and any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SPEC" for t in node.targets)
            for node in ast.parse(path.read_text()).body
        )
    }
    assert {reference.partition(":")[0] for reference in BUILTIN_METHODS.values()} == with_spec
    assert builtin_method_names() == sorted(BUILTIN_METHODS)
    for name, reference in BUILTIN_METHODS.items():
        spec = resolve_target(reference)
        assert isinstance(spec, MethodSpec) and spec.name == name


MAX_ROOT_MODULES = 12  # issue 36: the rest lives in the subpackages, one per stage or layer


def test_the_root_holds_at_most_twelve_modules_and_every_subpackage_says_what_it_owns():
    root = ROOTS["petlprof"]
    modules = sorted(p.name for p in root.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, f"{len(modules)} modules directly in petlprof/: {modules}"
    packages = sorted(p.parent for p in root.glob("*/__init__.py"))
    assert packages, "no subpackage found"
    for package in packages:
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert len(docstring.split()) >= 5, f"petlprof/{package.name}/__init__.py does not say what the package owns"
