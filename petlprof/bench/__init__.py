"""Cost regression checks for CI: one training step of a method profiled and held against a baseline.

Owns the step profile and its side-by-side ratios (``profile``) and the pytest plug-in with its
``petlprof_bench`` fixture (``plugin``, the ``pytest11`` entry point ``petlprof``).
"""
