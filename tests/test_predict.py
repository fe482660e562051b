"""Predicted time and energy (issue 38, first round): the roofline on device models, ``petlprof calibrate``'s
profile (saved, read back, stale, corrupt), and ``petlprof estimate``'s predicted figures with and without one."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.estimate import calibrate as cal
from petlprof.estimate import profiles as prof
from petlprof.estimate.command import duration, joules
from petlprof.estimate.gpus import GPUS
from petlprof.estimate.roofline import (
    GPU_BANDWIDTH_EFFICIENCY,
    GPU_MATMUL_EFFICIENCY,
    Budget,
    DeviceModel,
    optimizer_time,
    phase_time,
    prediction,
    table_model,
    train_total,
)

DEVICE = DeviceModel("test", {"float32": 1e9, "bfloat16": 4e9}, 1e8, 1e-5, 50.0, 5.0, True, "test", "test meter")


@pytest.mark.parametrize(
    "costs, dtype, expected",
    [
        ([(2_000_000_000, 1000)], "float32", (2.0, 0.0, 1e-5)),  # compute-bound: 2 GFLOP at 1 GFLOP/s
        ([(1000, 100_000_000)], "float32", (0.0, 1.0, 1e-5)),  # memory-bound: 100 MB at 100 MB/s
        ([(2_000_000_000, 1000)], "bfloat16", (0.5, 0.0, 1e-5)),  # the dtype's own throughput
        ([(2_000_000_000, 1000)], "float16", (2.0, 0.0, 1e-5)),  # a dtype without a figure: float32's
        ([(0, 0)] * 1000, "float32", (0.0, 0.0, 1e-2)),  # a thousand empty kernels: their fixed cost alone
        ([], "float32", (0.0, 0.0, 0.0)),
    ],
)
def test_each_kernel_takes_the_longer_of_its_compute_and_memory_time_plus_its_fixed_cost(costs, dtype, expected):
    time = phase_time(costs, DEVICE, dtype)
    assert (time.compute_bound_s, time.memory_bound_s, time.overhead_s) == pytest.approx(expected)
    assert time.time_s == pytest.approx(sum(expected)) and time.kernels == len(costs)


def test_a_kernel_that_draws_random_numbers_is_priced_by_the_numbers_it_draws():
    """A dropout mask of a million numbers at 6 ns a number (a CPU's calibrated cost): 6 ms of compute, though its
    4 MB would take 40 ms at this device's 100 MB/s; a device without the figure prices the draw by its bytes."""
    drawing = dataclasses.replace(DEVICE, random_s_per_number=6e-9)
    mask = [(0, 4_000_000, 1_000_000)]
    assert phase_time([(0, 400_000, 1_000_000)], drawing, "float32").compute_bound_s == pytest.approx(6e-3)
    assert phase_time(mask, drawing, "float32").memory_bound_s == pytest.approx(0.04)  # the longer of the two
    assert phase_time(mask, DEVICE, "float32").memory_bound_s == pytest.approx(0.04)


def test_a_product_timed_at_its_shape_computes_at_its_own_rate():
    """2 GFLOP at the device's 1 GFLOP/s is 2 s; the same product measured at 0.5 GFLOP/s at its shape is 4 s, and a
    product of another shape, or a kernel that is no product, keeps the device's rate."""
    product, other = (2_000_000_000, 0, 0, (1, 1000, 1000, 1000)), (2_000_000_000, 0, 0, (1, 10, 10, 10))
    rates = {(1, 1000, 1000, 1000): 0.5e9}
    assert phase_time([product], DEVICE, "float32", rates).compute_bound_s == pytest.approx(4.0)
    assert phase_time([other, (2_000_000_000, 0)], DEVICE, "float32", rates).compute_bound_s == pytest.approx(4.0)
    assert prediction([product], [], DEVICE, "float32", rates)["products_timed_at_their_shapes"] == 1


def test_cpu_attention_is_timed_at_its_shape_forward_and_backward():
    """Priced at the product rate, LST's attention on MiniLM came to 6 ms where it ran 42 ms: each call's shape is
    timed on this CPU, forward and backward, with its mask, at a rate in the FLOPs the trace counts for it."""
    from petlprof.estimate.products import _flops, product_rates
    from petlprof.estimate.trace import SDPA, SDPA_BACKWARD

    shapes = ((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8), (2, 1, 16, 16), 0.0, False)
    forward, backward = (SDPA, *shapes), (SDPA_BACKWARD, *shapes)
    assert _flops(forward) == 4 * 2 * 4 * 16 * 16 * 8 and _flops(backward) == 2.5 * _flops(forward)
    rates = product_rates([(_flops(k), 0, 0, k) for k in (forward, backward)], "float32")
    assert set(rates) == {forward, backward} and all(r > 0 for r in rates.values())
    unmasked = (SDPA, *shapes[:3], None, 0.0, True)
    assert product_rates([(0, 0, 0, unmasked)], "float32")[unmasked] > 0


def test_the_products_small_enough_are_timed_once_at_their_shapes():
    from petlprof.estimate.products import MAX_TIMED_FLOP, _rate, product_rates

    small, large = (1, 8, 16, 4), (1, 4096, 4096, 4096)
    assert 2 * 4096**3 > MAX_TIMED_FLOP
    rates = product_rates([(0, 0, 0, small), (0, 0, 0, large), (0, 0, 0, ()), (0, 0)], "float32")
    assert list(rates) == [small] and rates[small] > 0  # the large one runs at the calibrated rate
    hits = _rate.cache_info().hits
    assert product_rates([(0, 0, 0, small)], "float32") == rates and _rate.cache_info().hits == hits + 1  # timed once


def test_a_prediction_is_labelled_and_its_energy_is_time_times_busy_power():
    predicted = prediction([(1_000_000_000, 0)], [(0, 10_000_000)], DEVICE, "float32")
    assert predicted["kind"] == "predicted" and predicted["calibrated"] is True
    assert predicted["train_step_s"] == pytest.approx(1.0 + 1e-5)
    assert predicted["train_step_energy_j"] == pytest.approx(50.0 * (1.0 + 1e-5))
    assert predicted["inference_batch_s"] == pytest.approx(0.1 + 1e-5)


def test_a_table_gpu_is_uncalibrated_with_its_default_efficiencies_said():
    model = table_model(GPUS["h100-80gb"])
    assert not model.calibrated and "uncalibrated" in model.source
    assert model.throughput("bfloat16") == pytest.approx(989.4e12 * GPU_MATMUL_EFFICIENCY)
    assert model.bytes_per_s == pytest.approx(3350e9 * GPU_BANDWIDTH_EFFICIENCY)
    assert all(gpu.bandwidth_gb_s > 0 and gpu.tdp_w > 0 for gpu in GPUS.values())


@pytest.fixture(autouse=True)
def quick_optimizer(monkeypatch):
    """The optimiser timed on 2**16 elements a size, not calibrate's 2**23 (which took a second a calibration), and
    the caches evicted by a 1 MiB write, not up to a GiB's."""
    monkeypatch.setattr(cal, "OPTIMIZER_SIZES", (256, 2**12, 2**16))
    monkeypatch.setattr(cal, "OPTIMIZER_ELEMENTS", 2**16)
    monkeypatch.setattr(cal, "FLUSH_MAX_BYTES", 2**20)


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv(prof.PROFILE_ENV, str(tmp_path / "profiles"))
    return tmp_path / "profiles"


def test_calibrate_measures_this_cpu_and_its_profile_reads_back(profiles):
    profile = cal.calibrate("cpu", seconds=0.05)
    model = profile["model"]
    assert model["flops_per_s"]["float32"] > 1e8 and model["bytes_per_s"] > 1e8  # any CPU of this century
    assert 0 < model["kernel_overhead_s"] < 1e-2 and model["busy_w"] > 0
    assert 0 < model["random_s_per_number"] < 1e-6  # a few nanoseconds a number on a CPU
    path = prof.save_profile(profile, "cpu")
    assert path.parent == profiles and path.name.startswith("cpu-")
    loaded, why = prof.load_profile("cpu")
    assert loaded is not None and loaded.calibrated and why == f"profile {path}"
    assert loaded.throughput("float32") == model["flops_per_s"]["float32"]
    assert loaded.random_s_per_number == model["random_s_per_number"]
    assert loaded.measure_products  # a CPU profile times a step's products at their shapes
    sizes = [size for size, _ in loaded.optimizer_s]
    assert sizes == list(cal.OPTIMIZER_SIZES) and all(0 < s < 1 for _, s in loaded.optimizer_s)
    assert loaded.optimizer_s[-1][1] > loaded.optimizer_s[0][1]  # a 65,536-element tensor takes longer than 256
    assert 0 <= loaded.fresh_s_per_byte < 1e-8 and loaded.fresh_s_per_byte == model["fresh_s_per_byte"]


def test_fresh_memory_costs_more_than_memory_used_again_on_this_cpu():
    """The measurement behind ``fresh_s_per_byte`` sees the page faults (a 64 MiB buffer mapped anew took 14 ms to
    write here, one used again 1.4 ms): above 0 and below a MB a second, the median of several interleaved pairs;
    0 on a GPU, whose caching allocator keeps its blocks."""
    assert 0 < cal.fresh_s_per_byte("cpu", seconds=0.3) < prof.MAX_FRESH_S_PER_BYTE
    assert cal.fresh_s_per_byte("cuda", seconds=0.3) == 0.0


def test_the_optimizer_is_priced_between_its_calibrated_sizes():
    table = ((100, 1e-5), (1000, 2e-5), (10_000, 1e-3))
    assert optimizer_time([], table) == 0
    assert optimizer_time([1, 100], table) == pytest.approx(2e-5)  # below the smallest size: its time a tensor
    assert optimizer_time([550], table) == pytest.approx(1.5e-5)  # linear between two sizes
    assert optimizer_time([20_000], table) == pytest.approx(2e-3)  # past the largest: its time an element
    assert optimizer_time([1000, 1000], table) == pytest.approx(4e-5)


def test_a_kernel_making_a_fresh_large_storage_pays_for_its_pages():
    """On a CPU a storage of FRESH_PAGES_BYTES or more is mapped anew at each allocation and its pages faulted in as
    first written: the trace counts such new storages per kernel, and the roofline prices them at the calibrated
    cost a byte (a reused buffer's write: none; a smaller new one: none)."""
    import torch

    from petlprof.estimate.trace import FRESH_PAGES_BYTES, MetaTrace

    large = FRESH_PAGES_BYTES // 4 + 1024  # float32 elements
    weights = torch.empty(large, device="meta")
    tracer = MetaTrace(op_costs=True)
    with tracer, tracer.count_flops():
        doubled = weights * 2  # a new large storage
        doubled.mul_(3)  # written in place: nothing new
        small = weights[:1024] + 1  # a new small one
    assert [cost[4] for cost in tracer.op_costs] == [large * 4, 0, 0]
    del doubled, small
    fresh = dataclasses.replace(DEVICE, fresh_s_per_byte=1e-10)
    base = phase_time(tracer.op_costs, DEVICE, "float32")
    priced = phase_time(tracer.op_costs, fresh, "float32")
    assert priced.time_s == pytest.approx(base.time_s + large * 4 * 1e-10)
    assert priced.memory_bound_s == pytest.approx(base.memory_bound_s + large * 4 * 1e-10)


def test_a_calibrated_optimizer_replaces_the_roofline_for_the_optimizers_kernels():
    costs = [(1e9, 0, 0, ()), (0, 8e9, 0, ()), (0, 4e9, 0, ())]  # a product, then two optimiser kernels
    plain = prediction(costs, costs, DEVICE, "float32")
    calibrated = dataclasses.replace(DEVICE, optimizer_s=((1000, 0.25),))
    priced = prediction(costs, costs, calibrated, "float32", optimizer=(2, [1000, 1000]))
    assert priced["train_split_s"]["optimizer"] == pytest.approx(0.5)
    kernel = DEVICE.kernel_overhead_s
    assert priced["train_step_s"] == pytest.approx(plain["train_step_s"] - 12e9 / DEVICE.bytes_per_s - 2 * kernel + 0.5)
    assert priced["inference_batch_s"] == plain["inference_batch_s"]  # evaluation has no optimiser
    assert prediction(costs, costs, DEVICE, "float32", optimizer=(2, [1000]))["train_step_s"] == plain["train_step_s"]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"torch": "1.0.0"}, "stale profile"),
        ({"threads": 999}, "threads 999"),
        ({"machine": "elsewhere"}, "machine 'elsewhere'"),
        ({"version": 0}, "profile version 0"),
    ],
)
def test_a_profile_from_another_machine_torch_or_thread_count_is_named_stale_and_not_used(profiles, change, words):
    profile = {**cal.calibrate("cpu", seconds=0.02), **change}
    prof.save_profile(profile, "cpu")
    model, why = prof.load_profile("cpu")
    assert model is None and words in why and "run `petlprof calibrate --device cpu` again" in why


