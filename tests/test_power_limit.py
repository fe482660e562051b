"""``--power-limit`` as a sweep axis, against a fake NVML that records every call that changes a GPU: the option at
its edges, the checks before any run, each run at its limit, and the GPUs' own limits put back after success,
failure, an interrupt, a run's process killed, and (on resume) a sweep killed itself."""

from __future__ import annotations

import json

import pytest
from sensors import fake_world, steady

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.execution.sweep import Terminated, _run_locked
from petlprof.meters.devices import nvml as nvml_dev
from petlprof.meters.power_limit import STATE_FILE, PowerLimiter, check_power_limits
from petlprof.sweep.config import expand
from petlprof.sweep.options import RunOptions
from petlprof.sweep.spec import RunSpec
from petlprof.values import parse_watts

DEFAULT_KEY = "3eaec3a38967b4f0"  # RunSpec(method="read").run_key since before the option


@pytest.fixture
def gpus(monkeypatch):
    """Two fake GPUs at their 700 W default limit, settable from 200 to 700 W."""
    make = fake_world(monkeypatch)
    clock, gpus = make({"load": steady(100.0)}, {"load": steady(100.0)})
    import sys

    return sys.modules["pynvml"], gpus


def limits_set(nvml) -> list[tuple[str, int]]:
    return [(uuid, mw) for call, uuid, mw in nvml.calls if call == "set_power_limit"]


@pytest.mark.parametrize(
    "text, watts",
    [("300W", 300.0), ("0.45kW", 450.0), (" 250 w ", 250.0), ("1.5e2W", 150.0), ("300000mW", 300.0)],
)
def test_a_power_is_read_with_its_unit(text, watts):
    assert parse_watts(text) == watts


@pytest.mark.parametrize(
    "value, words",
    [
        ("300", "has no unit"),
        (300, "has no unit"),
        ("300J", "unknown unit 'J'"),
        ("nanW", "not a positive power"),
        ("infW", "not a positive power"),
        ("0W", "not a positive power"),
        ("-5W", "not a positive power"),
        ("1e30W", "more than 10,000 W"),
        (str(10**30) + "W", "more than 10,000 W"),
        (True, "not a positive power"),
        ("W", "not a positive power"),
    ],
)
def test_a_bad_power_is_one_line_naming_it(value, words):
    with pytest.raises(UsageError, match=words):
        parse_watts(value)


def test_default_runs_keep_their_keys_and_each_limit_is_its_own_run_grouped_together():
    assert RunSpec(method="read").run_key == DEFAULT_KEY
    plain = expand(RunOptions(methods=["lora", "bitfit"], seeds=[0, 1]), "cuda")
    limited = expand(RunOptions(methods=["lora", "bitfit"], seeds=[0, 1], power_limit=["450W", "300W"]), "cuda")
    assert all(s.power_limit_w is None for s in plain)
    assert [s.power_limit_w for s in limited] == [450.0] * 4 + [300.0] * 4  # as given, each limit's runs together
    assert len({s.run_key for s in limited}) == 8 and not {s.run_key for s in limited} & {s.run_key for s in plain}


def test_a_language_modelling_sweep_has_a_zero_shot_row_at_each_limit():
    specs = expand(
        RunOptions(methods=["lora"], backbone=["tiny-gpt2"], task=["arith"], power_limit=["300W", "450W"]), "cuda"
    )
    zero = [s.power_limit_w for s in specs if s.method == "zero_shot"]
    assert zero == [300.0, 450.0]
    assert [s.method for s in specs] == ["zero_shot", "lora", "zero_shot", "lora"]


def test_limits_are_checked_against_each_gpus_range_and_the_right_to_set_them(gpus):
    nvml, [first, second] = gpus
    check_power_limits([200.0, 700.0])
    assert limits_set(nvml) == [(first.uuid, 700_000), (second.uuid, 700_000)]  # the probe: each at its own limit
    with pytest.raises(
        UsageError, match=r"--power-limit 150W, 750W: GPU GPU-0000-aaaa takes limits from 200 W to 700 W"
    ):
        check_power_limits([150.0, 300.0, 750.0])
    second.may_set_power_limit = False
    with pytest.raises(
        UsageError, match="may not set GPU GPU-0001-aaaa's power limit .* as root or with CAP_SYS_ADMIN"
    ):
        check_power_limits([300.0])
    assert first.power_limit_mw == second.power_limit_mw == 700_000  # a check changes nothing


