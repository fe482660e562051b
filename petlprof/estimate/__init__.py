"""``petlprof estimate``: every method's memory and compute at any model size, from the config alone.

:func:`petlprof.estimate.core.estimate` builds the model a run would train on the meta device (no
weight allocated), traces one training step and one inference batch, and returns one
``estimates.jsonl`` record; :mod:`petlprof.estimate.command` is the command line around it.  Importing
this package is cheap (no torch): the sub-modules import what they need.
"""
