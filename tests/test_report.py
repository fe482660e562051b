"""Tests for Pareto fronts, the summary and configuration tables, loading the run store, the
DataFrame API and write_report.

Pareto fronts are checked against tables of hand-worked cases, per point and across seeds; the
report is checked on a small synthetic sweep holding a measured and an estimated energy figure, two
seeds of one configuration, a dominated configuration and an out-of-memory run, and on the stored
fixture ``tests/fixtures/report/results.jsonl`` (two seeds of every default grid point).
"""

from __future__ import annotations

import copy
import json
import math
import re

import matplotlib.image
import pytest

from petlprof.errors import UsageError
from petlprof.report import load_records, summary_table, write_report
from petlprof.report.frame import runs_frame
from petlprof.report.pareto import pareto_front
from petlprof.report.plots import ENERGY_AXIS, MEMORY_AXIS, cost_label, wants_log_scale
from petlprof.results.result import RunResult

MIB = 2**20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OOM_ERROR = "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
ESTIMATE_MODEL = "process CPU time x 10.0 W per core"


def P(**values):
    return values


PARETO_CASES = [
    # (id, objectives, points, expected front)
    (
        "higher-lower",
        ["accuracy", "energy_j"],
        [
            P(accuracy=0.9, energy_j=100),
            P(accuracy=0.8, energy_j=50),
            P(accuracy=0.7, energy_j=80),
            P(accuracy=0.9, energy_j=120),
        ],
        [0, 1],
    ),
    ("lower-higher order", ["energy_j", "accuracy"], [P(accuracy=0.7, energy_j=80), P(accuracy=0.8, energy_j=50)], [1]),
    (
        "equal points both kept",
        ["accuracy", "energy_j"],
        [P(accuracy=0.9, energy_j=100), P(accuracy=0.9, energy_j=100), P(accuracy=0.8, energy_j=200)],
        [0, 1],
    ),
    (
        "tie in one, better in other",
        ["accuracy", "energy_j"],
        [P(accuracy=0.9, energy_j=100), P(accuracy=0.9, energy_j=90)],
        [1],
    ),
    (
        "None never on front, removes nothing",
        ["accuracy", "energy_j"],
        [P(accuracy=0.99, energy_j=None), P(accuracy=0.8, energy_j=50), P(accuracy=0.7, energy_j=60)],
        [1],
    ),
    (
        "missing key and NaN",
        ["accuracy", "energy_j"],
        [P(accuracy=0.99), P(accuracy=math.nan, energy_j=1), P(accuracy=0.5, energy_j=9)],
        [2],
    ),
    (
        "three objectives",
        ["accuracy", "energy_j", "peak_memory_bytes"],
        [
            P(accuracy=0.9, energy_j=100, peak_memory_bytes=1000),
            P(accuracy=0.85, energy_j=50, peak_memory_bytes=2000),
            P(accuracy=0.8, energy_j=60, peak_memory_bytes=500),
            P(accuracy=0.8, energy_j=110, peak_memory_bytes=2000),
        ],
        [0, 1, 2],
    ),
    (
        "three objectives, one dominates all",
        ["accuracy", "time_s", "trainable_params"],
        [
            P(accuracy=0.7, time_s=5, trainable_params=10),
            P(accuracy=0.9, time_s=1, trainable_params=1),
            P(accuracy=0.9, time_s=2, trainable_params=1),
        ],
        [1],
    ),
    (
        "all higher",
        ["accuracy", "f1"],
        [P(accuracy=0.9, f1=0.5), P(accuracy=0.8, f1=0.8), P(accuracy=0.7, f1=0.4)],
        [0, 1],
    ),
    (
        "all lower",
        ["energy_j", "time_s"],
        [P(energy_j=10, time_s=5), P(energy_j=5, time_s=10), P(energy_j=10, time_s=10)],
        [0, 1],
    ),
    ("one objective", ["energy_j"], [P(energy_j=3), P(energy_j=1), P(energy_j=1)], [1, 2]),
    ("no points", ["accuracy", "energy_j"], [], []),
]


@pytest.mark.parametrize(
    "objectives, points, expected", [c[1:] for c in PARETO_CASES], ids=[c[0] for c in PARETO_CASES]
)
def test_pareto_front(objectives, points, expected):
    assert pareto_front(points, objectives) == expected


@pytest.mark.parametrize("objectives, error", [([], ValueError), (["accuracy", "no_such_metric"], KeyError)])
def test_pareto_front_rejects_bad_objectives(objectives, error):
    with pytest.raises(error):
        pareto_front([P(accuracy=1.0)], objectives)