GOOD_MODEL = {
    **{"name": "x", "source": "s", "power_source": "p", "flops_per_s": {"float32": 1e9}},
    **{"bytes_per_s": 1e9, "kernel_overhead_s": 1e-6, "busy_w": 10, "idle_w": 1},
}
# (a field of the profile's model, a bad value, words the error must hold: the field and what it may be)
BAD_FIELDS = [
    ("flops_per_s", {"float32": math.nan}, "flops_per_s.float32 must be a positive number"),
    ("flops_per_s", {"float32": "1e9"}, "flops_per_s.float32 must be a positive number"),
    ("flops_per_s", {"float32": 10**400}, "flops_per_s.float32 must be a positive number of at most 1e+18"),
    ("flops_per_s", {}, "flops_per_s is not an object"),
    ("bytes_per_s", -1, "bytes_per_s must be a positive number"),
    ("bytes_per_s", 1e308, "bytes_per_s must be a positive number of at most 1e+15, got 1e+308"),
    ("kernel_overhead_s", None, "kernel_overhead_s must be a positive number"),
    ("kernel_overhead_s", 1e308, "kernel_overhead_s must be a positive number of at most 1, got 1e+308"),
    ("busy_w", True, "busy_w must be a positive number"),
    ("busy_w", 1e308, "busy_w must be a positive number of at most 10000"),
    ("idle_w", -5, "idle_w must be a number in [0, 10000], got -5"),
    ("idle_w", 20, "idle_w (20 W) is above busy_w (10 W)"),
    ("random_s_per_number", -1, "random_s_per_number must be a number in [0, 0.001], got -1"),
    ("random_s_per_number", math.inf, "random_s_per_number must be a number in [0, 0.001]"),
    *(
        ("optimizer_s", table, words)
        for table, words in (
            ([[256, -1.0]], "its seconds are not above 0 and under 60"),
            ([[256]], "not an (elements, seconds) pair"),
            ([["256", 1e-5]], "not an (elements, seconds) pair"),
            ([[1.5, 1e-5]], "not a whole number from 1 to 1,125,899,906,842,624"),
            ({"256": 1e-5}, "optimizer_s is not a list"),
            ([[1e30, 1e-5]], "not a whole number from 1"),
            ([[10**400, 1e-5]], "not a whole number from 1"),
            ([[256, 10**400]], "its seconds are not above 0"),
            ([[256, 1e308]], "its seconds are not above 0"),
            ([[256, 1e-5], [256, 2e-5]], "optimizer_s holds 256 elements twice"),
            ([[True, 1e-5]], "not an (elements, seconds) pair"),
            ([[256, "x" * 6000]], "not an (elements, seconds) pair"),
        )
    ),
    *(
        ("fresh_s_per_byte", fresh, "fresh_s_per_byte must be a number in [0, 1e-06)")
        for fresh in (-1e-10, "1e-10", None, 10**400, 1e308, math.inf, 1e-6)
    ),
]


