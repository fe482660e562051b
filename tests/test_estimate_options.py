"""``petlprof estimate`` and ``petlprof run`` share their options' declarations and their model-building path
(issue 24): the same default, kind and help for every option both take, and from one backbone config the same
backbone model (its modules and shapes, no pooler, the pad id, the depth cut, the attention implementation)."""

from __future__ import annotations

import argparse
import json

import pytest

from petlprof.cli import build_parser, main
from petlprof.estimate.command import add_estimate_parser
from petlprof.estimate.model import build_backbone_model, resolve_backbone
from petlprof.models.backbones import load_backbone
from petlprof.sweep.options import default_of, help_of

# the run options `petlprof estimate` takes, and whether its help is the declaration's (else its own, with a reason)
SHARED = {
    "backbone": False,  # shapes and config files need no --random-init in an estimate
    "methods": False,  # every method by default
    "method_config": True,
    "grid": True,
    "batch_size": True,
    "max_length": True,
    "num_layers": True,
    "objective": True,
    "precision": True,
    "quantize": True,
    "quantize_compute_dtype": True,
    "quantize_double": True,
    "device": True,
    "output": False,  # estimate-<time>, nothing to resume
}


def _estimate_parser() -> argparse.ArgumentParser:
    return add_estimate_parser(argparse.ArgumentParser().add_subparsers())


@pytest.mark.parametrize("name", sorted(SHARED))
def test_a_shared_option_has_the_run_options_default_and_help(name):
    action = next(a for a in _estimate_parser()._actions if a.dest == name)
    default = None if name == "method_config" else default_of(name)  # an appended entry: none given is None
    assert build_parser().parse_args(["estimate"]).__dict__[name] == default
    assert (help_of(name) in action.help) == SHARED[name]


def test_shared_options_are_read_as_a_run_reads_them():
    args = build_parser().parse_args(
        ["estimate", "--backbone", "tiny-bert,t5-small", "--methods", "lora,read", "--batch-size", "3"]
        + ["--method-config", "lora.r=4", "--method-config", "read.cell=lstm", "--quantize", "none,nf4"]
    )
    assert args.backbone == ["tiny-bert", "t5-small"] and args.methods == ["lora", "read"]
    assert args.batch_size == 3 and args.quantize == ["none", "nf4"]
    assert args.method_config == ["lora.r=4", "read.cell=lstm"]


def test_by_default_an_estimate_prices_the_batch_a_run_trains(tmp_path):
    assert main(["estimate", "--backbone", "tiny-bert", "--methods", "bitfit", "--output", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "estimates.jsonl").read_text())
    assert (record["batch_size"], record["max_length"]) == (default_of("batch_size"), default_of("max_length"))
    assert record["objective"] == "classification"  # auto on an encoder: a classification head
    assert record["kernels"] == "cuda"  # --device auto: a GPU's kernels


DECODER_LINE = "objective: lm (the default for a decoder backbone; --objective classification for a classifier head)"
ENCODER_DECODER_LINE = "objective: lm (the default for an encoder-decoder backbone; --objective classification for a "
ENCODER_LINE = "objective: classification (the default for an encoder backbone, which has no LM head)"
OBJECTIVES = [  # (--backbone, more options) -> (each record's objective and target length, lines the output starts)
    ("tiny-llama", [], [("lm", 32)], [DECODER_LINE]),
    ("tiny-t5", [], [("lm", 32)], [ENCODER_DECODER_LINE]),
    ("tiny-bert", [], [("classification", None)], [ENCODER_LINE]),
    ("tiny-llama", ["--target-length", "4"], [("lm", 4)], [DECODER_LINE]),
    ("tiny-llama", ["--objective", "classification"], [("classification", None)], []),  # explicit wins, unannounced
    ("tiny-t5", ["--objective", "lm"], [("lm", 32)], []),
    ("tiny-bert,tiny-llama", [], [("classification", None), ("lm", 32)], [ENCODER_LINE, DECODER_LINE]),
    (
        "tiny-llama,tiny-bert",
        ["--target-length", "4"],
        [("lm", 4), ("classification", None)],
        [DECODER_LINE, ENCODER_LINE],
    ),
]


@pytest.mark.parametrize(("backbone", "more", "objectives", "lines"), OBJECTIVES)
def test_auto_prices_the_objective_a_backbone_is_tuned_for_and_says_so(
    tmp_path, capsys, backbone, more, objectives, lines
):
    argv = ["estimate", "--backbone", backbone, "--methods", "lora", "--batch-size", "2", "--max-length", "8"]
    assert main([*argv, *more, "--output", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "estimates.jsonl").read_text().splitlines()]
    assert [(r["objective"], r.get("target_length")) for r in records] == objectives
    assert [r["backbone"] for r in records] == backbone.split(",")
    out = capsys.readouterr().out
    announced = [line for line in out.splitlines() if line.startswith("objective: ")]
    assert len(announced) == len(lines) and all(line.startswith(start) for line, start in zip(announced, lines))
    if lines and lines[0].startswith("objective: lm"):
        target = "--target-length 4 tokens after" if "4" in more else "--target-length 32 tokens (its default)"
        assert target in announced[0] and "a prompt of --max-length 8" in announced[0]


