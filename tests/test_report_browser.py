"""report.html's explorer and sortable tables (page.js) in a real headless Chromium, driven by Selenium.

The page is built by ``write_report`` from a small sweep: two seeds of full fine-tuning, configurations that
trade accuracy against energy and memory differently (so the two frontiers differ), one without a memory
figure, a zero-shot row, and a second task (so the group selector shows).  What the page shows is compared
with the Python side: :func:`petlprof.report.frame.frontier` on the same records.

The system's browser is used (``apt-get install chromium chromium-driver``) so that Selenium Manager downloads
nothing.  Without it, or without selenium, the tests skip, unless ``PETLPROF_REQUIRE_BROWSER=1`` (CI), where
they fail.  ``PETLPROF_SCREENSHOTS=<folder>`` saves a picture of the explorer there.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from petlprof.report import load_records, write_report
from petlprof.report.frame import frontier, runs_frame, summarise

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MIB = 2**20
ARGS = (
    "--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-background-networking"
    " --disable-component-update --disable-sync --no-first-run --window-size=1280,1000"
).split()


def record(method, config, seed, accuracy, energy_j, memory_mib, task="tweets"):
    """One finished run; ``memory_mib`` None leaves the training peak memory out."""
    train = {"time_s": energy_j / 20 + 1, "steps": 61, "samples": 1952, "energy_j": energy_j}
    train.update(energy_kind="measured", energy_source="rapl", latency_s={"p50": 0.0125, "p90": 0.015})
    if memory_mib is not None:
        train.update(peak_memory_bytes=int(memory_mib * MIB), memory_source="rss-hwm")
    return {
        "schema_version": 1,
        "run_key": f"{method}-{json.dumps(config, sort_keys=True)}-{seed}-{task}",
        "status": "ok",
        "error": None,
        "method": method,
        "method_config": config,
        "backbone": "minilm",
        "task": task,
        "task_info": {"num_labels": 2, "train_samples": 2000, "eval_samples": 1000},
        "primary_metric": "accuracy",
        "seed": seed,
        "training": {"epochs": 1, "batch_size": 32, "lr": 5e-4, "max_length": 64, "device": "cpu"},
        "trainable_params": 0 if method == "zero_shot" else 148226,
        "total_params": 22861826,
        "metrics": {"accuracy": accuracy, "f1": accuracy - 0.05},
        "train": train,
        "eval": {"time_s": 5.0, "energy_j": 50.0, "energy_kind": "measured", "peak_memory_bytes": 200 * MIB},
        "env": {"petlprof": "0.1.0", "device": "cpu"},
    }


def sweep():
    """On accuracy against energy the front is linear_probe, read, lora r=8, full; against memory it is
    linear_probe, bitfit, lora r=8, full; prompt_tuning has no memory figure; lora r=4 is dominated."""
    return [
        record("full", {}, 0, 0.90, 5000.0, 900),
        record("full", {}, 1, 0.92, 5400.0, 900),
        record("bitfit", {}, 0, 0.85, 800.0, 500),
        record("lora", {"r": 8}, 0, 0.88, 1200.0, 600),
        record("lora", {"r": 4}, 0, 0.80, 1300.0, 650),
        record("read", {"hidden_size": 128}, 0, 0.86, 300.0, 700),
        record("linear_probe", {}, 0, 0.70, 100.0, 300),
        record("prompt_tuning", {"num_virtual_tokens": 20}, 0, 0.60, 2000.0, None),
        record("zero_shot", {}, 0, 0.55, 0.0, None),
        record("full", {}, 0, 0.75, 900.0, 800, task="other"),
        record("lora", {"r": 8}, 0, 0.70, 200.0, 400, task="other"),
        *generative(record("lora", {"r": 8}, 0, 0.40, 250.0, 500, task="arith")),
        *generative(record("read", {"hidden_size": 128}, 0, 0.30, 90.0, 300, task="arith")),
    ]


def generative(line):
    """``line`` as a run of a task scored on exact match (the LM objective's metric), not accuracy."""
    score = line["metrics"]["accuracy"]
    return [{**line, "primary_metric": "exact_match", "metrics": {"exact_match": score}}]


def name(row):
    return row["method"] if row["config"] in ("-", "") else f"{row['method']} {row['config']}"


def front_text(configs, x, x_label, y_label="accuracy"):
    """The sentence the page should show: the first task's Python frontier of ``configs``, in x order."""
    front = frontier(configs, x=x, y="quality")
    front = front[front["on_front"] & (front["task"] == "tweets")].sort_values(x, kind="stable")
    return f"On the frontier ({y_label} against {x_label}): " + ", ".join(name(r) for _, r in front.iterrows())


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser")
    results = folder / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in sweep()), encoding="utf-8")
    records = load_records([results])
    write_report(records, folder / "report")
    html = (folder / "report" / "report.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="petlprof-data">(.*?)</script>', html, re.S).group(1))
    configs = summarise(runs_frame(records))
    return {"url": (folder / "report" / "report.html").as_uri(), "configs": configs, "data": data, "runs": records}


def _start(profile, javascript=True):
    """A headless Chromium on the system's binaries; skipped (or failed under PETLPROF_REQUIRE_BROWSER=1)
    where they or selenium are missing."""
    missing = [
        f"{p} is missing (apt-get install chromium chromium-driver)" for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()
    ]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium is not installed (pip install selenium, or the dev extra)")
    if missing:
        if os.environ.get("PETLPROF_REQUIRE_BROWSER") == "1":
            pytest.fail("PETLPROF_REQUIRE_BROWSER=1 but " + "; ".join(missing))
        pytest.skip("; ".join(missing))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={profile}")  # a fresh profile in pytest's temporary folders
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    browser = _start(tmp_path_factory.mktemp("chromium"))
    yield browser
    browser.quit()


def by(kind):
    from selenium.webdriver.common.by import By

    return getattr(By, kind)


def load(driver, page):
    driver.get(page["url"])
    driver.get_log("browser")  # what an earlier test left, not this page's
    return driver.find_element(by("ID"), "explorer")


def frontier_text(driver):
    return driver.find_element(by("ID"), "explorer-frontier").text


def choose(driver, select_id, value):
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(by("ID"), select_id)).select_by_value(value)