@pytest.mark.parametrize("field, value, words", BAD_FIELDS)
def test_a_bad_profile_figure_is_one_line_naming_the_file_the_field_and_what_it_may_be(profiles, field, value, words):
    """Each figure is bounded far past any device: a corrupt or hand-edited profile is refused in one short line
    (a 6,000-character value is cut short), never turned into an infinite or negative prediction."""
    path = prof.profile_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 3, "model": {**GOOD_MODEL, field: value}}))
    with pytest.raises(UsageError) as refused:
        prof.load_profile("cpu")
    message = str(refused.value)
    assert str(path) in message and words in message and "\n" not in message and len(message) < 400, message


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"version": 3, "model": []})])
def test_an_unreadable_profile_is_one_line_naming_the_file(profiles, text):
    path = prof.profile_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(UsageError, match=str(path)) as refused:
        prof.load_profile("cpu")
    assert "\n" not in str(refused.value)


def test_the_good_model_of_these_tests_loads(profiles):
    """The bad-figure cases above each spoil one field of a profile that loads."""
    path = prof.profile_path("cpu")
    path.parent.mkdir(parents=True)
    profile = {**prof.machine_facts(), "version": prof.PROFILE_VERSION, "device": "cpu", "model": GOOD_MODEL}
    path.write_text(json.dumps(profile))
    model, why = prof.load_profile("cpu")
    assert model is not None and model.busy_w == 10.0, why


