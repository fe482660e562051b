"""Fuzzing the two readers of user-controlled text: no input may crash them with an unexpected
exception.  The config loader either returns options or raises UsageError; the results reader
returns the usable records and reports the rest."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from petlprof.errors import UsageError
from petlprof.report import load_records
from petlprof.results.result import RunResult
from petlprof.sweep.config import build_options, load_config_file, parse_method_overrides

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KEYS = st.sampled_from(
    [
        "methods",
        "backbone",
        "task",
        "seeds",
        "epochs",
        "max_steps",
        "train_size",
        "eval_size",
        "batch_size",
        "lr",
        "max_length",
        "device",
        "energy_meter",
        "output",
        "in_process",
        "method_config",
        "timeout",
        "max_memory",
        "warmup_steps",
        "num_layers",
        "inference_window_s",
        "cache_budget",
        "eval_every",
        "target_eval_size",
        "target_value",
        "max_train_time",
        "cpus_per_run",
        "nproc_per_run",
        "bogus",
    ]
)
# numbers at the edges, as numbers and as the text a YAML file or a command line gives
EDGES = st.sampled_from(
    [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 10**30, -(10**30), -0.0, 0, 2**63, 2**64, 5e-324]
)
NUMERIC_TEXT = st.sampled_from(
    ["1e-3", "1e308", "-1e308", "nan", ".nan", "inf", "-inf", "-0", "-0.0", "9" * 400, "1E3"]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    EDGES,
    NUMERIC_TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)


@FUZZ
@given(text=st.text(max_size=200), suffix=st.sampled_from([".toml", ".yaml", ".yml"]))
def test_config_files_of_any_text(tmp_path_factory, text, suffix):
    path = tmp_path_factory.mktemp("cfg") / f"sweep{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        build_options(load_config_file(str(path)), {})
    except UsageError:
        pass


@FUZZ
@given(values=st.dictionaries(KEYS, VALUES, max_size=6))
def test_config_values_of_any_shape(values):
    try:
        build_options(values, {})
    except UsageError:
        pass


EDGE_OPTIONS = st.sampled_from(
    ["seeds", "epochs", "warmup_steps", "num_layers", "lr", "timeout", "max_memory", "cache_budget", "max_length"]
    + ["inference_window_s", "train_size", "batch_size", "eval_every", "max_train_time", "target_value"]
)


@settings(max_examples=60, deadline=None)
@given(name=EDGE_OPTIONS, value=st.one_of(EDGES, NUMERIC_TEXT))
def test_numbers_at_the_edges_are_refused_or_sane(name, value):
    """A value at the edge is either refused with one line or kept inside the option's declared range."""
    import math

    from petlprof.sweep.options import kind_of

    values = {"methods": ["read"], name: value}
    if name in ("eval_every",):
        values["target_value"] = 0.5
    if name == "cache_budget":
        values["cache_hidden_states"] = True
    try:
        options = build_options(values, {})
    except UsageError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
        return
    kept = getattr(options, name)
    for item in kept if isinstance(kept, list) else [kept]:
        assert not (isinstance(item, float) and not math.isfinite(item)), (name, value)
        if isinstance(item, (int, float)) and getattr(kind_of(name), "maximum", None) is not None:
            assert item <= kind_of(name).maximum


@settings(max_examples=60, deadline=None)
@given(text=st.one_of(NUMERIC_TEXT, st.text(max_size=30)))
def test_method_config_values_of_any_text(text):
    try:
        parsed = parse_method_overrides([f"lora.alpha={text}"])
    except UsageError:
        return
    assert set(parsed) == {"lora"} and set(parsed["lora"]) == {"alpha"}


RECORDS = st.one_of(
    st.text(max_size=80),
    st.builds(json.dumps, VALUES),
    st.builds(
        lambda d: json.dumps({"schema_version": 1, "status": "ok", "method": "read", **d}),
        st.dictionaries(
            st.sampled_from(
                [
                    "train",
                    "eval",
                    "metrics",
                    "method_config",
                    "seed",
                    "task",
                    "backbone",
                    "trainable_params",
                    "error",
                    "primary_metric",
                ]
            ),
            VALUES,
            max_size=5,
        ),
    ),
)


@FUZZ
@given(lines=st.lists(RECORDS, max_size=6))
def test_results_files_of_any_lines(tmp_path_factory, lines):
    from petlprof.report import summary_table

    path = tmp_path_factory.mktemp("res") / "results.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    skipped: list[str] = []
    records = load_records([path], skipped)
    with path.open(encoding="utf-8", errors="replace") as fh:
        non_blank = sum(1 for line in fh if line.strip())
    # every line is either used or reported; of the used ones, a run's last attempt is kept
    assert 0 < len(records) + len(skipped) <= non_blank or non_blank == 0
    assert len({r.run_key for r in records if r.run_key}) == sum(1 for r in records if r.run_key)
    assert all(isinstance(r, RunResult) and isinstance(r.to_json(), dict) for r in records)
    summary_table(records)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(RECORDS, min_size=1, max_size=4))
def test_reports_render_from_any_usable_records(tmp_path_factory, lines):
    from petlprof.report import write_report

    folder = tmp_path_factory.mktemp("rep")
    (folder / "results.jsonl").write_text("\n".join(lines), encoding="utf-8")
    written = write_report(load_records([folder], []), folder)
    assert (folder / "report.md") in written
