"""Objects used out of order fail with a message that names the missing step (issue 24's type narrowing made
these states explicit: a meter's window, a step timer's start, a prompt layout the caller promised)."""

from __future__ import annotations

import pandas as pd
import pytest

from petlprof.errors import UsageError
from petlprof.meters.base import Meter, kind_key, source_key
from petlprof.meters.cpu_power_model import EstimateEnergyMeter
from petlprof.meters.latency import StepTimer
from petlprof.results.figures import ENERGY, ENERGY_COUNTER
from petlprof.tasks.generative import load_user_lm


def test_a_meter_ended_before_it_began_says_so():
    with pytest.raises(RuntimeError, match="begin\\(\\) was not called"):
        Meter().end()


def test_a_reading_needs_a_closed_window():
    meter = EstimateEnergyMeter()
    meter.begin()
    with pytest.raises(RuntimeError, match="end\\(\\) was not called"):
        meter._end()
    reading = meter.end()
    assert meter.closed_window_s() == reading["energy_window_s"] >= 0


def test_a_step_timer_stopped_before_it_started_says_so():
    timer = StepTimer("cpu")
    with pytest.raises(RuntimeError, match="before start"):
        timer.stop()
    timer.start()
    timer.stop()
    assert len(timer.latencies_s()) == 1


def test_provenance_keys_of_a_figure_that_has_none_are_refused():
    assert (kind_key(ENERGY), source_key(ENERGY)) == ("energy_kind", "energy_source")
    with pytest.raises(ValueError, match="energy_counter_j declares no kind key"):
        kind_key(ENERGY_COUNTER)


def test_user_lm_data_without_a_layout_is_refused_by_name():
    frame = pd.DataFrame({"question": ["a", "b", "c"], "reply": ["x", "y", "z"]})
    with pytest.raises(UsageError, match="data.csv has none of the prompt/target layouts.*columns: question, reply"):
        load_user_lm("data.csv", {"data.csv": frame}, None, None, 0, None, None)