def circles(driver):
    return driver.find_elements(by("CSS_SELECTOR"), "#chart circle.point")


def test_the_explorer_shows_the_default_axes_and_the_pythons_frontier(driver, page):
    explorer = load(driver, page)
    assert explorer.is_displayed()
    assert driver.find_element(by("ID"), "x-axis").get_attribute("value") == "energy_j"
    assert driver.find_element(by("ID"), "y-axis").get_attribute("value") == "accuracy"
    assert driver.find_element(by("ID"), "group").is_displayed()  # two tasks
    expected = front_text(page["configs"], "energy_j", "training energy")
    assert expected.endswith(": linear_probe, read hidden_size=128, lora r=8, full")
    assert frontier_text(driver) == expected
    # one circle per tuned configuration of the first task, the zero-shot row as a line
    assert len(circles(driver)) == 7
    assert len(driver.find_elements(by("CSS_SELECTOR"), "#chart line.zero-shot")) == 1
    assert len(driver.find_elements(by("CSS_SELECTOR"), "#chart circle.on-front")) == 4
    if os.environ.get("PETLPROF_SCREENSHOTS"):
        folder = Path(os.environ["PETLPROF_SCREENSHOTS"])
        folder.mkdir(parents=True, exist_ok=True)
        driver.execute_script("arguments[0].scrollIntoView()", explorer)
        explorer.screenshot(str(folder / "explorer.png"))


