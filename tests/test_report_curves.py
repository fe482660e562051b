"""Learning curves from the target checks: which runs give points, the mean over the seeds still
training at each step, which targets get a line, and the files written."""

from __future__ import annotations

import math

import pytest

from petlprof.report.curves import curve_frame, draw_curves, learning_curve_figures, mean_curve, target_lines
from petlprof.report.intervals import half_width


def record(method, seed, checks, target=0.6, status="ok", config=None, task="tweets3"):
    return {
        "status": status,
        "method": method,
        "method_config": config or {},
        "method_config_changed": [],
        "task": task,
        "backbone": "minilm",
        "seed": seed,
        "train": {
            "budget": {
                "target_metric": "accuracy",
                "target_value": target,
                "check_eval_size": 300,
                "eval_every_steps": 4,
                "checks": [{"step": s, "value": v, "elapsed_s": 1.0} for s, v in checks],
            }
        },
    }


RECORDS = [
    record("full", 0, [(4, 0.40), (8, 0.50), (12, 0.62)]),  # reached 0.6 at step 12
    record("full", 1, [(4, 0.44), (8, 0.52), (12, 0.58), (16, 0.61)]),
    record("read", 0, [(4, 0.30), (8, 0.35)]),
    record("read", 1, [(4, 0.50)], status="failed"),  # not ok: no points
    {"status": "ok", "method": "lora", "seed": 0, "task": "tweets3", "backbone": "minilm", "train": {}},  # no budget
]


def test_the_frame_holds_every_check_of_every_ok_run_with_a_budget():
    frame = curve_frame(RECORDS)
    assert sorted(frame["label"].unique()) == ["full", "read"]
    assert len(frame) == 3 + 4 + 2
    assert set(frame["slice"]) == {300} and set(frame["every"]) == {4}


MEAN_CASES = [
    # (label, expected (step, mean, seeds) rows): a seed that stopped at its target leaves the mean
    ("full", [(4, 0.42, 2), (8, 0.51, 2), (12, 0.60, 2), (16, 0.61, 1)]),
    ("read", [(4, 0.30, 1), (8, 0.35, 1)]),
]


@pytest.mark.parametrize("label, expected", MEAN_CASES)
def test_the_mean_is_over_the_seeds_checked_at_each_step(label, expected):
    frame = curve_frame(RECORDS)
    mean = mean_curve(frame[frame["label"] == label])
    got = [(int(r.step), round(float(r.value), 6), int(r.seeds)) for r in mean.itertuples()]
    assert got == [(s, pytest.approx(v), n) for s, v, n in expected]


@pytest.mark.parametrize("interval", ["ci95", "se"])
def test_each_steps_mean_carries_its_interval_where_two_seeds_reached_it(interval):
    frame = curve_frame(RECORDS)
    mean = mean_curve(frame[frame["label"] == "full"], interval)
    by_step = dict(zip(mean["step"], mean["half_width"]))
    for step, values in ((4, [0.40, 0.44]), (8, [0.50, 0.52]), (12, [0.62, 0.58])):
        assert by_step[step] == pytest.approx(half_width(values, interval))
    assert math.isnan(by_step[16])  # one seed went on past its target: no interval
    assert by_step[4] > 0 and (interval == "se" or by_step[4] == pytest.approx(12.706 * 0.02, rel=1e-3))


