"""The command line: bad input is one clear line with exit code 2 and nothing written; list; config files."""

from __future__ import annotations

from pathlib import Path

import pytest

from petlprof.cli import main
from petlprof.sweep.config import build_options, load_config_file


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--methods", "lora,raed"], "unknown method 'raed'; did you mean 'read'?"),
        (["--methods", "read", "--task", "tweet"], "unknown task 'tweet'; did you mean 'tweets'?"),
        (["--methods", "read", "--backbone", "tiny-bret"], "unknown backbone 'tiny-bret'; did you mean 'tiny-bert'?"),
        (["--methods", "read", "--backbone", "no such model!"], "unknown backbone 'no such model!'"),
        (["--methods", "read", "--train-size", "-5"], "--train-size must be an integer >= 1, got -5"),
        (["--methods", "read", "--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
        (["--methods", "read", "--lr", "-1"], "--lr must be a positive number, got -1.0"),
        (["--methods", "read", "--device", "tpu"], "unknown device 'tpu'"),
        (["--methods", "read", "--energy-meter", "rapll"], "did you mean 'rapl'?"),
        (["--methods", "read", "--method-config", "read.cell=transformer"], "read cell 'transformer' is not one of"),
        (["--methods", "read", "--method-config", "lora.r=4"], "unknown method in method_config 'lora'"),
        (["--methods", "read", "--method-config", "read"], "must look like METHOD.FIELD=VALUE"),
        ([], "no method given"),
        (
            ["--methods", "lora", "--backbone", "tiny-bert", "--method-config", "lora.r=65"],
            "lora r 65 is larger than the width 64 of backbone 'tiny-bert'",
        ),
        (["--methods", "read", "--backbone", "./no/such/model"], "backbone folder './no/such/model' does not exist"),
        (
            ["--methods", "read", "--backbone", "no-such-org/no-such-model"],
            "cannot load backbone 'no-such-org/no-such-model'",
        ),  # the hub is offline in tests
        (["--methods", "read", "--max-memory", "lots"], "--max-memory 'lots' is not a positive size"),
        (["--methods", "read", "--timeout", "-3"], "--timeout must be a positive number of seconds, got -3.0"),
        (["--methods", "read", "--timeout", "60", "--in-process"], "cannot be used with --in-process"),
        # found by a review: each of these ran, or failed inside every run, or left a folder behind
        (["--methods", "read", "--seeds", ""], "no seed given (an empty --seeds)"),
        (["--methods", "read", "--backbone", ","], "no backbone given (an empty --backbone)"),
        (["--methods", "read", "--task", ""], "no task given (an empty --task)"),
        (["--methods", "read", "--lr", "inf"], "--lr must be a positive number, got inf"),
        (["--methods", "read", "--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
        (["--methods", "read", "--max-train-time", "inf"], "--max-train-time must be a number, got inf"),
        (["--methods", "read", "--max-memory", "0.5B"], "--max-memory '0.5B' is less than 512 MiB"),
        (
            ["--methods", "read", "--method-grid", "lora=4,8"],
            "--method-grid 'lora=4,8' must look like METHOD.FIELD=V1,V2",
        ),
        (["--methods", "bitfit", "--method-config", "bitfit.x=1"], "method 'bitfit' has no options (got 'x')"),
        (
            ["--methods", "read", "--target-value", "0.5", "--target-metric", "energy_j"],
            "unknown target metric 'energy_j'",
        ),
        (
            ["--methods", "read", "--backbone", "tiny-bert", "--target-value", "0.5", "--target-metric", "pearson"],
            "target metric 'pearson' is not scored on task 'tweets'; it scores accuracy, f1",
        ),
        (
            ["--methods", "read", "--backbone", "tiny-bert", "--target-value", "5"],
            "--target-value 5 is outside the range of accuracy on task 'tweets', [0, 1]",
        ),
        (
            ["--methods", "read", "--num-layers", "100"],
            "--num-layers 100 exceeds the 6 pretrained layers of backbone 'minilm'",
        ),
        (
            ["--methods", "read", "--backbone", "tiny-gpt2", "--max-length", "100000"],
            "--max-length 100000 exceeds the 512 positions of backbone 'tiny-gpt2'",
        ),
        (["--methods", "read", "--val-size", "0"], "--val-size must be an integer >= 1"),
        (["--methods", "read", "--target-eval-size", "all"], "--target-eval-size acts only with --target-value"),
        (["--methods", "read", "--cache-budget", "2GiB"], "--cache-budget acts only with --cache-hidden-states"),
        (["--methods", "read", "--cache-dtype", "float32"], "--cache-dtype acts only with --cache-hidden-states"),
        (
            ["--methods", "lora,full", "--cache-hidden-states"],
            "--cache-hidden-states serves side-tuning methods (lst, read); none of --methods lora,full is one",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(args, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out_dir = tmp_path / "out"
    code, out, err = run_cli(["run", *args, "--output", str(out_dir)], capsys)
    assert code == 2
    assert expected in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out_dir.exists() and not (tmp_path / "petlprof-out").exists()


@pytest.mark.parametrize(
    "suffix, text, expected",
    [
        (".toml", "methods = [read\n", "is malformed"),
        (".yaml", "methods: [read\n  - x: ]", "is malformed"),
        (".toml", 'metods = ["read"]\n', "unknown option in"),
        (".json", "{}", "must end in .toml, .yaml or .yml"),
        (".yaml", "methods: [read]\n1: 2\n", "option name 1 is not text"),
    ],
)
def test_bad_config_file(suffix, text, expected, capsys, tmp_path):
    config = tmp_path / f"sweep{suffix}"
    config.write_text(text)
    code, _, err = run_cli(["run", "--config", str(config), "--output", str(tmp_path / "out")], capsys)
    assert code == 2 and expected in err and str(config) in err
    assert not (tmp_path / "out").exists()


def test_missing_config_file(capsys, tmp_path):
    code, _, err = run_cli(["run", "--config", str(tmp_path / "nope.toml")], capsys)
    assert code == 2 and "does not exist" in err


def test_toml_and_yaml_give_the_same_options_and_cli_wins(tmp_path):
    toml = tmp_path / "a.toml"
    toml.write_text(
        'methods = ["read", "lora"]\nbackbone = "tiny-bert"\nseeds = [0, 1]\nepochs = 2\n'
        "train-size = 100\n[method_config.lora]\nr = 4\n"
    )
    yaml = tmp_path / "a.yaml"
    yaml.write_text(
        "methods: read,lora\nbackbone: tiny-bert\nseeds: [0, 1]\nepochs: 2\ntrain_size: 100\n"
        "method_config:\n  lora:\n    r: 4\n"
    )
    a = build_options(load_config_file(str(toml)), {})
    b = build_options(load_config_file(str(yaml)), {})
    assert a == b
    assert a.methods == ["read", "lora"] and a.seeds == [0, 1] and a.method_config == {"lora": {"r": 4}}
    c = build_options(load_config_file(str(toml)), {"epochs": 3, "method_config": {"lora": {"alpha": 8}}})
    assert c.epochs == 3 and c.method_config == {"lora": {"r": 4, "alpha": 8}}


@pytest.mark.parametrize(
    "file_text, argv, expected",
    [
        (
            None,
            ["--train-size", "all", "--eval-size", "ALL", "--target-value", "0.8", "--target-eval-size", "all"],
            (None, None, None),
        ),
        (None, ["--train-size", "64"], (64, 1000, None)),
        (None, [], (2000, 1000, None)),
        ('train_size = "all"\neval_size = 50\ntarget_value = 0.8\ntarget_eval_size = "all"\n', [], (None, 50, None)),
        ('train_size = "all"\n', ["--train-size", "64"], (64, 1000, None)),  # the command line wins over the file
        ("train_size = 64\n", ["--train-size", "all"], (None, 1000, None)),
    ],
)
def test_sizes_take_all_on_the_command_line_and_in_files(tmp_path, file_text, argv, expected):
    from petlprof.cli import build_parser

    files = {}
    if file_text is not None:
        (tmp_path / "s.toml").write_text(file_text)
        files = load_config_file(str(tmp_path / "s.toml"))
    args = vars(build_parser().parse_args(["run", "--methods", "read", *argv]))
    cli = {k: v for k, v in args.items() if k not in ("command", "config", "debug", "method_config", "method_grid")}
    options = build_options(files, cli)
    assert (options.train_size, options.eval_size, options.target_eval_size) == expected


def test_a_size_that_is_not_a_number_is_named(capsys):
    code, _, err = run_cli(["run", "--methods", "read", "--train-size", "lots"], capsys)
    assert code == 2 and err == "petlprof: error: --train-size must be a number of examples >= 1 or 'all', got 'lots'\n"


@pytest.mark.parametrize("content", ["", '{"status": "ok", "meth', "not a record\n"])
def test_report_with_no_usable_record_is_an_error_and_writes_nothing(content, capsys, tmp_path):
    (tmp_path / "results.jsonl").write_text(content)
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == 2 and "no result records in" in err and "nothing to report" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_expand_makes_one_run_per_method_and_seed():
    from petlprof.sweep.config import expand

    options = build_options({}, {"methods": "read,lora", "seeds": "0,1,2", "backbone": "tiny-bert"})
    specs = expand(options, "cpu")
    assert [(s.method, s.seed) for s in specs] == [(m, s) for m in ("read", "lora") for s in (0, 1, 2)]
    assert len({s.run_key for s in specs}) == 6


def test_list_shows_methods_tasks_backbones_meters(capsys):
    code, out, _ = run_cli(["list"], capsys)
    assert code == 0
    for word in ("read", "lora", "bitfit", "full", "tweets", "sst2", "minilm", "tiny-t5", "estimate", "nvml", "rapl"):
        assert word in out
    assert "knob hidden_size" in out and "knob r" in out
    assert "peft:TYPE" in out.split("Tasks:")[0]  # PEFT's tuners, among the methods
    from petlprof.models.shapes import shape_names

    shapes = out.split("Model shapes")[1].split("Meters on this machine")[0]
    assert set(shape_names()) <= set(shapes.replace(",", " ").split()) and "t5-11b" in shape_names()


def test_help_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from petlprof.cli import build_parser; build_parser().format_help(); "
        "print(any(m in sys.modules for m in ('torch', 'transformers', 'pynvml')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_file_method_options_reach_the_runs(capsys, tmp_path, monkeypatch):
    """Through the real command: the file's [method_config] and the CLI's overrides both arrive."""
    import petlprof.run.execute

    seen = []

    def fake_execute(spec, **limits):
        seen.append(spec)
        return {
            "schema_version": 1,
            "run_key": spec.run_key,
            "status": "failed",
            "error": "fake",
            "method": spec.method,
            "method_config": spec.method_config,
            "seed": spec.seed,
        }

    monkeypatch.setattr(petlprof.run.execute, "execute", fake_execute)
    config = tmp_path / "sweep.toml"
    config.write_text(
        'methods = ["lora", "read"]\nbackbone = "tiny-bert"\nin_process = true\n[method_config.lora]\nr = 16\n'
    )
    code, _, err = run_cli(
        ["run", "--config", str(config), "--method-config", "read.cell=lstm", "--output", str(tmp_path / "out")], capsys
    )
    assert code == 1  # the fake runs "failed"
    configs = {spec.method: spec.method_config for spec in seen}
    assert configs["lora"]["r"] == 16 and configs["read"]["cell"] == "lstm"
    assert configs["read"]["hidden_size"] == 128  # resolved defaults are part of the run key


def test_explicit_defaults_and_repeated_methods_do_not_duplicate_runs():
    from petlprof.sweep.config import expand

    plain = expand(build_options({}, {"methods": "lora,lora", "backbone": "tiny-bert"}), "cpu")
    explicit = expand(
        build_options(
            {}, {"methods": "lora", "backbone": "tiny-bert", "lr": 2e-3, "method_config": {"lora": {"r": 8}}}
        ),
        "cpu",
    )
    assert len(plain) == 1 and plain[0].run_key == explicit[0].run_key


@pytest.mark.parametrize(
    "item, expected",
    [
        ("lora.r=abc", "lora r must be a positive integer, got 'abc'"),
        ("lora.r=2.5", "lora r must be a positive integer, got 2.5"),
        ("lora.alpha=abc", "lora alpha must be a positive number"),
        ("lora.target_modules=[q", "the value is not valid"),
        ("read.hidden_size=true", "hidden_size must be a positive integer, got True"),
    ],
)
def test_bad_method_option_values(item, expected, capsys, tmp_path):
    method = item.split(".")[0]
    code, _, err = run_cli(
        ["run", "--methods", method, "--method-config", item, "--output", str(tmp_path / "out")], capsys
    )
    assert code == 2 and expected in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text, expected",
    [
        ('methods = ["read"]\ndevice = 0\n', "option 'device' must be str, got 0"),
        ('methods = ["read"]\nin_process = "no"\n', "option 'in_process' must be bool"),
        ('methods = ["read"]\nmethod_config = 3\n', "option 'method_config' must be dict"),
        ('methods = ["read"]\n[method_config]\nread = 3\n', "method_config.read must be a table"),
    ],
)
def test_config_values_of_the_wrong_type(text, expected, capsys, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    code, _, err = run_cli(["run", "--config", str(config), "--output", str(tmp_path / "out")], capsys)
    assert code == 2 and expected in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--energy-meter", "nvml"], "energy meter 'nvml' was asked for but is not usable here"),
        (["--task", "tests/fixtures/userdata/reviews.csv", "--label-column", "stars"], "'stars'"),
        (["--num-layers", "2", "--task", "does/not/exist.csv"], "does not exist"),
    ],
)
def test_preflight_errors_come_before_anything_is_written(args, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parent.parent)
    code, _, err = run_cli(["run", "--methods", "read", *args, "--output", str(tmp_path / "out")], capsys)
    assert code == 2 and expected in err
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback_of_an_input_error(capsys):
    from petlprof.errors import UsageError

    with pytest.raises(UsageError, match="unknown method 'raed'"):
        main(["--debug", "run", "--methods", "raed"])


@pytest.mark.parametrize(
    "text, expected",
    [("2GiB", 2 * 2**30), ("500MB", 500 * 10**6), ("1.5g", int(1.5 * 2**30)), ("1048576B", 2**20), (None, None)],
)
def test_memory_sizes(text, expected):
    from petlprof.values import parse_bytes

    assert parse_bytes(text) == expected


def test_sizes_the_data_cannot_give_are_noted_before_the_runs(tmp_path):
    from petlprof.sweep.config import preflight

    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f"review number {i},{i % 2}\n" for i in range(10)))
    sizes = {"train_size": 100, "eval_size": 2, "batch_size": 1}  # 8 steps: enough to learn, so no note of that
    options = build_options({}, {"methods": "bitfit", "backbone": "tiny-bert", "task": str(data), **sizes})
    assert preflight(options) == [f"task '{data}' has 8 training examples; --train-size 100 uses those"]
    budget = {"train_size": 64, "batch_size": 8}
    assert preflight(build_options({}, {"methods": "bitfit", "backbone": "tiny-bert", **budget})) == []


def test_the_command_ends_with_its_code_after_what_a_normal_exit_does():
    """``petlprof`` (and every worker process) ends through ``exit_now``: the handler's exit code, and before the end
    what ``sys.exit`` would have done for the program (a non-daemon thread joined, ``atexit`` handlers run in
    order, buffered output flushed, even with no newline), only the interpreter's teardown skipped."""
    import subprocess
    import sys

    code = (
        "import atexit, sys, threading, time\n"
        "from petlprof.execution.process import exit_now\n"
        "atexit.register(lambda: print('first registered, last run', end=''))\n"
        "atexit.register(lambda: print('[handler]', end=' '))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('[thread]', end=' '))).start()\n"
        "sys.stderr.write('buffered')\n"
        "print('[main]', end=' ')\n"
        "exit_now(3)\n"
        "print('never')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "[main] [thread] [handler] first registered, last run"
    assert done.stderr == "buffered"


def test_the_petlprof_command_exits_with_the_commands_code(tmp_path):
    """The console script and ``python -m petlprof.cli`` end with the command's code: 2 for bad input, 0 for a
    command that worked (its output complete)."""
    import subprocess
    import sys

    bad = subprocess.run(
        [sys.executable, "-m", "petlprof.cli", "run", "--methods", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.startswith("petlprof: error:") and "nope" in bad.stderr
    listed = subprocess.run([sys.executable, "-m", "petlprof.cli", "list"], capture_output=True, text=True)
    assert listed.returncode == 0 and "Meters on this machine" in listed.stdout, listed.stderr[-2000:]
