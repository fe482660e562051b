"""The energy-to-accuracy view: cost to reach the target with and without the checks' cost, the
checks' share, ratios to ``full``, "reached k of n", the order by cost, the bars cut at the axes and
records written before the checks' energy was metered (shown ``—``), from synthetic records.
"""

from __future__ import annotations

import pytest

from petlprof.report import frame
from petlprof.report.frame import runs_frame
from petlprof.report.intervals import ci_half_width
from petlprof.report.markdown import render_report, write_report
from petlprof.report.target import ENERGY_TO_TARGET, TIME_TO_TARGET, TargetPlot, target_configs, target_tables
from petlprof.report.target_plot import cost_to_target_figures, draw_cost_to_target, row_label

NEW = ("check_energy_j", "time_to_target_without_checks_s", "energy_to_target_without_checks_j")


def budgeted(method, seed, reached, time_s, energy_j, check_time_s, check_energy_j, old=False):
    """A finished run trained to accuracy ≥ 0.6; ``old``: a record from before the checks' energy was metered."""
    budget = {
        "target_metric": "accuracy",
        "target_value": 0.6,
        "reached": reached,
        "reached_at_step": 10 if reached else None,
        "time_to_target_s": time_s if reached else None,
        "energy_to_target_j": energy_j if reached else None,
        "check_time_s": check_time_s,
        "check_energy_j": check_energy_j,
        "time_to_target_without_checks_s": time_s - check_time_s if reached else None,
        "energy_to_target_without_checks_j": energy_j - check_energy_j if reached else None,
        "checks": [],
    }
    if old:
        budget = {k: v for k, v in budget.items() if k not in NEW}
    return {
        "schema_version": 1,
        "run_key": f"{method}-{seed}",
        "status": "ok",
        "method": method,
        "method_config": {},
        "backbone": "minilm",
        "task": "tweets3",
        "primary_metric": "accuracy",
        "seed": seed,
        "metrics": {"accuracy": 0.6 if reached else 0.5},
        "train": {"time_s": time_s, "energy_j": energy_j, "energy_kind": "measured", "budget": budget},
    }


def sweep():
    return [
        # full: time shares 0.1/0.25/0.5, energy shares 0.2/0.25/0.2857
        budgeted("full", 0, True, 10.0, 100.0, 1.0, 20.0),
        budgeted("full", 1, True, 12.0, 120.0, 3.0, 30.0),
        budgeted("full", 2, True, 14.0, 140.0, 7.0, 40.0),
        # read: two of three seeds reach it, each with half its cost in checks
        budgeted("read", 0, True, 4.0, 40.0, 2.0, 20.0),
        budgeted("read", 1, True, 6.0, 60.0, 3.0, 30.0),
        budgeted("read", 2, False, 9.0, 90.0, 5.0, 50.0),
        # lora: older records, no checks' energy and no figures without the checks
        budgeted("lora", 0, True, 20.0, 200.0, 5.0, 0.0, old=True),
        budgeted("lora", 1, True, 22.0, 220.0, 5.5, 0.0, old=True),
        # bitfit never gets there
        budgeted("bitfit", 0, False, 30.0, 300.0, 6.0, 60.0),
        budgeted("bitfit", 1, False, 30.0, 300.0, 6.0, 60.0),
    ]


FIGURES = [
    # (method, column, mean)
    ("full", "energy_to_target_j", 120.0),
    ("full", "energy_to_target_without_checks_j", 90.0),
    ("full", "check_share_energy", (0.2 + 0.25 + 40 / 140) / 3),
    ("full", "check_share_time", (0.1 + 0.25 + 0.5) / 3),
    ("read", "energy_to_target_j", 50.0),  # over the two seeds that reached it
    ("read", "check_share_energy", 0.5),
    ("read", "energy_to_target_j_vs_full", 50 / 120),
    ("read", "energy_to_target_without_checks_j_vs_full", 25 / 90),
    ("read", "time_to_target_s_vs_full", 5 / 12),
    ("read", "time_to_target_without_checks_s_vs_full", 2.5 / (25 / 3)),  # full: 9, 9, 7 s
    ("lora", "time_to_target_s_vs_full", 21 / 12),
    ("lora", "check_share_time", 0.25),
    ("lora", "check_share_energy", None),  # not recorded
    ("lora", "energy_to_target_without_checks_j_vs_full", None),
    ("bitfit", "energy_to_target_j", None),
]


@pytest.mark.parametrize("method, column, mean", FIGURES, ids=[f"{m}-{c}" for m, c, _ in FIGURES])
def test_cost_to_target_figures(method, column, mean):
    configs = target_configs(runs_frame(sweep())).set_index("method")
    assert configs.loc[method, column] == pytest.approx(mean if mean is not None else float("nan"), nan_ok=True)


def cells(line):
    return [c.strip() for c in line.strip("|").split("|")]


def table_rows():
    """The target table's rows as {method: {header: cell}}, in the table's order."""
    ((key, heading, table),) = target_tables(runs_frame(sweep()))
    assert key == ("tweets3", "minilm", "accuracy", 0.6) and heading == "accuracy ≥ 0.6 — minilm on tweets3"
    header, _, *rows = table.splitlines()
    return {cells(row)[0]: dict(zip(cells(header), cells(row))) for row in rows}


