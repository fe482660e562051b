"""``--precision``: runs in bf16 and fp16 autocast (fp16 with a loss scaler), what their records say,
the run key of fp32 runs, and the one-line errors for a bad value and for a model without a kernel.

Real in-process runs on the tiny presets.  Each case of ``RUNS`` says what the record's ``precision``
must read; every mixed-precision run must train (a finite loss), keep float32 master weights and
gradients (4 bytes a parameter in its memory breakdown) and score its evaluation.  Two test methods (plug-ins
by ``module:ATTR``) drive the edge cases: ``LOUD_HEAD`` multiplies the logits by 100, so fp16's
scaled gradients overflow at the scaler's first scales -- those steps are skipped, not counted as a
divergence -- and ``ERFCX_HEAD`` runs ``torch.special.erfcx``, which has no bfloat16 or float16 CPU
kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from petlprof.cli import main
from petlprof.method_api import MethodConfig, MethodSpec
from petlprof.results.records import DIVERGED, FAILED, OK
from petlprof.run.execute import execute
from petlprof.sweep.spec import RunSpec

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(train_size=16, eval_size=8, batch_size=4, max_steps=4, warmup_steps=1, inference_window_s=0.0)
BF16_TEXT = "bfloat16 autocast, float32 weights"
FP16_TEXT = "float16 autocast + dynamic loss scaling, float32 weights"


@dataclass
class NoOptions(MethodConfig):
    """No options."""


def _test_method(name: str, hook) -> MethodSpec:
    def apply(classifier, config):
        classifier.head.register_forward_hook(lambda module, args, output: hook(output))
        return classifier  # full fine-tuning, the head's output changed by ``hook``

    return MethodSpec(
        name=name,
        description=f"full fine-tuning with {name} on the logits (tests --precision)",
        config_cls=NoOptions,
        apply=apply,
        default_lr=1e-4,
        lr_source="test",
    )


LOUD_HEAD = _test_method("loud_head", lambda logits: logits * 100)
ERFCX_HEAD = _test_method("erfcx_head", torch.special.erfcx)

# (id, spec fields, the record's precision text)
RUNS = [
    ("lora fp32 (the default)", dict(method="lora", backbone="tiny-bert"), "float32"),
    ("lora bf16", dict(method="lora", backbone="tiny-bert", precision="bf16"), BF16_TEXT),
    ("read bf16 on T5", dict(method="read", backbone="tiny-t5", precision="bf16"), BF16_TEXT),
    ("bitfit fp16", dict(method="bitfit", backbone="tiny-llama", precision="fp16"), FP16_TEXT),
    ("ia3 fp16", dict(method="ia3", backbone="tiny-gpt2", precision="fp16"), FP16_TEXT),
]


@pytest.mark.parametrize("case, fields, text", RUNS, ids=[c[0] for c in RUNS])
def test_a_mixed_precision_run_trains_and_its_record_says_so(case, fields, text):
    record = execute(RunSpec(**SMALL, **fields))
    assert record["status"] == OK, record.get("error")
    assert record["training"]["precision"] == text
    assert record["spec"]["precision"] == fields.get("precision", "fp32")
    train = record["train"]
    assert train["epochs_run"] == 1.0 and math.isfinite(train["first_loss"]) and math.isfinite(train["final_loss"])
    assert ("overflow_skipped_steps" in train) == (fields.get("precision") == "fp16")
    assert record["metrics"] and record["inference"]["batch_1"]["repeats"] >= 1
    memory = record["memory_breakdown"]  # master weights and gradients stay float32: 4 bytes a parameter
    assert memory["frozen_weights_bytes"] + memory["trainable_weights_bytes"] == 4 * record["total_params"]
    assert memory["gradients_bytes"] == 4 * record["trainable_params"]


def test_fp32_runs_keep_their_keys_and_other_precisions_are_other_runs():
    assert RunSpec(method="read").run_key == "3eaec3a38967b4f0"  # the key before --precision existed
    assert RunSpec(method="read", precision="fp32").run_key == "3eaec3a38967b4f0"
    keys = {RunSpec(method="read", precision=p).run_key for p in ("fp32", "bf16", "fp16")}
    assert len(keys) == 3


def test_fp16_overflows_are_skipped_steps_not_a_divergence():
    fields = dict(SMALL, backbone="tiny-bert", method="test_precision:LOUD_HEAD", max_steps=10)
    record = execute(RunSpec(**fields, precision="fp16"))
    assert record["status"] == OK, record.get("error")
    skipped = record["train"]["overflow_skipped_steps"]
    assert 1 <= skipped < 10  # the scale came down until the gradients fit float16, then steps applied
    assert record["train"]["epochs_run"] == 2.5  # every batch counted: skipped steps are steps of the run
    assert "overflow_skipped_steps" not in execute(RunSpec(**fields))["train"]  # fp32: nothing to skip


def test_a_diverging_fp16_run_is_still_diverged():
    record = execute(RunSpec(**SMALL, backbone="tiny-bert", method="full", lr=1e30, precision="fp16"))
    assert record["status"] == DIVERGED, record.get("error")
    assert not math.isfinite(float(record["diverged_at"]["loss"]))


@pytest.mark.parametrize("precision, dtype", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_an_operation_without_a_kernel_for_the_dtype_is_one_clear_line(precision, dtype):
    fields = dict(SMALL, backbone="tiny-bert", method="test_precision:ERFCX_HEAD")
    assert execute(RunSpec(**fields))["status"] == OK  # erfcx has a float32 kernel
    record = execute(RunSpec(**fields, precision=precision))
    assert record["status"] == FAILED
    error = record["error"]
    assert error.startswith(f"PrecisionError: --precision {precision}: an operation of this model has no {dtype}")
    assert "erfcx" in error and "--precision fp32" in error and len(error.splitlines()) == 1


@pytest.mark.parametrize("value", ["bf8", "float16", "FP16", ""])
def test_a_bad_precision_is_one_line_and_exit_2(tmp_path, capsys, value):
    code = main(["run", "--methods", "lora", "--precision", value, "--output", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bf16, fp16, fp32" in err
    assert not (tmp_path / "out").exists()
