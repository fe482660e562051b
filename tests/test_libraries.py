"""A run's libraries are imported without torch's compiler (petlprof.run.libraries): bitsandbytes decorates its
kernels with ``torch.compile`` at import, which imported the compiler in every run's process; the kernels
are now compiled at their first call, to the same compiled function."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from petlprof.run.libraries import RUNTIME_LIBRARIES, compile_on_first_call


def test_a_deferred_compile_compiles_at_the_first_call_with_its_options_and_then_reuses_it(monkeypatch):
    calls = []

    def compile_now(fn, **options):
        calls.append(options)
        return lambda *args: ("compiled", fn(*args))

    monkeypatch.setattr(torch, "compile", compile_now)
    with compile_on_first_call():
        plain = torch.compile(lambda x: x + 1, dynamic=False)

        @torch.compile(mode="reduce-overhead")
        def decorated(x):
            return x * 2

    assert torch.compile is compile_now and calls == []  # restored; nothing compiled yet
    assert plain(1) == ("compiled", 2) and plain(2) == ("compiled", 3)
    assert decorated(3) == ("compiled", 6) and decorated.__name__ == "decorated"
    assert calls == [{"dynamic": False}, {"mode": "reduce-overhead"}]  # once each, with its options


def test_a_failing_block_restores_torch_compile():
    before = torch.compile
    with pytest.raises(RuntimeError), compile_on_first_call():
        raise RuntimeError("import failed")
    assert torch.compile is before


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")
def test_a_runs_imports_leave_the_compiler_out_and_bitsandbytes_kernels_still_run():
    """In a fresh interpreter, as a run's worker imports them: every runtime library and bitsandbytes are
    imported, the compiler is not; an nf4 round trip through bitsandbytes' CPU kernels still gives the weights
    back within 4-bit error."""
    script = f"""
import sys
from petlprof.run.libraries import import_runtime_libraries
import_runtime_libraries()
assert all(name in sys.modules for name in {RUNTIME_LIBRARIES!r}) and "bitsandbytes" in sys.modules
assert "torch._inductor.compile_fx" not in sys.modules, "the compiler was imported"
import torch, bitsandbytes.functional as F
w = torch.randn(64, 64)
packed, state = F.quantize_4bit(w, quant_type="nf4")
error = (F.dequantize_4bit(packed, state) - w).abs().max().item()
assert error < 0.5 * w.abs().max().item(), error
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.parametrize("freeze", [True, False])
def test_a_process_that_keeps_its_imports_freezes_them_before_the_collector_runs_again(freeze, monkeypatch):
    """``freeze=True`` (a run's worker, a test session): the objects leave the collector's scans while it is still
    paused, so no collection ever walks them (one after the pause walked them all as young objects); without it
    (a run in the caller's own process, whose objects are its own) nothing is frozen."""
    import gc

    from petlprof.run import libraries

    frozen_with_collector_on = []
    monkeypatch.setattr(libraries.importlib, "import_module", lambda name: None)
    monkeypatch.setattr(libraries.gc, "freeze", lambda: frozen_with_collector_on.append(gc.isenabled()))
    gc.enable()
    libraries.import_runtime_libraries(freeze=freeze)
    assert frozen_with_collector_on == ([False] if freeze else [])
    assert gc.isenabled()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_imports_pause_the_garbage_collector_and_leave_it_as_it_was(enabled, monkeypatch):
    """Inside the imports no collection runs (each would scan the libraries' objects, 0.3-0.5 s of a fresh
    process's imports); after them the collector is on or off as the caller had it, also when an import fails."""
    import gc

    from petlprof.run import libraries

    seen = []
    monkeypatch.setattr(libraries.importlib, "import_module", lambda name: seen.append(gc.isenabled()))
    (gc.enable if enabled else gc.disable)()
    try:
        libraries.import_runtime_libraries()
        assert seen and not any(seen)
        assert gc.isenabled() is enabled

        def failing(name):
            raise RuntimeError(name)

        monkeypatch.setattr(libraries.importlib, "import_module", failing)
        with pytest.raises(RuntimeError):
            libraries.import_runtime_libraries()
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