def phase(energy_j, kind, memory_mib, p50_s=0.0125, source=None):
    figures = {
        "time_s": 60.0,
        "steps": 61,
        "samples": 1952,
        "samples_per_s": 32.5,
        "energy_j": energy_j,
        "energy_kind": kind,
        "energy_source": source or ("estimate" if kind == "estimated" else "rapl"),
        "peak_memory_bytes": int(memory_mib * MIB),
        "memory_source": "rss-hwm",
        "latency_s": {"p50": p50_s, "p90": p50_s * 1.2, "p99": p50_s * 1.5, "mean": p50_s * 1.1},
    }
    if kind == "estimated":
        figures["energy_model"] = ESTIMATE_MODEL
    return figures


def record(method, config, seed, accuracy, energy_j, kind, memory_mib, task="tweets", status="ok"):
    rec = {
        "schema_version": 1,
        "run_key": f"{method}-{json.dumps(config, sort_keys=True)}-{seed}-{task}",
        "status": status,
        "error": None,
        "method": method,
        "method_config": config,
        "backbone": "minilm",
        "backbone_info": {"family": "encoder", "num_layers": 6, "hidden_size": 384},
        "task": task,
        "task_info": {
            "num_labels": 2,
            "label_names": ["negative", "positive"],
            "train_samples": 2000,
            "eval_samples": 1000,
            "description": "tweet sentiment",
        },
        "primary_metric": "accuracy",
        "seed": seed,
        "training": {
            "epochs": 1,
            "max_steps": None,
            "batch_size": 32,
            "lr": 5e-4,
            "max_length": 64,
            "warmup_steps": 2,
            "device": "cpu",
        },
        "trainable_params": 148226,
        "total_params": 22861826,
        "metrics": {"accuracy": accuracy, "f1": accuracy - 0.05},
        "train": phase(energy_j, kind, memory_mib),
        "eval": phase(energy_j / 10, kind, memory_mib / 2),
        "env": {"petlprof": "0.1.0", "torch": "2.13.0", "python": "3.11.7", "device": "cpu"},
    }
    return rec


def sweep():
    oom = {
        "schema_version": 1,
        "run_key": "oom",
        "status": "oom",
        "error": OOM_ERROR,
        "method": "lora",
        "method_config": {"r": 64, "alpha": 128},
        "backbone": "minilm",
        "task": "tweets",
        "primary_metric": "accuracy",
        "seed": 0,
    }
    return [
        record("full", {}, 0, 0.90, 5000.0, "measured", 900),
        record("full", {}, 1, 0.92, 5400.0, "measured", 900),
        record("bitfit", {}, 0, 0.85, 800.0, "estimated", 500),
        record("lora", {"r": 8, "alpha": 16}, 0, 0.88, 1200.0, "estimated", 600),
        record("lora", {"r": 4, "alpha": 8}, 0, 0.80, 1300.0, "estimated", 650),  # dominated on both costs
        oom,
    ]


def front_line(report_text, figure_name):
    """The 'configurations on the Pareto front' sentence written under a figure."""
    after = report_text.split(f"]({figure_name})", 1)[1]
    return next(line for line in after.splitlines() if "Pareto front:" in line)


PLOTS = [
    f"pareto_accuracy_vs_{cost}.{fmt}" for cost in ("energy", "memory", "params", "time") for fmt in ("png", "svg")
]


