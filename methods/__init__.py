"""Fine-tuning method implementations, installed as ``petlprof.methods``.

Each built-in method's module defines its light spec as ``SPEC`` (name, config, default learning
rate); :data:`petlprof.registry.BUILTIN_METHODS` lists them, and the registry imports one only when
its method is asked for.  A method's torch/peft code is imported only when a run applies it.
"""
