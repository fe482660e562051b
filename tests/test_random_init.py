"""``petlprof run --random-init``: cost-only runs of bundled shapes and config files on random weights.

Refused input is one line with exit 2 and nothing written; a run on random weights is recorded and
reported as such; its ``cpu-tensors`` peaks agree with ``petlprof estimate``'s prediction for the same
shape, batch and length (the agreement check of tests/test_estimate.py); run keys of runs on weights
are those they had before the option.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_estimate import Measured, check_against_real

from petlprof.cli import main
from petlprof.estimate.core import Settings, estimate
from petlprof.estimate.model import resolve_backbone
from petlprof.models import backbones
from petlprof.report.records import COST_ONLY
from petlprof.report.table import summary_table
from petlprof.sweep.config import build_options, expand, load_config_file
from petlprof.sweep.spec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # slow: processes and sweeps

BATCH, LENGTH = 2, 16
SMALL = ["--train-size", "4", "--eval-size", "2", "--max-length", str(LENGTH), "--batch-size", str(BATCH)]
SMALL += ["--warmup-steps", "1", "--inference-window-s", "0", "--in-process"]
TINY_LLAMA = {  # a config.json as a user would write it: a 2-layer LLaMA of width 64
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def config_file(tmp: Path, **changes) -> str:
    path = tmp / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, **changes}))
    return str(path)


def config_folder(tmp: Path) -> str:
    """A model folder with its config.json and no checkpoint (what a hub id without weights gives)."""
    folder = tmp / "llama-config-only"
    folder.mkdir()
    config_file(folder)
    return str(folder)


# (arguments of `petlprof run --methods lora`, the memory this machine is said to have, what the one line says)
REFUSED = [
    (lambda tmp: ["--backbone", "t5-large"], None, "backbone 't5-large' is a bundled shape, a shape without weights"),
    (lambda tmp: ["--backbone", "tiny-bert,llama-3-8b"], None, "'llama-3-8b' is a bundled shape"),
    (lambda tmp: ["--backbone", config_file(tmp)], None, "config.json' is a config file, a shape without weights"),
    (lambda tmp: ["--backbone", config_folder(tmp)], None, "is a model folder with no checkpoint"),
    (lambda tmp: ["--backbone", "t5-lage"], None, "unknown backbone 't5-lage'; did you mean 't5-large'?"),
    (lambda tmp: ["--backbone", "t5-lage", "--random-init"], None, "llama-3-8b, llama-3.2-1b"),  # the choices
    (
        lambda tmp: ["--backbone", "t5-large", "--random-init", "--num-layers", "30"],
        None,
        "--num-layers 30 exceeds the 24 layers of backbone 't5-large'",
    ),
    (
        lambda tmp: ["--backbone", config_file(tmp, vocab_size=1000), "--random-init"],
        None,
        "has a vocabulary of 1000 tokens; --random-init tokenizes with all-MiniLM-L6-v2, whose ids go up to 30521",
    ),
    (lambda tmp: ["--backbone", config_file(tmp, model_type="no-such-model"), "--random-init"], None, "no-such-model"),
    (
        lambda tmp: ["--backbone", "t5-small", "--random-init"],
        100 * 2**20,
        "backbone 't5-small' with --random-init needs 0.2 GiB for its 60,506,624 float32 weights alone; this "
        "machine has 0.1 GiB of memory available",
    ),
    (
        lambda tmp: ["--backbone", "t5-11b", "--random-init", "--num-layers", "2"],
        2 * 2**30,
        # depth cut: embeddings 32128 x 1024, 2 encoder blocks of 201,328,640 and 2 decoder blocks of 268,438,528,
        # the two relative-position tables (32 x 128) and the stacks' final norms (2 x 1024), counted by hand
        "needs 3.6 GiB for its 972,443,648 float32 weights alone",
    ),
]


@pytest.mark.parametrize("args, available_bytes, expected", REFUSED)
def test_refused_input_is_one_line_exit_2_nothing_written(
    args, available_bytes, expected, tmp_path, capsys, monkeypatch
):
    if available_bytes is not None:  # the machine's memory is the one hardware figure faked here
        monkeypatch.setattr(backbones, "available_memory_bytes", lambda: available_bytes)
    out = tmp_path / "out"
    assert main(["run", "--methods", "lora", *args(tmp_path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err
    assert not out.exists()


def test_run_keys_change_only_with_random_init(tmp_path):
    assert RunSpec(method="read").run_key == "3eaec3a38967b4f0"  # the key of a run on weights, as before the option
    assert RunSpec(method="read", random_init=True).run_key != RunSpec(method="read").run_key
    file = tmp_path / "sweep.toml"
    file.write_text('methods = ["lora", "read"]\nbackbone = ["t5-small", "bert-base"]\nrandom_init = true\n')
    from_file = expand(build_options(load_config_file(str(file)), {}), "cpu")
    cli = {"methods": ["lora", "read"], "backbone": ["t5-small", "bert-base"], "random_init": True}
    from_cli = expand(build_options({}, cli), "cpu")
    assert [s.run_key for s in from_file] == [s.run_key for s in from_cli]
    assert len(from_file) == 4 and all(s.random_init for s in from_file)


# (backbone, method, --num-layers, the source the record names; {} is the test's folder)
RUNS = [
    ("t5-small", "lora", None, "random init (shape t5-small, seed 1)"),
    ("bert-base", "bitfit", "2", "random init (shape bert-base, seed 1)"),
    ("{}/config.json", "lora", None, "random init (config file {}/config.json, seed 1)"),
    ("{}/llama-config-only", "lora", None, "random init (config of {}/llama-config-only, seed 1)"),
]


def run_random_init(backbone: str, method: str, num_layers: str | None, out: Path, *extra: str) -> dict:
    """One --random-init run (in this process) and its record."""
    depth = ["--num-layers", num_layers] if num_layers else []
    args = ["run", "--backbone", backbone, "--methods", method, "--random-init", "--seeds", "1", *depth, *SMALL]
    assert main([*args, *extra, "--output", str(out)]) == 0
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return record


@pytest.mark.parametrize("backbone, method, num_layers, source", RUNS)
def test_a_random_init_run_is_recorded_and_reported_cost_only(backbone, method, num_layers, source, tmp_path):
    config_file(tmp_path)
    config_folder(tmp_path)
    record = run_random_init(backbone.format(tmp_path), method, num_layers, tmp_path / "out")
    assert record["status"] == "ok", record["error"]
    assert record["spec"]["random_init"] is True
    info = record["backbone_info"]
    assert info["random_init"] is True and info["source"].startswith(source.format(tmp_path))
    if num_layers:
        assert info["num_layers"] == int(num_layers)
    score = f"{record['metrics']['accuracy']:.4f} (cost-only)"
    assert score in summary_table([record])
    report = (tmp_path / "out" / "report.md").read_text()
    assert COST_ONLY in report and f"| {score} |" in report


# (shape, method): the run's cpu-tensors peaks against the estimate of the same shape, batch and length
MEASURED_VS_ESTIMATE = [("t5-small", "lora")]


@pytest.mark.parametrize("shape, method", MEASURED_VS_ESTIMATE)
def test_a_random_init_run_measures_what_the_estimate_predicts(shape, method, tmp_path):
    record = run_random_init(shape, method, None, tmp_path / "out", "--meters", "cpu-tensors")
    assert record["status"] == "ok", record["error"]
    measured = Measured(
        peak_train_bytes=record["train"]["peak_tensor_bytes"],
        peak_inference_bytes=record["inference"][f"batch_{BATCH}"]["peak_tensor_bytes"],
        static=record["memory_breakdown"],
    )
    predicted = estimate(
        resolve_backbone(shape), method, {}, Settings(batch_size=BATCH, max_length=LENGTH, device="cpu")
    )
    check_against_real(predicted, measured)


@pytest.mark.parametrize("spec, random", [("tiny-bert", True), ("tiny-llama", True), ("minilm", False)])
def test_the_tiny_presets_are_marked_random_init_as_a_shape_run_is(spec, random):
    """A tiny preset has random weights too: its record must say so, so reports mark its accuracy cost-only."""
    assert backbones.load_backbone(spec, num_layers=1).info().get("random_init", False) is random


def test_a_config_that_asks_for_bfloat16_builds_float32_weights(tmp_path):
    """transformers 5 builds in a config's `torch_dtype` by default; a run's weights are float32 whatever the
    config says (--precision decides what the products run in), as the estimate builds them."""
    import torch

    path = config_file(tmp_path, torch_dtype="bfloat16")
    backbone = backbones.load_backbone(path, random_init=True)
    assert {p.dtype for p in backbone.model.parameters()} == {torch.float32}