def test_write_report_writes_valid_pngs_and_report(tmp_path):
    written = write_report(sweep(), tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == sorted(PLOTS + ["report.md", "report.html"])
    for path in written:
        assert path.is_file() and path.parent == tmp_path / "out"
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == PNG_MAGIC
            height, width = matplotlib.image.imread(path).shape[:2]
            assert height > 300 and width > 300


def test_report_md_contents(tmp_path):
    records = sweep()
    write_report(records, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert summary_table(records, fmt="markdown") in report
    assert "estimated" in report and ESTIMATE_MODEL in report
    assert "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" in report
    assert "](pareto_accuracy_vs_energy.png)" in report and "](pareto_accuracy_vs_memory.png)" in report
    assert "warm-up" in report and "rss-hwm" in report and "2.13.0" in report
    for figure in ("pareto_accuracy_vs_energy.png", "pareto_accuracy_vs_memory.png"):
        line = front_line(report, figure)
        assert "full" in line and "bitfit" in line and "lora r=8 alpha=16" in line
        assert "r=4" not in line


@pytest.mark.parametrize(
    "kinds, must, must_not",
    [
        (["measured"], ["Train energy (J)", "source: rapl"], ["estimated"]),
        (["estimated"], ["(estimated)", "source: estimate"], []),
        (["measured", "estimated"], ["(estimated", "sources: rapl, estimate"], []),
    ],
)
def test_energy_axis_label_says_estimated(kinds, must, must_not):
    records = [record("full", {}, i, 0.9, 100.0, kind, 10) for i, kind in enumerate(kinds)]
    runs = runs_frame(records)
    label = cost_label(ENERGY_AXIS, runs)
    assert all(text in label for text in must), label
    assert not any(text in label for text in must_not), label
    assert "estimated" not in cost_label(MEMORY_AXIS, runs) and "MiB" in cost_label(MEMORY_AXIS, runs)


@pytest.mark.parametrize(
    "values, log", [([800, 5400], False), ([100, 1001], True), ([0.0, 5000], False), ([7, 7], False)]
)
def test_log_scale_only_for_wide_positive_spread(values, log):
    assert wants_log_scale(values) is log


def test_one_plot_per_task_named_by_task(tmp_path):
    records = sweep() + [record("bitfit", {}, 0, 0.7, 300.0, "measured", 400, task="sst2")]
    names = {p.name for p in write_report(records, tmp_path)}
    assert {
        "pareto_accuracy_vs_energy_tweets.png",
        "pareto_accuracy_vs_energy_sst2.png",
        "pareto_accuracy_vs_memory_tweets.png",
        "pareto_accuracy_vs_memory_sst2.png",
    } <= names


def test_report_without_plottable_runs_says_why(tmp_path):
    no_energy = copy.deepcopy(sweep())
    for rec in no_energy:
        if "train" in rec:
            rec["train"]["energy_j"] = None
    names = {p.name for p in write_report(no_energy, tmp_path)}
    assert names == {p for p in PLOTS if "energy" not in p} | {"report.md", "report.html"}
    assert (
        "Not plotted: none of the 5 finished run(s) has both accuracy and train energy_j"
        in (tmp_path / "report.md").read_text()
    )

    only_failed = [r for r in sweep() if r["status"] != "ok"]
    assert [p.name for p in write_report(only_failed, tmp_path / "failed")] == ["report.md", "report.html"]
    report = (tmp_path / "failed" / "report.md").read_text()
    assert "Not plotted" in report and "CUDA out of memory" in report


def test_summary_table_headers_carry_units():
    table = summary_table(sweep())
    header = table.splitlines()[0]
    for title in (
        "accuracy",
        "trainable params (count, % of total)",
        "train time (s)",
        "train peak mem (MiB)",
        "train energy (J)",
        "energy kind",
        "eval p50 latency (ms/batch)",
        "error",
    ):
        assert title in header


def test_summary_table_text_rows():
    lines = summary_table(sweep()).splitlines()
    assert set(lines[1]) <= {"-", " "} and len(lines) == 2 + 6
    oom = next(line for line in lines if line.split()[0] == "lora" and "r=64" in line)
    assert " oom " in oom and "RuntimeError: CUDA out of memory" in oom
    bitfit = next(line for line in lines if line.startswith("bitfit"))
    assert "148,226 (0.65%)" in bitfit and "500.0" in bitfit and "800.0" in bitfit and "estimated" in bitfit
    assert "12.5" in bitfit and "0.8500" in bitfit
    assert [line.split()[1] for line in lines if line.startswith("lora")] == ["r=4", "r=8", "r=64"]
    column = lines[0].index("status")
    assert all(line[column:].startswith(("ok", "oom", "status")) for line in lines if not line.startswith("-"))


def test_summary_table_markdown_and_bad_format():
    lines = summary_table(sweep(), fmt="markdown").splitlines()
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    assert "---:" in lines[1] and "train energy (J)" in lines[0]
    with pytest.raises(UsageError, match="table format"):
        summary_table(sweep(), fmt="html")


def test_summary_table_tolerates_bare_failed_record():
    table = summary_table([{"schema_version": 1, "status": "failed", "error": "boom", "method": "read"}])
    assert "failed" in table and "boom" in table


@pytest.mark.parametrize(
    "method, config, label",
    [
        ("lora", {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None}, "r=8"),  # the defaults: the knob only
        ("lora", {"r": 4, "alpha": 32, "dropout": 0.1, "target_modules": None}, "r=4 alpha=32"),
        ("bitfit", {}, "-"),
    ],
)
def test_a_failed_run_is_labelled_like_the_finished_runs_of_its_configuration(method, config, label):
    from petlprof.report.records import config_label
    from petlprof.run.execute import failed_record
    from petlprof.sweep.spec import RunSpec

    failed = failed_record(RunSpec(method=method, method_config=config), "lost with its node")
    assert config_label(RunResult.from_json(failed)) == label
    assert failed["method_config"] == config


@pytest.mark.parametrize(
    "training, label",
    [
        ({"precision": "float32"}, "r=8"),
        ({"precision": "float32", "quantization": {"method": "nf4", "double_quant": True}}, "r=8 nf4"),
        ({"precision": "bfloat16", "quantization": {"method": "int8"}}, "r=8 int8 bf16"),
        ({"precision": "float16"}, "r=8 fp16"),
    ],
)
def test_configurations_that_differ_only_in_their_numbers_are_labelled_apart(training, label):
    """A --quantize none,nf4 or --precision fp32,bf16 sweep: each configuration's rows and points say which."""
    from petlprof.report.records import config_label, run_label

    record = {"method": "lora", "method_config": {"r": 8}, "pareto_knob": "r", "method_config_changed": []}
    assert config_label(RunResult.from_json({**record, "training": training})) == label
    assert run_label(RunResult.from_json({"method": "bitfit", "method_config": {}, "training": training})) == " ".join(
        ["bitfit", *label.split()[1:]]
    )


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_load_records_reads_files_and_folders(tmp_path):
    records = sweep()
    (tmp_path / "a").mkdir()
    write_jsonl(tmp_path / "a" / "results.jsonl", [json.dumps(r) for r in records[:2]] + [""])
    other = write_jsonl(tmp_path / "other.jsonl", [json.dumps(r) for r in records[2:]])
    assert [r.to_json() for r in load_records([tmp_path / "a", other])] == records


GOOD = '{"schema_version": 1, "status": "ok", "method": "read"}'


@pytest.mark.parametrize(
    "lines, message",
    [
        ([GOOD, '{"schema_version": 1, "status": '], r"results\.jsonl:2: malformed"),  # a torn last line
        (["[1, 2]", GOOD], r"results\.jsonl:1: .*JSON object"),
        (['{"schema_version": 2}', GOOD], r"results\.jsonl:1: unsupported schema_version 2"),
        ([GOOD, '{"schema_version": 1, "status": "ok"}'], r"results\.jsonl:2: record lacks method"),
    ],
)
def test_load_records_skips_bad_lines_and_says_which(tmp_path, lines, message):
    path = write_jsonl(tmp_path / "results.jsonl", lines)
    skipped: list[str] = []
    assert [r.to_json() for r in load_records([path], skipped)] == [json.loads(GOOD)]
    assert len(skipped) == 1 and re.search(message, skipped[0])


def test_load_records_rejects_missing_file(tmp_path):
    with pytest.raises(UsageError, match="no results file"):
        load_records([tmp_path / "nowhere.jsonl"])
    with pytest.raises(UsageError, match="no results file"):
        load_records([tmp_path])


def test_a_resumed_run_shows_as_its_last_attempt(tmp_path):
    cancelled = {
        "schema_version": 1,
        "run_key": "k",
        "status": "cancelled",
        "error": "stopped by SIGINT",
        "method": "read",
    }
    done = {**cancelled, "status": "ok", "error": None}
    other = {**cancelled, "run_key": "j"}
    path = write_jsonl(tmp_path / "results.jsonl", [json.dumps(r) for r in (cancelled, other, done)])
    assert [r.to_json() for r in load_records([path])] == [other, done]


# --- frontiers across seeds, confidence intervals, relative columns (the DataFrame layer) -----------

from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from petlprof.api import frontier, load_results, plot_frontier, relative_to, summarise  # noqa: E402
from petlprof.report.intervals import ci_half_width  # noqa: E402
from petlprof.report.markdown import render_report  # noqa: E402
from petlprof.report.plots import pareto_figures  # noqa: E402
from petlprof.report.table import (  # noqa: E402
    TARGET_CAPTION,
    VS_CAPTION,
    configuration_sections,
    configuration_tables,
)

FIXTURE = Path(__file__).parent / "fixtures" / "report" / "results.jsonl"


def seeds_of(name, runs, method=None, **extra):
    """Records of one configuration: ``runs`` is a list of (accuracy, energy_j) per seed."""
    out = []
    for seed, (acc, energy) in enumerate(runs):
        rec = {**record(method or name, {"k": name}, seed, acc, energy or 1.0, "measured", 100), **extra}
        rec["train"]["energy_j"] = energy
        out.append(rec)
    return out


FRONT_CASES = [
    # (id, configurations, configurations expected on the accuracy-vs-energy front)
    (
        "seed means decide, not the best seed",  # B's seed 0 beats A, but B's mean (0.75) is below A's
        {"A": [(0.8, 100), (0.8, 100)], "B": [(0.9, 100), (0.6, 100)]},
        {"A"},
    ),
    ("equal means are both on the front", {"A": [(0.9, 100), (0.7, 100)], "B": [(0.8, 100)]}, {"A", "B"}),
    ("tie on cost, better mean wins", {"A": [(0.8, 100), (0.9, 100)], "B": [(0.8, 100), (0.8, 100)]}, {"A"}),
    ("tie on quality, cheaper mean wins", {"A": [(0.8, 90), (0.8, 110)], "B": [(0.8, 80), (0.8, 100)]}, {"B"}),
    (
        "a trade-off keeps both",
        {"A": [(0.9, 200), (0.9, 200)], "B": [(0.8, 50), (0.8, 70)], "C": [(0.7, 100)]},
        {"A", "B"},
    ),
    ("a seed missing its energy is left out of the mean", {"A": [(0.8, None), (0.8, 100)], "B": [(0.8, 150)]}, {"A"}),
    ("a configuration with no energy at all is never on the front", {"A": [(0.99, None)], "B": [(0.5, 10)]}, {"B"}),
]


@pytest.mark.parametrize("configs, expected", [c[1:] for c in FRONT_CASES], ids=[c[0] for c in FRONT_CASES])
def test_frontier_across_seeds(configs, expected):
    records = [r for name, runs in configs.items() for r in seeds_of(name, runs)]
    front = frontier(runs_frame(records), x="energy_j", y="accuracy")
    assert set(front.loc[front["on_front"], "method"]) == expected
    assert sorted(front["n_seeds"]) == sorted(len(v) for v in configs.values())


def test_frontier_is_per_task_and_directions_come_from_the_table():
    records = (
        seeds_of("A", [(0.9, 100)], task="t1")
        + seeds_of("B", [(0.5, 50)], task="t2")
        + seeds_of("C", [(0.4, 60)], task="t2")
    )
    front = frontier(runs_frame(records), x="energy_j", y="quality")
    assert set(front.loc[front["on_front"], "method"]) == {"A", "B"}
    # time_s is better lower: the faster of two equally accurate configurations wins
    records = seeds_of("A", [(0.8, 1)]) + seeds_of("B", [(0.8, 1)])
    records[0]["train"]["time_s"], records[1]["train"]["time_s"] = 5.0, 9.0
    front = frontier(runs_frame(records), x="time_s", y="accuracy")
    assert list(front.loc[front["on_front"], "method"]) == ["A"]
    with pytest.raises(KeyError, match="no direction known for metric 'steps'"):
        frontier(runs_frame(records), x="steps", y="accuracy")
    with pytest.raises(KeyError, match="no column 'no_such_metric'"):
        frontier(runs_frame(records), x="energy_j", y="no_such_metric")


@pytest.mark.parametrize(
    "values, expected",
    [
        ([1.0, 2.0, 3.0], 4.302652729911275 * 1.0 / math.sqrt(3)),  # t(0.975, 2) * sd / sqrt(n)
        ([5.0, 5.0], 0.0),
        ([0.8, 0.9], 12.706204736174707 * (0.1 / math.sqrt(2)) / math.sqrt(2)),
        ([0.8], math.nan),
        ([0.8, math.nan], math.nan),
    ],
)
def test_ci_half_width_uses_the_t_distribution(values, expected):
    got = ci_half_width(values)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, rel=1e-9)


def test_summarise_means_and_relative_columns():
    records = seeds_of("full", [(0.90, 1000), (0.92, 1000)]) + seeds_of("read", [(0.89, 150), (0.91, 150)])
    records[2]["train"]["peak_memory_bytes"] = records[3]["train"]["peak_memory_bytes"] = 28 * MIB
    configs = relative_to(summarise(runs_frame(records)))
    read = configs[configs["method"] == "read"].iloc[0]
    assert read["n_seeds"] == 2 and read["accuracy"] == pytest.approx(0.90)
    assert read["energy_j_vs_full_pct"] == pytest.approx(-85.0)
    assert read["peak_memory_bytes_vs_full_pct"] == pytest.approx(-72.0)
    assert read["quality_vs_full"] == pytest.approx(-0.01)
    assert configs[configs["method"] == "full"].iloc[0]["energy_j_vs_full_pct"] == pytest.approx(0.0)
    no_full = relative_to(summarise(runs_frame(records[2:])))
    assert no_full["energy_j_vs_full_pct"].isna().all()


def table_rows(table):
    """{(method, config): row line} of a Markdown table, and its header line."""
    lines = table.splitlines()
    return lines[0], {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in lines[2:]}


def test_configuration_table_from_the_fixture():
    ((task, backbone, table),) = configuration_tables(load_records([FIXTURE]))
    assert (task, backbone) == ("tweets", "minilm")
    header, rows = table_rows(table)
    titles = ["accuracy (mean ± 95% CI)", "train energy (J", "train peak mem (MiB)", "train time (s)"]
    titles += ["trainable params (count)", "on frontier of"]
    assert all(t in header for t in titles)
    assert [header.index(t) for t in titles] == sorted(header.index(t) for t in titles)  # costs first, in order
    assert "vs full" not in header and "latency" not in header
    assert len(rows) == 8  # full, bitfit, 3 lora and 3 read grid points; the oom run is not a configuration
    assert "| 2 |" in rows[("full", "-")] and " ± " in rows[("full", "-")]
    assert "energy, memory, time" in rows[("read", "hidden_size=32")]
    assert [key[1] for key in rows if key[0] == "lora"] == ["r=2", "r=8", "r=32"]  # knob order, not text order


def test_vs_full_table_only_where_full_ran():
    records = load_records([FIXTURE])
    ((_, _, tables),) = [(s.task, s.backbone, dict(s.tables)) for s in configuration_sections(runs_frame(records))]
    header, rows = table_rows(tables[VS_CAPTION])
    for title in ("Δ accuracy vs full", "energy vs full", "memory vs full", "time vs full", "params vs full"):
        assert title in header
    assert rows[("full", "-")].count("| ref") == 5 and "−71%" in rows[("read", "hidden_size=32")]
    without_full = [r for r in records if r.method != "full"]
    (section,) = configuration_sections(runs_frame(without_full))
    assert VS_CAPTION not in dict(section.tables)
    assert all("vs full" not in table for _, table in section.tables)
    assert "vs full" not in render_report(without_full, runs_frame(without_full), [])  # nor in the differences table


def test_energy_kind_is_a_column_only_when_kinds_differ():
    records = seeds_of("a", [(0.8, 100)]) + seeds_of("b", [(0.7, 50)])
    (section,) = configuration_sections(runs_frame(records))
    header = section.tables[0][1].splitlines()[0]
    assert "train energy (J, measured)" in header and "energy kind" not in header
    records[1]["train"]["energy_kind"] = "estimated"
    header = configuration_sections(runs_frame(records))[0].tables[0][1].splitlines()[0]
    assert "| train energy (J) |" in header and header.endswith("| energy kind |")


MAJORITY_CASES = [
    # (id, majority_rate per record (absent: no field), primary metric, row expected)
    ("recorded", [0.41, 0.41], "accuracy", "0.4100"),
    ("not recorded: nothing guessed", [None, None], "accuracy", None),
    ("records disagree", [0.41, 0.5], "accuracy", None),
    ("not an accuracy", [0.41, 0.41], "f1", None),
]


@pytest.mark.parametrize("rates, metric, shown", [c[1:] for c in MAJORITY_CASES], ids=[c[0] for c in MAJORITY_CASES])
def test_majority_class_reference_row_and_line(rates, metric, shown, tmp_path):
    records = seeds_of("a", [(0.8, 100)]) + seeds_of("b", [(0.7, 50)])
    for record, rate in zip(records, rates):
        record["primary_metric"] = metric
        if rate is not None:
            record["task_info"]["majority_rate"] = rate
    table = configuration_sections(runs_frame(records))[0].tables[0][1]
    row = next((line for line in table.splitlines() if "majority class" in line), None)
    assert (row is None) == (shown is None)
    if shown:
        assert row.startswith("| *majority class* |") and f"| {shown} |" in row
    assert (
        "always answering the evaluation set's most common class" in render_report(records, runs_frame(records), [])
    ) == bool(shown)
    (plot,) = [p for p in pareto_figures(runs_frame(records), tmp_path) if p.axis.slug == "energy"]
    svg = next(p for p in plot.paths if p.suffix == ".svg").read_text()
    assert ("majority-class rate" in svg) == (shown is not None)


def test_report_from_the_stored_fixture(tmp_path):
    written = write_report(load_records([FIXTURE]), tmp_path)
    assert sorted(p.name for p in written) == sorted(PLOTS + ["report.md", "report.html"])
    for path in written:
        if path.suffix == ".svg":
            assert path.read_text().lstrip().startswith("<?xml") and "<svg" in path.read_text()
    report = (tmp_path / "report.md").read_text()
    assert "## Results per configuration" in report and "95% confidence interval" in report
    assert "## All runs" in report and "CUDA out of memory" in report
    line = front_line(report, "pareto_accuracy_vs_energy.png")
    assert "read hidden_size=32" in line and "full" not in line and "bitfit" not in line
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    images = re.findall(r'<img[^>]*src="([^"]*)"', page)
    assert len(images) == 4 and all(src.startswith("data:image/svg+xml;base64,") for src in images)
    assert not re.search(r'(src|href)="(?!data:|#)', page), "the page links no other file"
    assert "<table>" in page and "Environment" in page and "estimated" in page


def test_api_loads_plots_and_warns_on_bad_lines(tmp_path):
    runs = load_results(FIXTURE)
    assert isinstance(runs, pd.DataFrame) and len(runs) == 17
    assert {"quality", "energy_j", "peak_memory_bytes", "time_s", "trainable_params", "eval_energy_j"} <= set(
        runs.columns
    )
    fig = plot_frontier(runs, x="peak_memory_bytes")
    ax = fig.axes[0]
    assert "MiB" in ax.get_xlabel() and "accuracy" in ax.get_ylabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"bitfit", "full", "lora (r = point label)", "read (hidden_size = point label)"} <= set(legend)
    broken = write_jsonl(tmp_path / "results.jsonl", [FIXTURE.read_text().splitlines()[0], "{torn"])
    with pytest.warns(UserWarning, match="malformed"):
        assert len(load_results([broken])) == 1