@pytest.mark.parametrize(
    "method, expected",
    [
        (
            "read",
            {
                "reached (seeds)": "2 of 3",
                "energy to target (J, mean ± 95% CI)": f"50.0 ± {ci_half_width([40, 60]):.1f}",
                "checks' share of energy": "50%",
                "energy without checks (J)": f"25.0 ± {ci_half_width([20, 30]):.1f}",
                "energy vs full": "0.42×",
                "energy without checks vs full": "0.28×",
                "time vs full": "0.42×",
                "time without checks vs full": "0.30×",
            },
        ),
        (
            "full",
            {"checks' share of energy": "25%", "checks' share of time": "28%", "energy vs full": "ref"},
        ),
        (
            "lora",  # older records: no checks' energy, nothing without the checks
            {
                "checks' share of energy": "—",
                "energy without checks (J)": "—",
                "energy without checks vs full": "—",
                "checks' share of time": "25%",
                "time vs full": "1.75×",
            },
        ),
        ("bitfit", {"reached (seeds)": "0 of 2", "energy to target (J, mean ± 95% CI)": "—", "energy vs full": "—"}),
    ],
)
def test_cost_to_target_table(method, expected):
    rows = table_rows()
    assert list(rows) == ["read", "full", "lora", "bitfit"]  # cheapest energy first, never-reached last
    assert {name: rows[method][name] for name in expected} == expected


# energy axis over the means 25..210 J: 10.2..224.8 J; read's bars (2 seeds, t = 12.7) run below it
# and lora's above it at 95%, none at ± 1 s.e.
@pytest.mark.parametrize(
    "kind, clipped, caption",
    [
        (
            "ci95",
            ["read (with checks): x low", "read (without checks): x low", "lora (with checks): x high"],
            "bars: 95% CI over 2/3 seeds (Student's t); 3 bar end(s) run past the axes: cut at the edge and marked "
            "with a caret",
        ),
        ("se", [], "bars: ± 1 s.e. over 2/3 seeds"),
    ],
)
def test_cost_to_target_plot(kind, clipped, caption):
    configs = target_configs(runs_frame(sweep()))
    plot = TargetPlot(title="t", cost=ENERGY_TO_TARGET, key=())
    fig = draw_cost_to_target(configs, runs_frame(sweep()), plot, kind)
    ax = fig.axes[0]
    assert plot.order == ["read — reached 2 of 3", "full", "lora", "bitfit — did not reach it (0 of 2)"]
    assert [t.get_text() for t in ax.get_yticklabels()] == plot.order
    assert ax.get_xlim() == pytest.approx((25 - 0.08 * 185, 210 + 0.08 * 185))
    assert plot.clipped == clipped and plot.caption == caption
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["as measured (target checks included)", "without the checks' measured cost"]


def test_old_records_only_say_the_figures_without_checks_are_not_recorded():
    old = [r for r in sweep() if r["method"] == "lora"]
    plot = TargetPlot(title="t", cost=TIME_TO_TARGET, key=())
    fig = draw_cost_to_target(target_configs(runs_frame(old)), runs_frame(old), plot, "ci95")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "without the checks' measured cost: not recorded (older records)" in legend


def test_row_label_says_how_many_seeds_reached_it():
    assert row_label({"name": "lora r=8", "n_seeds": 3, "reached": 3}) == "lora r=8"
    assert row_label({"name": "lora r=8", "n_seeds": 3, "reached": 1}) == "lora r=8 — reached 1 of 3"


def test_report_shows_the_cost_to_target_plots_and_table(tmp_path):
    plots = cost_to_target_figures(runs_frame(sweep()), tmp_path, "ci95")
    assert [p.path.name for p in plots] == ["cost_to_target_energy.png", "cost_to_target_time.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for plot in plots for p in plot.paths if p.suffix == ".png")
    assert plots[0].title == "Train energy to reach accuracy ≥ 0.6 — backbone minilm, task tweets3"
    report = render_report(sweep(), runs_frame(sweep()), [], plots)
    section = report.split("## Cost to reach the target", 1)[1].split("\n## ", 1)[0]
    assert "### accuracy ≥ 0.6 — minilm on tweets3" in section
    assert (
        "![Train energy to reach accuracy ≥ 0.6 — backbone minilm, task tweets3](cost_to_target_energy.png)" in section
    )
    assert "Bars: 95% CI over 2/3 seeds (Student's t); 3 bar end(s) run past the axes" in section
    assert cost_to_target_figures(runs_frame([r for r in sweep() if r["method"] == "bitfit"]), tmp_path, "ci95") == []


def test_the_report_builds_its_runs_table_once(tmp_path, monkeypatch):
    # every plot and table of results reads the one runs table write_report builds: each record becomes a
    # row once, however many sections (configurations, differences, cost to target, Pareto plots) read it
    rows = []
    monkeypatch.setattr(frame, "_row", lambda record, row=frame._row: rows.append(record) or row(record))
    records = sweep()
    written = {p.name for p in write_report(records, tmp_path)}
    assert {"cost_to_target_energy.png", "pareto_accuracy_vs_energy.png", "report.md"} <= written
    report = (tmp_path / "report.md").read_text()
    assert "## Cost to reach the target" in report and "## Which differences are larger" in report
    assert len(rows) == len(records)