TARGET_LENGTH_REFUSED = [  # a target length that no backbone's objective reads: one line, exit 2
    (["--backbone", "tiny-bert", "--target-length", "5"], "backbone 'tiny-bert' is an encoder, priced with a"),
    (["--backbone", "tiny-llama", "--objective", "classification", "--target-length", "5"], "use --objective lm"),
]


@pytest.mark.parametrize(("args", "says"), TARGET_LENGTH_REFUSED)
def test_a_target_length_no_objective_reads_is_one_line(tmp_path, capsys, args, says):
    assert main(["estimate", "--methods", "lora", *args, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "--target-length is the language-modelling objective's" in err[0]
    assert not (tmp_path / "out").exists()


def _shapes(model) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


@pytest.mark.parametrize(("backbone", "lm_head"), [("tiny-bert", False), ("tiny-t5", True), ("tiny-llama", False)])
def test_an_estimate_builds_the_backbone_model_a_run_loads(backbone, lm_head):
    run = load_backbone(backbone, num_layers=1, lm_head=lm_head).model
    estimated = build_backbone_model(resolve_backbone(backbone, num_layers=1), device="cpu", lm_head=lm_head)
    assert type(run) is type(estimated) and _shapes(run) == _shapes(estimated)
    assert getattr(run, "pooler", None) is None and getattr(estimated, "pooler", None) is None
    assert run.config.pad_token_id == estimated.config.pad_token_id is not None
    assert run.config.num_hidden_layers == estimated.config.num_hidden_layers == 1
    assert getattr(run.config, "num_decoder_layers", 1) == getattr(estimated.config, "num_decoder_layers", 1) == 1
    assert run.config._attn_implementation == estimated.config._attn_implementation


def test_a_task_prices_each_backbone_at_its_longest_training_batch(tmp_path, capsys):
    """``--task``: the lengths a run of the task pads its longest batch to, per backbone (its tokenizer), instead of
    every row --max-length tokens; the LM objective's prompt and target, a classifier's texts within --max-length."""
    from petlprof.sweep.config import sweep_task
    from petlprof.sweep.lengths import longest_rows
    from petlprof.sweep.options import RunOptions

    out = tmp_path / "lm"
    base = ["estimate", "--methods", "lora", "--train-size", "60"]
    assert main([*base, "--backbone", "tiny-gpt2,tiny-t5", "--task", "arith", "--output", str(out)]) == 0
    assert "lengths: the longest training batch of task 'arith' (60 examples)" in capsys.readouterr().out
    for record in (json.loads(line) for line in (out / "estimates.jsonl").read_text().splitlines()):
        options = RunOptions(task=["arith"], objective="lm", train_size=60)
        expected = longest_rows(options, "arith", sweep_task(options, "arith"), record["backbone"])
        assert (record["max_length"], record["target_length"]) == expected and record["status"] == "ok"
    full, data = (tmp_path / "full", tmp_path / "data")
    assert main([*base, "--backbone", "tiny-bert", "--max-length", "512", "--output", str(full)]) == 0
    assert (
        main([*base, "--backbone", "tiny-bert", "--max-length", "512", "--task", "tweets", "--output", str(data)]) == 0
    )
    [padded], [real] = (
        [json.loads(line) for line in (path / "estimates.jsonl").read_text().splitlines()] for path in (full, data)
    )
    assert padded["max_length"] == 512 and 1 < real["max_length"] < 512  # tweets are short
    assert real["memory"]["peak_train_bytes"] < padded["memory"]["peak_train_bytes"]


def test_a_task_on_a_backbone_without_its_tokenizer_here_is_one_line(tmp_path, capsys):
    args = ["estimate", "--backbone", "llama-2-7b", "--task", "arith", "--methods", "lora"]
    assert main([*args, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs backbone 'llama-2-7b's tokenizer to read its lengths" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, code, imported",
    [
        (["--backbone", "tiny-bert", "--methods", "bitfit"], 0, [True]),
        (["--backbone", "tiny-bert", "--methods", "bitfit", "--max-length", "-3"], 2, []),
    ],
    ids=["an estimate", "a refused option"],
)
def test_an_estimate_imports_the_runs_libraries_frozen_once_its_options_are_checked(
    tmp_path, monkeypatch, args, code, imported
):
    """The estimate runs with the libraries imported as a run's process imports them and frozen out of the collector's
    scans (``petlprof estimate --backbone t5-3b`` took 11.3 s instead of 12.8 s); a refused option costs no import,
    and a program that called the command gets its collector back as it had it (nothing frozen here)."""
    import gc

    from petlprof.run import libraries

    calls: list[bool] = []
    real = libraries.import_runtime_libraries
    monkeypatch.setattr(
        libraries, "import_runtime_libraries", lambda freeze=False: (calls.append(freeze), real(freeze))
    )
    gc.unfreeze()  # tests/conftest.py froze what collection imported
    try:
        assert main(["estimate", *args, "--output", str(tmp_path / "out")]) == code
        assert gc.get_freeze_count() == 0
    finally:
        gc.freeze()
    assert calls == imported
