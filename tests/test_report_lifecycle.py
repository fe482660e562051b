"""The adapter's whole life in the report: energy per request served, the break-even against full fine-tuning and
the zero-shot model (checked against a hand computation), energy in kWh, grams of CO2e and money, the options'
bad values, and the explorer's data embedded in report.html."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.report import load_records, write_report
from petlprof.report.frame import (
    REQUEST_B1,
    REQUEST_BATCH,
    REQUEST_BATCH_MERGED,
    runs_frame,
    serving_figures,
    summarise,
)
from petlprof.report.lifecycle import NEVER_PAST, SERVED_B1, break_even, lifecycle_section, with_served
from petlprof.report.page import embedded_json, page_data
from petlprof.results.figures import ENERGY
from petlprof.results.result import RunResult
from petlprof.results.units import energy_units

REPORTS = Path(__file__).resolve().parents[1] / "reports"
LM = REPORTS / "smollm2-arith" / "results.jsonl"  # zero-shot, READ and LoRA (merges), 3 seeds each
CLASSIFIER = REPORTS / "minilm-tweets-all-methods" / "results.jsonl"  # ten methods, inference phase


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(
    "config, ref, expected",
    [
        # (training J, J per request): the configuration against the reference
        ((100.0, 1.0), (0.0, 2.0), (100.0, "ref", "a")),  # dearer to train, cheaper to serve: a wins after 100
        ((50.0, 3.0), (250.0, 1.0), (100.0, "a", "ref")),  # cheaper to train, dearer to serve: ref wins after 100
        ((10.0, 1.0), (20.0, 1.0), (None, "a", "a")),  # cheaper at every number of requests
        ((30.0, 2.0), (20.0, 1.0), (None, "ref", "ref")),  # dearer at every number: never breaks even
        ((20.0, 1.0), (20.0, 1.0), (None, "a", "a")),  # the same: a tie goes to the configuration
        ((1e6, 1.0), (0.0, 1.0 + 1e-9), (1e15, "ref", "a")),  # past a trillion: not within it
    ],
)
def test_break_even_matches_the_hand_computation(config, ref, expected):
    got = break_even("a", *config, "ref", *ref)
    requests, before, after = expected
    assert (got.before, got.after) == (before, after)
    if requests is None:
        assert got.requests is None and "never" in got.text()
    else:
        assert got.requests == pytest.approx(requests, rel=1e-6)
    if got.requests is not None and got.requests > NEVER_PAST:
        assert got.text() == "ref costs less within 1e+12 requests"  # no huge number printed
    elif got.requests is not None:
        assert got.text() == f"{after} cheaper after {math.ceil(requests):,} requests"


def test_a_language_models_requests_are_its_generated_responses_merged_where_it_merges():
    records = [RunResult.from_json(d) for d in lines_of(LM)]
    lora = next(r for r in records if r.method == "lora")
    row = serving_figures(lora)
    window = lora.windows("generation")["batch_1"]
    assert row[REQUEST_B1] == pytest.approx(window.raw("energy_per_response_j"))
    assert row[REQUEST_BATCH_MERGED] == pytest.approx(
        lora.windows("generation_merged")["batch_32"].raw("energy_per_response_j")
    )
    assert row["request_kind"] == "response" and row["serving_batch"] == 32
    assert row["request_prompt_tokens"] == pytest.approx(window.raw("prompt_tokens") / window.raw("responses"))


def test_a_classifiers_requests_are_its_inference_samples():
    record = next(RunResult.from_json(d) for d in lines_of(CLASSIFIER) if d["method"] == "lora")
    row = serving_figures(record)
    assert row[REQUEST_B1] == pytest.approx(record.windows("inference")["batch_1"].raw("energy_per_sample_j"))
    assert row["request_kind"] == "sample" and row[REQUEST_BATCH] is not None


def test_the_reports_break_even_is_the_hand_computed_one(tmp_path):
    """READ against the zero-shot model at batch 1, from the seeds' means, as the reader would work it out."""
    records = load_records([LM])
    write_report(records, tmp_path)
    configs = with_served(summarise(runs_frame(records)))
    read = configs[configs["method"] == "read"].iloc[0]
    zero = configs[configs["method"] == "zero_shot"].iloc[0]
    train = sum(r.train[ENERGY] for r in records if r.method == "read" and r.train) / 3
    assert read["energy_j"] == pytest.approx(train)
    expected = math.ceil(train / (zero[SERVED_B1] - read[SERVED_B1]))
    report = (tmp_path / "report.md").read_text()
    assert f"cheaper after {expected:,} responses" in report
    assert (tmp_path / "lifecycle_arith_smollm2_b1.svg").is_file()
    assert "![energy over the adapter's life, batch 1](lifecycle_arith_smollm2_b1.png)" in report


