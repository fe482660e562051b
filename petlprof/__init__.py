"""petlprof: energy, memory and latency profiling of parameter-efficient fine-tuning methods.

The package is the harness (CLI, registry, backbones, tasks, training loop, meters, result
store, Pareto reports); the method implementations live in ``petlprof.methods``.
Importing this package is cheap: torch, transformers and NVML are imported only when used.

The names below are the stable surface for method plug-ins (see :mod:`petlprof.method_api`)::

    from petlprof import MethodConfig, MethodSpec, SideTunedModel, choice, integer, number
"""

from petlprof.method_api import (
    MAX_COUNT,
    MAX_WIDTH,
    MethodConfig,
    MethodSpec,
    MethodSpecError,
    choice,
    integer,
    module_names,
    number,
    text,
)

__version__ = "0.1.0"

__all__ = [
    "MAX_COUNT",
    "MAX_WIDTH",
    "MethodConfig",
    "MethodSpec",
    "MethodSpecError",
    "SideTunedModel",
    "choice",
    "integer",
    "module_names",
    "number",
    "text",
]


def __getattr__(name: str):
    if name == "SideTunedModel":  # imports torch: only when a side-tuning plug-in asks for it
        # kept out of petlprof --help's imports
        from petlprof.side_tuning import SideTunedModel

        return SideTunedModel
    raise AttributeError(f"module 'petlprof' has no attribute {name!r}")