def test_no_gpu_is_one_line(monkeypatch):
    make = fake_world(monkeypatch)
    make()  # NVML with no GPU
    with pytest.raises(UsageError, match="--power-limit needs NVIDIA GPUs read through NVML: no NVIDIA GPU visible"):
        check_power_limits([300.0])


@pytest.mark.parametrize(
    "args, words",
    [
        (["--power-limit", "300W"], "--power-limit needs NVIDIA GPUs read through NVML"),
        (["--settle"], "--settle needs an NVIDIA GPU whose temperature NVML reads"),
    ],
)
def test_gpu_settings_on_a_machine_without_nvml_are_refused_before_any_run(tmp_path, capsys, args, words):
    """The machine-independent refusals are in tests/test_inputs.py's table; these depend on this machine's NVML."""
    if nvml_dev.availability()[0]:
        pytest.skip("this machine has an NVIDIA GPU")
    out = tmp_path / "out"
    code = main(["run", "--methods", "linear_probe", "--backbone", "tiny-bert", "--output", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err, err
    assert not out.exists()


class FakeExecutor:
    """Runs each spec instantly: ``outcome`` says how each run ends (``ok``, ``failed``, ``killed``: its process
    killed with SIGKILL, as the sweep sees it) or that the sweep is stopped mid-run (``SIGTERM``, ``SIGINT``).
    ``seen`` holds each GPU's limit (W) as each run started."""

    name = "fake"

    def __init__(self, nvml, gpus, outcome: str):
        self.nvml, self.gpus, self.outcome = nvml, gpus, outcome
        self.in_flight: list = []
        self.seen: list[list[float]] = []

    def describe(self) -> str:
        return "a fake"

    def prepare_idle(self, device, energy_meter) -> str:
        return "no idle baseline (fake)"

    def cancel(self) -> None:
        self.in_flight = []

    def results(self, specs, on_start=None):
        for index, spec in enumerate(specs):
            on_start(spec)
            self.seen.append([gpu.power_limit_mw / 1000 for gpu in self.gpus])
            self.in_flight = [spec]
            if index == 1 and self.outcome == "SIGTERM":
                raise Terminated()
            if index == 1 and self.outcome == "SIGINT":
                raise KeyboardInterrupt()
            status = "ok" if self.outcome == "ok" or index != 1 else "failed"
            error = {"killed": "the run's process was killed by SIGKILL", "failed": "RuntimeError: boom"}
            yield (
                spec,
                {"status": status, "method": spec.method, "run_key": spec.run_key, "error": error.get(self.outcome)},
            )


@pytest.mark.parametrize("outcome, code", [("ok", 0), ("failed", 1), ("killed", 1), ("SIGTERM", 143), ("SIGINT", 130)])
def test_each_run_is_at_its_limit_and_the_gpus_get_their_own_back_however_the_sweep_ends(gpus, tmp_path, outcome, code):
    nvml, [first, second] = gpus
    first.power_limit_mw = 650_000  # the GPUs' own limits, which the sweep must put back
    options = RunOptions(methods=["linear_probe"], seeds=[0, 1], power_limit=["300W", "450W"], output=str(tmp_path))
    executor = FakeExecutor(nvml, [first, second], outcome)
    result = _run_locked(options, executor, tmp_path, "cuda", None)
    assert result.exit_code == code
    stopped = outcome in ("SIGTERM", "SIGINT")
    assert executor.seen == ([[300.0, 300.0]] * 2 if stopped else [[300.0, 300.0]] * 2 + [[450.0, 450.0]] * 2)
    assert (first.power_limit_mw, second.power_limit_mw) == (650_000, 700_000)
    assert limits_set(nvml)[-2:] == [(first.uuid, 650_000), (second.uuid, 700_000)]
    assert not (tmp_path / STATE_FILE).exists()


def test_a_sweep_killed_itself_leaves_the_originals_on_disk_and_the_resume_restores_them(gpus, tmp_path, capsys):
    nvml, [first, second] = gpus
    killed = PowerLimiter(tmp_path)
    killed.set(300.0)  # ... and the sweep's process is killed with -9 here: nothing restores
    assert (first.power_limit_mw, second.power_limit_mw) == (300_000, 300_000)
    assert json.loads((tmp_path / STATE_FILE).read_text()) == {first.uuid: 700_000, second.uuid: 700_000}
    options = RunOptions(methods=["linear_probe"], power_limit=["450W"], output=str(tmp_path))
    executor = FakeExecutor(nvml, [first, second], "ok")
    assert _run_locked(options, executor, tmp_path, "cuda", None).exit_code == 0
    assert "restored the power limits a killed sweep left changed: GPU-0000-aaaa 700 W, GPU-0001-aaaa 700 W" in (
        capsys.readouterr().err
    )
    assert executor.seen == [[450.0, 450.0]]
    assert (first.power_limit_mw, second.power_limit_mw) == (700_000, 700_000)  # the true originals, not 300 W
    assert not (tmp_path / STATE_FILE).exists()


def test_a_corrupt_state_file_is_said_and_left_for_the_user(gpus, tmp_path):
    (tmp_path / STATE_FILE).write_text("{not json")
    note = PowerLimiter(tmp_path).restore_left_behind()
    assert note is not None and "could not read the power limits" in note and "set them by hand" in note


@pytest.mark.parametrize(
    "energy, time, expected",
    [
        ([100.0, 60.0, 55.0, 54.0], [10.0, 11.0, 20.0, 40.0], 1),  # energy falls, then time explodes: the bend
        ([100.0, 90.0, 80.0], [10.0, 11.0, 12.0], None),  # a straight trade-off has no knee
        ([100.0, 60.0], [10.0, 20.0], None),  # two limits: no inner point
        ([50.0, 50.0, 50.0], [10.0, 10.0, 10.0], None),  # nothing moves
    ],
)
def test_the_knee_is_the_bend_of_the_energy_time_curve(energy, time, expected):
    from petlprof.report.power_plot import knee

    assert knee(energy, time) == expected


def test_the_report_plots_each_configuration_across_the_limits_and_names_its_knee(tmp_path):
    """The stored offline-default runs, as if run at four limits: lower limits save energy until time explodes."""
    from pathlib import Path

    from petlprof.report.markdown import write_report

    stored = Path(__file__).resolve().parents[1] / "reports" / "minilm-tweets-default" / "results.jsonl"
    records = [json.loads(line) for line in stored.read_text().splitlines() if line.strip()]
    scaled = {200.0: (0.54, 4.0), 300.0: (0.55, 2.0), 400.0: (0.6, 1.1), 500.0: (1.0, 1.0)}  # energy, time factors
    limited = []
    for record in records:
        for limit, (energy, time) in scaled.items():
            copy = json.loads(json.dumps(record))
            copy["spec"]["power_limit_w"] = limit
            copy["run_key"] = f"{record['run_key'][:10]}{int(limit)}"
            copy["train"]["energy_j"] *= energy
            copy["train"]["time_s"] *= time
            limited.append(copy)
    written = write_report(limited, tmp_path)
    text = (tmp_path / "report.md").read_text()
    section = text.split("## Power limit")[1].split("\n## ")[0]
    assert "![power limit, tweets / minilm](power_limit_tweets_minilm.png)" in section
    assert section.count("| knee |") == 4  # one knee per method: where the time starts to explode
    assert "| lora r=8 | 400 | 1,075.9 | 99.2 | knee |" in section  # 40% less energy for 10% more time; below, 2x
    assert "| read hidden_size=128 | 400 | 478.7 | 43.7 | knee |" in section
    assert "| training energy (J, estimated) | training time (s, measured) |" in section  # the stored runs: estimated
    assert (tmp_path / "power_limit_tweets_minilm.png") in written
    assert "| lora | r=8 300W |" in text  # each limit is a configuration of its own in the tables


def test_a_gpu_that_refuses_mid_sweep_stops_it_in_one_line_and_one_that_will_not_restore_is_named(
    gpus, tmp_path, capsys
):
    nvml, [first, second] = gpus
    limiter = PowerLimiter(tmp_path)
    limiter.set(300.0)
    second.may_set_power_limit = False  # e.g. another tool took the GPU over
    with pytest.raises(UsageError, match="--power-limit 450W: NVML would not set GPU GPU-0001-aaaa's power limit now"):
        limiter.set(450.0)
    limiter.restore()
    assert first.power_limit_mw == 700_000 and second.power_limit_mw == 300_000
    assert "could not put GPU GPU-0001-aaaa's power limit back to 700 W" in capsys.readouterr().err
    assert json.loads((tmp_path / STATE_FILE).read_text())[second.uuid] == 700_000  # kept for the next sweep
    second.may_set_power_limit = True
    assert "restored the power limits" in PowerLimiter(tmp_path).restore_left_behind()
    assert second.power_limit_mw == 700_000 and not (tmp_path / STATE_FILE).exists()
