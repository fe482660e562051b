"""The text a run fine-tunes on and is scored with.

Owns the records every task loader returns and the objectives (``base``), labelled tasks and the one loader
of every kind (``labelled``), prompt/target tasks for the language-modelling objective (``generative``), the
user's files (``files``: CSV, TSV, JSON Lines, Parquet, splits) and the metrics with their directions
(``metrics``).  Never imports torch or a model: a task is data.
"""
