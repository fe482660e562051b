"""The validation split (issue 37): carved from the training pool, disjoint from training and evaluation, read by
every decision a run makes (its checks, its target), while the evaluation split is scored once for the record."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.run.budget import TARGET, Budget
from petlprof.sweep.config import build_options, expand
from petlprof.sweep.options import DEFAULT_EVAL_EVERY, DEFAULT_VAL_SIZE
from petlprof.tasks.labelled import load_task

FIXTURES = Path(__file__).parent / "fixtures"


def _user_file(tmp_path: Path, rows: int = 60) -> str:
    path = tmp_path / "reviews.csv"
    lines = ["text,label"] + [
        f"review number {i} is {'good' if i % 3 else 'bad'},{int(i % 3 > 0)}" for i in range(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _prompt_folder(tmp_path: Path) -> str:
    folder = tmp_path / "qa"
    folder.mkdir()
    for name, count in (("train", 40), ("validation", 12)):
        rows = [{"prompt": f"{name} {i} plus one is", "completion": str(i + 1)} for i in range(count)]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(folder)


# (id, task, load_task keywords): every loader, both objectives
LOADERS = [
    ("tweets", lambda tmp: "tweets", {"train_size": 100, "eval_size": 40}),
    ("tweets as text-to-text", lambda tmp: "tweets", {"train_size": 100, "eval_size": 40, "objective": "lm"}),
    ("tweets, every training example", lambda tmp: "tweets", {"train_size": None, "eval_size": 40}),
    ("arith", lambda tmp: "arith", {"train_size": 50, "eval_size": 20}),
    ("GLUE from files", lambda tmp: "sst2", {"train_size": 20, "eval_size": 10, "data_dir": str(FIXTURES / "glue")}),
    ("GLUE, all rows", lambda tmp: "sst2", {"train_size": None, "eval_size": 10, "data_dir": str(FIXTURES / "glue")}),
    ("one user file", _user_file, {"train_size": 20, "eval_size": 10}),
    (
        "a user folder",
        lambda tmp: str(FIXTURES / "userdata" / "headlines"),
        {"train_size": 10, "eval_size": 5, "text_column": "headline", "label_column": "topic"},
    ),
    ("a prompt/target folder", _prompt_folder, {"train_size": 20, "eval_size": 5}),
]


def _rows(split) -> list[tuple]:
    return list(zip(split.texts, split.pairs or [None] * len(split), split.targets or [None] * len(split)))


@pytest.mark.parametrize("make, kwargs", [c[1:] for c in LOADERS], ids=[c[0] for c in LOADERS])
def test_the_validation_split_is_disjoint_and_leaves_the_other_splits_as_they_were(tmp_path, make, kwargs):
    task = make(tmp_path)
    plain = load_task(task, **kwargs)
    carved = load_task(task, val_size=4, **kwargs)
    again = load_task(task, val_size=4, **kwargs)
    assert plain.val is None and carved.val is not None and len(carved.val) == 4
    assert _rows(carved.val) == _rows(again.val), "seeded: the same examples every time"
    assert not set(_rows(carved.val)) & set(_rows(carved.train)), "no validation example is trained on"
    assert not set(_rows(carved.val)) & set(_rows(carved.eval)), "no validation example is scored for the record"
    assert _rows(carved.eval) == _rows(plain.eval)
    if kwargs["train_size"] is not None and len(plain.train) == kwargs["train_size"]:
        assert _rows(carved.train) == _rows(plain.train), "a pool that holds both trains on the same examples"
    else:  # every training example was used: the validation ones leave the training set
        assert len(carved.train) == len(plain.train) - 4
    assert "val 4" in carved.description
    if carved.objective == "lm":
        assert carved.val.targets is not None and len(carved.val.targets) == 4
    assert (carved.val.pairs is None) is (carved.train.pairs is None)


@pytest.mark.parametrize(
    "val_size, pool, message",
    [(48, 48, "--val-size 48 leaves no training data: the training pool of"), (10**6, 48, "give at most 47")],
)
def test_a_validation_split_that_leaves_no_training_data_is_refused(tmp_path, val_size, pool, message):
    with pytest.raises(UsageError, match=message):
        load_task(_user_file(tmp_path, rows=60), train_size=None, val_size=val_size)  # 80% of 60 rows train


def _val_file(tmp_path: Path, kind: str, rows: int = 9) -> str:
    """A validation file of ``rows`` rows laid out like the training data of ``kind`` (labelled, prompt/target),
    rows no other split holds."""
    if kind == "labelled":
        path = tmp_path / "held-out.csv"
        lines = ["text,label"] + [f"held-out review {i} is {'good' if i % 2 else 'bad'},{i % 2}" for i in range(rows)]
        path.write_text("\n".join(lines) + "\n")
    else:
        path = tmp_path / "held-out.jsonl"
        path.write_text(
            "".join(json.dumps({"prompt": f"{i} plus two is", "completion": str(i + 2)}) + "\n" for i in range(rows))
        )
    return str(path)


# (id, task, its kind, load_task keywords): the loaders of the user's files, both objectives
USER_LOADERS = [c for c in LOADERS if c[0] in ("one user file", "a prompt/target folder")]


@pytest.mark.parametrize("make, kwargs", [c[1:] for c in USER_LOADERS], ids=[c[0] for c in USER_LOADERS])
@pytest.mark.parametrize("val_size", [None, 4], ids=["the whole file", "--val-size of its rows"])
def test_a_users_validation_file_is_the_validation_split_and_leaves_the_other_splits_as_they_were(
    tmp_path, make, kwargs, val_size
):
    task = make(tmp_path)
    kind = "prompt/target" if "prompt" in str(task) or Path(task).is_dir() else "labelled"
    val_file = _val_file(tmp_path, kind)
    plain = load_task(task, **kwargs)
    given = load_task(task, val_file=val_file, val_size=val_size, **kwargs)
    again = load_task(task, val_file=val_file, val_size=val_size, **kwargs)
    assert len(given.val) == (val_size or 9) and _rows(given.val) == _rows(again.val)
    assert all("held-out" in text or "plus two" in text for text in given.val.texts), "the file's rows, no others"
    assert _rows(given.train) == _rows(plain.train) and _rows(given.eval) == _rows(plain.eval)
    assert "validation file held-out" in given.description


def test_a_validation_file_of_a_labelled_task_shares_its_label_set(tmp_path):
    given = load_task(_user_file(tmp_path), train_size=20, eval_size=10, val_file=_val_file(tmp_path, "labelled"))
    assert given.label_names == load_task(_user_file(tmp_path), train_size=20, eval_size=10).label_names
    assert sorted(set(given.val.labels)) == [0, 1]


@pytest.mark.parametrize(
    "task, val_file, message",
    [
        ("tweets", "held-out.csv", "--val-file applies only to your own data files, not to the registered task"),
        ("reviews.csv", "missing.csv", "--val-file 'MISSING': no such file"),
        ("reviews.csv", "reviews.csv", "is one of the task's own data files"),
        ("reviews.csv", "notes.txt", "unsupported file type '.txt'"),
        ("reviews.csv", "no-text.csv", "no-text.csv has no column 'text'"),
        ("reviews.csv", "copied.csv", "copied.csv' shares 1 row(s) with the evaluation split"),
    ],
    ids=[
        "a registered task",
        "no such file",
        "the training file itself",
        "an unknown file type",
        "other columns",
        "an evaluation example in it",
    ],
)
def test_a_validation_file_that_cannot_serve_is_refused(tmp_path, task, val_file, message):
    _user_file(tmp_path)
    _val_file(tmp_path, "labelled")
    (tmp_path / "notes.txt").write_text("a note\n")
    (tmp_path / "no-text.csv").write_text("sentence_b,label\nsome words,1\n")
    evaluation = load_task(str(tmp_path / "reviews.csv"), train_size=20).eval  # the split a decision must not read
    row = f"{evaluation.texts[0]},{int(evaluation.labels[0])}"
    (tmp_path / "copied.csv").write_text(f"text,label\nsomething new,1\n{row}\n")
    task = task if task == "tweets" else str(tmp_path / task)
    path = str(tmp_path / val_file)
    with pytest.raises(UsageError, match=re.escape(message.replace("MISSING", path))):
        load_task(task, train_size=20, val_file=path)


RUN = ["run", "--methods", "bitfit", "--backbone", "tiny-bert", "--batch-size", "8", "--in-process"]
RUN += ["--inference-window-s", "0"]  # the inference phase's 10 repeats alone: it is not what these tests check


def test_a_run_checks_on_the_users_validation_file_and_records_it(tmp_path):
    """``--val-file``: every check scores the file's rows (9 here), the run key says the file was given, and the
    training and evaluation examples are those of the run without it."""
    out, val_file = tmp_path / "out", _val_file(tmp_path, "labelled")
    args = [*RUN, "--task", _user_file(tmp_path), "--train-size", "32", "--eval-every", "2", "--output", str(out)]
    assert main([*args, "--val-file", val_file]) == 0
    assert main([*args, "--val-size", "9"]) == 0  # the same sweep with 9 examples carved from the pool instead
    given, carved = (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines())
    assert given["spec"]["val_file"] == val_file and carved["spec"]["val_file"] is None
    assert given["run_key"] != carved["run_key"]
    assert given["train"]["budget"]["check_eval_size"] == carved["train"]["budget"]["check_eval_size"] == 9
    assert "validation file held-out.csv" in json.dumps(given["task_info"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--val-size", "nan"], "--val-size must be"),
        (["--val-size", str(10**30)], "--val-size must be at most"),
        (["--val-size", "0"], "--val-size must be an integer >= 1"),
        (["--val-size", "2.5"], "--val-size must be an integer"),
        (["--val-size", "many"], "--val-size must be"),
        (["--eval-every", "1", "--val-size", "48"], "--val-size 48 leaves no training data"),
        (["--eval-every", "inf"], "--eval-every must be"),
        (["--eval-every", "40", "--val-size", "8"], "--eval-every 40: a run on task"),
        (["--eval-every", "2"], "is the default where runs check a validation split; give a smaller --val-size"),
        (["--target-eval-size", "4"], "--target-eval-size acts only with --target-value or --eval-every"),
        (["--eval-every", "2", "--val-file", "nope.csv"], "--val-file 'nope.csv': no such file"),
        (["--eval-every", "2", "--val-file", "/dev/null"], "--val-file '/dev/null' is a character device"),
    ],
    ids=[
        "nan",
        "10**30",
        "zero",
        "a fraction",
        "a word",
        "the whole pool",
        "inf checks",
        "no check inside a run",
        "the default split is larger than the pool",
        "a slice without checks",
        "a validation file that is not there",
        "a validation file that never ends",
    ],
)
def test_bad_validation_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code = main([*RUN, "--task", _user_file(tmp_path), "--train-size", "all", *args, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err[-1500:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def _options(**values):
    return build_options({}, {"methods": ["bitfit"], "backbone": ["tiny-bert"], **values})


@pytest.mark.parametrize(
    "values, val_size, eval_every",
    [
        ({}, None, None),
        ({"target_value": 0.9}, DEFAULT_VAL_SIZE, DEFAULT_EVAL_EVERY),
        ({"eval_every": 3}, DEFAULT_VAL_SIZE, 3),
        ({"eval_every": 3, "val_size": 50}, 50, 3),
        ({"val_size": 50}, 50, None),
    ],
    ids=["no decision", "a target", "a curve", "a curve on a given split", "a split alone"],
)
def test_the_expansion_fills_in_the_validation_split_a_decision_needs(values, val_size, eval_every):
    (spec,) = expand(_options(**values), "cpu")
    assert (spec.val_size, spec.eval_every) == (val_size, eval_every)
    plain = expand(_options(), "cpu")[0]
    assert (spec.run_key == plain.run_key) is (not values), "a run that decides nothing keeps its key"


def test_the_zero_shot_row_carries_no_checks():
    specs = expand(_options(task=["arith"], backbone=["tiny-gpt2"], target_value=0.5, eval_every=2), "cpu")
    zero = next(s for s in specs if s.method == "zero_shot")
    assert (zero.val_size, zero.eval_every, zero.target_value) == (None, None, None)


class Energy:
    """A stand-in energy meter reading ``joules`` per window it is opened around (a hardware fake)."""

    def __init__(self, joules: float):
        self.joules, self.device = joules, "cpu"

    def prepare(self) -> None:
        pass

    def begin(self) -> None:
        pass

    def end(self) -> dict:
        return {"energy_j": self.joules}


def test_a_curve_point_counts_the_training_so_far_and_leaves_the_checks_out():
    scores = iter([0.2, 0.4, 0.6, 0.8])
    budget = Budget(
        metric="accuracy",
        target_value=None,
        eval_every=2,
        score=lambda model: next(scores),
        model=None,
        max_time_s=None,
        eval_size=8,
        check_meter=Energy(100.0),
        train_meter=Energy(3.0),
    )
    budget.start()
    assert not any(budget(step) for step in range(1, 9)), "without a target a curve never stops training"
    summary = budget.summary({"time_s": 1.0, "energy_j": 420.0})
    checks = summary["checks"]
    assert [c["step"] for c in checks] == [2, 4, 6, 8] and [c["value"] for c in checks] == [0.2, 0.4, 0.6, 0.8]
    assert [c["train_energy_j"] for c in checks] == [3.0, 6.0, 9.0, 12.0], "one training window per interval"
    assert summary["check_energy_j"] == 400.0 and summary["reached"] is None and summary["stop_reason"] is None
    times = [c["train_time_s"] for c in checks]
    assert times == sorted(times) and all(t <= c["elapsed_s"] for t, c in zip(times, checks))


def test_a_target_is_reached_on_the_curve():
    scores = iter([0.2, 0.9])
    budget = Budget(
        metric="accuracy",
        target_value=0.8,
        eval_every=1,
        score=lambda model: next(scores),
        model=None,
        max_time_s=None,
        eval_size=8,
    )
    assert budget(1) is None and budget(2) == TARGET


def _sweep(tmp_path: Path, name: str, task: str, extra: list[str]) -> list[dict]:
    out = tmp_path / name
    args = [*extra, "--task", task, "--eval-every", "2", "--val-size", "8", "--seeds", "0", "--output", str(out)]
    assert (
        main(["run", "--in-process", "--batch-size", "4", "--warmup-steps", "0", "--inference-window-s", "0", *args])
        == 0
    )
    return [
        json.loads(line) for name in ("trials.jsonl", "results.jsonl") for line in (out / name).read_text().splitlines()
    ]


def _relabel_eval(folder: Path, text_key: str) -> None:
    """Every evaluation row's answer changed: what the run is scored on, never what it decides on."""
    path = folder / "validation.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row[text_key] = "WRONG" if text_key == "completion" else 1 - int(row[text_key])
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


