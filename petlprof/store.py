"""The run store: an append-only JSON Lines file, one schema-versioned record per finished run.

A record is written with one ``write`` of a whole line, flushed and fsync'ed, so an interrupted
sweep never leaves a half record and never loses a finished one.  ``finished_keys`` lets a
re-run skip what is already recorded as ``ok``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"


def append_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=False, default=str) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def finished_keys(path: Path) -> set[str]:
    """Run keys already recorded with status ``ok`` (failed runs are retried)."""
    if not path.exists():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a killed writer is not a finished run
        if record.get("status") == "ok" and record.get("run_key"):
            keys.add(record["run_key"])
    return keys