def test_no_profile_says_how_to_make_one(profiles):
    model, why = prof.load_profile("cpu")
    assert model is None and "no profile of cpu: " in why and "petlprof calibrate --device cpu" in why


@pytest.mark.parametrize("device, words", [("tpu", "is not cpu, cuda or cuda:N"), ("cuda:x", "is not cpu, cuda")])
def test_calibrate_refuses_a_bad_device_in_one_line(capsys, device, words):
    assert main(["calibrate", "--device", device]) == 2
    assert words in capsys.readouterr().err


def test_calibrate_on_a_gpu_this_machine_lacks_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["calibrate", "--device", "cuda"]) == 2
    assert "torch sees no CUDA device here" in capsys.readouterr().err


def test_calibrate_prints_each_figure_with_its_unit_and_how_it_was_obtained(profiles, capsys, monkeypatch):
    quick = cal.calibrate("cpu", seconds=0.02)
    monkeypatch.setattr(cal, "calibrate", lambda device: quick)  # the command's own 15 s measurement, shortened
    assert main(["calibrate", "--device", "cpu"]) == 0
    figures = [line.strip() for line in capsys.readouterr().err.splitlines() if line.startswith("  ")]
    units = ("GFLOP/s", "GB/s", " us ", " ns ", " ms ", " W ")
    assert len(figures) == 7 and all(any(u in line for u in units) for line in figures), figures
    assert all("(measured" in line or "(estimated" in line for line in figures), figures
    assert any(line.startswith("cost of a random number:") for line in figures)
    assert any(line.startswith("optimiser (gradient clipping + an AdamW step): ") for line in figures)
    assert any(line.startswith("cost of fresh memory: ") for line in figures)


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "estimates.jsonl").read_text().splitlines()]