def test_time_to_target_columns_appear_for_budgeted_runs():
    records = seeds_of("read", [(0.85, 100), (0.86, 110)]) + seeds_of("lora", [(0.80, 100), (0.80, 100)])
    for rec, (reached, step, time_s) in zip(
        records, [(True, 30, 12.0), (True, 40, 14.0), (False, None, None), (False, None, None)]
    ):
        rec["train"]["budget"] = {
            "reached": reached,
            "reached_at_step": step,
            "time_to_target_s": time_s,
            "energy_to_target_j": time_s and time_s * 10,
        }
    ((_, _, tables),) = [(s.task, s.backbone, dict(s.tables)) for s in configuration_sections(runs_frame(records))]
    header, _, *rows = tables[TARGET_CAPTION].splitlines()
    assert header.endswith("| reached target (seeds) | steps to target | time to target (s) | energy to target (J) |")
    read = next(r for r in rows if r.startswith("| read"))
    assert read.endswith(f"| 2/2 | 35 ± {12.706204736174707 * 5:,.0f} | 13.0 ± 12.7 | 130.0 ± 127.1 |")
    assert next(r for r in rows if r.startswith("| lora")).endswith("| 0/2 | - | - | - |")
    assert TARGET_CAPTION not in dict(configuration_sections(runs_frame(seeds_of("bitfit", [(0.8, 100)])))[0].tables)


