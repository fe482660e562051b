"""Where the runs of a sweep execute: executors, worker processes, the warm worker.

Owns the local and Ray executors (``executors``), the worker process a run executes in (``worker``) and how
it is started and tied to its parent (``process``), and the sweep's warm worker that forks one child per run
(``warm``).  What runs inside a worker is :mod:`petlprof.run`.
"""
