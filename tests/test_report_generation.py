"""The report of a generative sweep: the generation-cost table, the zero-shot row (the model before any
tuning, at zero training energy) in the tables, plots and differences, and the primary metric of a
language-modelling task on the Pareto plots.

The records copy the shape of ``tests/test_report.py``'s, with ``generation`` (and, for a method that
merges, ``generation_merged``) phases as :func:`petlprof.run.generation.measure_generation` writes them and
a zero-shot record as the pipeline writes it (``method`` ``zero_shot``, an untrained training phase).
"""

from __future__ import annotations

import copy

import pytest
from test_report import record

from petlprof.report import write_report
from petlprof.report.differences import difference_tables
from petlprof.report.frame import COSTS, frontier, runs_frame
from petlprof.report.plots import pareto_figures
from petlprof.report.table import GENERATION_CAPTION, configuration_sections
from petlprof.tasks.metrics import HIGHER, METRIC_DIRECTIONS, METRIC_RANGES

METRIC = "exact_match"
ZERO_SHOT_ROW = "*zero-shot (before tuning)*"


@pytest.fixture(autouse=True)
def exact_match_known(monkeypatch):
    """The direction and range of exact match (petlprof.tasks.metrics declares them; set here in case it does not
    yet)."""
    monkeypatch.setitem(METRIC_DIRECTIONS, METRIC, HIGHER)
    monkeypatch.setitem(METRIC_RANGES, METRIC, (0.0, 1.0))


def window(tokens_per_s, energy_per_token_j, ttft_s, size, side_share=None, warnings=()):
    tokens = 48 * size
    time_s = tokens / tokens_per_s
    figures = {
        "batch_size": size,
        "batches": 3,
        "responses": 3 * size,
        "generated_tokens": tokens,
        "time_s": time_s,
        "tokens_per_s": tokens_per_s,
        "energy_j": energy_per_token_j * tokens,
        "energy_per_token_j": energy_per_token_j,
        "energy_per_response_j": energy_per_token_j * tokens / (3 * size),
        "time_to_first_token_s": ttft_s,
        "per_token_latency_s": {"p50": 0.04, "p90": 0.05, "p99": 0.06, "mean": 0.045},
        "peak_memory_bytes": 300 * 2**20,
        "energy_kind": "measured",
        "energy_source": "rapl",
        "latency_source": "perf-counter, device synchronised at each token",
        "warnings": list(warnings),
    }
    if side_share is not None:
        figures["side_network"] = {"module": "SideNetwork", "share_of_per_token": side_share, "share_of_call": 0.1}
    return figures


def generative(method, config, seed, score, energy_j, params, speed=20.0, side_share=None, merged=False):
    rec = record(method, config, seed, 0.0, energy_j, "measured", 500, task="arith")
    rec.update(backbone="smollm2", primary_metric=METRIC, trainable_params=params)
    rec["metrics"] = {METRIC: score, "rouge_l": score + 0.1, "perplexity": 4.0}
    rec["task_info"] = {"train_samples": 256, "eval_samples": 64, "description": "arithmetic (reasoning-gym)"}
    rec["generation"] = {
        "target_window_s": 5.0,
        "max_prompts": 16,
        "batch_1": window(speed, 0.5, 0.2, 1, side_share, ["energy window shorter than 5 s: low confidence"]),
        "batch_8": window(speed * 5, 0.12, 0.6, 8, side_share),
    }
    if merged:
        rec["generation_merged"] = {
            "batch_1": window(speed * 1.2, 0.45, 0.18, 1),
            "batch_8": window(speed * 6, 0.1, 0.5, 8),
        }
    return rec


def zero_shot_record():
    """As the pipeline writes it: the model as loaded, nothing trained, evaluated and generated once."""
    rec = generative("zero_shot", {}, 0, 0.1, 0.0, 0)
    rec["train"] = {
        "time_s": 0.0,
        "steps": 0,
        "samples": 0,
        "warmup_steps": 0,
        "energy_j": 0.0,
        "energy_source": "no training step ran (zero-shot)",
        "epochs_run": 0.0,
        "first_loss": None,
        "final_loss": None,
        "warnings": [],
    }
    rec["pareto_knob"] = None
    return rec