OBJECTIVES = [
    (
        "classification",
        ["--methods", "bitfit", "--backbone", "tiny-bert", "--train-size", "24", "--epochs", "2"],
        "label",
    ),
    (
        "lm",
        [
            "--methods",
            "lora",
            "--backbone",
            "tiny-gpt2",
            "--train-size",
            "16",
            "--max-steps",
            "6",
            "--max-new-tokens",
            "3",
        ],
        "completion",
    ),
]


@pytest.mark.parametrize("args, key", [c[1:] for c in OBJECTIVES], ids=[c[0] for c in OBJECTIVES])
def test_changing_the_evaluation_split_changes_no_decision(tmp_path, args, key):
    folder = tmp_path / "data"
    folder.mkdir()
    for name, count in (("train", 40), ("validation", 8)):
        if key == "completion":
            rows = [{"prompt": f"{name} {i} plus one is", "completion": str(i + 1)} for i in range(count)]
        else:
            rows = [
                {"text": f"{name} review {i} was {'fine' if i % 2 else 'poor'}", "label": i % 2} for i in range(count)
            ]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    tune = "lr,lora.r" if "lora" in args else "lr"  # lora's rank too: 3 learning rates x 3 ranks
    decide = [*args, "--target-value", "1", "--tune", tune, "--tune-points", "3"]
    before = _sweep(tmp_path, "before", str(folder), decide)
    _relabel_eval(folder, key)
    after = _sweep(tmp_path, "after", str(folder), decide)

    def decisions(records):
        """Every check of every trial and final run, and each final run's chosen learning rate and its score."""
        return {
            r["run_key"]: (
                [(c["step"], c["value"]) for c in r["train"]["budget"]["checks"]],
                (r.get("tuning") or {}).get("chosen"),
                (r.get("tuning") or {}).get("validation_score"),
            )
            for r in records
            if r["method"] != "zero_shot"
        }

    assert decisions(before) == decisions(after) and all(checks for checks, _, _ in decisions(before).values())
    # three learning rates: one rung, each at the full budget; with lora's 3 ranks, 9 pilots of 2 steps and 3 of 6
    assert sum(r.get("kind") == "trial" for r in before) == (12 if "lora.r" in tune else 3)
    trained = [r for r in before if r["method"] != "zero_shot" and r.get("kind") != "trial"]
    assert all(r["tuning"]["chosen"] in r["tuning"]["space"] for r in trained)
    assert all(r["train"]["budget"]["check_eval_size"] == 8 for r in trained)
    assert all("val 8" in r["task_info"]["description"] for r in trained)


@pytest.mark.parametrize("task, backbone", [("arith", "tiny-gpt2"), ("tweets", "tiny-bert")])
def test_the_checks_score_the_validation_examples_on_both_objectives(task, backbone):
    """What the checks score is the validation split's first examples (an LM check generates for its prompts and
    compares with its targets), whatever the evaluation split holds."""
    from petlprof.models.backbones import load_backbone
    from petlprof.run.budget import make_budget
    from petlprof.run.pipeline import _batches
    from petlprof.sweep.spec import RunSpec

    spec = RunSpec(method="lora", backbone=backbone, task=task, eval_every=2, val_size=6, target_eval_size=5)
    data = load_task(task, train_size=8, eval_size=4, val_size=6)
    lm = data.objective == "lm"
    loaded = load_backbone(backbone, lm_head=lm)
    budget = make_budget(spec, data, None, _batches(spec, data, loaded))
    scored = budget.score.batches
    if lm:
        assert list(scored.references) == data.val.targets[:5] != data.eval.targets[:5]
    else:
        expected = _batches(spec, data, loaded)(data.val.head(5))
        assert len(scored.encodings) == 5 == budget.eval_size and scored.encodings == expected.encodings
        assert [int(x) for x in scored.labels] == data.val.labels[:5]