def test_another_cost_axis_gives_that_costs_frontier(driver, page):
    load(driver, page)
    choose(driver, "x-axis", "peak_memory_bytes")
    expected = front_text(page["configs"], "peak_memory_bytes", "training peak mem")
    assert expected.endswith(": linear_probe, bitfit, lora r=8, full")
    assert frontier_text(driver) == expected
    # prompt_tuning has no memory figure: not drawn, and said so
    assert len(circles(driver)) == 6
    assert driver.find_element(by("ID"), "explorer-note").text.startswith("1 configuration lacks training peak mem")


def test_a_budget_removes_what_exceeds_it_and_the_frontier_is_recomputed(driver, page):
    from selenium.webdriver.common.keys import Keys

    load(driver, page)
    configs = page["configs"]
    cap = 5000.0  # full's mean training energy is 5200 J
    cap_box = driver.find_element(by("CSS_SELECTOR"), 'input.budget[data-axis="energy_j"]')
    assert cap_box.get_attribute("placeholder") == "no limit"
    cap_box.send_keys(str(int(cap)))
    kept = configs[configs["energy_j"] <= cap]
    expected = front_text(kept, "energy_j", "training energy")
    assert expected.endswith(": linear_probe, read hidden_size=128, lora r=8")
    assert frontier_text(driver) == expected
    ids = {c.get_attribute("data-id") for c in circles(driver)}
    full = next(p["id"] for p in page["data"]["points"] if p["method"] == "full" and p["group"] == 0)
    assert full not in ids and len(ids) == 6
    cap_box.send_keys(Keys.BACKSPACE * 4)  # emptied: no limit again
    assert len(circles(driver)) == 7


def test_a_method_toggled_off_loses_its_points(driver, page):
    load(driver, page)
    lora = {p["id"] for p in page["data"]["points"] if p["method"] == "lora" and p["group"] == 0}
    assert len(lora) == 2 and lora <= {c.get_attribute("data-id") for c in circles(driver)}
    driver.find_element(by("CSS_SELECTOR"), 'input.method-toggle[data-method="lora"]').click()
    shown = {c.get_attribute("data-id") for c in circles(driver)}
    assert not lora & shown and len(shown) == 5
    assert "lora" not in frontier_text(driver)


def test_hovering_a_point_shows_its_figures(driver, page):
    from selenium.webdriver.common.action_chains import ActionChains

    load(driver, page)
    configs = page["configs"]
    full = configs[(configs["method"] == "full") & (configs["task"] == "tweets")].iloc[0]
    point = next(p for p in page["data"]["points"] if p["method"] == "full" and p["group"] == 0)
    circle = driver.find_element(by("CSS_SELECTOR"), f'#chart circle.point[data-id="{point["id"]}"]')
    assert not driver.find_element(by("ID"), "tooltip").is_displayed()
    ActionChains(driver).move_to_element(circle).perform()
    tooltip = driver.find_element(by("ID"), "tooltip")
    assert tooltip.is_displayed()
    text = tooltip.text
    assert "full" in text and "seeds: 0, 1" in text
    assert f"accuracy: {full['accuracy']:.3g} ± {full['accuracy_ci95']:.3g}" in text
    assert "training energy: 5,200 J" in text and point["interval"] in text
    ActionChains(driver).move_to_element(driver.find_element(by("CSS_SELECTOR"), "#explorer h2")).perform()
    assert not tooltip.is_displayed()


def test_between_two_costs_the_zero_shot_row_is_a_hollow_marker_and_log_is_off(driver, page):
    load(driver, page)
    choose(driver, "x-axis", "trainable_params")  # zero-shot: no parameters trained, no training energy
    x_log = driver.find_element(by("ID"), "x-log")
    assert x_log.is_selected() and x_log.is_enabled()  # the axis' default; the zero-shot row is a line
    choose(driver, "y-axis", "energy_j")
    marker = driver.find_elements(by("CSS_SELECTOR"), "#chart circle.zero-shot")
    assert len(marker) == 1 and not driver.find_elements(by("CSS_SELECTOR"), "#chart line.zero-shot")
    assert not driver.find_element(by("ID"), "x-log").is_enabled()
    assert not driver.find_element(by("ID"), "y-log").is_enabled()
    assert "log scale" not in driver.find_element(by("ID"), "chart").text


