"""The Zeus second opinion against a fake ``zeus`` package (the real one is optional and not installed in CI): the
Zeus-backed meter's figure, source and grade on a GPU and on the CPU, the comparison ``meters --check`` makes, and
the one line a run gets where zeus is missing."""

from __future__ import annotations

import pytest
from sensors import install_fake_zeus

from petlprof.cli import main
from petlprof.meters.base import Meter, Provenance, Reading, Window
from petlprof.meters.zeus import ZeusEnergyMeter, zeus_checks
from petlprof.results.figures import ENERGY
from petlprof.vocabulary import MEASURED


@pytest.fixture
def fake_zeus(monkeypatch):
    return install_fake_zeus(monkeypatch)


def test_on_the_cpu_zeus_gives_packages_and_dram_graded_b_for_its_unknown_update_rate(fake_zeus):
    assert ZeusEnergyMeter.available() == (
        True,
        "Zeus 0.16.0: the GPUs and CPUs its monitor reads (NVIDIA, AMD, RAPL, Apple silicon)",
    )
    with Window([ZeusEnergyMeter("cpu")]) as window:
        pass
    phase = window.reading.record()
    assert fake_zeus[0].gpu_indices == [] and fake_zeus[0].cpu_indices is None
    assert phase["energy_j"] == pytest.approx(150.0)  # 80 + 60 J of packages, 10 J of DRAM
    assert (phase["energy_kind"], phase["energy_source"], phase["zeus_version"]) == (MEASURED, "zeus", "0.16.0")
    assert phase["energy_grade"] == "B"
    assert phase["energy_grade_reasons"] == ["B: source 'zeus': petlprof does not know how often it updates"]


def test_on_a_gpu_zeus_reads_that_gpu_alone(fake_zeus):
    with Window([ZeusEnergyMeter("cuda:1")]) as window:
        pass
    assert fake_zeus[0].gpu_indices == [1] and fake_zeus[0].cpu_indices == []
    assert window.reading.record()["energy_j"] == pytest.approx(600.0)


class Steady(Meter):
    """petlprof's own meter in the comparison: ``joules`` per window."""

    name = "rapl"
    FIGURES = (ENERGY,)

    def __init__(self, joules: float):
        super().__init__("cpu")
        self.joules = joules

    def _end(self) -> Reading:
        return Reading({ENERGY: self.joules}, provenance={ENERGY: Provenance(MEASURED, "rapl")})


@pytest.mark.parametrize("ours, verdict", [(148.0, "pass"), (135.0, "warn"), (100.0, "fail")])
def test_meters_check_compares_zeus_with_petlprofs_meter_on_one_window(fake_zeus, ours, verdict):
    [check] = zeus_checks(Steady(ours), work=lambda: None)
    assert check.name == "agrees with rapl" and check.verdict == verdict
    assert check.value == round(150.0 / ours, 3) and check.unit == "x"
    assert "Zeus 0.16.0 / petlprof's rapl" in check.detail


def test_without_zeus_its_meter_is_refused_in_one_line(tmp_path, capsys):
    if ZeusEnergyMeter.available()[0]:
        pytest.skip("zeus is installed here")
    code = main(["run", "--methods", "linear_probe", "--energy-meter", "zeus", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "energy meter 'zeus' was asked for but is not usable here" in err and "pip install zeus" in err