def sweep():
    """LoRA (3 seeds, merges), READ (3 seeds, scores below zero-shot but cheapest), full (1 seed), zero-shot."""
    lora = [
        generative("lora", {"r": 8}, s, q, 100.0 + s, 100_000, merged=True) for s, q in enumerate((0.3, 0.34, 0.32))
    ]
    read = [
        generative("read", {"r": 16}, s, q, 40.0 + s, 1_000, side_share=0.2) for s, q in enumerate((0.05, 0.06, 0.07))
    ]
    full = [generative("full", {}, 0, 0.36, 300.0, 135_000_000, speed=18.0)]
    return [zero_shot_record(), *lora, *read, *full]


def tables(records):
    (section,) = configuration_sections(runs_frame(records))
    return dict(section.tables)


def rows_of(table):
    """The rows of a Markdown table, without the header, its rule and the notes under it."""
    return [line for line in table.splitlines()[2:] if line.startswith("|")]


def test_the_generation_table_has_a_row_per_configuration_model_and_batch_size():
    table = tables(sweep())[GENERATION_CAPTION]
    header = table.splitlines()[0]
    for title in ("tokens/s", "energy per token (J, measured)", "time to first token (s, median)", "KV cache"):
        assert title in header
    assert "side network's share of per-token time (%)" in header and "| model |" in header
    rows = rows_of(table)
    lora = [r for r in rows if r.startswith("| lora |")]
    assert [r.split(" | ")[2:4] for r in lora] == [
        ["as tuned", "1"],
        ["as tuned", "8"],
        ["merged", "1"],
        ["merged", "8"],
    ]
    assert "| 100.0 ± 0.0 | 0.1200 ± 0.0000 |" in lora[1]  # tokens/s and energy per token, mean ± CI over 3 seeds
    (read_b1,) = [r for r in rows if r.startswith("| read |") and "| as tuned | 1 |" in r]
    assert read_b1.endswith("| 20 ± 0 |")  # the side network's share, in percent
    assert sum(r.startswith("| zero-shot (before tuning) |") for r in rows) == 2  # batch 1 and 8, not merged
    assert len(rows) == 4 + 2 + 2 + 2


def test_no_generation_table_without_a_generation_phase():
    records = sweep()
    for rec in records:
        rec.pop("generation"), rec.pop("generation_merged", None)
    assert GENERATION_CAPTION not in tables(records)


def test_the_zero_shot_row_is_a_reference_row_on_no_frontier():
    records = sweep()
    shown = tables(records)
    costs = rows_of(shown["Quality and costs"])
    assert costs[-1].startswith(f"| {ZERO_SHOT_ROW} |") and "| 0.1000 [" in costs[-1]  # one seed: binomial interval
    assert "| 0.0 |" in costs[-1]  # no training energy, as recorded
    assert not any(r.startswith("| zero_shot") for r in costs)
    (read,) = [r for r in costs if r.startswith("| read |")]
    assert "energy" in read.split(" | ")[-1]  # cheapest tuned: on the energy frontier, though below zero-shot
    assert "zero" not in shown["Against `full`"]
    configs = frontier(runs_frame(records), x="energy_j")
    assert not configs.loc[configs["method"] == "zero_shot", "on_front"].any()
    assert set(configs.loc[configs["on_front"], "method"]) == {"read", "lora", "full"}


def test_differences_compare_every_configuration_with_the_zero_shot_score():
    ((_, _, table),) = difference_tables(runs_frame(sweep()))
    header, *_ = table.splitlines()
    assert "Δ vs zero-shot (before tuning) (95% CI)" in header
    rows = {r.split(" | ")[0].lstrip("| "): r for r in rows_of(table)}
    assert rows["lora"].rstrip(" |").endswith("yes") and rows["read"].rstrip(" |").endswith("yes")
    assert rows["full"].rstrip(" |").endswith("—")  # one seed: no interval
    assert "| ref | — |" in rows["zero-shot (before tuning)"]


