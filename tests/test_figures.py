"""Every measured figure is declared once (petlprof.results.figures): no other module spells a figure's key,
declarations refuse what they cannot mean, and what derives from them (rank aggregation, DataFrame
columns, report headers, the direction table) follows a declaration, including the training phase's
tokens per second, the figure added by declaration and meter alone."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from petlprof.bench.plugin import RATIO_RTOL, default_rtol
from petlprof.bench.profile import StepProfile
from petlprof.report.frame import runs_frame
from petlprof.report.table import columns
from petlprof.results import figures
from petlprof.results.figures import ENERGY, HIGHER, LOWER, MAX, RATE, SUM, TIME, TOKENS, TOKENS_PER_S, Figure
from petlprof.results.result import RunResult
from petlprof.run import distributed
from petlprof.run.execute import execute
from petlprof.sweep.spec import RunSpec
from petlprof.tasks.metrics import direction

ROOT = Path(__file__).resolve().parents[1]
# counts (samples, steps, tokens) are plain words elsewhere too (power samples, tokenizer tokens); every
# figure with a unit in its name is a record key and nothing else
KEYS = {f.name for f in figures.FIGURES if f.unit != "count"}
# the declarations alone: the notebook API's docstring and the GPU script name figures by them too
SPELLERS = {"petlprof/results/figures.py"}
QUOTED = re.compile(r"""["']([a-z0-9_]+)["']""")
# the static memory breakdown's keys (declared as a group in petlprof.results.figures; its optimiser state is a
# step figure)
BREAKDOWN_KEYS = {*figures.STATIC_BREAKDOWN, figures.BREAKDOWN_QUANTIZATION_STATE, figures.BREAKDOWN_TOTAL}


def _spelled_keys(source: str, keys: set[str] = KEYS) -> set[str]:
    """The figure keys ``source`` spells as a string: a string constant, or a quoted word in any text (a
    docstring's example or a comment counts too)."""
    constants = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and n.value in keys}
    return constants | {word for word in QUOTED.findall(source) if word in keys}


def _spelled_keys_text(text: str, keys: set[str] = KEYS) -> set[str]:
    """The figure keys a non-Python text (a shell script's embedded Python) spells in quotes."""
    return {word for word in QUOTED.findall(text) if word in keys}


def _spelling_modules(keys: set[str] = KEYS) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted([*(ROOT / "petlprof").rglob("*.py"), *(ROOT / "methods").rglob("*.py")]):
        if spelled := _spelled_keys(path.read_text(encoding="utf-8"), keys):
            found[path.relative_to(ROOT).as_posix()] = spelled
    return found


@pytest.mark.parametrize(
    "source, spelled",
    [
        ('x = "energy_j"\n', {"energy_j"}),
        ('"""A point ({"accuracy": 0.8, "peak_memory_bytes": 3})."""\n', {"peak_memory_bytes"}),
        ("x = ENERGY.name  # the energy figure\n", set()),
        ('x = "energy"\n', set()),
        ('resident -= breakdown["optimizer_state_bytes"]\n', {"optimizer_state_bytes"}),
    ],
    ids=["constant", "docstring example", "declaration", "another word", "the breakdown's optimiser state"],
)
def test_the_spelling_check_sees_constants_and_quoted_words_in_text(source, spelled):
    assert _spelled_keys(source) == spelled


def test_only_the_declarations_spell_a_figure_key():
    found = _spelling_modules()
    assert set(found) == SPELLERS, {m: sorted(k) for m, k in found.items() if m not in SPELLERS}
    assert len(found) <= 1
    script = (ROOT / "scripts" / "gpu-first-contact.sh").read_text(encoding="utf-8")
    assert not _spelled_keys_text(script), "the GPU script names figures by their declarations"


def test_only_the_declarations_spell_a_memory_breakdown_key():
    found = _spelling_modules(BREAKDOWN_KEYS)
    assert found.pop("petlprof/results/figures.py") == BREAKDOWN_KEYS
    assert found == {}  # the estimate too reads the breakdown and names its memory figures by the declarations
    assert _spelled_keys('x = static["total_bytes"]\n', BREAKDOWN_KEYS) == {"total_bytes"}


def test_the_step_figures_are_a_step_profiles_fields_by_name():
    profile = StepProfile("m", "b", 2, 8, 10, 100, 400, 40, 80, 1000)
    step = [f for f in figures.FIGURES if figures.STEP in f.phases and f is not figures.STEP_TIME_RATIO]
    assert [profile.figure(f) for f in step] == [400, 40, 80, 10, 1000, 400 + 40 + 80 + 1000]
    assert figures.BREAKDOWN_OPTIMIZER_STATE == figures.OPTIMIZER_STATE.name  # the breakdown's and the step's


BAD = [  # (fields, what the error names)
    (dict(better="smaller"), "smaller"),
    (dict(ranks="average"), "average"),
    (dict(ranks=RATE), "per="),  # a rate without its count
    (dict(ranks=SUM, per=TOKENS), "per="),  # a count per second that is not a rate
    (dict(baseline="sometimes"), "sometimes"),  # no rule the bench fixture knows
]


@pytest.mark.parametrize("fields, named", BAD, ids=[str(f) for f, _ in BAD])
def test_a_declaration_that_cannot_mean_anything_is_refused(fields, named):
    declared = dict(name="x_j", unit="J", better=LOWER, ranks=MAX, label="x", phases=("train",)) | fields
    with pytest.raises(ValueError, match=re.escape(named)):
        Figure(**declared)