def number(cell):
    match = re.match(r"[-+]?\d+(\.\d+)?", cell.replace(",", "").strip())
    return float(match.group(0)) if match else None


def test_a_table_header_click_sorts_that_table(driver, page):
    load(driver, page)
    tables = driver.find_elements(by("TAG_NAME"), "table")
    table = max(tables, key=lambda t: len(t.find_elements(by("CSS_SELECTOR"), "tbody tr")))  # all runs
    headers = table.find_elements(by("CSS_SELECTOR"), "thead th")

    def column(title):
        col = next(i for i, h in enumerate(headers) if h.text.startswith(title))
        rows = table.find_elements(by("CSS_SELECTOR"), "tbody tr")
        return headers[col], [r.find_elements(by("TAG_NAME"), "td")[col].text for r in rows]

    header, energy = column("train energy")
    values = [number(c) for c in energy]
    assert len(values) == len(page["runs"]) and values != sorted(values) and None not in values
    header.click()
    assert [number(c) for c in column("train energy")[1]] == sorted(values)
    assert header.get_attribute("aria-sort") == "ascending"
    header.click()
    assert [number(c) for c in column("train energy")[1]] == sorted(values, reverse=True)
    assert header.get_attribute("aria-sort") == "descending"
    # a column with missing figures ("-"): numbers in order, then the missing ones, both ways
    header, memory = column("train peak mem")
    numbers = [number(c) for c in memory if number(c) is not None]
    assert len(numbers) == len(page["runs"]) - 2  # prompt_tuning and the zero-shot row have none
    for order in (sorted(numbers), sorted(numbers, reverse=True)):
        header.click()
        assert column("train peak mem")[1] == [f"{v:,.1f}" for v in order] + ["-", "-"]
        assert header.get_attribute("aria-sort") == ("ascending" if order[0] < order[-1] else "descending")


def test_without_javascript_the_page_is_the_static_report(page, tmp_path):
    browser = _start(tmp_path / "chromium", javascript=False)
    try:
        browser.get(page["url"])
        assert not browser.find_element(by("ID"), "explorer").is_displayed()
        assert not browser.find_elements(by("ID"), "chart")
        tables = browser.find_elements(by("TAG_NAME"), "table")
        assert tables and all(t.is_displayed() for t in tables)
        assert not browser.find_elements(by("CSS_SELECTOR"), "table.sortable")
        assert "With JavaScript on, an explorer here" in browser.find_element(by("TAG_NAME"), "body").text
    finally:
        browser.quit()


def test_no_script_errors_over_every_axis_and_control(driver, page):
    load(driver, page)
    axes = [a["key"] for a in page["data"]["axes"]]
    for key in axes:  # every axis on x, then on y, log where offered, every budget, then the second task
        choose(driver, "x-axis", key)
        assert driver.find_element(by("ID"), "chart")
    for key in axes:
        choose(driver, "y-axis", key)
    for box in ("x-log", "y-log"):
        element = driver.find_element(by("ID"), box)
        if element.is_enabled():
            element.click()
    for cap in driver.find_elements(by("CSS_SELECTOR"), "input.budget"):
        cap.send_keys("400")
    choose(driver, "group", "1")
    assert frontier_text(driver).startswith("On the frontier")
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_another_task_brings_its_own_metric_onto_the_y_axis(driver, page):
    load(driver, page)
    groups = [o.text for o in driver.find_elements(by("CSS_SELECTOR"), "#group option")]
    choose(driver, "group", str(groups.index("arith / minilm")))
    assert driver.find_element(by("ID"), "y-axis").get_attribute("value") == "exact_match"
    assert (
        frontier_text(driver) == "On the frontier (exact_match against training energy): read hidden_size=128, lora r=8"
    )
    choose(driver, "group", str(groups.index("tweets / minilm")))
    assert driver.find_element(by("ID"), "y-axis").get_attribute("value") == "accuracy"