def test_plots_show_the_primary_metric_and_the_zero_shot_line(tmp_path):
    plots = pareto_figures(runs_frame(sweep()), tmp_path)
    assert [p.axis.slug for p in plots] == ["energy", "memory", "time", "params"]
    for plot in plots:
        assert plot.metric == METRIC and plot.path is not None and plot.zero_shot == pytest.approx(0.1)
        assert plot.configs == 3 and not any("zero" in name for name in plot.on_front)
        svg = next(p for p in plot.paths if p.suffix == ".svg").read_text()
        assert "zero-shot (before tuning): 0.100, no training cost" in svg
        assert "exact_match on eval set (fraction, higher is better)" in svg
    assert "[log scale]" in next(p for p in plots if p.axis.slug == "params").paths[1].read_text()


def test_only_the_zero_shot_row_finished(tmp_path):
    plots = pareto_figures(runs_frame([zero_shot_record()]), tmp_path)
    assert all(p.path is None and "only the zero-shot row" in p.skipped for p in plots)
    costs = rows_of(tables([zero_shot_record()])["Quality and costs"])
    assert len(costs) == 1 and costs[0].startswith(f"| {ZERO_SHOT_ROW} |")


def test_the_report_of_a_generative_sweep(tmp_path):
    records = sweep()
    records.append({**copy.deepcopy(records[1]), "run_key": "oom", "status": "oom", "error": "CUDA out of memory"})
    for key in ("metrics", "generation", "generation_merged"):
        records[-1].pop(key)
    write_report(records, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert f"**{GENERATION_CAPTION}.** Greedy decoding" in report
    assert "The *zero-shot (before tuning)* row is the model as loaded" in report
    assert "The dash-dot line is the *zero-shot (before tuning)* score" in report
    assert "### Generation phase" in report and "- Time to first token and per-token latency:" in report
    assert "low confidence — 8 times, phases generation batch 1;" in report  # each run's generation warnings
    failed = report.split("## Failed runs", 1)[1]
    assert "zero" not in failed and "CUDA out of memory" in failed
    assert "<table>" in (tmp_path / "report.html").read_text()


def test_the_dataframe_carries_the_record_paths_of_the_generation_figures():
    runs = runs_frame(sweep())
    for column in (
        "generation.batch_1.tokens_per_s",
        "generation.batch_1.energy_per_token_j",
        "generation.batch_1.time_to_first_token_s",
        "generation.batch_8.tokens_per_s",
        "generation_merged.batch_8.energy_per_token_j",
        "generation.batch_1.side_network.share_of_per_token",
    ):
        assert column in runs and runs[column].dtype == float
    lora = runs[runs["method"] == "lora"]
    assert list(lora["generation.batch_8.tokens_per_s"]) == [100.0] * 3
    assert runs.loc[runs["method"] == "zero_shot", "energy_j"].tolist() == [0.0]


@pytest.mark.parametrize("constant_seeds", [(0,), (0, 1, 2)], ids=["one of three seeds", "every seed"])
def test_a_run_that_answers_every_prompt_alike_is_marked_and_on_no_frontier(constant_seeds, tmp_path):
    """READ, cheapest of all, would be on the energy frontier; once a seed answered every prompt with one text its
    configuration is on no frontier, its score is marked in the tables (with how many seeds), it is left out of
    the differences, and report.md and report.html say why."""
    records = sweep()
    reads = [r for r in records if r["method"] == "read"]
    for seed in constant_seeds:
        reads[seed]["constant_output"] = True
    for x in COSTS:
        configs = frontier(runs_frame(records), x=x)
        assert not configs.loc[configs["method"] == "read", "on_front"].any(), x
    (read,) = [r for r in rows_of(tables(records)["Quality and costs"]) if r.startswith("| read |")]
    assert f"(one answer to every prompt: {len(constant_seeds)} of 3 seeds)" in read
    assert read.endswith("| - |")  # on no frontier
    ((_, _, differences),) = difference_tables(runs_frame(records))
    assert "| read |" not in differences
    write_report(records, tmp_path)
    for page in ("report.md", "report.html"):
        text = (tmp_path / page).read_text()
        assert "one answer to every prompt" in text and "constant_output" in text, page
    write_report(sweep(), tmp_path)
    assert "one answer to every prompt" not in (tmp_path / "report.md").read_text()
