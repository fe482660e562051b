"""Where the runs of a sweep execute, and the sweep that drives them.

Owns the sweep's driver (``sweep``: lock the store, check, run what is not yet recorded, append each record,
cancel on interrupt), the local and Ray executors (``executors``), a run in a child process and its lifecycle
(``child``: a fresh interpreter or a fork of the warm worker, timeouts, lost processes), the worker process a
run executes in (``worker``) and how it is started and tied to its parent (``process``), the sweep's warm
worker that forks one child per run (``warm``), and torchrun's launch of a data-parallel run with the cause of
its failure (``launch``).  What runs inside a worker is :mod:`petlprof.run`.
"""
