"""What a run leaves behind: figures, records, the store and the environment.

Owns every measured figure's declaration (``figures``), the result record's fields, statuses and schema
(``records``: TypedDicts for the side that writes), the typed read side that reports and the API use
(``result``: ``RunResult`` and its parts, built from a record and written back unchanged), the append-only JSON
Lines store with its lock (``store``) and the environment provenance each record carries (``environment``).
It stands just above the base layer (``petlprof.values``, ``vocabulary``, ``errors``, ``lookup``): it imports
nothing of the run, its execution or the report.
"""