def test_estimate_predicts_on_this_machines_profile_and_says_when_it_has_none(profiles, tmp_path, capsys):
    args = ["estimate", "--backbone", "tiny-bert", "--methods", "lora,full", "--device", "cpu"]
    assert main([*args, "--output", str(tmp_path / "a")]) == 0
    assert "no time or energy prediction: no profile of cpu" in capsys.readouterr().err
    assert all("predicted" not in r for r in records(tmp_path / "a"))
    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    assert main([*args, "--output", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "train_step_predicted" in out and "energy/step_predicted" in out
    for record in records(tmp_path / "b"):
        predicted = record["predicted"]
        assert predicted["calibrated"] is True and predicted["kind"] == "predicted"
        assert predicted["train_step_s"] > predicted["inference_batch_s"] > 0
        assert predicted["train_step_energy_j"] > 0
        assert predicted["products_timed_at_their_shapes"] > 0  # a CPU profile times the step's products
    full, lora = sorted(records(tmp_path / "b"), key=lambda r: r["method"])
    assert full["predicted"]["train_step_s"] > lora["predicted"]["train_step_s"]  # full trains every weight


def test_estimate_on_a_gpu_predicts_from_the_table_uncalibrated(tmp_path):
    out = tmp_path / "o"
    assert (
        main(["estimate", "--backbone", "tiny-llama", "--methods", "lora", "--gpu", "h100-80gb", "--output", str(out)])
        == 0
    )
    [record] = records(out)
    assert record["predicted"]["device"] == "h100-80gb" and record["predicted"]["calibrated"] is False
    assert "uncalibrated" in record["predicted"]["model"]


def test_every_counted_kernel_is_in_the_ops_the_roofline_prices():
    """The trace's per-kernel FLOPs add up to the step's FLOPs: none priced twice, none left out."""
    from petlprof.estimate.model import build, resolve_backbone
    from petlprof.estimate.products import _flops
    from petlprof.estimate.trace import SDPA, SDPA_BACKWARD, example_batch, inference_batch, train_steps
    from petlprof.registry import get_method

    resolved = resolve_backbone("tiny-bert", None)
    method = get_method("lora")
    model = build(resolved, method, method.make_config({}), 2).model
    inputs, labels = example_batch(4, 16, 5)
    train = train_steps(model, inputs, labels, device="cpu", op_costs=True)
    infer = inference_batch(model, inputs, device="cpu", op_costs=True)
    assert not train_steps(model, inputs, labels, device="cpu").op_costs  # off unless a prediction asks
    for trace in (train, infer):
        assert sum(c[0] for c in trace.op_costs) == trace.flops and all(c[1] >= 0 for c in trace.op_costs)
        # each kernel a CPU profile times at its shape (a product's (batch, M, K, N), attention's shapes) has the FLOPs
        # the timing divides by: the rate it is priced at is its own
        timed = [c for c in trace.op_costs if c[3]]
        assert timed and all(c[0] == _flops(c[3]) for c in timed)
    # LoRA trains the backbone's attention with dropout: torch's math path in training, flash in evaluation; LST's
    # side network trains its attention without it: flash both ways, its backward timed too
    side = build(resolved, get_method("lst"), get_method("lst").make_config({}), 2).model
    kinds = [
        {c[3][0] for c in trace.op_costs if c[3] and isinstance(c[3][0], str)}
        for trace in (train, infer, train_steps(side, inputs, labels, device="cpu", op_costs=True))
    ]
    assert kinds == [set(), {SDPA}, {SDPA, SDPA_BACKWARD}]
    assert len(train.op_costs) > len(infer.op_costs) > 10
    # dropout's masks are drawn in training (at least the embeddings' output: 4 x 16 tokens x width), never in eval
    drawn = sum(c[2] for c in train.op_costs)
    assert drawn >= 4 * 16 * resolved.config.hidden_size and sum(c[2] for c in infer.op_costs) == 0


def test_each_configuration_is_predicted_once_and_its_seeds_share_it(profiles, monkeypatch):
    from petlprof.estimate import core
    from petlprof.estimate.runs import predict_runs
    from petlprof.sweep.spec import RunSpec

    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    calls = []
    real = core.estimate
    monkeypatch.setattr(core, "estimate", lambda *args: calls.append(args[1]) or real(*args))
    specs = [
        RunSpec(method="lora", backbone="tiny-bert", seed=0, batch_size=4, max_length=16),
        RunSpec(method="lora", backbone="tiny-bert", seed=1, batch_size=4, max_length=16),
        RunSpec(method="full", backbone="tiny-bert", seed=0, batch_size=4, max_length=16),
        RunSpec(method="lora", backbone="tiny-gpt2", task="arith", objective="lm", seed=0),
    ]
    out = predict_runs(specs, lambda task: 2)
    assert calls == ["lora", "full"]  # once per configuration; the LM one, without its lengths, is not traced
    assert out[specs[0].run_key] is out[specs[1].run_key]
    lora, full = out[specs[0].run_key], out[specs[2].run_key]
    assert lora["calibrated"] is True and lora["train"]["step_time_s"] > 0 and lora["train"]["energy_j"] > 0
    assert full["train"]["peak_memory_bytes"] > lora["train"]["peak_memory_bytes"]
    assert out[specs[3].run_key] == {
        "kind": "predicted",
        "error": "no token lengths to price the language-modelling step at",
    }


def test_configurations_batched_alike_share_one_heaviest_batch_walk_and_the_others_walk_their_own(
    profiles, monkeypatch
):
    """The heaviest-batch walk is shared only by configurations whose runs cut and order the rows alike (same task,
    backbone, length, seeds, batch size, accumulation and steps; the method apart): each configuration is priced at the
    heaviest batch of its own runs."""
    from petlprof.estimate import runs
    from petlprof.sweep.spec import RunSpec

    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    lengths = [3, 40, 5, 7, 38, 2, 9, 11, 4, 6]
    walks: list[list[str]] = []
    real = runs.heaviest_batch

    def walked(rows, specs):
        walks.append(sorted({spec.method + str(spec.batch_size) for spec in specs}))
        return real(rows, specs)

    monkeypatch.setattr(runs, "heaviest_batch", walked)
    base = dict(backbone="tiny-bert", max_length=48, max_steps=2)
    specs = [
        RunSpec(method="lora", batch_size=4, **base),
        RunSpec(method="bitfit", batch_size=4, **base),  # batched as lora: shares its walk
        RunSpec(method="full", batch_size=2, **base),  # its own
        RunSpec(method="ia3", batch_size=4, gradient_accumulation=2, **base),  # its own
    ]
    out = runs.predict_runs(specs, lambda task: 2, row_lengths=lambda task, backbone, length: lengths)
    assert walks == [["lora4"], ["full2"], ["ia34"]]
    for spec in specs:
        longest, tokens = real(lengths, [spec])
        priced = out[spec.run_key]["priced"]
        assert f"padded to {longest} tokens" in priced and f"), {tokens} of them real tokens" in priced, priced
    assert len({out[spec.run_key]["priced"] for spec in specs}) == 3  # the three cuts differ: a wrong share shows


def test_a_language_modelling_run_is_predicted_at_its_datas_longest_rows_with_its_generation(profiles):
    from petlprof.estimate.core import Settings, estimate
    from petlprof.estimate.model import resolve_backbone
    from petlprof.estimate.runs import predict_runs
    from petlprof.sweep.spec import RunSpec

    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    spec = RunSpec(method="lora", backbone="tiny-gpt2", task="arith", objective="lm", batch_size=4)
    asked = []
    out = predict_runs([spec], lambda task: 2, lambda s: asked.append(s.run_key) or (20, 6))
    predicted = out[spec.run_key]
    assert asked == [spec.run_key] and "longest prompt (20 tokens) and target (6 tokens)" in predicted["priced"]
    model = prof.load_profile("cpu")[0]
    settings = Settings(batch_size=4, max_length=20, objective="lm", target_length=6, device="cpu", device_model=model)
    same = estimate(resolve_backbone("tiny-gpt2", None), "lora", spec.method_config, settings)["predicted"]
    assert predicted["train"]["step_time_s"] == pytest.approx(same["train_step_s"])  # the estimate at those lengths
    assert "generation" not in predicted  # the run generates at lengths the training rows do not say
    broken = predict_runs([spec], lambda task: 2, lambda s: 1 / 0)[spec.run_key]
    assert broken == {"kind": "predicted", "error": "ZeroDivisionError: division by zero"}


@pytest.mark.parametrize("objective", ["lm", "auto"])
def test_a_sweeps_predictions_price_its_lm_runs_at_their_tasks_rows_and_skip_zero_shot(profiles, objective):
    """``--objective auto`` (the default) on a generative task trains the LM head: it is priced so, not as a classifier
    of max_length tokens (which it once was, its spec's objective read as given)."""
    from petlprof.api import predictions_of
    from petlprof.sweep.config import expand, sweep_task
    from petlprof.sweep.lengths import longest_rows
    from petlprof.sweep.options import RunOptions

    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    options = RunOptions(
        methods=["zero_shot", "lora"], backbone=["tiny-gpt2"], task=["arith"], objective=objective, train_size=40
    )
    specs = expand(options, "cpu")
    out = predictions_of(options)(specs)
    by_method = {spec.method: out[spec.run_key] for spec in specs}
    assert by_method["zero_shot"]["error"] == "zero-shot trains nothing: no training step to predict"
    prompt, target = longest_rows(options, "arith", sweep_task(options, "arith"), "tiny-gpt2")
    assert f"longest prompt ({prompt} tokens) and target ({target} tokens)" in by_method["lora"]["priced"]
    assert by_method["lora"]["train"]["step_time_s"] > 0


@pytest.mark.parametrize("backbone", ["tiny-gpt2", "tiny-t5"])
def test_the_longest_rows_are_what_the_runs_tokenisation_pads_a_batch_to(backbone):
    from petlprof.models.backbones import backbone_config, backbone_tokenizer
    from petlprof.models.families import DECODER, family_of
    from petlprof.sweep.config import sweep_task
    from petlprof.sweep.lengths import encode_split, longest_rows
    from petlprof.sweep.options import RunOptions

    options = RunOptions(methods=["lora"], backbone=[backbone], task=["arith"], objective="lm", train_size=40)
    task = sweep_task(options, "arith")
    prompt, target = longest_rows(options, "arith", task, backbone)
    family = family_of(backbone_config(backbone))
    rows = encode_split(options, task.train, backbone_tokenizer(backbone, False), family)
    assert target == max(len(r["target"]) for r in rows) > 0
    if family == DECODER:  # one sequence a row: the longest prompt + target
        assert prompt + target == max(len(r["prompt"]) + len(r["target"]) for r in rows)
    else:
        assert prompt == max(len(r["prompt"]) for r in rows)


def test_a_run_with_training_settings_is_predicted_with_them(profiles):
    """The prediction a run keeps prices the run's own settings (half weights, 8-bit state, micro-batches,
    quantisation), not the defaults'."""
    from petlprof.estimate.runs import predict_runs
    from petlprof.sweep.spec import RunSpec

    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    base = dict(method="full", backbone="tiny-bert", batch_size=4, max_length=16)
    specs = {
        "default": RunSpec(**base),
        "bfloat16": RunSpec(**base, weights_dtype="bfloat16"),
        "8-bit": RunSpec(**base, optimizer="adamw8bit"),
        "accumulation": RunSpec(**base, gradient_accumulation=3),
        "nf4 lora": RunSpec(**{**base, "method": "lora"}, quantize="nf4"),
        "lora": RunSpec(**{**base, "method": "lora"}),
    }
    out = predict_runs(list(specs.values()), lambda task: 2)
    train = {name: out[spec.run_key]["train"] for name, spec in specs.items()}
    peak = {name: figures["peak_memory_bytes"] for name, figures in train.items()}
    assert max(peak["bfloat16"], peak["8-bit"]) < peak["default"] and peak["nf4 lora"] < peak["lora"]
    assert train["accumulation"]["step_time_s"] > train["default"]["step_time_s"]  # two more forward-backwards


def test_a_cpu_never_calibrated_predicts_nothing(profiles):
    from petlprof.estimate.runs import predict_runs
    from petlprof.sweep.spec import RunSpec

    assert predict_runs([RunSpec(method="lora")], lambda task: 2) == {}


@pytest.mark.parametrize("meters", [[], ["--meters", "cpu-tensors"]], ids=["rss", "cpu-tensors"])
def test_a_sweep_keeps_each_runs_prediction_in_its_record_and_the_report_compares_them(profiles, tmp_path, meters):
    """The memory column compares the predicted peak with the RSS, or, where every run counted its live tensors
    (``--meters cpu-tensors``), with those: what the prediction counts, the same bytes.  At --max-length 48 the
    tweets' batches are padded (a row has about 33 tokens), and READ's side network, which runs on the real tokens
    only, holds less than a full batch would make: each configuration is priced at the heaviest batch its run takes
    (its longest row, and its most real tokens)."""
    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    out = tmp_path / "out"
    args = ["run", "--methods", "lora,bitfit,read", "--backbone", "tiny-bert", "--train-size", "32"]
    args += [
        "--eval-size",
        "16",
        "--batch-size",
        "8",
        "--max-length",
        "48",
        "--inference-window-s",
        "0",
        "--in-process",
        "--output",
        str(out),
        *meters,
    ]
    assert main(args) == 0
    stored = records_of(out)
    assert all(r["predicted"]["calibrated"] is True and r["predicted"]["train"]["step_time_s"] > 0 for r in stored)
    assert all(r["predicted"]["priced"].startswith("one step at the heaviest training batch") for r in stored)
    report = (out / "report.md").read_text()
    section = report.split("## Predicted and measured")[1].split("\n## ")[0]
    assert "| tweets / tiny-bert / lora r=8 | 1 |" in section
    assert "| in the runs (estimated) |" in section  # this machine's energy is the labelled estimate
    if meters:
        assert "| in the runs (measured: live tensors, cpu-tensors) |" in section and "RSS" not in section
        for record in stored:
            predicted, counted = record["predicted"]["train"]["peak_memory_bytes"], record["train"]["peak_tensor_bytes"]
            # an upper bound within 3%: the longest row and the most real tokens may come from two batches
            assert counted * 0.99 <= predicted <= counted * 1.03, (record["method"], predicted / counted)
            assert f"| {predicted / counted:.2f} |" in section
    else:
        assert "| in the runs (measured) |" in section and "the RSS high-water mark" in section


def records_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_a_prediction_that_fails_never_stops_the_sweep(capsys):
    from petlprof.execution.sweep import _predictions
    from petlprof.sweep.spec import RunSpec

    def broken(specs):
        raise RuntimeError("no trace")

    assert _predictions(broken, [RunSpec(method="lora")]) == {}
    assert "no predictions for this sweep (RuntimeError: no trace)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H200", "h200-141gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA GeForce RTX 4090", "rtx4090-24gb"),
        ("NVIDIA A10", "a10-24gb"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("Tesla T4", None),
    ],
)
def test_a_gpu_is_found_in_the_table_by_its_name(name, key):
    from petlprof.estimate.runs import table_gpu

    assert table_gpu(name) == key


