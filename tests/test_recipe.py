"""The training recipe: the record's description comes from the same object the loop trains by.

Each case builds a recipe, checks the text the record carries (the default's must stay what the
records of schema version 1 say), and checks that the optimiser, schedule, clipping and precision the
loop gets from it do what that text says, on a small module with a matrix, a bias and a norm.
"""

from __future__ import annotations

import pytest
import torch

from petlprof.run.recipe import TrainRecipe

# (id, recipe, optimizer text, schedule text, precision text, dtype of a matrix product under its autocast)
CASES = [
    (
        "default (as every record of schema 1 says)",
        TrainRecipe(lr=1e-3),
        "AdamW(weight_decay=0.01 on matrices, 0 on biases/norms)",
        "linear, 6% warm-up",
        "float32",
        torch.float32,
    ),
    (
        "stronger decay, longer warm-up",
        TrainRecipe(lr=1e-3, weight_decay=0.1, warmup_fraction=0.1),
        "AdamW(weight_decay=0.1 on matrices, 0 on biases/norms)",
        "linear, 10% warm-up",
        "float32",
        torch.float32,
    ),
    (
        "fractional warm-up, bfloat16 autocast",
        TrainRecipe(lr=1e-3, warmup_fraction=0.025, precision="bf16"),
        "AdamW(weight_decay=0.01 on matrices, 0 on biases/norms)",
        "linear, 2.5% warm-up",
        "bfloat16 autocast, float32 weights",
        torch.bfloat16,
    ),
    (
        "float16 autocast with loss scaling",
        TrainRecipe(lr=1e-3, precision="fp16"),
        "AdamW(weight_decay=0.01 on matrices, 0 on biases/norms)",
        "linear, 6% warm-up",
        "float16 autocast + dynamic loss scaling, float32 weights",
        torch.float16,
    ),
]


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))


@pytest.mark.parametrize("case, recipe, optimizer, schedule, precision, dtype", CASES, ids=[c[0] for c in CASES])
def test_the_record_describes_what_the_loop_does(case, recipe, optimizer, schedule, precision, dtype):
    model = small_model()
    assert recipe.describe(model) == {"optimizer": optimizer, "schedule": schedule, "precision": precision}

    adamw, params = recipe.optimizer(model)
    assert isinstance(adamw, torch.optim.AdamW) and len(params) == 4
    decayed, plain = adamw.param_groups
    assert [p.ndim for p in decayed["params"]] == [2] and decayed["weight_decay"] == recipe.weight_decay
    assert sorted(p.ndim for p in plain["params"]) == [1, 1, 1] and plain["weight_decay"] == 0.0

    total = 200
    lrs = []
    sched = recipe.schedule(adamw, total)
    for _ in range(total):
        lrs.append(adamw.param_groups[0]["lr"])
        adamw.step()
        sched.step()
    warmup = int(recipe.warmup_fraction * total)
    assert lrs[0] == 0.0 and max(lrs) == pytest.approx(recipe.lr) and lrs.index(max(lrs)) == warmup

    with recipe.autocast("cpu"):
        out = model[0](torch.ones(2, 4))
    assert out.dtype == dtype and model[0].weight.dtype == torch.float32  # master weights stay float32
    scaler = recipe.scaler("cpu")
    assert scaler.is_enabled() == (recipe.precision == "fp16")
    assert float(scaler.scale(torch.tensor(1.0))) == scaler.get_scale()  # 65536 for fp16, 1 otherwise

    for p in params:
        p.grad = torch.full_like(p, 10.0)
    norm = recipe.clip(params)
    assert norm == pytest.approx(10.0 * 21**0.5)  # the norm before clipping: 12 + 3 weights and biases, 3 + 3 norm
    clipped = torch.sqrt(sum((p.grad**2).sum() for p in params))
    assert float(clipped) == pytest.approx(recipe.max_grad_norm, rel=1e-4)
