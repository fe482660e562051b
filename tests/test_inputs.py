"""Careless and hostile run options (issue 19): every one is refused with exit code 2 and one short line
naming it, before any folder is written; numeric text where a number is expected is read as the number.

Each case is a command line and/or a config file fed to one shared check.
"""

from __future__ import annotations

import pytest

from petlprof.cli import main
from petlprof.sweep.config import build_options, load_config_file, parse_method_overrides
from petlprof.sweep.options import MAX_SEED, OPTIONS
from petlprof.values import parse_bytes

HUGE = "9" * 400  # a 400-digit number
LONG = "x" * 300  # longer than a file name may be
BAD = [
    # (id, command line after `run`, config file (name, text) or None, what the error line says)
    ("seed past torch's range", ["--seeds", "99999999999999999999"], None, f"--seeds must be at most {MAX_SEED}"),
    ("seed 10**30 in a file", [], ("s.toml", f"seeds = [{10**30}]\n"), "--seeds must be at most"),
    ("warm-up 10**30", ["--warmup-steps", str(10**30)], None, "--warmup-steps must be at most 10000"),
    ("warm-up 10**30 in a file", [], ("s.yaml", f"warmup_steps: {10**30}\n"), "--warmup-steps must be at most"),
    ("inference window 1e308", ["--inference-window-s", "1e308"], None, "--inference-window-s must be at most 3600"),
    ("layers 10**30 on a tiny preset", ["--backbone", "tiny-bert", "--num-layers", str(10**30)], None, "at most 128"),
    ("400-digit max_memory", ["--max-memory", HUGE], None, "--max-memory '999999"),
    ("400-digit max_memory in a file", [], ("s.toml", f'max_memory = "{HUGE}GiB"\n'), "is more than"),
    ("400-digit cache budget", ["--cache-hidden-states", "--cache-budget", HUGE], None, "--cache-budget '9999"),
    ("max_memory of 1e308 bytes", ["--max-memory", "1e308B"], None, "is more than 1152921504606846976 bytes"),
    ("task name too long", ["--task", LONG], None, "--task 'xxxx"),
    # the GPU settings, refused on any machine before they could touch a GPU
    ("power limit without its unit", ["--power-limit", "300"], None, "--power-limit '300' has no unit"),
    ("power limit of 10**30 W", ["--power-limit", f"{10**30}W"], None, "is more than 10,000 W"),
    ("power limit nan", ["--power-limit", "nanW"], None, "--power-limit 'nanW' is not a positive power"),
    ("power limit in joules", [], ("s.toml", 'power_limit = ["300J"]\n'), "unknown unit 'J' (W, kW or mW)"),
    ("power limit on the CPU", ["--power-limit", "300W", "--device", "cpu"], None, "--device cpu runs on the CPU"),
    ("power limit on a Ray cluster", ["--power-limit", "300W", "--executor", "ray"], None, "with --executor local"),
    ("settle on the CPU", ["--settle", "--device", "cpu"], None, "--settle warms an NVIDIA GPU"),
    ("backbone name too long", ["--backbone", LONG], None, "is too long"),
    ("backbone path part too long", ["--backbone", f"./{LONG}/model"], None, "is too long"),
    ("output folder name too long", ["--output-name-too-long"], None, "is too long"),
    ("lr 1e308", ["--lr", "1e308"], None, "--lr must be at most 10"),
    ("lr 1e308 in a file", [], ("s.yaml", "lr: 1e308\n"), "--lr must be at most 10"),
    ("lr a 400-digit integer in a file", [], ("s.toml", f"lr = {HUGE}\n"), "--lr must be at most 10, got 9999"),
    ("window a 400-digit integer", [], ("s.yaml", f"inference_window_s: {HUGE}\n"), "--inference-window-s must be at"),
    ("lr nan in a file", [], ("s.yaml", "lr: .nan\n"), "--lr must be a positive number, got nan"),
    ("lr -inf as text", [], ("s.toml", 'lr = "-inf"\n'), "--lr must be a positive number, got -inf"),
    ("timeout 1e308", ["--timeout", "1e308"], None, "--timeout must be at most"),
    ("time limit 1e308", ["--max-train-time", "1e308"], None, "--max-train-time must be at most"),
    ("target value inf", [], ("s.toml", "target_value = inf\n"), "--target-value must be a number, got inf"),
    ("eval every 10**30", ["--target-value", "0.5", "--eval-every", str(10**30)], None, "--eval-every must be at most"),
    ("train size 10**30", ["--train-size", str(10**30)], None, "--train-size must be at most"),
    ("batch size 10**30", ["--batch-size", str(10**30)], None, "--batch-size must be at most"),
    ("epochs 1e3 is not an integer", [], ("s.yaml", "epochs: 1e3\n"), "--epochs must be an integer >= 1, got 1000.0"),
    ("negative zero lr", ["--lr", "-0.0"], None, "--lr must be a positive number, got -0.0"),
    ("lr not a number", ["--lr", "abc"], None, "--lr must be a positive number, got 'abc'"),
    ("warm-up not an integer", ["--warmup-steps", "2.5"], None, "--warmup-steps must be an integer >= 0, got '2.5'"),
    ("layers in float notation", ["--num-layers", "1e2"], None, "--num-layers must be an integer >= 1, got '1e2'"),
    ("YAML duplicate key", [], ("s.yaml", "lr: 0.1\nlr: 0.2\n"), "duplicate key 'lr'"),
    ("YAML duplicate method field", [], ("s.yaml", "method_config:\n  read:\n    cell: gru\n    cell: lstm\n"), "dup"),
    ("5 MB method name", ["--methods", "m" * 5_000_000], None, "--methods 'mmmm"),
    ("5 MB value in a file", [], ("s.toml", f'device = "{"d" * 5_000_000}"\n'), "--device 'dddd"),
    ("5 MB option name in a file", [], ("s.toml", f"{'k' * 5_000_000} = 1\n"), "unknown option in"),
    ("5 MB --method-config", ["--method-config", "x" * 5_000_000], None, "must look like METHOD.FIELD=VALUE"),
]


