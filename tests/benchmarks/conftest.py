"""Benchmarks run only when asked for (``--benchmark-enable`` or ``--petlprof-update-baseline``),
so the unit-test command stays fast; `.ci/run` runs them as a second step."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    disabled = config.getoption("benchmark_disable") and not config.getoption("benchmark_enable")
    if not disabled or config.getoption("--petlprof-update-baseline"):
        return
    skip = pytest.mark.skip(reason="benchmark: run `pytest tests/benchmarks --benchmark-enable`")
    for item in items:
        if item.path.parent.name == "benchmarks":
            item.add_marker(skip)
