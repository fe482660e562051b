"""Language-modelling runs end to end: a run's record on a causal and an encoder–decoder preset (the
scores of generated text, perplexity, the generation phase), the zero-shot row a generative sweep
gets, and the options a generative run refuses up front.

The runs use the tiny random presets (a few steps, a handful of prompts): what is checked is the
record's shape and the figures' consistency, not what a random model learns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from petlprof.cli import main
from petlprof.results.records import OK, measured_phases_s
from petlprof.run.execute import execute
from petlprof.sweep.config import build_options, expand
from petlprof.sweep.spec import RunSpec
from petlprof.vocabulary import ZERO_SHOT

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]

TINY_LM = dict(task="arith", train_size=8, eval_size=4, batch_size=4, max_steps=2, max_new_tokens=4, warmup_steps=0)
GENERATION_FIGURES = ("tokens_per_s", "energy_per_token_j", "time_to_first_token_s")


@pytest.mark.parametrize("backbone", ["tiny-llama", "tiny-t5"])
@pytest.mark.parametrize("method", ["lora", "read"])
def test_an_lm_run_scores_its_generations_and_measures_generation(backbone, method):
    record = execute(RunSpec(method=method, backbone=backbone, inference_window_s=0.05, **TINY_LM))
    assert record["status"] == OK, record.get("traceback")
    assert record["primary_metric"] == "exact_match" and record["task_info"]["objective"] == "lm"
    metrics = record["metrics"]
    assert 0.0 <= metrics["exact_match"] <= 1.0
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    assert "inference" not in record  # generation takes its place
    sizes = {key for key in record["generation"] if key.startswith("batch_")}
    assert sizes == {"batch_1", "batch_4"}
    for size in sizes:
        phase = record["generation"][size]
        for figure in GENERATION_FIGURES:
            assert phase[figure] is not None and phase[figure] >= 0, (size, figure)
        assert phase["tokens_per_s"] * phase["time_s"] == pytest.approx(phase["generated_tokens"], rel=1e-6)
    examples = record["eval"]["examples"]
    assert len(examples) == 3 and all(set(e) == {"prompt", "generated", "reference"} for e in examples)
    assert record["eval"]["samples"] == 4  # every evaluation prompt answered
    json.dumps(record, allow_nan=False)  # a valid JSON line: no NaN or inf figure
    weights = 4 * record["trainable_params"]  # float32: the checkpoint is the trainable tensors plus a header
    assert weights < record["checkpoint_bytes"] < weights + 64 * 1024
    assert measured_phases_s(record) >= record["generation"]["batch_1"]["time_s"]


def test_the_zero_shot_run_trains_nothing_and_costs_no_training_energy():
    record = execute(RunSpec(method=ZERO_SHOT, backbone="tiny-llama", inference_window_s=0.05, **TINY_LM))
    assert record["status"] == OK, record.get("traceback")
    assert record["trainable_params"] == 0 and record["checkpoint_bytes"] == 0  # nothing to save
    assert record["train"]["steps"] == 0 and record["train"]["energy_j"] == 0.0 and record["train"]["time_s"] == 0.0
    assert record["train"]["energy_kind"] == record["eval"]["energy_kind"]
    assert record["generation"]["batch_1"]["tokens_per_s"] > 0


def _options(**values):
    return build_options({}, values)


def test_a_generative_sweep_gets_one_zero_shot_row_per_backbone_and_task():
    options = _options(methods=["read", "lora"], backbone=["tiny-llama"], task=["arith"], seeds=[0, 1])
    specs = expand(options, "cpu")
    zero = [s for s in specs if s.method == ZERO_SHOT]
    assert len(zero) == 1 and zero[0].seed == 0 and zero[0].task == "arith"
    assert len(specs) == 1 + 2 * 2
    classification = expand(_options(methods=["read"], backbone=["tiny-bert"], task=["tweets"]), "cpu")
    assert all(s.method != ZERO_SHOT for s in classification)


def test_default_options_leave_every_classification_run_key_as_it_was():
    assert RunSpec(method="read").run_key == "3eaec3a38967b4f0"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--task", "tweets", "--max-new-tokens", "8"], "--max-new-tokens"),
        (["--task", "arith", "--nproc-per-run", "2"], "--nproc-per-run 2"),
        (["--task", "arith", "--methods", "lm_normtune:SPEC"], "does not support the 'lm' objective"),
        (["--task", "arith", "--backbone", "tiny-bert"], "tiny-bert"),
    ],
)
def test_what_a_generative_run_cannot_do_is_refused_before_any_run(tmp_path, capsys, monkeypatch, argv, words):
    plugin = ROOT / "examples" / "petlprof-normtune" / "petlprof_normtune" / "__init__.py"
    (tmp_path / "lm_normtune.py").write_text(plugin.read_text())  # a plug-in that declares classification only
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["run", "--methods", "lora", "--backbone", "tiny-llama", "--train-size", "8", "--eval-size", "4"]
    args += [*argv, "--output", str(tmp_path / "out")]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("petlprof: error:") == 1 and words in err, err
    assert not (tmp_path / "out").exists()
