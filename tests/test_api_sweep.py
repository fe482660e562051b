"""``petlprof.api.run_sweep``, the Python front door: the command line's options, checks and runs (issue 36), and the
frozen run spec whose folders the expansion fills in."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from petlprof.api import Sweep, run_sweep
from petlprof.cli import main
from petlprof.errors import UsageError, printable
from petlprof.sweep.config import build_options, expand
from petlprof.sweep.spec import RunSpec

# a sweep of seconds a run, in this process: the tiny preset, two steps, the inference phase's 10 repeats alone
TINY = {
    "backbone": "tiny-bert",
    "train_size": 32,
    "eval_size": 16,
    "batch_size": 16,
    "max_steps": 2,
    "inference_window_s": 0.0,
}
TINY_CLI = ["--backbone", "tiny-bert", "--train-size", "32", "--eval-size", "16", "--batch-size", "16"]
TINY_CLI += ["--max-steps", "2", "--inference-window-s", "0"]


def keys(out: Path) -> list[str]:
    return [json.loads(line)["run_key"] for line in (out / "results.jsonl").read_text().splitlines()]


def cli_error(argv: list[str], capsys) -> str:
    """The one line ``petlprof run ARGV`` prints for bad input (its exit code 2)."""
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("petlprof: error: "), err
    return err.removeprefix("petlprof: error: ").rstrip("\n")


def raised(capsys, **values) -> str:
    """The line of the UsageError ``run_sweep(**values)`` raises, as the command line shows it."""
    with pytest.raises(UsageError) as caught:
        run_sweep(**values)
    assert capsys.readouterr().err == ""  # refused before any status line
    return printable(" ".join(str(caught.value).split()))


@pytest.mark.parametrize(
    "values, argv",
    [
        ({"methods": ["lora", "raed"]}, ["--methods", "lora,raed"]),
        ({"methods": "read", "train_size": -5}, ["--methods", "read", "--train-size", "-5"]),
        (
            {"methods": "read", "timeout": 60, "in_process": True},
            ["--methods", "read", "--timeout", "60", "--in-process"],
        ),
        (
            {"methods": "read", "method_config": {"read": {"cell": "transformer"}}},
            ["--methods", "read", "--method-config", "read.cell=transformer"],
        ),
        ({"methods": "read", "target_eval_size": 5}, ["--methods", "read", "--target-eval-size", "5"]),
        ({"methods": "read", "device": "tpu"}, ["--methods", "read", "--device", "tpu"]),
        ({}, []),  # no method
    ],
    ids=["unknown method", "negative size", "timeout in process", "method config", "only with", "device", "none"],
)
def test_bad_input_raises_the_line_the_command_line_prints(values, argv, capsys, tmp_path):
    out = tmp_path / "out"
    line = raised(capsys, output=out, **values)
    assert line == cli_error([*argv, "--output", str(out)], capsys)
    assert not out.exists()


def test_a_config_file_is_read_and_checked_as_the_command_line_reads_it(capsys, tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('methods = ["read"]\ntrain_size = 0\n')
    out = tmp_path / "out"
    line = raised(capsys, config=config, output=out)
    assert "--train-size must be" in line and line == cli_error(["--config", str(config), "--output", str(out)], capsys)
    # the keywords lie over the file, as the command line's options do: here the bad size is replaced, the methods kept
    with pytest.raises(UsageError, match="--batch-size must be"):
        run_sweep(config=config, output=out, train_size=32, batch_size=0)
    assert not out.exists()


def test_an_option_is_named_as_in_a_config_file(capsys):
    line = raised(capsys, methods="read", trian_size=32)
    assert line.startswith("unknown option 'trian_size'; did you mean 'train_size'?"), line


def test_the_run_spec_is_frozen_and_its_key_unchanged():
    spec = RunSpec(method="read")
    assert spec.run_key == "3eaec3a38967b4f0"  # the key of every stored run of this spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1  # type: ignore[misc]
    moved = dataclasses.replace(spec, cache_dir="/elsewhere/cache")
    assert moved.run_key == spec.run_key and spec.cache_dir is None


def test_the_expansion_puts_the_cache_and_snapshots_in_the_output_folder(tmp_path):
    options = build_options({}, {"methods": "read,lora", "cache_hidden_states": True, "memory_snapshot": True})
    specs = {s.method: s for s in expand(options, "cuda", tmp_path)}
    assert specs["read"].cache_dir == str(tmp_path / "cache")  # a side-tuning method's cache spills here
    assert specs["lora"].cache_dir is None and not specs["lora"].cache_hidden_states
    assert {s.memory_snapshot_dir for s in specs.values()} == {str(tmp_path / "memory-snapshots")}
    nowhere = {s.method: s for s in expand(options, "cuda")}
    assert all(s.cache_dir is None and s.memory_snapshot_dir is None for s in nowhere.values())
    assert {m: s.run_key for m, s in specs.items()} == {m: s.run_key for m, s in nowhere.items()}  # not their identity


@pytest.mark.slow  # two sweeps of real (tiny) runs, and their reports
def test_run_sweep_runs_what_the_command_line_runs_and_resumes(tmp_path, capsys):
    by_cli, by_api = tmp_path / "cli", tmp_path / "api"
    argv = ["run", "--methods", "bitfit", "--seeds", "0,1", *TINY_CLI, "--in-process", "--output", str(by_cli)]
    assert main(argv) == 0
    sweep = run_sweep(methods=["bitfit"], seeds=[0, 1], in_process=True, output=by_api, **TINY)
    err = capsys.readouterr().err
    assert "petlprof: 2 run(s) on cpu; 0 already in" in err and f"wrote {by_api / 'report.md'}" in err
    assert isinstance(sweep, Sweep) and keys(by_api) == keys(by_cli) and len(keys(by_api)) == 2
    assert sweep == Sweep(by_api, by_api / "results.jsonl", runs=2, recorded=0, ran=2, failed=0, exit_code=0)
    assert list(sweep.results()["seed"]) == [0, 1]

    # resumed from a thread that is not the main one (no signal handler can be set there): the recorded runs
    # are skipped, the new seed runs
    resumed: list[Sweep] = []
    worker = threading.Thread(
        target=lambda: resumed.append(
            run_sweep(methods="bitfit", seeds=(0, 1, 2), in_process=True, output=str(by_api), **TINY)
        )
    )
    worker.start()
    worker.join()
    assert resumed and (resumed[0].runs, resumed[0].recorded, resumed[0].ran, resumed[0].exit_code) == (3, 2, 1, 0)
    assert keys(by_api)[:2] == keys(by_cli) and len(keys(by_api)) == 3
    assert "3 run(s) on cpu; 2 already in" in capsys.readouterr().err
