"""The environment stored with each record names the C allocator's settings, which move CPU peak memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from petlprof.report.markdown import _environment
from petlprof.results.environment import allocator_settings, environment, startup_environment
from petlprof.results.result import results_of


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "defaults"),
        ({"PATH": "/usr/bin", "MALLOCX": "1", "OMP_NUM_THREADS": "1"}, "defaults"),
        ({"MALLOC_ARENA_MAX": "2", "PATH": "/usr/bin"}, "MALLOC_ARENA_MAX=2"),
        (
            {"MALLOC_MMAP_THRESHOLD_": "131072", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2", "GLIBC_TUNABLES": "x=1"},
            "GLIBC_TUNABLES=x=1, LD_PRELOAD=/usr/lib/libjemalloc.so.2, MALLOC_MMAP_THRESHOLD_=131072",
        ),
        ({"MALLOC_TRIM_THRESHOLD_": ""}, "MALLOC_TRIM_THRESHOLD_="),
    ],
)
def test_allocator_settings_names_each_variable_that_moves_cpu_peaks(env, expected):
    assert allocator_settings(env) == expected


def test_a_records_environment_carries_the_allocator_settings_this_process_started_with(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "3")  # too late for this process's allocator: not reported
    assert environment("cpu")["allocator"] == allocator_settings(startup_environment())
    assert "MALLOC_ARENA_MAX=3" not in environment("cpu")["allocator"]


@pytest.mark.parametrize(
    "start, now, expected",
    [
        ({}, {"MALLOC_ARENA_MAX": "2"}, "defaults"),  # set after start-up: the C library never saw it
        ({"MALLOC_ARENA_MAX": "4"}, {"MALLOC_ARENA_MAX": "2"}, "MALLOC_ARENA_MAX=4"),
    ],
)
def test_allocator_settings_are_those_the_process_started_with(start, now, expected):
    """A run forked from the warm worker gets the driver's environment in ``os.environ``, but its allocator
    was set up when the warm worker started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | start
    code = (
        f"import os; os.environ.update({now!r}); "
        "from petlprof.results.environment import allocator_settings as a; print(a())"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == expected


@pytest.mark.parametrize(
    "envs, differing",
    [
        ([{"torch": "2.13", "allocator": "defaults"}, {"torch": "2.13", "allocator": "defaults"}], None),
        ([{"torch": "2.13", "allocator": "MALLOC_ARENA_MAX=2"}, {"torch": "2.13"}], "allocator"),
        ([{"torch": "2.13"}, {"torch": "2.13", "allocator": "defaults"}], "allocator"),  # older record first
        ([{"torch": "2.13"}, {"torch": "2.14"}, None], "torch"),
    ],
)
def test_the_report_names_environment_keys_in_which_records_differ(envs, differing):
    lines = _environment(results_of({"env": env} for env in envs))
    said = [line for line in lines if line.startswith("Other records differ in")]
    assert said == ([f"Other records differ in: {differing}."] if differing else [])


def test_an_environment_value_cannot_break_the_reports_layout():
    hostile = "/opt/lib\n## Injected heading\x1b[31m" + "x" * 5000
    lines = _environment(
        results_of([{"env": {"allocator": f"LD_PRELOAD={hostile}"}}, {"env": {"allocator": "defaults"}}])
    )
    entry = next(line for line in lines if line.startswith("- **allocator:**"))
    assert "\n" not in entry and "\x1b" not in entry and "\\n## Injected" in entry and "\\x1b" in entry
    assert len(entry) < 400 and "characters)" in entry  # cut, with its full length said
    several = "GLIBC_TUNABLES=glibc.malloc.trim_threshold=0, MALLOC_ARENA_MAX=2, MALLOC_MMAP_THRESHOLD_=131072"
    assert f"- **allocator:** {several}" in _environment(
        results_of([{"env": {"allocator": several}}])
    )  # a few settings, whole
    assert not any(line.startswith("## Injected") for line in lines)
    assert "Other records differ in: allocator." in lines
