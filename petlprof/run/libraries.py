"""The libraries every run imports before it takes its memory baseline, and how they are imported.

A run's process (a fresh worker, the warm worker, a rank of a data-parallel run, or a test's process)
imports :data:`RUNTIME_LIBRARIES` before :func:`petlprof.run.pipeline.prepare` reads the process's memory, so the
libraries' own memory is never counted as a method's.

Where bitsandbytes is installed (``pip install petlprof[quantize]``), PEFT imports it at its own import, and
bitsandbytes wraps a dozen of its CPU kernels in ``torch.compile`` as it is imported.  ``torch.compile``
imports torch's inductor compiler at once, even for a function that is never called: about 1.4 s of CPU
per process measured here (7.0 s against 5.6 s for these five libraries, 3 alternating pairs on a shared
2-core machine), in every run's process, though a run without ``--quantize`` never calls those kernels.
:func:`compile_on_first_call` defers the compilation to the kernel's first call, where ``torch.compile``
would have done its work anyway (it compiles on the first call, not when applied): a run that calls the
kernels gets the same compiled function; one that does not never imports the compiler.
"""

from __future__ import annotations

import functools
import gc
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# sklearn.metrics: a classification run scores its predictions with it (petlprof.tasks.metrics) after its windows;
# imported here, before the memory baseline, it costs a forked run nothing (0.44 s of CPU in each run's
# process, measured, when it was imported at scoring time) and no window's peak changes (the baseline and the
# high-water mark both carry it)
RUNTIME_LIBRARIES = ("datasets", "pandas", "peft", "sklearn.metrics", "torch", "transformers")


@contextmanager
def compile_on_first_call() -> Iterator[None]:
    """While the block runs, ``torch.compile(fn, **options)`` returns a function that calls
    ``torch.compile(fn, **options)`` on its first call and the compiled function from then on (and
    ``torch.compile(**options)`` a decorator that does the same)."""
    # torch: slow to import, loaded only when used
    import torch

    compile_now = torch.compile

    def deferred(model: Callable[..., Any] | None = None, **options: Any) -> Any:
        if model is None:  # used as @torch.compile(dynamic=False)
            return lambda fn: deferred(fn, **options)
        if not callable(model) or isinstance(model, torch.nn.Module):  # a module keeps its compiled wrapper type
            return compile_now(model, **options)
        compiled: list[Callable[..., Any]] = []

        @functools.wraps(model)
        def first_call(*args: Any, **kwargs: Any) -> Any:
            if not compiled:
                compiled.append(compile_now(model, **options))
            return compiled[0](*args, **kwargs)

        return first_call

    torch.compile = deferred  # the same signature, the compilation deferred
    try:
        yield
    finally:
        torch.compile = compile_now


def import_runtime_libraries(freeze: bool = False) -> None:
    """Import :data:`RUNTIME_LIBRARIES`, bitsandbytes (when installed) with its compilation deferred first,
    so that PEFT's import of it costs no compiler; with the garbage collector paused.

    ``freeze``: for a process that keeps what it imported for its whole life (a run's worker, a test session), every
    object the process holds then leaves the collector's scans for good (``gc.freeze``), while the collector is still
    paused.  Left to the collector, the first collection after the pause scanned every object the imports made as a
    young one, and a collection before freezing scanned them again: 0.6-0.8 s of CPU in each such process (3.3-3.5 s
    against 4.0-4.1 s, three alternating pairs, measured here).  Frozen with them is the imports' cyclic garbage
    (about 13,000 objects, which a collection would have freed): the process's RSS was 518-521 MiB either way."""
    with gc_paused():
        import torch  # noqa: F401  (torch first: compile_on_first_call patches it)

        with compile_on_first_call():
            try:
                importlib.import_module("bitsandbytes")
            except ImportError:  # not installed (the quantize extra): PEFT then does not import it either
                pass
        for name in RUNTIME_LIBRARIES:
            importlib.import_module(name)
        if freeze:
            gc.freeze()


@contextmanager
def gc_paused() -> Iterator[None]:
    """The garbage collector off while the block runs (as it was after).  The libraries' imports create a few
    hundred thousand objects that live as long as the process, and each allocation threshold passed started a scan
    of them all: 0.3-0.5 s of each fresh process's 5 s of imports, measured here.  A run collects garbage before
    each phase anyway, so nothing the imports left for the collector is in a measured window."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
