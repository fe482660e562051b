"""The report's bottom line and what it rests on: the Wilson interval of a one-seed share-of-samples score (known
values, edges), that interval and its caption in the costs table, the mark beside every figure a contended window
measured (and on no count), and the bottom line's sentences for sweeps with a clear winner, with differences within
their intervals, with one seed, and on a contended machine.

Records are built with ``tests/test_report.py``'s :func:`record` and :func:`seeds_of`.
"""

from __future__ import annotations

import math

import pytest
from test_report import record, seeds_of

from petlprof.report.bottom_line import HEADING, bottom_line
from petlprof.report.frame import runs_frame, summarise
from petlprof.report.intervals import wilson_interval
from petlprof.report.markdown import render_report
from petlprof.report.table import (
    CONTENDED_MARK,
    CONTENDED_NOTE,
    COSTS_CAPTION,
    MORE_CAPTION,
    VS_CAPTION,
    configuration_sections,
)

NAN = math.nan

WILSON_CASES = [
    # (id, proportion, samples, (low, high)): by hand, z = 1.959964 (95%), n' = n + z^2:
    # centre (x + z^2/2) / n', half z sqrt(n) / n' * sqrt(p (1 - p) + z^2 / (4 n))
    ("80 of 100", 0.8, 100, (0.7112, 0.8666)),
    ("50 of 100", 0.5, 100, (0.4038, 0.5962)),
    ("0 of 10: low is exactly 0", 0.0, 10, (0.0, 0.2775)),
    ("10 of 10: high is exactly 1", 1.0, 10, (0.7225, 1.0)),
    ("1 of 1", 1.0, 1, (0.2065, 1.0)),
    ("no samples", 0.5, 0, (NAN, NAN)),
    ("sample count unknown", 0.5, None, (NAN, NAN)),
    ("sample count NaN", 0.5, NAN, (NAN, NAN)),
    ("no score", None, 100, (NAN, NAN)),
    ("score NaN", NAN, 100, (NAN, NAN)),
    ("not a proportion", 1.5, 100, (NAN, NAN)),
]


@pytest.mark.parametrize(
    "proportion, samples, expected", [c[1:] for c in WILSON_CASES], ids=[c[0] for c in WILSON_CASES]
)
def test_wilson_interval_of_a_proportion(proportion, samples, expected):
    low, high = wilson_interval(proportion, samples)
    assert (low, high) == (
        pytest.approx(expected[0], abs=5e-5, nan_ok=True),
        pytest.approx(expected[1], abs=5e-5, nan_ok=True),
    )
    assert (proportion != 0.0 or low == 0.0) and (proportion != 1.0 or high == 1.0)  # exactly, not 1e-17 off


def costs_rows(records):
    """{method: row} of the quality-and-costs table, and the notes under it."""
    (section,) = configuration_sections(runs_frame(records))
    table = dict(section.tables)[COSTS_CAPTION]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:] if line.startswith("|")}
    notes = [line for line in table.splitlines() if line and not line.startswith("|")]
    return rows, notes


INTERVAL_CASES = [
    # (id, primary metric, seeds' accuracy, eval samples, cell shown, a note under the table says)
    (
        "accuracy, one seed",
        "accuracy",
        [0.8],
        100,
        "0.8000 [0.7112, 0.8666]",
        "from the 100 evaluation samples; one seed",
    ),
    ("exact match, one seed", "exact_match", [0.5], 100, "0.5000 [0.4038, 0.5962]", "binomial (Wilson)"),
    ("several seeds: over seeds", "accuracy", [0.8, 0.9], 100, "0.8500 ± 0.6353", None),
    ("f1 is no share of samples", "f1", [0.8], 100, "| 0.8000 |", "A one-seed f1 has no interval"),
    ("sample count unknown", "accuracy", [0.8], None, "| 0.8000 |", None),
]


@pytest.mark.parametrize(
    "metric, scores, samples, cell, note", [c[1:] for c in INTERVAL_CASES], ids=[c[0] for c in INTERVAL_CASES]
)
def test_a_one_seed_score_has_its_binomial_interval(metric, scores, samples, cell, note):
    records = seeds_of("a", [(s, 100.0) for s in scores])
    for rec in records:
        rec["primary_metric"] = metric
        rec["metrics"][metric] = rec["metrics"]["accuracy"]
        if samples is None:
            rec["task_info"].pop("eval_samples")
        else:
            rec["task_info"]["eval_samples"] = samples
    rows, notes = costs_rows(records)
    assert cell in rows["a"]
    if note is None:
        assert not any("interval" in n for n in notes)
    else:
        assert any(note in n for n in notes)


