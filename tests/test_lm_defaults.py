"""Each method's default learning rate on the LM objective (``MethodSpec.lm_lr``, chosen by ``--tune lr`` on
smollm2/arith: reports/smollm2-arith-tuned) beside its classification default: which one a run takes, what its
record says of it, what ``petlprof list`` shows and searches around, and a spec that declares one badly."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from petlprof.cli import main
from petlprof.execution.tune import searches
from petlprof.method_api import MethodSpec, MethodSpecError
from petlprof.registry import builtin_method_names, get_method
from petlprof.run.execute import execute
from petlprof.sweep.config import build_options, expand
from petlprof.sweep.spec import RunSpec
from petlprof.sweep.tuning import lr_space
from petlprof.vocabulary import CLASSIFICATION, LM, ZERO_SHOT

pytestmark = pytest.mark.usefixtures("one_thread")

# the methods whose LM default the reference study chose (bitfit's search could tell no rate apart: on LLaMA it
# trains the LM head's bias alone), and those among them where it moved from the classification default
SEARCHED = {"full", "lora", "ia3", "lst", "read"}
MOVED = {"lora", "ia3", "lst"}
TRAINING = [m for m in builtin_method_names() if m != ZERO_SHOT and LM in get_method(m).objectives]


def test_the_searched_methods_declare_an_lm_default_with_its_source():
    declared = {m for m in builtin_method_names() if get_method(m).lm_lr is not None}
    assert declared == SEARCHED
    for name in declared:
        method = get_method(name)
        lr, source = method.lr_for(LM)
        assert lr == method.lm_lr and "reports/smollm2-arith-tuned" in source and source == method.lm_lr_source
        assert (lr != method.default_lr) == (name in MOVED), name
        assert method.lr_for(CLASSIFICATION) == (method.default_lr, method.lr_source)


@pytest.mark.parametrize("method", TRAINING)
def test_a_sweep_gives_each_run_its_objectives_default_and_lr_overrides_both(method):
    both = build_options({}, {"methods": method, "backbone": "tiny-llama", "task": "tweets,arith"})
    specs = {s.task: s for s in expand(both, "cpu") if s.method == method}
    spec = get_method(method)
    assert specs["tweets"].lr == spec.default_lr
    assert specs["arith"].lr == spec.lr_for(LM)[0]
    given = build_options({}, {"methods": method, "backbone": "tiny-llama", "task": "tweets,arith", "lr": "0.0007"})
    assert {s.lr for s in expand(given, "cpu") if s.method == method} == {0.0007}


@pytest.mark.parametrize("method", sorted(MOVED))
def test_the_lr_search_tries_rates_around_the_objectives_default(method):
    """What the search itself builds (execution.tune.searches): its space and its first rung's trials."""
    lm_lr, default_lr = get_method(method).lm_lr, get_method(method).default_lr
    for task, centre in (("arith", lm_lr), ("tweets", default_lr)):
        values = {"methods": method, "backbone": "tiny-llama", "task": task, "tune": "lr", "train_size": "64"}
        options = build_options({}, values)
        [search] = searches(options, [s for s in expand(options, "cpu") if s.method == method]).values()
        assert [point[0][1] for point in search.space] == lr_space(centre, 5), task
        assert sorted(trial.lr for trial in search.next_trials()) == lr_space(centre, 5), task
        assert search.default == (("lr", centre),)  # a tie goes to the objective's default


def test_a_users_model_folder_takes_the_objectives_default_too(lm_folder):
    lora = get_method("lora")
    options = build_options({}, {"methods": "lora", "backbone": lm_folder, "task": "tweets,arith"})
    assert {s.task: s.lr for s in expand(options, "cpu")} == {"tweets": lora.default_lr, "arith": lora.lm_lr}