def test_names_are_unique_and_each_direction_reaches_the_direction_table():
    names = [f.name for f in figures.FIGURES]
    assert len(names) == len(set(names))
    for f in figures.FIGURES:
        if f.better is None:  # a count, no cost: no frontier may be drawn over it
            with pytest.raises(KeyError, match=f.name):
                direction(f.name)
        else:
            assert direction(f.name) == f.better
    assert (ENERGY.better, TOKENS_PER_S.better) == (LOWER, HIGHER)


SHOWN = [  # (figure, value in its record unit, shown text, header)
    (figures.PEAK_MEMORY, 3 * 2**20, "3.0", "peak mem (MiB)"),
    (figures.LATENCY, 0.0123, "12.3", "p50 latency (ms/batch)"),
    (figures.CO2, 0.5, "0.500", "CO2-eq (g)"),
    (TOKENS_PER_S, 1234.56, "1234.6", "tokens/s (1/s)"),
]


@pytest.mark.parametrize("figure, value, text, header", SHOWN, ids=[s[0].name for s in SHOWN])
def test_a_figure_is_shown_in_its_declared_unit_and_format(figure, value, text, header):
    assert (figure.shown(value), figure.header, figure.shown(None)) == (text, header, None)


def _rank_phase(time_s: float, samples: int, tokens: int, energy_j: float) -> dict:
    return {
        "time_s": time_s,
        "samples": samples,
        "tokens": tokens,
        "tokens_per_s": tokens / time_s,
        "energy_j": energy_j,
        "energy_kind": "measured",
        "energy_meter": "nvml",
        "peak_memory_bytes": 100 * samples,
        "latency_s": {"p50": time_s / 10},
        "warnings": [],
    }


def test_ranks_combine_each_figure_as_declared_the_new_rate_included():
    phases = [_rank_phase(2.0, 8, 100, 5.0), _rank_phase(4.0, 8, 60, 7.0)]
    out = distributed._aggregate_phase(phases, [0, 1], ["h", "h"], ["cuda:0", "cuda:1"])
    assert (out["time_s"], out["samples"], out["tokens"]) == (4.0, 16, 160)  # slowest rank, sums
    assert (out["samples_per_s"], out["tokens_per_s"]) == (4.0, 40.0)  # counts over the slowest rank's time
    assert (out["energy_j"], out["peak_memory_bytes"], out["latency_s"]) == (12.0, 800, {"p50": 0.4})
    assert out["per_rank"]["energy_j"] == [5.0, 7.0]
    assert out["aggregation"]["time_s"] == TIME.ranks


def test_old_records_without_the_new_figure_aggregate_as_before():
    phases = [_rank_phase(2.0, 8, 100, 5.0), _rank_phase(4.0, 8, 60, 7.0)]
    for phase in phases:
        del phase["tokens"], phase["tokens_per_s"]
    out = distributed._aggregate_phase(phases, [0, 1], ["h", "h"], ["cuda:0", "cuda:1"])
    assert "tokens" not in out and "tokens_per_s" not in out and not out["warnings"]


@pytest.fixture(scope="module")
def record():
    spec = RunSpec(
        method="bitfit",
        backbone="tiny-bert",
        train_size=16,
        eval_size=8,
        batch_size=8,
        max_steps=3,
        inference_window_s=0.0,
    )
    out = execute(spec)
    assert out["status"] == "ok", out.get("error")
    return out


def test_the_training_phase_measures_tokens_per_second(record):
    train = record["train"]
    max_length = record["spec"]["max_length"]
    assert train["samples"] <= train["tokens"] <= train["samples"] * max_length  # padding is not counted
    assert math.isclose(train["tokens_per_s"], train["tokens"] / train["time_s"])
    assert "tokens_per_s" not in record["eval"]  # declared for the training phase only


def test_the_dataframe_and_the_table_follow_the_declarations(record):
    frame = runs_frame([record])
    for phase in figures.MEASURED_PHASES:
        for column, figure in figures.frame_columns(phase).items():
            value = record[phase]
            for key in figure.path:
                value = value.get(key) if isinstance(value, dict) else None
            shown = frame[column].iloc[0]
            assert math.isnan(shown) if value is None else shown == pytest.approx(value), column
    assert frame["tokens_per_s"].iloc[0] == pytest.approx(record["train"]["tokens_per_s"])
    headers = [c.header for c in columns([RunResult.from_json(record)])]
    assert {f"train {f.header}" for f in (TIME, ENERGY, figures.PEAK_MEMORY)} <= set(headers)
    assert f"eval {figures.LATENCY.header}" in headers


def test_the_bench_fixture_checks_the_declared_exact_counts_of_a_step_profile():
    profile = StepProfile("m", "b", 2, 8, 10, 100, 400, 40, 80, 1000)
    exact = figures.checked_against_baseline(figures.EXACT)
    assert {f.name for f in exact} == {"trainable_params", "saved_activation_bytes", "training_tensor_bytes"}
    assert [profile.figure(f) for f in exact] == [10, 1000, 400 + 40 + 80 + 1000]
    assert figures.checked_against_baseline(figures.GROWTH) == (figures.STEP_TIME_RATIO,)
    assert default_rtol(figures.STEP_TIME_RATIO) == RATIO_RTOL and default_rtol(figures.SAVED_ACTIVATIONS) == 0.05
    with pytest.raises(KeyError, match="step_time_ratio"):  # a ratio of two steps, no figure of one profile
        profile.figure(figures.STEP_TIME_RATIO)
    with pytest.raises(ValueError, match=ENERGY.name):
        default_rtol(ENERGY)