@pytest.mark.parametrize(
    "backbone, objective",
    [
        ("deberta", "classification"),  # an architecture outside the presets, from its config.json alone
        ("tiny-gpt2", "lm"),  # generation: the backbone's own LM head over the target
        ("tiny-t5", "lm"),  # an encoder-decoder
    ],
)
def test_predictions_beyond_the_presets_and_on_both_objectives(profiles, tmp_path, backbone, objective):
    from transformers import DebertaV2Config

    prof.save_profile(cal.calibrate("cpu", seconds=0.02), "cpu")
    if backbone == "deberta":
        config = DebertaV2Config(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
        )
        config.save_pretrained(tmp_path / "deberta")
        backbone = str(tmp_path / "deberta" / "config.json")
    out = tmp_path / "out"
    args = ["estimate", "--backbone", backbone, "--methods", "lora,full", "--objective", objective]
    assert main([*args, "--device", "cpu", "--batch-size", "2", "--max-length", "16", "--output", str(out)]) == 0
    for record in records(out):
        assert record["status"] == "ok", record.get("error")
        predicted = record["predicted"]
        split = predicted["train_split_s"]
        parts = split["compute"] + split["memory"] + split["kernels"] + split["optimizer"]
        assert predicted["train_step_s"] == pytest.approx(parts)
        assert predicted["train_step_s"] > predicted["inference_batch_s"] > 0 and predicted["train_kernels"] > 0


