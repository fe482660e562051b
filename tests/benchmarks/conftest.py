"""Benchmarks run only when asked for (``--benchmark-enable`` or ``--petlprof-update-baseline``),
so the unit-test command stays fast; `.ci/run` runs them as a second step.  The by-hand ones (marked ``by_hand``)
run only when their file is named on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest


def _named(config, path: Path) -> bool:
    """Whether ``path`` (a test file) was named on the command line, alone or with a test of it."""
    return any(Path(arg.split("::")[0]).resolve() == path.resolve() for arg in config.args)


def pytest_collection_modifyitems(config, items):
    # the by-hand benchmarks (by_hand.py) run only when their file is named: minutes each, past what CI leaves
    for item in items:
        if item.get_closest_marker("by_hand") and not _named(config, item.path):
            item.add_marker(
                pytest.mark.skip(
                    reason=f"by hand: pytest {item.path.relative_to(config.rootpath)} --benchmark-enable -s"
                )
            )
    disabled = config.getoption("benchmark_disable") and not config.getoption("benchmark_enable")
    if not disabled or config.getoption("--petlprof-update-baseline"):
        return
    skip = pytest.mark.skip(reason="benchmark: run `pytest tests/benchmarks --benchmark-enable`")
    for item in items:
        if item.path.parent.name == "benchmarks":
            item.add_marker(skip)
