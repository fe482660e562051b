"""Fine-tuning method implementations, installed as ``petlprof.methods``.

Importing this package registers every built-in method's light spec (name, config, default
learning rate); each method's torch/peft code is imported only when a run applies it.
"""

from petlprof.methods import (  # noqa: F401  (self-registering)
    adapter,
    bitfit,
    full,
    ia3,
    linear_probe,
    lora,
    lst,
    prefix_tuning,
    prompt_tuning,
    read,
    zero_shot,
)