def run_cli(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("argv, config, expected", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_option_is_one_short_line_exit_2_before_any_folder(argv, config, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out_dir = tmp_path / "out"
    if argv == ["--output-name-too-long"]:
        argv, out_dir = [], tmp_path / LONG / "out"
    args = ["run", "--methods", "read", *argv, "--output", str(out_dir)]
    if argv[:1] == ["--methods"]:
        args = ["run", *argv, "--output", str(out_dir)]
    if config is not None:
        (tmp_path / config[0]).write_text(config[1])
        args += ["--config", str(tmp_path / config[0])]
    code, out, err = run_cli(args, capsys)
    assert code == 2, err[:300]
    assert expected in err, err[:300]
    assert err.count("\n") == 1 and "Traceback" not in err
    # the bad value is shortened, whatever its size; a list of choices may follow (every option's name, for a bad one)
    assert len(err) < 500 + len(", ".join(OPTIONS))
    assert not (tmp_path / "out").exists() and not (tmp_path / "petlprof-out").exists()


GOOD = [
    # (id, config file name, text, options attribute, expected value)
    ("YAML lr 1e-3 is a number", "s.yaml", "methods: [read]\nlr: 1e-3\n", "lr", 0.001),
    ("YAML lr 2E-4 is a number", "s.yaml", "methods: [read]\nlr: 2E-4\n", "lr", 0.0002),
    ("TOML lr as text is a number", "s.toml", 'methods = ["read"]\nlr = "1e-3"\n', "lr", 0.001),
    ("epochs as text is a number", "s.toml", 'methods = ["read"]\nepochs = "2"\n', "epochs", 2),
    ("seeds as text", "s.yaml", "methods: [read]\nseeds: '0, 1'\n", "seeds", [0, 1]),
    ("the largest seed", "s.toml", f'methods = ["read"]\nseeds = [{MAX_SEED}]\n', "seeds", [MAX_SEED]),
    ("YAML timeout 1.5e2", "s.yaml", "methods: [read]\ntimeout: 1.5e2\n", "timeout", 150.0),
    (
        "YAML method field 1e3",
        "s.yaml",
        "methods: [lora]\nmethod_config:\n  lora:\n    alpha: 1e3\n",
        "method_config",
        {"lora": {"alpha": 1000.0}},
    ),
    (
        "YAML text that looks numeric but is not",
        "s.yaml",
        "methods: [read]\ncountry_code: e10\nmeters: codecarbon\n",
        "country_code",
        None,
    ),
]


@pytest.mark.parametrize("name, text, attribute, expected", [c[1:] for c in GOOD], ids=[c[0] for c in GOOD])
def test_numeric_text_is_read_as_a_number(name, text, attribute, expected, tmp_path):
    (tmp_path / name).write_text(text)
    if expected is None:  # 'e10' is not a number: it stays text (and is not an ISO country code)
        with pytest.raises(Exception, match="alpha-3 code"):
            build_options(load_config_file(str(tmp_path / name)), {})
        return
    assert getattr(build_options(load_config_file(str(tmp_path / name)), {}), attribute) == expected


@pytest.mark.parametrize(
    "item, expected",
    [("lora.alpha=1e3", 1000.0), ("lora.alpha=2.5e-1", 0.25), ("lora.alpha=.inf", float("inf")), ("lora.r=8", 8)],
)
def test_method_config_values_read_numbers_as_yaml_1_2_does(item, expected):
    method, _, field = item.partition("=")[0].partition(".")
    assert parse_method_overrides([item]) == {method: {field: expected}}


def test_text_column_error_names_the_flag(capsys, tmp_path):
    data = tmp_path / "mine.csv"
    data.write_text("words,label\n" + "".join(f"w{i},{i % 2}\n" for i in range(8)))
    code, _, err = run_cli(["run", "--methods", "read", "--task", str(data), "--output", str(tmp_path / "o")], capsys)
    assert code == 2 and "name one with --text-column" in err and "with text_column" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "text, expected_bytes",
    [("1e9B", 10**9), ("1.5e3MB", 1_500_000_000), ("2E1GiB", 20 * 2**30), ("2GiB", 2 * 2**30), ("1e0 kB", 1000)],
)
def test_a_size_in_exponent_notation_is_read(text, expected_bytes):
    """A size's number may be written ``1e9``, as for every numeric option (its unit is still needed)."""
    assert parse_bytes(text) == expected_bytes