def test_a_contended_window_marks_its_time_energy_and_latency_and_no_count():
    busy = seeds_of("busy", [(0.8, 100.0), (0.8, 100.0)])  # contended in one seed of two: marked
    busy[1]["train"]["contended"] = True
    busy[0]["train"]["contended"] = busy[0]["eval"]["contended"] = busy[1]["eval"]["contended"] = False
    idle = seeds_of("idle", [(0.7, 50.0)])
    idle[0]["train"]["contended"] = idle[0]["eval"]["contended"] = False
    full = seeds_of("full", [(0.9, 900.0)])
    full[0]["eval"]["contended"] = True  # its evaluation only
    runs = runs_frame(busy + idle + full)
    configs = summarise(runs).set_index("method")
    assert list(configs.loc[["busy", "idle", "full"], "contended"]) == [True, False, False]
    assert list(configs.loc[["busy", "idle", "full"], "eval_contended"]) == [False, False, True]

    (section,) = configuration_sections(runs)
    tables = dict(section.tables)
    header, _, *lines = tables[COSTS_CAPTION].splitlines()
    titles = [c.strip() for c in header.strip("|").split("|")]
    cells = {
        line.split(" | ")[0].lstrip("| "): [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line.startswith("|")
    }
    time, energy, memory = (
        titles.index(t) for t in ("train time (s)", "train energy (J, measured)", "train peak mem (MiB)")
    )
    params = titles.index("trainable params (count)")
    assert cells["busy"][time].endswith(CONTENDED_MARK) and cells["busy"][energy].endswith(CONTENDED_MARK)
    assert not cells["idle"][time].endswith(CONTENDED_MARK) and not cells["idle"][energy].endswith(CONTENDED_MARK)
    assert not cells["full"][time].endswith(CONTENDED_MARK)  # its training was not contended
    assert not any(cells[m][i].endswith(CONTENDED_MARK) for m in cells for i in (memory, params))  # counts
    assert CONTENDED_NOTE in tables[COSTS_CAPTION]

    more = {line.split(" | ")[0].lstrip("| "): line for line in tables[MORE_CAPTION].splitlines()[2:]}
    assert f"{CONTENDED_MARK} |" in more["full"] and CONTENDED_MARK not in more["busy"]  # eval latency: the eval's
    vs = {line.split(" | ")[0].lstrip("| "): line for line in tables[VS_CAPTION].splitlines()[2:]}
    assert CONTENDED_MARK in vs["busy"] and CONTENDED_MARK not in vs["idle"]


def test_no_mark_and_no_note_where_no_window_was_contended():
    records = seeds_of("a", [(0.8, 100.0)]) + seeds_of("b", [(0.7, 50.0)])
    records[0]["train"]["contended"] = False  # the others say nothing: records from before the contention meter
    (section,) = configuration_sections(runs_frame(records))
    assert all(CONTENDED_MARK not in table for _, table in section.tables)


def bottom_text(records):
    lines = bottom_line(runs_frame(records))
    assert lines[0] == HEADING
    return " ".join(lines[1:])


BOTTOM_LINE_CASES = [
    # (id, {method: [(accuracy, train energy J) per seed]}, what the bottom line says, what it must not)
    (
        "one dominates, told apart",
        {
            "read": [(0.90, 150.0), (0.91, 160.0), (0.89, 155.0)],
            "full": [(0.85, 1000.0), (0.86, 1100.0), (0.84, 1050.0)],
        },
        [
            "read k=read (accuracy 0.9000, 155.0 J measured) dominates on accuracy against training energy: "
            "every other configuration (full k=full) scores no better and uses no less energy.",
            "Best mean accuracy: read k=read (0.9000, 3 seeds); told apart from it (worse by more than the 95% "
            "interval of the difference, Welch's t): full k=full (−0.0500 ± 0.0227).",
        ],
        ["not told apart", "One seed"],
    ),
    (
        "a trade-off, not told apart",
        {"read": [(0.80, 150.0), (0.90, 160.0)], "full": [(0.86, 1000.0), (0.87, 1100.0)]},
        [
            "On the frontier of accuracy against training energy, cheapest first: read k=read (accuracy 0.8500, "
            "155.0 J measured); full k=full (accuracy 0.8650, 1,050.0 J measured).",
            "Best mean accuracy: full k=full (0.8650, 2 seeds); not told apart from it at these seeds (the difference "
            "is within its 95% interval): read k=read (−0.0150 ±",
        ],
        ["dominates", "told apart from it (worse"],
    ),
    (
        "one seed each: the intervals come from the evaluation samples",
        {"read": [(0.80, 150.0)], "full": [(0.85, 1000.0)]},
        [
            "Best mean accuracy: full k=full (0.8500, 1 seed). One seed per configuration, so no difference is set "
            "against seed-to-seed variation: the intervals in the tables are binomial, from the 1000 evaluation "
            "samples, not from seeds (the best's: [0.8265, 0.8708])",
        ],
        ["Welch"],
    ),
]


@pytest.mark.parametrize(
    "configs, says, not_said", [c[1:] for c in BOTTOM_LINE_CASES], ids=[c[0] for c in BOTTOM_LINE_CASES]
)
def test_the_bottom_line_says_who_is_on_the_frontier_and_what_can_be_told_apart(configs, says, not_said):
    text = bottom_text([r for method, seeds in configs.items() for r in seeds_of(method, seeds)])
    for sentence in says:
        assert sentence in text
    for words in not_said:
        assert words not in text
    assert "Against training peak memory the frontier is" in text and "MiB" in text


def test_the_bottom_line_of_a_metric_that_is_no_share_of_samples():
    records = seeds_of("read", [(0.8, 150.0)]) + seeds_of("full", [(0.85, 1000.0)])
    for rec in records:
        rec["primary_metric"] = "f1"
    text = bottom_text(records)
    assert "f1 is not a share of the evaluation samples, so the tables give it no interval" in text
    assert "binomial" not in text


def test_the_bottom_line_names_contended_runs_and_leaves_out_random_weights():
    records = seeds_of("read", [(0.9, 150.0)]) + seeds_of("full", [(0.85, 1000.0)])
    records[0]["train"]["contended"] = records[1]["eval"]["contended"] = True
    text = bottom_text(records)
    assert f"150.0 J{CONTENDED_MARK} measured" in text
    assert f"(marked {CONTENDED_MARK} in the tables): read k=read (training), full k=full (evaluation)." in text
    for rec in records:
        rec["backbone_info"]["random_init"] = True
    text = bottom_text(records)
    assert "No finished run has a score that means something" in text and "frontier" not in text


def test_the_bottom_line_has_an_item_per_task_and_comes_right_after_the_title():
    records = seeds_of("read", [(0.9, 150.0)], task="t1") + seeds_of("full", [(0.85, 1000.0)], task="t2")
    lines = bottom_line(runs_frame(records))
    assert [line.split(":**")[0] for line in lines if line.startswith("- ")] == ["- **t1 on minilm", "- **t2 on minilm"]
    report = render_report(records, runs_frame(records), [])
    title, blank, heading, *_ = report.splitlines()
    assert title.startswith("# petlprof report") and (blank, heading) == ("", HEADING)
    assert report.index(HEADING) < report.index("## How far to trust the energy figures")


def test_the_bottom_line_without_a_finished_run():
    failed = record("full", {}, 0, 0.9, 100.0, "measured", 10, status="failed")
    assert "No run finished" in " ".join(bottom_line(runs_frame([failed])))


def test_the_all_runs_table_marks_a_contended_runs_time_and_energy_not_its_memory():
    from petlprof.report.table import summary_table

    records = seeds_of("busy", [(0.8, 100.0), (0.7, 120.0)])
    records[1]["train"]["contended"] = True
    records[0]["train"]["contended"] = False
    table = summary_table(records, fmt="markdown")
    rows = [line for line in table.splitlines() if line.startswith("| busy")]
    assert [row.count(CONTENDED_MARK) for row in rows] == [0, 2]  # seed 1: train time and energy, not memory
    assert table.endswith(CONTENDED_NOTE)


def test_the_cost_to_target_table_marks_a_contended_configuration_and_a_contended_reference():
    from petlprof.report.target import target_tables

    records = []
    for method, energy, busy in (("full", 300.0, True), ("busy", 100.0, False)):
        for seed, line in enumerate(seeds_of(method, [(0.8, energy), (0.8, energy)])):
            line["train"]["budget"] = {
                "target_metric": "accuracy", "target_value": 0.7, "reached": True, "reached_at_step": 10,
                "stop_reason": "target", "energy_to_target_j": energy, "time_to_target_s": 5.0,
            }  # fmt: skip
            line["train"]["contended"] = busy and seed == 0
            records.append(line)
    ((_, _, table),) = target_tables(runs_frame(records))
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "ref" + CONTENDED_MARK in rows["full"] and CONTENDED_MARK not in rows["busy"]
    assert table.endswith(CONTENDED_NOTE)


def test_the_bottom_line_of_the_zero_shot_model_alone_says_nothing_was_tuned():
    records = seeds_of("zero_shot", [(0.6, 0.0)])
    assert "Nothing was tuned (the zero-shot model alone)" in "\n".join(bottom_line(runs_frame(records)))
