"""Error bars a reader can trust: the interval kinds (95% t-interval, standard error) for known inputs,
Welch's interval of a difference, the captions, axes that follow the means with bars cut and marked
at the edge (which ones, for synthetic sweeps), the differences table and ``petlprof report --interval``.
"""

from __future__ import annotations

import json
import math

import pytest

from petlprof.cli import main
from petlprof.report.differences import difference_tables
from petlprof.report.frame import frontier, runs_frame
from petlprof.report.intervals import caption, half_width, standard_error, welch_difference
from petlprof.report.plotkit import CARETS, axis_limits, bar_ends
from petlprof.report.plots import ENERGY_AXIS, draw_pareto

T2 = 4.302652729911275  # Student's t, 97.5% quantile, 2 degrees of freedom
T1 = 12.706204736174707  # ... 1 degree of freedom


def run(method, seed, accuracy, energy_j, task="tweets3"):
    """A finished run's record with what the report reads."""
    return {
        "schema_version": 1,
        "run_key": f"{method}-{seed}-{task}",
        "status": "ok",
        "method": method,
        "method_config": {},
        "backbone": "minilm",
        "task": task,
        "primary_metric": "accuracy",
        "seed": seed,
        "trainable_params": 1000,
        "total_params": 100000,
        "metrics": {"accuracy": accuracy},
        "train": {"time_s": energy_j / 10, "energy_j": energy_j, "energy_kind": "measured", "peak_memory_bytes": 2**20},
    }


def sweep(configs):
    """Records from {method: [(accuracy, energy_j) per seed]}."""
    return [run(m, seed, acc, e) for m, seeds in configs.items() for seed, (acc, e) in enumerate(seeds)]


@pytest.mark.parametrize(
    "values, ci95, se",
    [
        ([1.0, 2.0, 3.0], T2 / math.sqrt(3), 1 / math.sqrt(3)),  # sd 1
        ([0.5, 0.7], T1 * 0.1, 0.1),  # sd 0.1414, se 0.1: two seeds make the 95% interval 12.7 s.e. wide
        ([0.8, 0.8, 0.8], 0.0, 0.0),
        ([0.8], math.nan, math.nan),  # one seed: no interval
        ([0.8, None, math.nan], math.nan, math.nan),  # missing values are not seeds
    ],
)
def test_interval_half_widths_for_known_inputs(values, ci95, se):
    for kind, expected in (("ci95", ci95), ("se", se)):
        assert half_width(values, kind) == pytest.approx(expected, nan_ok=True)
    assert standard_error(values) == pytest.approx(se, nan_ok=True)


def test_an_unknown_interval_kind_names_the_choices():
    with pytest.raises(Exception, match="unknown interval 'ci90'.*Valid choices: ci95, se"):
        half_width([1.0, 2.0], "ci90")


@pytest.mark.parametrize(
    "a, b, diff, half",
    [
        ([1, 2, 3], [4, 5, 6, 7], -3.5, 2.231711481338788),  # scipy ttest_ind(equal_var=False).confidence_interval
        ([0.80, 0.82, 0.81], [0.70, 0.75, 0.72], 0.08666666666666667, 0.05415189721462843),
        ([0.5, 0.5], [0.4, 0.4], 0.1, 0.0),  # neither side varies
        ([0.5], [0.4, 0.45], 0.075, math.nan),  # one seed: no interval
    ],
)
def test_welch_interval_of_a_difference(a, b, diff, half):
    got_diff, got_half = welch_difference(a, b)
    assert (got_diff, got_half) == (pytest.approx(diff), pytest.approx(half, nan_ok=True))


@pytest.mark.parametrize(
    "kind, seeds, expected",
    [
        ("ci95", [3, 3], "bars: 95% CI over 3 seeds (Student's t)"),
        ("se", [3, 5], "bars: ± 1 s.e. over 3/5 seeds"),
        ("ci95", [2, 1], "bars: 95% CI over 2 seeds (Student's t); single-seed points have none"),
        ("se", [1, 1], "one seed per point: no bars"),
    ],
)
def test_caption_says_what_the_bars_are(kind, seeds, expected):
    assert caption(kind, seeds) == expected


@pytest.mark.parametrize(
    "values, log, expected",
    [
        ([0.6, 0.8], False, (0.584, 0.816)),  # 8% of the span on each side
        ([100.0], False, (92.0, 108.0)),  # one value: 8% of itself
        ([0.0], False, (-0.08, 0.08)),
        ([10.0, 1000.0], True, (10**0.84, 10**3.16)),  # in decades on a log axis
    ],
)
def test_axis_limits_follow_the_means(values, log, expected):
    assert axis_limits(values, log=log) == pytest.approx(expected)


