"""The environment stored with each record names the C allocator's settings, which move CPU peak memory."""

from __future__ import annotations

import os

import pytest

from petlprof.envinfo import allocator_settings, environment


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


def test_a_records_environment_carries_this_processs_allocator_settings(monkeypatch):
    for name in [n for n in os.environ if n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert "MALLOC_MMAP_THRESHOLD_=131072" in environment("cpu")["allocator"]
