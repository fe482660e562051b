"""The one registry class (:class:`petlprof.lookup.Registry`) and the kinds built on it.

Each check runs over a table of cases against tiny modules and ``.dist-info`` folders written to a temporary
folder on ``sys.path`` (what ``pip install`` leaves for ``importlib.metadata``), never mocks of importlib: a
lazy entry is imported only when asked for; an unknown name is the did-you-mean error with the choices; an
entry point is a plug-in, and each way one can be broken is one line naming it and its distribution; an entry
of the wrong type is refused; ``module:attr`` is taken where the kind allows it and refused where not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from petlprof.errors import UsageError
from petlprof.execution.executors import EXECUTOR_KINDS
from petlprof.lookup import Registry
from petlprof.meters import ENERGY_METERS, EXTRA_METERS, MEMORY_METERS
from petlprof.meters.base import Meter
from petlprof.models.backbones import BACKBONES, Preset
from petlprof.registry import METHODS
from petlprof.tasks.labelled import TASKS
from petlprof.vocabulary import EXECUTORS

GROUP = "petlprof_test.widgets"


@dataclass(frozen=True)
class Widget:
    name: str


class Base:
    pass


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for fake modules and distributions; the modules are forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("fake_"):
            del sys.modules[name]


def write_module(site: Path, name: str, source: str) -> None:
    (site / f"{name}.py").write_text(textwrap.dedent(source))


def write_distribution(site: Path, name: str, entry_points: dict[str, str]) -> None:
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")


# a module making widgets: this file's Widget, imported by name so that isinstance holds
WIDGETS = f"""
from {__name__} import Widget, Base
ALPHA = Widget("alpha")
BETA = Widget("beta")
OTHER = Widget("other")
NOT_ONE = {{"name": "alpha"}}
class Sub(Base):
    pass