@pytest.mark.parametrize(
    "tuner, lm_lr", [("peft:loha", get_method("lora").lm_lr), ("peft:vera", get_method("lora").lm_lr)]
)
def test_a_peft_tuner_like_lora_takes_loras_defaults_on_each_objective(tuner, lm_lr):
    spec = get_method(tuner)
    assert spec.default_lr == get_method("lora").default_lr
    assert spec.lr_for(LM)[0] == lm_lr and "lora's LM default" in spec.lr_for(LM)[1]


def test_an_lm_run_at_its_default_records_the_lm_default_and_its_source():
    lora = get_method("lora")
    spec = RunSpec(
        method="lora", backbone="tiny-llama", task="arith", train_size=8, eval_size=4, batch_size=4, max_steps=1,
        max_new_tokens=2, warmup_steps=0, inference_window_s=0.05,
    )  # fmt: skip
    assert spec.lr is None  # a spec built by hand: the run takes its objective's default
    record = execute(spec)
    assert record["status"] == "ok", record.get("traceback")
    assert record["training"]["lr"] == lora.lm_lr and record["training"]["lr_source"] == lora.lm_lr_source
    user = execute(dataclasses.replace(spec, lr=lora.default_lr))  # the classification default, given: the user's
    assert user["training"]["lr"] == lora.default_lr and user["training"]["lr_source"] == "user"


def test_list_shows_both_defaults_where_they_differ(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("  lora "))
    lora = get_method("lora")
    assert f"lr (classification) {lora.default_lr:g}" in line and f"lr (lm) {lora.lm_lr:g}" in line
    read = next(line for line in out.splitlines() if line.startswith("  read "))
    assert "; lr 0.001 (--tune lr: 0.0001..0.01);" in read  # the search kept its default: one for both objectives


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"lm_lr": math.nan}, "lm_lr must be a positive number of at most 10, or None, got nan"),
        ({"lm_lr": math.inf}, "lm_lr must be a positive number of at most 10, or None, got inf"),
        ({"lm_lr": 1e308}, "lm_lr must be a positive number of at most 10, or None, got 1e+308"),
        (
            {"lm_lr": 10**30},
            "lm_lr must be a positive number of at most 10, or None, got 1000000000000000000000000000000",
        ),
        ({"lm_lr": 0.0}, "lm_lr must be a positive number of at most 10, or None, got 0.0"),
        ({"lm_lr": -1e-3}, "lm_lr must be a positive number of at most 10, or None, got -0.001"),
        ({"lm_lr": "0.001"}, "lm_lr must be a positive number of at most 10, or None, got '0.001'"),
        ({"lm_lr": True}, "lm_lr must be a positive number of at most 10, or None, got True"),
        ({"lm_lr_source": None}, "lm_lr_source must say where lm_lr comes from, got None"),
        ({"lm_lr_source": "  "}, "lm_lr_source must say where lm_lr comes from"),
        ({"lm_lr": None}, "lm_lr_source is given ("),
        ({"objectives": (CLASSIFICATION,)}, "lm_lr is set but objectives ('classification',) do not include 'lm'"),
    ],
)
def test_a_bad_lm_default_is_refused_when_the_spec_is_made(changes, message):
    lora = get_method("lora")
    with pytest.raises(MethodSpecError, match=re.escape(message)):
        MethodSpec(**{**lora.__dict__, **changes})


def test_the_largest_lm_default_is_accepted():
    lora = get_method("lora")
    assert MethodSpec(**{**lora.__dict__, "lm_lr": 10}).lr_for(LM)[0] == 10


def test_the_report_says_whose_learning_rate_is_whose_when_a_method_took_two():
    from types import SimpleNamespace

    from petlprof.report.markdown import _lr_per_method

    def run(method, task, lr):
        return SimpleNamespace(method=method, task=task, training={"lr": lr})

    mixed = [
        run("lora", "tweets", 0.002),
        run("lora", "arith", 0.00632),
        run("read", "tweets", 0.001),
        run("read", "arith", 0.001),
    ]
    assert _lr_per_method(mixed) == ["lora on tweets=0.002", "lora on arith=0.00632", "read=0.001"]
    assert _lr_per_method(mixed[2:]) == ["read=0.001"]
