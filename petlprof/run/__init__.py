"""One run, in the process it executes in: prepare, train, evaluate, infer, generate, record.

Owns the run's steps (``pipeline``: prepare -> phases -> record fields; ``execute``: the three steps, with
a failure turned into a record), the one training and evaluation loop (``train``) and its recipe
(``recipe``), the budget's target checks (``budget``), the side-tuning hidden-state cache (``cache``), the
inference and generation phases (``inference``, ``generation``, ``lm_eval``), the LM objective's batches
(``lm_batches``), the libraries a run imports before its memory baseline (``libraries``) and the ranks of a
data-parallel run (``ranks``, ``distributed``).  Where a run's process comes from is :mod:`petlprof.execution`.
"""