@pytest.mark.parametrize(
    "y, half, metric, below, above",
    [
        (0.98, 0.10, "accuracy", 0.10, 0.02),  # cut at 1: accuracy cannot pass it
        (0.03, 0.10, "f1", 0.03, 0.10),  # cut at 0
        (0.50, 0.10, "accuracy", 0.10, 0.10),  # inside the range: untouched
        (-0.95, 0.2, "matthews_correlation", 0.05, 0.2),
        (0.50, None, "accuracy", 0.0, 0.0),  # one seed: no bar
        (5.0, 2.0, "unbounded_metric", 2.0, 2.0),
        (120.0, 300.0, "cost", 120.0, 300.0),  # an energy interval stops at 0 J
    ],
)
def test_error_bars_stay_inside_the_metric_range(y, half, metric, below, above):
    from petlprof.report.plotkit import bounded_interval

    low, high = bounded_interval(y, half, metric)
    assert (low, high) == (pytest.approx(below), pytest.approx(above))


# --- a report a reader takes in at a glance (issue 28) ----------------------------------------------


def test_settings_line_is_key_value_without_nulls():
    records = sweep()
    report = render_report(records, runs_frame(records), [])
    settings = next(line for line in report.splitlines() if line.startswith("- **Training settings:**"))
    assert "epochs=1; batch_size=32; lr=0.0005; max_length=64" in settings
    assert "max_steps" not in settings and "null" not in settings and "None" not in settings