@pytest.mark.parametrize(
    "budget, steps, batches",
    [
        (Budget(100, 1, None, 32), 4, 4),  # the last batch short: 32, 32, 32, 4
        (Budget(100, 3, None, 32), 12, 12),
        (Budget(64, 1, None, 32), 2, 2),
        (Budget(100, 1, 10, 32), 10, 10),  # --max-steps overrides --epochs, epoch after epoch
        (Budget(100, 3, None, 32, accumulation=2), 6, 12),  # the last step of 12 batches: 2 of them
        (Budget(100, 1, None, 32, accumulation=3), 2, 4),  # 4 batches, 3 a step: the second step has one
        (Budget(100, 1, 5, 32, accumulation=3), 5, 15),  # --max-steps counts optimiser steps
        (Budget(1, 1, None, 32), 1, 1),
    ],
)
def test_a_budgets_totals_count_its_batches_as_a_run_does_and_price_each_as_the_step_prices_it(budget, steps, batches):
    step = prediction([(1_000_000_000, 0)], [], DEVICE, "float32")  # 1 s (+ one kernel's 10 us) and 50 W busy
    total = train_total(step, budget)
    assert (total["optimiser_steps"], total["batches"]) == (steps, batches)
    assert total["time_s"] == pytest.approx(step["train_step_s"] * batches / budget.accumulation)
    assert total["energy_j"] == pytest.approx(total["time_s"] * 50.0)
    assert total["train_size"] == budget.train_size and total["max_steps"] == budget.max_steps


