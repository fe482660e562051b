"""One registry of named things, for every kind a user names: methods, backbone presets, tasks, meters, executors.

A :class:`Registry` keeps its kind's noun for messages ("method", "backbone", ...) and a table of entries, each
either an object given directly or a lazy ``"module:attr"`` reference, imported only when that entry is asked
for, so listing names imports nothing heavy.  A registry may also take

* an entry-point group (``importlib.metadata``): each installed distribution's entry point of that group is a
  plug-in, its value a ``module:attr`` reference; one whose name clashes with a built-in entry, that two
  distributions declare, whose value is malformed or whose import fails is one :class:`UsageError` line saying
  which plug-in, which distribution and what is wrong;
* ``module:attr`` references given by the user in place of a name (``references``; the current folder is
  importable, as for ``python -m``);
* a check of what an entry resolves to: an instance of a type, or a subclass of a base class, and (``named``)
  an object whose ``name`` is the entry's.

An unknown name is :func:`petlprof.errors.unknown_choice`'s did-you-mean error, with the registry's names as
the choices.  Kinds whose names are open-ended (a backbone may be a folder or a hub id, a task a file) keep
their own rules around the lookup; only their named entries live here.

It stands in the base layer, beside the errors it raises, so every layer that owns a kind can build one.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from petlprof.errors import UsageError, shown, unknown_choice

T = TypeVar("T")
REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")  # package.module:ATTR


def resolve(reference: str) -> Any:
    """The object ``"module:attr"`` names (``attr`` may be dotted), importing its module."""
    module, _, attr = reference.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class _Broken(Exception):
    """What is wrong with a plug-in; the caller says which plug-in (naming a module's distribution is slow)."""


class Registry(Generic[T]):
    """Named entries of one kind, looked up by :meth:`get`; see the module docstring.

    ``entries``: objects given directly; ``lazy``: ``"module:attr"`` references, imported on first use;
    ``group``: the entry-point group of plug-ins; ``references``: whether the user may give ``module:attr``;
    ``instance_of``/``subclass_of``: what an entry must resolve to, ``kind_label`` its name in messages;
    ``named``: an entry's object carries the entry's name (``.name``); ``entry_word``: what one entry is called
    in a malformed plug-in's message; ``malformed_errors``: exceptions whose raising by a plug-in's import means
    it made a malformed entry; ``check_plugin``: any other problem of a plug-in's object, in words, or None;
    ``hint``: what the unknown-name error adds after the choices.
    """

    def __init__(
        self,
        noun: str,
        entries: Mapping[str, T] | None = None,
        *,
        lazy: Mapping[str, str] | None = None,
        group: str | None = None,
        references: bool = False,
        instance_of: type | None = None,
        subclass_of: type | None = None,
        kind_label: str | None = None,
        named: bool = False,
        entry_word: str = "entry",
        malformed_errors: tuple[type[Exception], ...] = (),
        check_plugin: Callable[[T], str | None] | None = None,
        hint: str = "",
    ):
        self.noun, self.group, self.references, self.hint = noun, group, references, hint
        self._direct: dict[str, T] = dict(entries or {})
        self._lazy: dict[str, str] = dict(lazy or {})
        if set(self._direct) & set(self._lazy):
            raise ValueError(
                f"{noun} entries given both directly and lazily: {sorted(set(self._direct) & set(self._lazy))}"
            )
        self._targets = [*self._direct, *self._lazy]  # every built-in name, in the order given
        self._instance_of, self._subclass_of, self._named = instance_of, subclass_of, named
        kind = instance_of or subclass_of
        self._kind_name = kind.__name__ if kind is not None else "object"
        self._kind_label = kind_label or self._kind_name
        self._entry_word, self._malformed_errors, self._check_plugin = entry_word, malformed_errors, check_plugin
        self._builtins: dict[str, T] = {}  # built-in entries resolved in this process
        self._plugins: dict[str, T] = {}  # plug-ins resolved in this process, by the name they were asked for
        self._found: dict[str, list[metadata.EntryPoint]] | None = None

    # --- names (nothing is imported) -------------------------------------------------------------------------

    def builtin_names(self) -> list[str]:
        """The entries given in code, in their order."""
        return list(self._targets)

    def names(self) -> list[str]:
        """The entries given in code, then the installed plug-ins' names, sorted."""
        return [*self._targets, *sorted(set(self.entry_points()) - set(self._targets))]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._targets or name in self.entry_points())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.noun!r}, {self.names()})"

    def entry_points(self) -> dict[str, list[metadata.EntryPoint]]:
        """Installed plug-ins by entry-point name (a name two distributions declare has two), read once."""
        if self._found is None:  # built whole before it is kept, so a second thread never reads half of it
            found: dict[str, list[metadata.EntryPoint]] = {}
            for ep in metadata.entry_points(group=self.group) if self.group else ():
                if all(ep.value != other.value for other in found.get(ep.name, [])):  # one dist seen twice
                    found.setdefault(ep.name, []).append(ep)
            self._found = found
        return self._found

    def forget(self) -> None:
        """Read the entry points again and resolve plug-ins afresh (after a distribution was installed)."""
        self._found = None
        self._plugins.clear()

    # --- lookup ----------------------------------------------------------------------------------------------

    def get(self, name: str) -> T:
        """The entry ``name`` (a built-in, an installed plug-in or, where allowed, ``module:attr``), resolved."""
        if not isinstance(name, str):
            article = "an" if self.noun[:1] in "aeiou" else "a"
            raise UsageError(f"{article} {self.noun} name must be text, got {shown(name)}")
        if name in self._plugins:
            return self._plugins[name]
        plugins = self.entry_points().get(name, [])
        if name in self._targets:
            if plugins:
                raise UsageError(
                    f"{self._entry_label(plugins[0])}: its name clashes with the built-in {self.noun} '{name}'; "
                    "rename it"
                )
            return self._builtin(name)
        if self.references and ":" in name:
            found = self._load_reference(name)
        elif len(plugins) > 1:
            raise UsageError(
                f"plug-in {self.noun} '{name}' is declared by several distributions "
                f"({', '.join(sorted(_distribution(ep) for ep in plugins))}); uninstall all but one"
            )
        elif plugins:
            found = self._load_entry_point(plugins[0])
        else:
            raise self.unknown(name)
        self._plugins[name] = found
        return found

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) of every name, each resolved (a lazy one imported)."""
        return [(name, self.get(name)) for name in self.names()]

    def unknown(self, name: str, also: Iterable[str] = (), extra: str | None = None) -> UsageError:
        """The did-you-mean error for ``name``: the registry's names and ``also`` as the choices, then ``extra``
        (the registry's hint unless given)."""
        return unknown_choice(self.noun, name, [*self.names(), *also], self.hint if extra is None else extra)

    # --- resolving -------------------------------------------------------------------------------------------

    def _builtin(self, name: str) -> T:
        if name not in self._builtins:
            obj = resolve(self._lazy[name]) if name in self._lazy else self._direct[name]
            if self._wrong_kind(obj) or (self._named and _name_of(obj) != name):
                where = self._lazy.get(name, "the entry given")
                raise RuntimeError(
                    f"{where} is {shown(obj)}, not the {self._kind_name} of built-in {self.noun} '{name}'"
                )
            self._builtins[name] = obj
        return self._builtins[name]

    def _wrong_kind(self, obj: Any) -> str | None:
        """What ``obj`` is instead of the kind's type (``a dict, not a petlprof.MethodSpec``), or None."""
        if self._instance_of is not None and not isinstance(obj, self._instance_of):
            return f"a {type(obj).__name__}, not a {self._kind_label}"
        if self._subclass_of is not None and not (isinstance(obj, type) and issubclass(obj, self._subclass_of)):
            what = f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
            return f"{what}, not a subclass of {self._kind_label}"
        return None

    def _entry_label(self, ep: metadata.EntryPoint) -> str:
        return (
            f"plug-in {self.noun} '{ep.name}' (entry point '{ep.name} = {ep.value}' of distribution "
            f"{_distribution(ep)})"
        )

    def _reference_label(self, reference: str) -> str:
        top = reference.split(":")[0].split(".")[0]
        dists = metadata.packages_distributions().get(top, [])
        where = f"distribution {', '.join(dists)}" if dists else "not from an installed distribution"
        return f"plug-in {self.noun} '{reference}' ({where})"

    def _load_entry_point(self, ep: metadata.EntryPoint) -> T:
        try:
            if not REFERENCE.fullmatch(ep.value):
                raise _Broken(f"malformed entry point: its value must be module:ATTR naming a {self._kind_name}")
            obj = self._import(ep.value)
            if self._named and (named := _name_of(obj)) != ep.name:
                raise _Broken(
                    f"malformed {self._entry_word}: it is named '{named}'; the entry point must use the same name"
                )
        except _Broken as exc:
            raise UsageError(f"{self._entry_label(ep)}: {exc}") from None
        return obj

    def _load_reference(self, reference: str) -> T:
        if not REFERENCE.fullmatch(reference):
            raise UsageError(
                f"{self.noun} '{reference}' is neither a {self.noun} name nor package.module:ATTR (see `petlprof list`)"
            )
        cwd = os.getcwd()
        if "" not in sys.path and cwd not in sys.path:  # a module in the current folder, as `python -m` finds it
            sys.path.append(cwd)
        try:
            obj = self._import(reference)
            problem = self._check_plugin(obj) if self._check_plugin else None
            if problem:
                raise _Broken(problem)
            if self._named:
                self._check_clash(reference, _name_of(obj), obj)
        except _Broken as exc:
            raise UsageError(f"{self._reference_label(reference)}: {exc}") from None
        return obj

    def _check_clash(self, reference: str, name: str, obj: T) -> None:
        """A ``module:attr`` plug-in named like a built-in entry or an installed plug-in is refused."""
        if name in self._targets and self._builtin(name) is not obj:
            raise _Broken(f"its name '{name}' clashes with the built-in {self.noun} '{name}'; rename it")
        for ep in self.entry_points().get(name, []):
            if ep.value != reference:
                raise _Broken(f"its name '{name}' clashes with the installed {self._entry_label(ep)}")

    def _import(self, reference: str) -> T:
        """The entry ``module:attr`` names, or :class:`_Broken` saying why not, in one line."""
        module_name, _, attr = reference.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except self._malformed_errors as exc:  # the module made a malformed entry
            raise _Broken(f"malformed {self._entry_word}: {exc}") from None
        except Exception as exc:  # any error of a third-party import is the plug-in's, said in one line
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise _Broken(
                f"import of '{module_name}' failed: {type(exc).__name__}: {first} "
                f"(see it in full: python -c 'import {module_name}')"
            ) from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise _Broken(f"malformed {self._entry_word}: module '{module_name}' has no attribute '{attr}'")
            obj = getattr(obj, part)
        wrong = self._wrong_kind(obj)
        if wrong:
            raise _Broken(f"malformed {self._entry_word}: '{attr}' is {wrong}")
        return obj


def _name_of(obj: Any) -> Any:
    return getattr(obj, "name", None)


def _distribution(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unknown distribution"


__all__ = ["REFERENCE", "Registry", "resolve"]