WARNING = "energy is estimated because it could not be measured (rapl: no RAPL domains)"
WARNING_CASES = [
    # (id, (record index, phase) pairs carrying WARNING, the report's line for it)
    ("one place: named in full", [(0, "train")], f"- full, seed 0, train: {WARNING}"),
    (
        "every run: said once with a count",
        [(i, p) for i in range(5) for p in ("train", "eval")],
        f"- {WARNING} — 10 times, phases train, eval; every run (5 runs, 4 configurations)",
    ),
    (
        "some runs: named with their seeds",
        [(0, "train"), (1, "train"), (2, "eval")],
        f"- {WARNING} — 3 times, phases train, eval; bitfit (seed 0); full (seeds 0, 1)",
    ),
]


@pytest.mark.parametrize("places, line", [c[1:] for c in WARNING_CASES], ids=[c[0] for c in WARNING_CASES])
def test_identical_measurement_warnings_are_listed_once(places, line, capsys):
    from petlprof.report.terminal import print_summary
    from petlprof.results.result import results_of

    records = sweep()[:5]
    for index, phase_name in places:
        records[index][phase_name]["warnings"] = [WARNING]
    section = (
        render_report(records, runs_frame(records), []).split("## Measurement warnings\n\n", 1)[1].split("\n\n", 1)[0]
    )
    assert section.splitlines() == [line]
    print_summary(results_of(records), [])  # the terminal says each text once as report.md does
    said = [s for s in capsys.readouterr().out.splitlines() if s.startswith("warning: ")]
    assert said == [f"warning: {line.removeprefix('- ')}"]