def test_estimate_totals_the_training_length_it_is_given_and_none_without_one(tmp_path, capsys):
    base = ["estimate", "--backbone", "tiny-bert", "--methods", "lora,full", "--batch-size", "8"]
    assert main([*base, "--train-size", "100", "--epochs", "2", "--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "2 epoch(s) of 100 examples = 26 optimiser steps" in out and "train_energy_predicted" in out
    for record in records(tmp_path / "a"):
        predicted = record["predicted"]
        total = predicted["train_total"]
        assert (total["optimiser_steps"], total["batches"], total["batch_size"]) == (26, 26, 8)
        assert total["time_s"] == pytest.approx(26 * predicted["train_step_s"])
        assert total["energy_j"] == pytest.approx(26 * predicted["train_step_energy_j"])
    assert main([*base, "--max-steps", "7", "--gradient-accumulation", "2", "--output", str(tmp_path / "b")]) == 0
    assert "--max-steps 7 = 7 optimiser steps (14 batches" in capsys.readouterr().out
    for record in records(tmp_path / "b"):
        assert record["predicted"]["train_total"]["time_s"] == pytest.approx(7 * record["predicted"]["train_step_s"])
    assert main([*base, "--train-size", "all", "--output", str(tmp_path / "c")]) == 0  # no data to count
    assert "train_time_predicted" not in capsys.readouterr().out
    assert all("train_total" not in r["predicted"] for r in records(tmp_path / "c"))


@pytest.mark.parametrize(
    "seconds, text",
    [(0.0129, "12.9 ms"), (59.9, "59.9 s"), (60, "1 min"), (431.0, "7.18 min"), (3600, "1 h"), (61920, "17.2 h")],
)
def test_durations_read_in_the_largest_unit_that_keeps_them_short(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize(
    "energy, text", [(4.12, "4.12 J"), (359_999, "3.6e+05 J"), (360_000, "0.1 kWh"), (3.474e7, "9.65 kWh")]
)
def test_energy_reads_in_joules_and_from_a_tenth_of_a_kwh_in_kwh(energy, text):
    assert joules(energy) == text


def test_the_optimizers_kernels_are_clipping_and_adamw_only():
    """What a calibrated device's optimiser table replaces: the kernels from clipping on; fp16's unscaling of the
    gradients before them stays priced by the roofline (the table does not time it)."""
    import torch

    from petlprof.estimate.trace import train_steps

    model = torch.nn.Linear(8, 2, device="meta")
    inputs, labels = {"input": torch.ones(4, 8)}, torch.zeros(4, dtype=torch.long)
    steps = {p: train_steps(model, inputs, labels, precision=p, device="cpu", op_costs=True) for p in ("fp32", "fp16")}
    assert steps["fp16"].trained_numels == steps["fp32"].trained_numels == (16, 2)
    # as many at fp16 as at fp32: fp16's unscaling (one _foreach_mul_, before clipping) is not among them
    assert steps["fp16"].optimizer_kernels == steps["fp32"].optimizer_kernels > 0
