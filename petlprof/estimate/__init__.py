"""``petlprof estimate``: every method's memory and compute at any model size, from the config alone.

:func:`estimate` builds the model a run would train on the meta device (no weight allocated),
traces one training step and one inference batch, and returns one ``estimates.jsonl`` record;
:mod:`petlprof.estimate.command` is the command line around it.
"""

from petlprof.estimate.core import Settings, estimate
from petlprof.estimate.model import resolve_backbone, shape_names

__all__ = ["Settings", "estimate", "resolve_backbone", "shape_names"]