@pytest.mark.parametrize("params", [[8_835, 74_883, 296_067], [1_155, 22_566_531], [30_000, 800_000]])
def test_log_axis_has_a_tick_label_at_or_left_of_its_leftmost_point(params):
    from petlprof.report.frame import frontier
    from petlprof.report.plots import PARAMS_AXIS, draw

    records = [record(f"m{i}", {}, 0, 0.8 + i / 100, 100.0, "measured", 100) for i in range(len(params))]
    for rec, count in zip(records, params):
        rec["trainable_params"] = count
    configs = frontier(runs_frame(records), x=PARAMS_AXIS.column, y="accuracy")
    ax = draw(configs, "accuracy", "accuracy", PARAMS_AXIS, "params", "title").axes[0]
    low, high = ax.get_xlim()
    ticks = [t for t in ax.xaxis.get_major_ticks() if low <= t.get_loc() <= high and t.label1.get_text()]
    assert ticks and min(t.get_loc() for t in ticks) <= min(params), [t.label1.get_text() for t in ticks]


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, 1.0),
        (0.5, 0.5),
        (1e308, 1e308),
        (10**30, 1e30),
        (10**400, None),
        (math.nan, None),
        (math.inf, None),
        (-math.inf, None),
        (True, None),
        ("0.9", None),
        (None, None),
        ([1], None),
    ],
)
def test_a_figure_is_read_as_a_finite_float_or_none(value, expected):
    from petlprof.results.result import finite

    assert finite(value) == expected


