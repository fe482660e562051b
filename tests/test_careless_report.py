"""Careless input, round two (issue 28): a results file that cannot be read, and records the reader rejects.

* D1 — a ``results.jsonl`` that is a folder or unreadable ends ``petlprof run`` and ``petlprof report`` with
  one line naming the path and the problem, exit code 2, nothing written and no traceback.
* D4 — ``run`` and ``report`` read the store with one reader: a record it rejects (a mistyped field,
  another schema version) is not a finished run, so ``run`` runs its key again, and report.md names the
  line (number, run key, why); the line itself stays in the file.

Each case is a row of a table fed to one shared check.
"""

from __future__ import annotations

import errno
import io
import json

import pytest

from petlprof.cli import main
from petlprof.report import load_records, write_report
from petlprof.results.records import RESULTS_FILE
from petlprof.results.store import finished_keys


def folder_in_place(results):
    results.mkdir(parents=True)


def unreadable(results, monkeypatch):
    """A results file open() refuses, as for a user without read permission (tests run as root, who may
    read a chmod 000 file anyway)."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(record("a")) + "\n")
    real_open = io.open

    def refusing_open(file, *args, **kwargs):
        if str(file) == str(results):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", refusing_open)


D1 = [
    # (id, command, how the results file is broken, what the error line says)
    ("run: results file is a folder", "run", "folder", "is a folder, not a file"),
    ("report: results file is a folder", "report", "folder", "is a folder, not a file"),
    ("run: results file unreadable", "run", "unreadable", "cannot read the results file"),
    ("report: results file unreadable", "report", "unreadable", "cannot read the results file"),
]


@pytest.mark.parametrize("command, broken, expected", [c[1:] for c in D1], ids=[c[0] for c in D1])
def test_unusable_results_file_is_one_line_exit_2_nothing_written(
    command, broken, expected, tmp_path, monkeypatch, capsys
):
    store = tmp_path / "store"
    results = store / RESULTS_FILE
    if broken == "folder":
        folder_in_place(results)
    else:
        unreadable(results, monkeypatch)
    before = sorted(p.name for p in store.iterdir())
    out = tmp_path / "report-out"
    argv = ["run", "--methods", "bitfit", "--output", str(store)] if command == "run" else ["report", str(store)]
    code = main(argv + (["--output", str(out)] if command == "report" else []))
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert expected in err and str(results) in err, err
    assert sorted(p.name for p in store.iterdir()) == before and not out.exists()


def record(key, **changes):
    base = {
        "schema_version": 1,
        "run_key": key,
        "status": "ok",
        "error": None,
        "method": "bitfit",
        "method_config": {},
        "backbone": "minilm",
        "task": "tweets",
        "seed": 0,
        "primary_metric": "accuracy",
        "metrics": {"accuracy": 0.8},
        "train": {"time_s": 1.0, "energy_j": 10.0, "energy_kind": "measured", "peak_memory_bytes": 2**20},
    }
    return {**base, **changes}


D4 = [
    # (id, the rejected line's record (or text), its run key as report.md shows it, why)
    ("seed mistyped", record("b", seed="zero"), "b", "field 'seed' is a str, not int"),
    ("schema version 99", record("b", schema_version=99), "b", "unsupported schema_version 99"),
    ("metrics a list", record("b", metrics=[0.8]), "b", "field 'metrics' is a list, not dict"),
    ("params as text", record("b", trainable_params="many"), "b", "field 'trainable_params' is a str, not int"),
    ("torn line", '{"schema_version": 1, "run_key": "b", "sta', "-", "malformed result record"),
]


@pytest.mark.parametrize("bad, key, why", [c[1:] for c in D4], ids=[c[0] for c in D4])
def test_a_rejected_record_is_rerun_by_run_and_named_by_report(bad, key, why, tmp_path):
    store = tmp_path / RESULTS_FILE
    line = bad if isinstance(bad, str) else json.dumps(bad)
    store.write_text(f"{json.dumps(record('a'))}\n{line}\n")
    written = store.read_bytes()

    assert finished_keys(store) == {"a"}  # run skips a, runs b again
    skipped: list[str] = []
    records = load_records([store], skipped)
    assert [r.run_key for r in records] == ["a"] and len(skipped) == 1 and why in skipped[0]

    write_report(records, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    section = report.split("## Rejected lines of the results", 1)[1].split("\n## ", 1)[0]
    assert f"| {store} | 2 | {key} | {why}" in section
    assert store.read_bytes() == written  # the store is append-only: the bad line stays for its owner