@pytest.mark.parametrize(
    "centre, below, above, ends",
    [
        (5.0, 1.0, 1.0, (4.0, 6.0, False, False)),
        (5.0, 10.0, 1.0, (0.0, 6.0, True, False)),
        (5.0, 1.0, 10.0, (4.0, 8.0, False, True)),
        (5.0, 0.0, 0.0, (5.0, 5.0, False, False)),
    ],
)
def test_bar_ends_are_cut_at_the_axes(centre, below, above, ends):
    assert bar_ends(centre, below, above, (0.0, 8.0)) == pytest.approx(ends)


# full: accuracy ±0.127 (95%) or ±0.01 (s.e.), energy ±63.5 or ±5; lora: accuracy ±0.0635 or ±0.005,
# energy without spread; bitfit: one seed.  Axes: accuracy 0.5886..0.8264, energy 97.4..207.6 J.
SWEEP = {"full": [(0.80, 100.0), (0.82, 110.0)], "lora": [(0.60, 200.0), (0.61, 200.0)], "bitfit": [(0.70, 150.0)]}


@pytest.mark.parametrize(
    "kind, clipped, legend",
    [
        (
            "ci95",
            ["full: x low", "full: y high", "lora: y low"],
            "bars: 95% CI over 2 seeds (Student's t); single-seed points have none",
        ),
        ("se", [], "bars: ± 1 s.e. over 2 seeds; single-seed points have none"),
    ],
)
def test_pareto_bars_run_off_the_axes_cut_and_marked(kind, clipped, legend):
    configs = frontier(runs_frame(sweep(SWEEP)), x="energy_j", y="accuracy")
    fig, text, cut = draw_pareto(configs, "accuracy", "accuracy", ENERGY_AXIS, "energy", "title", interval=kind)
    ax = fig.axes[0]
    assert sorted(cut) == clipped
    assert ax.get_xlim() == pytest.approx((97.4, 207.6)) and ax.get_ylim() == pytest.approx((0.5886, 0.8264))
    carets = sorted(
        (line.get_marker(), float(line.get_xdata()[0]), float(line.get_ydata()[0]))
        for line in ax.lines
        if line.get_marker() in CARETS.values()
    )
    edges = {"x low": ("<", 97.4, 0.81), "y high": ("^", 105.0, 0.8264), "y low": ("v", 200.0, 0.5886)}
    expected = sorted(edges[end.split(": ")[1]] for end in clipped)
    assert carets == [(m, pytest.approx(x), pytest.approx(y)) for m, x, y in expected]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend in labels
    assert any("cut at the axes' edge" in label for label in labels) == bool(clipped)
    assert text == legend + (
        f"; {len(clipped)} bar end(s) run past the axes: cut at the edge and marked with a caret" if clipped else ""
    )


def test_differences_table_says_which_are_larger_than_their_interval():
    records = sweep(
        {
            "full": [(0.80, 1.0), (0.82, 1.0), (0.81, 1.0)],
            "read": [(0.70, 1.0), (0.75, 1.0), (0.72, 1.0)],  # 0.0867 ± 0.0542 below full: larger
            "lora": [(0.80, 1.0), (0.84, 1.0), (0.81, 1.0)],  # 0.0067 above full, interval ± 0.05: not
            "bitfit": [(0.78, 1.0)],  # one seed: no interval
            "ia3": [(0.99, 1.0), (0.99, 1.0)],  # on random weights below: cost-only, left out
        }
    )
    for rec in records:
        if rec["method"] == "ia3":
            rec["backbone_info"] = {"random_init": True}
    ((task, backbone, table),) = difference_tables(runs_frame(records))
    assert (task, backbone) == ("tweets3", "minilm")
    header, _, *rows = table.splitlines()
    assert header == (
        "| method | config | seeds | accuracy (mean) | Δ vs best (95% CI, Welch) | larger than its interval "
        "| Δ vs full (95% CI, Welch) | larger than its interval |"
    )
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == ["lora", "full", "bitfit", "read"]  # best mean first; no random-init run
    full_vs_lora = welch_difference([0.80, 0.82, 0.81], [0.80, 0.84, 0.81])
    assert cells[0][4:] == ["best", "—", f"+{-full_vs_lora[0]:.4f} ± {full_vs_lora[1]:.4f}", "no"]
    assert cells[1][6:] == ["ref", "—"]
    assert cells[2][5] == "—" and cells[2][7] == "—"
    assert cells[3][6:] == ["−0.0867 ± 0.0542", "yes"]


def test_report_interval_option_reaches_the_plots_and_report(tmp_path, capsys):
    store = tmp_path / "results.jsonl"
    store.write_text("\n".join(json.dumps(r) for r in sweep(SWEEP)) + "\n")
    assert main(["report", str(tmp_path), "--interval", "se"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "± 1 standard error of the mean over seeds" in report
    assert "Bars: ± 1 s.e. over 2 seeds; single-seed points have none." in report
    assert "## Which differences are larger than their intervals" in report
    assert "Cost to reach the target" not in report  # no run had a target
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path), "--interval", "sd"])
    err = capsys.readouterr().err.replace("'", "")
    assert exit_.value.code == 2 and "--interval: invalid choice: sd (choose from ci95, se)" in err
