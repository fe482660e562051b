"""``checkpoint_bytes``: what a method must save (its trainable tensors as one safetensors file), computed
from names, dtypes and shapes, equal to the size of the file safetensors really writes."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import make_task_model
from petlprof.registry import builtin_method_names, get_method
from petlprof.results.records import safetensors_bytes
from petlprof.run.pipeline import checkpoint_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = [
    (backbone, objective, method)
    for backbone, objective in [("tiny-bert", "classification"), ("tiny-t5", "lm")]
    for method in builtin_method_names()
    if objective in get_method(method).objectives
]


def written_bytes(tensors, tmp_path) -> int:
    path = tmp_path / "state.safetensors"
    save_file({name: t.detach().contiguous() for name, t in tensors.items()}, str(path))
    return os.path.getsize(path)


@pytest.mark.parametrize("backbone, objective, method", CASES)
def test_a_methods_checkpoint_is_the_size_of_its_trainable_state_written_as_safetensors(
    backbone, objective, method, tmp_path
):
    spec = get_method(method)
    model = spec.build()(
        make_task_model(load_backbone(backbone, lm_head=objective == "lm"), objective, 2), spec.make_config({})
    )
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    expected = written_bytes(trainable, tmp_path) if trainable else 0  # zero-shot: nothing to save
    assert checkpoint_bytes(model) == expected


@pytest.mark.parametrize(
    "tensors",
    [
        {"b": torch.zeros(3, dtype=torch.bfloat16), "a": torch.zeros(2, 2), "c": torch.zeros(5, dtype=torch.int64)},
        {"é": torch.zeros(1), "z" * 300: torch.zeros(7, 3, dtype=torch.float16)},  # non-ASCII and long names
        {"x": torch.zeros(0)},  # an empty tensor still has its header entry
    ],
)
def test_the_computed_size_is_the_written_files_for_mixed_dtypes_and_names(tensors, tmp_path):
    assert safetensors_bytes(tensors) == written_bytes(tensors, tmp_path)
