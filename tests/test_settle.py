"""``--settle``: a GPU loaded until its temperature holds, on a simulated clock and temperature (a warming chip, a
chip that never settles, one already warm).  Its refusals without a GPU are with the other bad input
(tests/test_inputs.py, tests/test_power_limit.py)."""

from __future__ import annotations

import math

import pytest
from sensors import Clock

from petlprof.meters.settle import MAX_S, STEADY_S, settle


def run(monkeypatch, temperature, burst_s: float = 0.25):
    """settle() with ``temperature(t)`` (°C at t seconds of load), each burst of work taking ``burst_s``."""
    clock = Clock(start=0.0).install(monkeypatch)
    return settle(lambda: temperature(clock.now), lambda: clock.sleep(burst_s))


def test_a_warming_gpu_is_loaded_until_its_temperature_holds(monkeypatch):
    # 40 °C warming towards 70 °C with a 15 s time constant moves at most 1 °C over the 10 s before t from
    # 30 (e^(10/15) - 1) e^(-t/15) <= 1, t >= 50.2 s: the first reading after that, at 51 s
    settled = run(monkeypatch, lambda t: 70.0 - 30.0 * math.exp(-t / 15.0))
    assert settled.steady and settled.seconds == pytest.approx(51.0, abs=0.3), settled
    assert settled.start_c == pytest.approx(40.0) and settled.end_c == pytest.approx(69.0, abs=0.1)
    assert settled.warnings() == []
    assert settled.record() == {
        "settle_s": round(settled.seconds, 3),
        "settle_start_c": 40.0,
        "settle_end_c": settled.end_c,
        "settled": True,
    }


def test_a_gpu_that_keeps_warming_stops_at_the_cap_and_says_so(monkeypatch):
    settled = run(monkeypatch, lambda t: 40.0 + 0.5 * t)
    assert not settled.steady and MAX_S <= settled.seconds <= MAX_S + 1.0
    assert "still moved more than 1 °C over 10 s after 120 s of load (40 -> 100 °C)" in settled.warnings()[0]


def test_a_gpu_already_warm_takes_only_the_steady_span(monkeypatch):
    settled = run(monkeypatch, lambda t: 65.0)
    assert settled.steady and settled.seconds == pytest.approx(STEADY_S, abs=1.0)
