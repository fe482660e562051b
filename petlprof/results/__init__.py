"""What a run leaves behind: figures, records, the store and the environment.

Owns every measured figure's declaration (``figures``), the result record's fields, statuses and schema
(``records``), the append-only JSON Lines store with its lock (``store``) and the environment provenance each
record carries (``environment``).  The lowest layer but the root leaves: it imports nothing of the run, its
execution or the report.
"""