"""


def widgets(**options) -> Registry[Widget]:
    return Registry("widget", lazy={"alpha": "fake_widgets:ALPHA"}, instance_of=Widget, named=True, **options)


# --- lazy entries -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "look",
    [
        lambda r: r.names(),
        lambda r: r.builtin_names(),
        lambda r: "alpha" in r,
        lambda r: list(r),
        lambda r: r.unknown("alpah"),
        lambda r: pytest.raises(UsageError, r.get, "gamma"),
    ],
    ids=["names", "builtin_names", "in", "iter", "unknown", "get of another name"],
)
def test_a_lazy_entry_is_not_imported_until_asked_for(site, look):
    write_module(site, "fake_widgets", WIDGETS)
    registry = widgets()
    look(registry)
    assert "fake_widgets" not in sys.modules
    assert registry.get("alpha").name == "alpha" and "fake_widgets" in sys.modules
    assert registry.get("alpha") is registry.get("alpha")


def test_objects_given_directly_and_lazily_keep_their_order():
    registry = Registry("thing", {"b": 2, "a": 1}, lazy={"c": "math:pi"})
    assert registry.names() == ["b", "a", "c"] and registry.builtin_names() == ["b", "a", "c"]
    assert registry.items() == [("b", 2), ("a", 1), ("c", pytest.approx(3.14159, abs=1e-5))]
    with pytest.raises(ValueError, match="both directly and lazily"):
        Registry("thing", {"a": 1}, lazy={"a": "math:pi"})


# --- unknown names ----------------------------------------------------------------------------------------

UNKNOWN = [
    # (registry, name, the whole message)
    (
        Registry("colour", {"red": 1, "green": 2, "blue": 3}),
        "gren",
        "unknown colour 'gren'; did you mean 'green'? Valid choices: blue, green, red.",
    ),
    (
        Registry("colour", {"red": 1}, hint="Or give #RRGGBB."),
        "xx",
        "unknown colour 'xx'. Valid choices: red. Or give #RRGGBB.",
    ),
    (Registry("colour", {"red": 1}), "", "unknown colour ''. Valid choices: red."),
    (Registry("colour", {"red": 1}), "a\x1bb", "unknown colour 'a\\x1bb'. Valid choices: red."),
    (EXECUTOR_KINDS, "loca", "unknown executor 'loca'; did you mean 'local'? Valid choices: local, ray."),
    (
        ENERGY_METERS,
        "nvm",
        "unknown energy meter 'nvm'; did you mean 'nvml'? Valid choices: estimate, nvml, rapl, zeus.",
    ),
    (EXTRA_METERS, "zz", "unknown extra meter (--meters) 'zz'. Valid choices: codecarbon, cpu-tensors."),
]


@pytest.mark.parametrize(("registry", "name", "message"), UNKNOWN)
def test_an_unknown_name_says_did_you_mean_and_the_choices(registry, name, message):
    with pytest.raises(UsageError) as info:
        registry.get(name)
    assert str(info.value) == message
    assert name not in registry


@pytest.mark.parametrize(
    ("registry", "noun", "known"),
    [
        (METHODS, "method", "lora"),
        (BACKBONES, "backbone", "tiny-bert"),
        (TASKS, "task", "tweets"),
        (ENERGY_METERS, "energy meter", "nvml"),
        (MEMORY_METERS, "memory meter", "cpu-rss"),
        (EXECUTOR_KINDS, "executor", "local"),
    ],
)
def test_each_kind_is_a_registry_with_its_noun(registry, noun, known):
    assert isinstance(registry, Registry) and registry.noun == noun and known in registry
    with pytest.raises(UsageError, match=f"^unknown {noun} 'no-such-name-q'"):
        registry.get("no-such-name-q")
    with pytest.raises(UsageError, match=f"^an? {noun} name must be text, got 3$"):
        registry.get(3)


def test_the_unknown_error_takes_more_choices_and_another_hint():
    message = str(BACKBONES.unknown("t5-lage", also=["t5-large"], extra="Or a folder."))
    assert message.startswith("unknown backbone 't5-lage'; did you mean 't5-large'? Valid choices: minilm, ")
    assert message.endswith("tiny-t5. Or a folder.") and "t5-large" in message


def test_the_registries_hold_what_their_kind_resolves_to():
    assert EXECUTOR_KINDS.names() == list(EXECUTORS)
    assert all(
        issubclass(cls, Meter) for kind in (ENERGY_METERS, MEMORY_METERS, EXTRA_METERS) for _, cls in kind.items()
    )
    assert all(isinstance(preset, Preset) for _, preset in BACKBONES.items())
    assert [name for name, preset in BACKBONES.items() if preset.pretrained] == ["minilm", "smollm2"]
    assert all(isinstance(line, str) for _, line in TASKS.items())


def test_listing_every_kind_of_name_imports_no_torch_and_no_method():
    code = (
        "import sys\n"
        "from petlprof.registry import METHODS\nfrom petlprof.models.backbones import BACKBONES\n"
        "from petlprof.tasks.labelled import TASKS\nfrom petlprof.meters import ENERGY_METERS, EXTRA_METERS\n"
        "for r in (METHODS, BACKBONES, TASKS, ENERGY_METERS, EXTRA_METERS): r.names()\n"
        "print('torch' in sys.modules, any(m.startswith('petlprof.methods') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# --- entry points -----------------------------------------------------------------------------------------

ENTRY_POINTS = [
    # (id, distributions {name: {entry point: value}}, name asked for, what the line says, or None: found)
    ("a plug-in", {"beta-dist": {"beta": "fake_widgets:BETA"}}, "beta", None),
    (
        "named like a built-in",
        {"clash-dist": {"alpha": "fake_widgets:OTHER"}},
        "alpha",
        "plug-in widget 'alpha' (entry point 'alpha = fake_widgets:OTHER' of distribution clash-dist 1.0): its name "
        "clashes with the built-in widget 'alpha'; rename it",
    ),
    (
        "two distributions, one name",
        {"dist-a": {"beta": "fake_widgets:BETA"}, "dist-b": {"beta": "fake_widgets:OTHER"}},
        "beta",
        "plug-in widget 'beta' is declared by several distributions (dist-a 1.0, dist-b 1.0); uninstall all but one",
    ),
    (
        "a value that is not module:attr",
        {"odd-dist": {"odd": "just_a_module"}},
        "odd",
        "plug-in widget 'odd' (entry point 'odd = just_a_module' of distribution odd-dist 1.0): malformed entry "
        "point: its value must be module:ATTR naming a Widget",
    ),
    (
        "its import fails",
        {"dep-dist": {"needy": "fake_needs_dep:BETA"}},
        "needy",
        "plug-in widget 'needy' (entry point 'needy = fake_needs_dep:BETA' of distribution dep-dist 1.0): import of "
        "'fake_needs_dep' failed: ModuleNotFoundError: No module named 'no_such_dependency_xyz' (see it in full: "
        "python -c 'import fake_needs_dep')",
    ),
    (
        "no such attribute",
        {"attr-dist": {"beta": "fake_widgets:GAMMA"}},
        "beta",
        "plug-in widget 'beta' (entry point 'beta = fake_widgets:GAMMA' of distribution attr-dist 1.0): malformed "
        "entry: module 'fake_widgets' has no attribute 'GAMMA'",
    ),
    (
        "of the wrong type",
        {"type-dist": {"alpha2": "fake_widgets:NOT_ONE"}},
        "alpha2",
        "plug-in widget 'alpha2' (entry point 'alpha2 = fake_widgets:NOT_ONE' of distribution type-dist 1.0): "
        "malformed entry: 'NOT_ONE' is a dict, not a Widget",
    ),
    (
        "named otherwise than its entry point",
        {"rn-dist": {"mine": "fake_widgets:OTHER"}},
        "mine",
        "plug-in widget 'mine' (entry point 'mine = fake_widgets:OTHER' of distribution rn-dist 1.0): malformed "
        "entry: it is named 'other'; the entry point must use the same name",
    ),
]


@pytest.mark.parametrize(
    ("distributions", "name", "expected"), [c[1:] for c in ENTRY_POINTS], ids=[c[0] for c in ENTRY_POINTS]
)
def test_an_entry_point_is_a_plugin_and_a_broken_one_is_one_line(site, distributions, name, expected):
    write_module(site, "fake_widgets", WIDGETS)
    write_module(site, "fake_needs_dep", "import no_such_dependency_xyz\n")
    for dist, entry_points in distributions.items():
        write_distribution(site, dist, entry_points)
    registry = widgets(group=GROUP)
    assert name in registry and name in registry.names()
    if expected is None:
        assert registry.get(name).name == name
        return
    with pytest.raises(UsageError) as info:
        registry.get(name)
    assert str(info.value) == expected


def test_entry_points_are_read_once_until_forgotten(site):
    write_module(site, "fake_widgets", WIDGETS)
    registry = widgets(group=GROUP)
    assert registry.names() == ["alpha"]
    write_distribution(site, "beta-dist", {"beta": "fake_widgets:BETA"})
    assert "beta" not in registry
    registry.forget()
    assert registry.names() == ["alpha", "beta"] and registry.get("beta").name == "beta"


def test_a_registry_without_a_group_reads_no_entry_points(site):
    write_module(site, "fake_widgets", WIDGETS)
    write_distribution(site, "beta-dist", {"beta": "fake_widgets:BETA"})
    assert "beta" not in widgets() and "beta" in widgets(group=GROUP)


# --- the type of an entry ---------------------------------------------------------------------------------

WRONG_TYPE = [
    # (id, registry, name, error, the whole message)
    (
        "a lazy built-in of another type",
        Registry("widget", lazy={"alpha": "fake_widgets:NOT_ONE"}, instance_of=Widget),
        "alpha",
        RuntimeError,
        "fake_widgets:NOT_ONE is {'name': 'alpha'}, not the Widget of built-in widget 'alpha'",
    ),
    (
        "a built-in named otherwise",
        Registry("widget", lazy={"alpha": "fake_widgets:BETA"}, instance_of=Widget, named=True),
        "alpha",
        RuntimeError,
        "fake_widgets:BETA is Widget(name='beta'), not the Widget of built-in widget 'alpha'",
    ),
    (
        "an object given directly, not a subclass",
        Registry("part", {"p": dict}, subclass_of=Base),
        "p",
        RuntimeError,
        "the entry given is <class 'dict'>, not the Base of built-in part 'p'",
    ),
    (
        "a module:attr reference of another type",
        Registry("widget", instance_of=Widget, kind_label="petlprof.Widget", references=True),
        "fake_widgets:NOT_ONE",
        UsageError,
        "plug-in widget 'fake_widgets:NOT_ONE' (not from an installed distribution): malformed entry: 'NOT_ONE' is a "
        "dict, not a petlprof.Widget",
    ),
    (
        "a module:attr reference that is no subclass",
        Registry("part", subclass_of=Base, references=True),
        "fake_widgets:Widget",
        UsageError,
        "plug-in part 'fake_widgets:Widget' (not from an installed distribution): malformed entry: 'Widget' is the "
        "class Widget, not a subclass of Base",
    ),
]


@pytest.mark.parametrize(
    ("registry", "name", "error", "message"), [c[1:] for c in WRONG_TYPE], ids=[c[0] for c in WRONG_TYPE]
)
def test_an_entry_of_the_wrong_type_is_refused_with_one_line(site, registry, name, error, message):
    write_module(site, "fake_widgets", WIDGETS)
    with pytest.raises(error) as info:
        registry.get(name)
    assert str(info.value) == message and "\n" not in message


def test_a_subclass_is_taken_where_a_base_class_is_asked_for(site):
    write_module(site, "fake_widgets", WIDGETS)
    registry = Registry("part", lazy={"sub": "fake_widgets:Sub"}, subclass_of=Base, references=True)
    assert issubclass(registry.get("sub"), Base) and registry.get("fake_widgets:Sub") is registry.get("sub")


# --- module:attr given by the user ------------------------------------------------------------------------

REFERENCES = [
    # (id, references allowed, name, the whole message, or None: found)
    ("allowed", True, "fake_widgets:BETA", None),
    (
        "refused where not allowed",
        False,
        "fake_widgets:BETA",
        "unknown widget 'fake_widgets:BETA'. Valid choices: alpha.",
    ),
    (
        "not module:attr",
        True,
        "a:b:c",
        "widget 'a:b:c' is neither a widget name nor package.module:ATTR (see `petlprof list`)",
    ),
    (
        "named like a built-in",
        True,
        "fake_widgets:OTHER_ALPHA",
        "plug-in widget 'fake_widgets:OTHER_ALPHA' (not from an installed distribution): its name 'alpha' clashes "
        "with the built-in widget 'alpha'; rename it",
    ),
    ("the built-in itself", True, "fake_widgets:ALPHA", None),
    (
        "no such module",
        True,
        "fake_no_such_module_q:X",
        "plug-in widget 'fake_no_such_module_q:X' (not from an installed distribution): import of "
        "'fake_no_such_module_q' failed: ModuleNotFoundError: No module named 'fake_no_such_module_q' (see it in "
        "full: python -c 'import fake_no_such_module_q')",
    ),
]


@pytest.mark.parametrize(("allowed", "name", "expected"), [c[1:] for c in REFERENCES], ids=[c[0] for c in REFERENCES])
def test_module_attr_where_the_kind_allows_it_and_refused_where_not(site, allowed, name, expected):
    write_module(site, "fake_widgets", WIDGETS + 'OTHER_ALPHA = Widget("alpha")\n')
    registry = widgets(references=allowed)
    if expected is None:
        assert registry.get(name) is registry.get(name) and registry.get(name).name == name.split(":")[1].lower()
        return
    with pytest.raises(UsageError) as info:
        registry.get(name)
    assert str(info.value) == expected


def test_a_module_attr_named_like_an_installed_plugin_is_refused(site):
    write_module(site, "fake_widgets", WIDGETS)
    write_distribution(site, "beta-dist", {"beta": "fake_widgets:BETA"})
    write_module(site, "fake_twin", f"from {__name__} import Widget\nBETA = Widget('beta')\n")
    registry = widgets(group=GROUP, references=True)
    assert registry.get("fake_widgets:BETA") is registry.get("beta")  # the plug-in itself, by its reference
    with pytest.raises(UsageError, match="its name 'beta' clashes with the installed plug-in widget 'beta'"):
        registry.get("fake_twin:BETA")


def test_a_kind_may_refuse_a_plugin_for_its_own_reason(site):
    write_module(site, "fake_widgets", WIDGETS)
    registry = widgets(references=True, check_plugin=lambda w: "beta is reserved" if w.name == "beta" else None)
    with pytest.raises(UsageError, match=r"^plug-in widget 'fake_widgets:BETA' \(not from .*\): beta is reserved$"):
        registry.get("fake_widgets:BETA")
    assert registry.get("fake_widgets:OTHER").name == "other"
