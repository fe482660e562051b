"""petlprof: energy, memory and latency profiling of parameter-efficient fine-tuning methods.

The package is the harness (CLI, registry, backbones, tasks, training loop, meters, result
store, Pareto reports); the method implementations live in ``petlprof.methods``.
Importing this package is cheap: torch, transformers and NVML are imported only when used.
"""

__version__ = "0.1.0"