def test_a_configuration_of_several_seeds_is_drawn_with_its_band_and_a_single_seed_without(tmp_path):
    from matplotlib.collections import PolyCollection

    frame = curve_frame(RECORDS)
    fig = draw_curves(frame, "t", interval="se")
    steps = fig.axes[0]
    bands = [c for c in steps.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # full's two seeds; read has one
    top = bands[0].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(0.60 + half_width([0.62, 0.58], "se"))  # the band's top at step 12
    assert any("band: ± 1 standard error" in text.get_text() for text in steps.get_legend().get_texts())
    wide = draw_curves(frame, "t")  # ci95 over two seeds: 12.7 standard errors each side, cut at the axes
    assert wide.axes[0].get_ylim()[1] < 0.62 + half_width([0.62, 0.58], "ci95")
    assert wide.axes[0].get_ylim()[0] <= 0.30 and wide.axes[0].get_ylim()[1] >= 0.62  # every value shown
    solo = draw_curves(frame[frame["label"] == "read"], "t")
    assert not [c for c in solo.axes[0].collections if isinstance(c, PolyCollection)]
    assert not any("band" in text.get_text() for text in solo.axes[0].get_legend().get_texts())


@pytest.mark.parametrize(
    "targets, lines",
    [
        ([0.6], [0.6]),  # inside the values' span
        ([1.0], []),  # an unreachable target that only traced the curve: no line squeezing it
        ([0.6, 0.5], [0.5, 0.6]),
        ([0.645], [0.645]),  # within a tenth of the span (0.30 .. 0.62: 0.032) above the highest value
    ],
)
def test_only_targets_near_the_curves_get_a_line(targets, lines):
    records = [record("full", i, [(4, 0.30), (8, 0.62)], target=t) for i, t in enumerate(targets)]
    assert target_lines(curve_frame(records)) == lines


def test_one_plot_per_task_and_backbone_with_both_formats(tmp_path):
    plots = learning_curve_figures([*RECORDS, record("full", 0, [(4, 0.7)], task="tweets")], tmp_path)
    assert [(p.task, p.configurations) for p in plots] == [("tweets", 1), ("tweets3", 2)]
    for plot in plots:
        assert plot.path.stat().st_size > 0 and plot.stem.with_suffix(".svg").exists()
    assert learning_curve_figures(RECORDS[-1:], tmp_path / "none") == []


def test_the_report_shows_the_curves_only_for_runs_with_checks(tmp_path):
    from petlprof.report.markdown import write_report

    written = write_report(RECORDS[:3], tmp_path / "with")
    text = (tmp_path / "with" / "report.md").read_text()
    assert "## Learning curves" in text and "(learning_curves.png)" in text
    assert tmp_path / "with" / "learning_curves.png" in written
    write_report(RECORDS[-1:], tmp_path / "without")
    assert "## Learning curves" not in (tmp_path / "without" / "report.md").read_text()


def curve(method, seed, points, metric="accuracy", val_size=200, kind="measured"):
    """A record of a run with a learning curve: (step, value, training energy so far, training time so far)."""
    return {
        "status": "ok",
        "method": method,
        "method_config": {},
        "method_config_changed": [],
        "task": "arith",
        "backbone": "smollm2",
        "seed": seed,
        "spec": {"val_size": val_size} if val_size else {},
        "train": {
            "energy_kind": kind,
            "budget": {
                "target_metric": metric,
                "target_value": None,
                "check_eval_size": val_size,
                "eval_every_steps": 10,
                "checks": [
                    {"step": s, "value": v, "elapsed_s": t + 1.0, "train_time_s": t, "train_energy_j": e}
                    for s, v, e, t in points
                ],
            },
        },
    }


LEVEL_CASES = [
    # (id, records, metric, expected level, expected (label, step, energy, time) to it)
    (
        "drifts, then the other climbs past: the level is the worse of the two bests",
        [
            curve("read", 0, [(10, 0.30, 5.0, 1.0), (20, 0.38, 10.0, 2.0), (30, 0.06, 15.0, 3.0)]),
            curve("lora", 0, [(10, 0.10, 8.0, 1.5), (20, 0.20, 16.0, 3.0), (30, 0.44, 24.0, 4.5)]),
        ],
        "exact_match",
        0.38,
        [("lora", 30, 24.0, 4.5), ("read", 20, 10.0, 2.0)],
    ),
    (
        "means over seeds at each step",
        [
            curve("full", 0, [(10, 0.5, 4.0, 1.0), (20, 0.7, 8.0, 2.0)]),
            curve("full", 1, [(10, 0.7, 6.0, 1.2), (20, 0.9, 10.0, 2.2)]),
            curve("bitfit", 0, [(10, 0.55, 1.0, 0.5), (20, 0.6, 2.0, 1.0)]),
        ],
        "accuracy",
        0.6,
        [("bitfit", 20, 2.0, 1.0), ("full", 10, 5.0, 1.1)],
    ),
    (
        "lower is better",
        [
            curve("full", 0, [(10, 3.0, 4.0, 1.0), (20, 2.0, 8.0, 2.0)], metric="eval_loss"),
            curve("read", 0, [(10, 2.5, 1.0, 0.5), (20, 2.4, 2.0, 1.0)], metric="eval_loss"),
        ],
        "eval_loss",
        2.4,
        [("full", 20, 8.0, 2.0), ("read", 20, 2.0, 1.0)],
    ),
]


@pytest.mark.parametrize(
    "records, metric, level, expected", [c[1:] for c in LEVEL_CASES], ids=[c[0] for c in LEVEL_CASES]
)
def test_the_cost_to_a_common_level_is_read_from_the_curves(records, metric, level, expected):
    from petlprof.report.curves import common_level, costs_to_level

    frame = curve_frame(records)
    assert common_level(frame) == pytest.approx(level)
    costs = {c.label: (c.step, c.energy_j, c.time_s) for c in costs_to_level(frame, common_level(frame))}
    assert costs == {label: (step, pytest.approx(energy), pytest.approx(t)) for label, step, energy, t in expected}


def test_one_configuration_has_no_common_level_and_old_records_say_their_split():
    from petlprof.report.curves import common_level

    frame = curve_frame([curve("read", 0, [(10, 0.3, 1.0, 1.0)], val_size=None)])
    assert common_level(frame) is None
    assert set(frame["split"]) == {"evaluation"}, "a record from before validation splits scored the eval split"
    assert set(curve_frame([curve("read", 0, [(10, 0.3, 1.0, 1.0)])])["split"]) == {"validation"}


def test_the_report_gives_each_configurations_cost_to_the_common_level(tmp_path):
    from petlprof.report.markdown import write_report

    records = LEVEL_CASES[1][1]
    written = write_report(records, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "first step at 0.6" in text and "training energy to it (J, measured)" in text
    assert "| bitfit | 0.6000 | 20 | 2.0 | 1.00 |" in text
    assert any(p.name == "learning_curves.png" for p in written)