def test_a_budgets_malformed_checks_are_left_out_not_fatal():
    from petlprof.results.result import BudgetResult, Check

    checks = [
        {"step": 2, "value": 0.5},
        {"step": "3", "value": 0.6},
        {"step": 4, "value": math.nan},
        "x",
        {"step": 5},
        {"step": 6, "value": 10**400},
        {"step": 7, "value": 1},
    ]
    budget = BudgetResult.from_json({"checks": checks})
    assert budget is not None and budget.checks == (Check(2, 0.5), Check(7, 1.0))


def test_records_load_from_one_path_as_from_a_list_of_it():
    from petlprof.api import load_records

    one, listed = load_records(FIXTURE), load_records([str(FIXTURE)])
    assert [r.run_key for r in one] == [r.run_key for r in listed] and len(one) == 17


@pytest.mark.parametrize("placed", [False, True], ids=["constrained layout", "labels placed first"])
def test_a_figure_is_laid_out_once_and_drawn_once_per_file(tmp_path, monkeypatch, placed):
    """save_figure: one layout pass by the layout engine alone (no draw), then one draw per file.  Before, savefig
    made a layout pass of its own for every file of a figure with a layout engine (the placeholder
    ``set_layout_engine("none")`` leaves included), 2 of the 5 draws of each report plot, and the layout pass was a
    draw of every artist."""
    from matplotlib.figure import Figure

    from petlprof.report.plotkit import place_labels, save_figure
    from petlprof.report.plots import new_axes

    fig, ax = new_axes(figsize=(4, 3))  # constrained layout, on the Agg canvas
    ax.plot([1, 2, 3], [0.4, 0.6, 0.5], "o")
    ax.set_xlabel("energy (J)")
    if placed:
        place_labels(fig, ax, [(2, 0.6, "r=8", "C0")], [(2, 0.6)])
    draws = []
    real_draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: draws.append(1) or real_draw(self, renderer))
    position = ax.get_position().bounds
    save_figure(fig, [tmp_path / "plot.png", tmp_path / "plot.svg"])
    assert len(draws) == 2  # one per file: the layout pass draws nothing
    assert fig.get_layout_engine() is None and matplotlib.image.imread(tmp_path / "plot.png").shape[2] == 4
    if placed:
        assert ax.get_position().bounds == position  # the files draw the layout the labels were placed on
    else:  # laid out before the files were drawn: the constrained layout moved the axes from their default place
        assert ax.get_position().bounds != position
