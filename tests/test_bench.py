"""The cost-regression machinery: baseline semantics, the deterministic figures, and the
``petlprof_bench`` fixture as a user's suite sees it (fresh machine, update, regression)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from petlprof.bench.profile import Baseline, MethodStep, paired_ratio, time_rounds

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("value, failed", [(100, False), (104.9, False), (90, False), (106, True)])
def test_baseline_allows_growth_up_to_the_tolerance(tmp_path, value, failed):
    baseline = Baseline(tmp_path / "b.json")
    baseline.record("x", 100, rtol=0.05)
    message = baseline.check("x", value)
    assert (message is not None) == failed
    if failed:
        assert "exceeds the baseline 100 by more than 5%" in message


def test_missing_entries_never_fail_and_save_round_trips(tmp_path):
    baseline = Baseline(tmp_path / "nope" / "b.json")
    assert baseline.check("unknown", 1e9) is None
    baseline.record("b", 2, 0.1)
    baseline.save()
    assert json.loads((tmp_path / "nope" / "b.json").read_text()) == {"figures": {"b": {"value": 2, "rtol": 0.1}}}


def test_the_committed_baseline_saves_back_byte_for_byte(tmp_path):
    committed = Path(__file__).parent / "benchmarks" / "petlprof-baseline.json"
    copy = tmp_path / "b.json"
    copy.write_bytes(committed.read_bytes())
    Baseline(copy).save()
    assert copy.read_bytes() == committed.read_bytes()


def test_an_entry_keeps_its_int_value_and_unknown_keys(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"figures": {"n": {"value": 10**30, "rtol": 0, "why": "exact"}}}))
    Baseline(path).save()
    assert json.loads(path.read_text()) == {"figures": {"n": {"value": 10**30, "rtol": 0.0, "why": "exact"}}}


@pytest.mark.parametrize(
    "entry", [{"value": "1.5", "rtol": 0.1}, {"value": True, "rtol": 0.1}, {"rtol": 0.1}, {"value": 1}]
)
def test_a_malformed_entry_is_named(tmp_path, entry):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"figures": {"bad": entry}}))
    with pytest.raises(ValueError, match=r"figure 'bad': a baseline entry needs a numeric value and rtol"):
        Baseline(path)


def test_rounds_vary_the_order_and_keep_rounds_aligned():
    calls: list[str] = []
    samples = time_rounds({name: (lambda name=name: calls.append(name)) for name in "abc"}, rounds=6, warmup=1)
    assert calls[:3] == list("abc") and len(calls) == 3 + 6 * 3
    rounds = [calls[3 + 3 * i : 6 + 3 * i] for i in range(6)]
    assert all(sorted(r) == list("abc") for r in rounds)  # every function once per round
    assert len({tuple(r) for r in rounds}) > 1  # not always the same order
    assert {name: len(values) for name, values in samples.items()} == {"a": 6, "b": 6, "c": 6}


def test_paired_ratio_compares_within_rounds():
    # the machine slows down tenfold during round 3, after x ran: the ratio of the two medians
    # (1 / 20) would set x's fast rounds against ref's slow ones
    samples = {"x": [1, 1, 1, 10, 10], "ref": [2, 2, 20, 20, 20]}
    assert paired_ratio(samples, "x", "ref") == 0.5
    with pytest.raises(ValueError):
        paired_ratio({"x": [1, 2], "ref": [1]}, "x", "ref")


def test_read_saves_far_fewer_activations_than_full():
    # the pretrained slice: on 64-wide tiny presets a 128-wide READ RNN saves more than the backbone does
    read = MethodStep("read", "minilm", num_layers=2, batch_size=4, seq_len=16).profile()
    full = MethodStep("full", "minilm", num_layers=2, batch_size=4, seq_len=16).profile()
    assert read.trainable_params < full.trainable_params / 10
    assert read.grad_bytes == 4 * read.trainable_params and read.optimizer_state_bytes == 2 * read.grad_bytes
    assert 0 < read.saved_activation_bytes < full.saved_activation_bytes
    assert full.training_tensor_bytes > 3 * read.training_tensor_bytes


USER_TEST = """
def test_cost(petlprof_bench):
    petlprof_bench.check(petlprof_bench.profile("read", batch_size=4, seq_len=16))
"""


def test_fixture_on_a_fresh_machine_then_update_then_regression(pytester):
    pytester.makepyfile(test_user=USER_TEST)
    fresh = pytester.runpytest("-p", "no:cacheprovider")
    fresh.assert_outcomes(passed=1)  # no baseline yet: recorded, not failed
    updated = pytester.runpytest("-p", "no:cacheprovider", "--petlprof-update-baseline")
    updated.assert_outcomes(passed=1)
    path = pytester.path / "petlprof-baseline.json"
    figures = json.loads(path.read_text())["figures"]
    assert set(figures) == {
        f"read/tiny-bert/b4x16/{k}" for k in ("trainable_params", "saved_activation_bytes", "training_tensor_bytes")
    }
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    figures["read/tiny-bert/b4x16/trainable_params"]["value"] //= 2  # as if the method had doubled
    path.write_text(json.dumps({"figures": figures}))
    regressed = pytester.runpytest("-p", "no:cacheprovider")
    regressed.assert_outcomes(failed=1)
    regressed.stdout.fnmatch_lines(["*cost regression*", "*trainable_params = 115906 exceeds the baseline*"])


def test_a_plug_in_named_by_module_is_keyed_by_its_spec_name(tmp_path, monkeypatch):
    (tmp_path / "plug_bench.py").write_text(
        "import dataclasses\nfrom petlprof.registry import get_method\n"
        "SPEC = dataclasses.replace(get_method('bitfit'), name='plugbench')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    profile = MethodStep("plug_bench:SPEC", "tiny-bert", batch_size=2, seq_len=8).profile()
    assert profile.method == "plugbench"  # the baseline key starts plugbench/tiny-bert/..., not plug_bench:SPEC/...