def test_missing_serving_figures_leave_the_cells_empty_with_the_reason(tmp_path):
    data = lines_of(LM)
    for line in data:
        if line["method"] == "read":
            line.pop("generation", None)
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in data))
    write_report(load_records([path]), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "No serving figures for read (hidden_size=128)" in report
    row = next(
        line for line in report.splitlines() if line.startswith("| read (hidden_size=128) | ") and "after" not in line
    )
    assert "- (no serving figure)" in report
    assert row.count("| - ") >= 2


@pytest.mark.parametrize(
    "options, shown, not_shown",
    [
        ({}, ["(kWh, estimated)"], ["g CO2e)", "(money)"]),
        ({"price_per_kwh": "0.30"}, ["(money)"], ["g CO2e)"]),
        ({"country_code": "fra"}, ["g CO2e)", "France grid"], ["(money)"]),
        ({"carbon_intensity": 400, "price_per_kwh": 0.3}, ["g CO2e)", "(money)", "given (--carbon-intensity 400)"], []),
    ],
)
def test_energy_is_shown_in_the_units_given_and_money_only_with_a_price(options, shown, not_shown):
    runs = runs_frame(load_records([LM]))
    section = "\n".join(lifecycle_section(summarise(runs), runs, (), energy_units(**options)))
    for text in shown:
        assert text in section
    for text in not_shown:
        assert text not in section


def test_grams_and_money_follow_from_the_kwh():
    units = energy_units(carbon_intensity="250", price_per_kwh=0.2)
    assert units.co2_g(7.2e6) == pytest.approx(500.0)  # 2 kWh x 250 g/kWh
    assert units.money(7.2e6) == pytest.approx(0.4)
    assert units.co2_g(None) is None and energy_units().money(1.0) is None


def test_codecarbons_own_intensity_is_used_where_it_measured(tmp_path):
    data = lines_of(LM)
    for line in data:
        if line.get("train"):
            line["train"].update(
                co2eq_g=line["train"]["energy_j"] / 3.6e6 * 300.0, codecarbon_energy_j=line["train"]["energy_j"]
            )
            line["train"]["co2eq_source"] = "codecarbon 3.3.2 offline, grid intensity of DEU"
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in data))
    write_report(load_records([path]), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "kWh x 300 g CO2e/kWh, CodeCarbon's own over the windows it measured" in report


@pytest.mark.parametrize(
    "options, message",
    [
        (["--price-per-kwh=-1"], "--price-per-kwh must be a positive price"),
        (["--price-per-kwh", "0"], "--price-per-kwh must be a positive price"),
        (["--price-per-kwh", "nan"], "--price-per-kwh must be a positive price"),
        (["--price-per-kwh", "inf"], "--price-per-kwh must be a positive price"),
        (["--price-per-kwh", str(10**30)], "--price-per-kwh must be at most"),
        (["--price-per-kwh", "cheap"], "--price-per-kwh must be a positive price"),
        (["--carbon-intensity=-5"], "--carbon-intensity must be a carbon intensity"),
        (["--carbon-intensity", "1e308"], "--carbon-intensity must be at most 5000"),
        (["--carbon-intensity=-inf"], "--carbon-intensity must be a carbon intensity"),
        (["--country-code", "ZZZ"], "unknown --country-code 'ZZZ'. Give an ISO 3166 alpha-3 code"),
        (["--country-code", "FR"], "unknown --country-code 'FR'; did you mean FRO, FRA?"),
        (["--country-code", "FRA", "--carbon-intensity", "50"], "not both"),
    ],
)
def test_a_bad_price_intensity_or_country_is_one_line_and_exit_2(tmp_path, capsys, options, message):
    assert main(["report", str(LM), "--output", str(tmp_path), *options]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "report.md").exists()  # refused before anything was read or written


def test_numeric_strings_are_read_as_numbers():
    assert energy_units(carbon_intensity=" 0 ", price_per_kwh="1e-1").price_per_kwh == pytest.approx(0.1)
    with pytest.raises(UsageError):
        energy_units(carbon_intensity=True)


def test_the_page_embeds_every_configuration_with_its_figures_in_shown_units(tmp_path):
    records = load_records([CLASSIFIER])
    write_report(records, tmp_path)
    page = (tmp_path / "report.html").read_text()
    data = json.loads(re.search(r'id="petlprof-data">(.*?)</script>', page, flags=re.S)[1])
    configs = summarise(runs_frame(records))
    assert len(data["points"]) == len(configs)
    keys = {axis["key"] for axis in data["axes"]}
    assert {"accuracy", "energy_j", "peak_memory_bytes", "time_s", SERVED_B1} <= keys
    memory = next(a for a in data["axes"] if a["key"] == "peak_memory_bytes")
    first = configs.iloc[0]
    assert memory["unit"] == "MiB"
    assert data["points"][0]["values"]["peak_memory_bytes"] == pytest.approx(first["peak_memory_bytes"] / 2**20)
    assert data["x"] == "energy_j" and data["y"] == "accuracy" and data["groups"][0]["y"] == "accuracy"
    assert data["points"][0]["flags"]["energy_j"].startswith("estimated")  # these runs' energy is a CPU-time model
    assert "accuracy" not in data["points"][0]["flags"] and "peak_memory_bytes" not in data["points"][0]["flags"]
    assert set(data["budgets"]) == {"peak_memory_bytes", "energy_j", "time_s"}


@pytest.mark.parametrize("label", ["</script><script>alert(1)</script>", "<!--<script>", "a & b > c"])
def test_a_label_cannot_end_or_hold_open_the_pages_script(label):
    configs = summarise(runs_frame(load_records([LM])))
    configs.loc[configs.index[0], "config"] = label
    text = embedded_json(page_data(configs, ["exact_match"]))
    assert not {"<", ">", "&"} & set(text)  # JSON escapes: the HTML parser sees none of them
    assert json.loads(text)["points"][0]["config"] == label


def test_html_in_the_records_is_shown_as_text_never_run(tmp_path):
    data = lines_of(LM)
    for line in data:
        line["task"] = line["spec"]["task"] = "<img src=x onerror=alert(1)>"
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in data))
    write_report(load_records([path]), tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<img src=x" not in page and '<img src="x"' not in page


def sweep_of(runs: int, configurations: int, folder: Path) -> Path:
    """A results file of ``runs`` runs: the classifier study's ten methods at ``configurations // 10`` learning
    rates each, the seeds making up the rest."""
    base = lines_of(CLASSIFIER)
    per_config = max(runs // configurations, 1)
    data = []
    for i in range(runs):
        line = json.loads(json.dumps(base[i % len(base)]))
        variant, line["seed"] = divmod(i // len(base), per_config)
        line["run_key"] = f"{line['run_key']}-{i}"
        line["spec"].update(seed=line["seed"], lr=(line["spec"].get("lr") or 1e-3) * (1 + variant / 10))
        data.append(line)
    path = folder / "results.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in data))
    return path


def test_fifty_runs_make_a_page_under_2_mb(tmp_path):
    write_report(load_records([sweep_of(50, 10, tmp_path)]), tmp_path)
    size = (tmp_path / "report.html").stat().st_size
    assert size < 2 * 2**20, f"report.html of 50 runs is {size:,} B"


def _report_cpu_s(runs: int, configurations: int, folder: Path) -> float:
    folder.mkdir()
    path = sweep_of(runs, configurations, folder)
    start = time.process_time()
    write_report(load_records([path]), folder)
    return time.process_time() - start


def test_five_hundred_runs_report_at_most_three_times_what_ten_runs_cost(tmp_path):
    """100 configurations of 5 seeds: the plots, the tables, the page, against a report of 10 runs (2 configurations)
    timed before and after it in this process.  The issue's bound was 10 CPU-s (5.6-7.9 measured alone); CPU seconds
    grow with the machine's speed and its load, so an absolute bound failed CI when the same report took 16.6 CPU-s
    beside the other workers, and 26-27 alone on a slow day (the 10-run report 11.8-17.6 then): the ratio held at
    1.8-2.0.  A report whose cost grew with its runs (a quadratic label placement, a per-run plot) passes 3."""
    before = _report_cpu_s(10, 2, tmp_path / "before")
    spent = _report_cpu_s(500, 100, tmp_path / "big")
    after = _report_cpu_s(10, 2, tmp_path / "after")
    assert len(summarise(runs_frame(load_records([tmp_path / "big" / "results.jsonl"])))) == 100
    assert spent < 3 * (before + after) / 2, f"500 runs: {spent:.1f} CPU-s; 10 runs: {before:.1f} and {after:.1f}"


@pytest.mark.parametrize("edge", [math.nan, math.inf, -math.inf, 10**400, "12", True, None])
def test_a_figure_at_its_edge_is_left_out_of_the_page_and_the_tables(edge):
    runs = runs_frame(load_records([LM]))
    configs = summarise(runs).astype({"energy_j": object})
    configs.loc[configs.index[1], "energy_j"] = edge
    data = page_data(configs, ["exact_match"])
    assert data["points"][1]["values"]["energy_j"] is None
    json.loads(embedded_json(data))  # strict JSON: no NaN or Infinity
    section = "\n".join(lifecycle_section(configs, runs, (), energy_units()))
    row = next(line for line in section.splitlines() if line.startswith(f"| {configs.iloc[1]['method']}"))
    assert row.split("|")[2].strip() == "-"  # its training energy: empty, not nan or a huge number
