"""Tasks for the language-modelling objective: prompts and the target texts a model learns to generate.

Three kinds, each a :class:`~petlprof.tasks.base.TaskData` with ``objective == "lm"`` (prompts in
``Split.texts``, references in ``Split.targets``), scored on generated text by ``score_generations``:

* the generative tasks ``arith`` and ``gsm``, drawn from the ``reasoning-gym`` package (procedural,
  seeded, pure Python).  One seeded stream of problems per task, each question kept once: its first
  :data:`EVAL_POOL` questions are the evaluation pool, the next :data:`TRAIN_POOL` (at most) the training
  pool, so the splits are disjoint and each is a prefix of the same pool whatever the sizes asked for.
  Prompts are the question followed by ``"\\nAnswer:"``.  ``arith`` (:data:`ARITH`): two terms drawn as
  reasoning-gym's one- and two-digit numbers (0-10 and 0-100), ``+`` and ``-``, no parentheses or
  negation, e.g. ``Calculate 13 - 92.`` -> ``-79``, scored by exact match of the last number on the
  first line generated.  ``gsm``: ``gsm_symbolic``'s GSM8K-style word problems; the target is the worked
  answer ending ``#### <answer>``, scored by exact match of the number after the generated ``####``
  (else the last number generated);
* the user's prompt/target rows: ``--prompt-column`` (and ``--target-column``, else the first of
  :data:`TARGET_COLUMNS`), or a recognised layout: ``instruction``/``input``/``output`` (Alpaca: the
  prompt is the instruction, then a blank line and the input when there is one), ``prompt``/``completion``,
  or chat ``messages`` (a list of ``{"role", "content"}``: the last turn, an assistant's, is the target,
  the turns before it the prompt).  Scored by ROUGE-L (primary) and exact match of the whole text;
* any labelled task with ``--objective lm``: the READ paper's T5 setup, each label verbalised as its
  name (underscores as spaces) and the prompt ``"<text>\\n[<text pair>\\n]<cue> (<label> or <label>):"``
  with the cue ``Sentiment`` for sentiment tasks, else ``Label``; scored by exact match of the first
  line generated.  Regression has no label words and is refused.

Exact match normalises both sides (:func:`petlprof.tasks.metrics.normalise`).  Layouts are recognised only where
the data has no label column, so a labelled file keeps its classification head under ``--objective auto``.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from petlprof.errors import UsageError, shown, unknown_choice
from petlprof.tasks.base import Split, TaskData, sizes_text
from petlprof.tasks.files import require_columns, split_frames
from petlprof.tasks.metrics import normalise
from petlprof.vocabulary import CHAT_TEMPLATES, CLASSIFICATION, LM, OBJECTIVE_CHOICES

if TYPE_CHECKING:
    import pandas as pd

EVAL_POOL = 1000  # evaluation problems of a generative task (--eval-size takes the first N)
TRAIN_POOL = 5000  # training problems at most (--train-size takes the first N; 'all' is this many)
STREAM = 20 * (EVAL_POOL + TRAIN_POOL)  # problems drawn at most to find the pools' distinct questions
SPLIT_SEED_STRIDE = 10**7  # reasoning-gym seeds item i with seed + i: split seeds this far apart share no item
ANSWER_CUE = "\nAnswer:"
TARGET_COLUMNS = ("target", "completion", "output", "response", "answer")
USER_MAX_NEW_TOKENS = 64  # generated per prompt of the user's free text unless --max-new-tokens says otherwise
LABEL_MAX_NEW_TOKENS = 16
SENTIMENT_TASKS = ("tweets", "tweets3", "sst2")
NO_LAYOUT = (
    "none of the prompt/target layouts instruction/input/output, prompt/completion or messages; name its columns "
    "with --prompt-column and --target-column"
)

# reasoning-gym's basic_arithmetic, set so that a short CPU budget moves a 135M model
ARITH = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 2,
    "operators": ("+", "-"),
    "allow_parentheses": False,
    "allow_negation": False,
}


@dataclass(frozen=True)
class _Generator:
    dataset: str  # reasoning-gym's name
    config: dict[str, Any]
    seed: int
    answer: str  # petlprof.tasks.metrics.ANSWERS: how exact match takes the answer
    max_new_tokens: int
    title: str


_GENERATORS = {
    "arith": _Generator(
        "basic_arithmetic",
        ARITH,
        2605,
        "number",
        16,
        "arithmetic from reasoning-gym basic_arithmetic (2 terms of 0-10 or 0-100, + and -, no parentheses or "
        "negation), exact match of the answer",
    ),
    "gsm": _Generator(
        "gsm_symbolic",
        {},
        1305,
        "final",
        256,
        "GSM8K-style word problems from reasoning-gym gsm_symbolic, worked answers ending '#### <answer>', "
        "exact match of the final answer",
    ),
}


def check_lm_options(
    objective: str,
    prompt_column: str | None,
    target_column: str | None,
    chat_template: str,
    label_column: str | None,
    text_column: str | None,
    text_pair_column: str | None = None,
) -> None:
    """The LM options' values and the pairs of them that cannot go together (no data read)."""
    if objective not in OBJECTIVE_CHOICES:
        raise unknown_choice("objective", objective, OBJECTIVE_CHOICES)
    if chat_template not in CHAT_TEMPLATES:
        raise unknown_choice("chat template", chat_template, CHAT_TEMPLATES)
    if target_column is not None and prompt_column is None:
        raise UsageError("--target-column acts only with --prompt-column, which was not given")
    if prompt_column is None:
        return
    if objective == CLASSIFICATION:
        raise UsageError(
            "--prompt-column names an LM task's prompts; it cannot be used with --objective classification"
        )
    for option, column in (
        ("--label-column", label_column),
        ("--text-column", text_column),
        ("--text-pair-column", text_pair_column),
    ):
        if column is not None:
            raise UsageError(
                f"{option} names a classification task's column; with --prompt-column the task is an LM task"
            )
    if prompt_column == target_column:
        raise UsageError(
            f"--prompt-column and --target-column are both '{prompt_column}': the prompt would hold its answer"
        )


def with_objective(task: TaskData, objective: str, chat_template: str) -> TaskData:
    """A labelled task as ``objective`` asks: verbalised for ``lm``, else as it is (``chat_template`` must
    then be left at auto: it acts only on LM tasks)."""
    if objective == LM:
        return verbalised(task)
    if chat_template != "auto":
        raise UsageError(
            f"--chat-template {chat_template} acts only on the LM objective; task '{task.name}' trains a "
            "classification head (add --objective lm to run it as text-to-text)"
        )
    return task


# --- generative tasks ------------------------------------------------------------------------------


def load_generative(
    name: str,
    objective: str,
    train_size: int | None,
    eval_size: int | None,
    split_seed: int,
    val_size: int | None = None,
) -> TaskData:
    """``arith`` or ``gsm``: disjoint, seeded train and eval pools of reasoning-gym problems (module docstring); a
    validation split takes the ``val_size`` problems that follow the training ones in the stream."""
    if objective == CLASSIFICATION:
        raise UsageError(f"task '{name}' has prompts and answers, not labels: it runs with --objective lm (or auto)")
    try:
        # reasoning_gym: slow to import, loaded only when used
        import reasoning_gym
    except ImportError:
        raise UsageError(
            f"the task '{name}' is generated by reasoning-gym, which is not installed: pip install reasoning-gym"
        ) from None
    gen = _GENERATORS[name]
    seed = gen.seed + split_seed * SPLIT_SEED_STRIDE
    dataset = reasoning_gym.create_dataset(gen.dataset, seed=seed, size=STREAM, **gen.config)
    trained = min(train_size or TRAIN_POOL, TRAIN_POOL)
    wanted = EVAL_POOL + trained + (val_size or 0)
    seen: set[str] = set()
    prompts, targets = [], []
    for index in range(STREAM):
        item = dataset[index]
        if item["question"] in seen:
            continue
        seen.add(item["question"])
        prompts.append(item["question"] + ANSWER_CUE)
        targets.append(item["metadata"]["answer_cot"] if name == "gsm" else item["answer"])
        if len(prompts) == wanted:
            break
    if val_size and len(prompts) <= EVAL_POOL + trained:  # never for the built-in generators' streams
        raise UsageError(f"--val-size {val_size}: task '{name}' has no problem left after its training ones")
    end = EVAL_POOL + trained
    train = Split(prompts[EVAL_POOL:end], None, [], targets[EVAL_POOL:end])
    val = Split(prompts[end:], None, [], targets[end:]) if val_size else None
    evaluation = Split(prompts[:EVAL_POOL], None, [], targets[:EVAL_POOL])
    if eval_size is not None:
        evaluation = evaluation.head(eval_size)
    return TaskData(
        name,
        train,
        evaluation,
        0,
        None,
        ("exact_match",),
        f"{gen.title} ({sizes_text(train, val, evaluation)}, seed {seed}; prompt '<question>\\nAnswer:')",
        objective=LM,
        answer=gen.answer,
        max_new_tokens=gen.max_new_tokens,
        val=val,
    )


# --- labelled tasks as text-to-text ----------------------------------------------------------------


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def verbalised(task: TaskData) -> TaskData:
    """A labelled task as text-to-text (module docstring): targets are the label names, scored by exact match."""
    if task.objective != CLASSIFICATION:
        raise UsageError(
            f"task '{task.name}' is a regression (scores, not classes): --objective lm verbalises class labels "
            "and a score has no label word; run it with --objective auto"
        )
    if task.label_names is None:  # every classification loader names its classes
        raise ValueError(f"task '{task.name}' is a classification without label names: nothing to verbalise")
    words = [str(name).replace("_", " ") for name in task.label_names]
    if len({normalise(word) for word in words}) < len(words):
        raise UsageError(
            f"task '{task.name}': labels {words} are not told apart once lower-cased, so exact match cannot score "
            "them as text; run it with --objective auto"
        )
    cue = "Sentiment" if task.name in SENTIMENT_TASKS else "Label"
    suffix = f"{cue} ({_either(words)}):"

    def split(part: Split) -> Split:
        pairs: Sequence[str | None] = part.pairs or [None] * len(part)
        prompts = [
            f"{text}\n{pair}\n{suffix}" if pair is not None else f"{text}\n{suffix}"
            for text, pair in zip(part.texts, pairs)
        ]
        return Split(prompts, None, list(part.labels), [words[int(label)] for label in part.labels])

    return TaskData(
        task.name,
        split(task.train),
        split(task.eval),
        0,
        words,
        ("exact_match",),
        f"{task.description}; as text-to-text: prompt '<text>\\n{suffix}', target the label's name, exact match "
        "of the first line generated",
        list(task.warnings),
        objective=LM,
        answer="line",
        max_new_tokens=LABEL_MAX_NEW_TOKENS,
        val=None if task.val is None else split(task.val),
    )


# --- the user's prompt/target data -----------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    kind: str  # "columns", "alpaca" or "messages"
    prompt: str
    target: str | None  # None: in the messages
    name: str


def _columns_text(frame: pd.DataFrame) -> str:
    return ", ".join(map(str, frame.columns))


def _layout(frame: pd.DataFrame, where: str, prompt_column: str | None, target_column: str | None) -> _Layout | None:
    """The prompt/target layout of a frame: the named columns (each must exist), or a recognised one, or None."""
    columns = set(map(str, frame.columns))
    if prompt_column is not None:
        for option, column in (("--prompt-column", prompt_column), ("--target-column", target_column)):
            if column is not None and column not in columns:
                raise UsageError(
                    f"{option} {shown(column)}: {where} has no such column; its columns: {_columns_text(frame)}"
                )
        if target_column is None:
            target_column = next((c for c in TARGET_COLUMNS if c in columns and c != prompt_column), None)
            if target_column is None:
                raise UsageError(
                    f"{where} has none of the default target columns {list(TARGET_COLUMNS)}; name one with "
                    f"--target-column. Its columns: {_columns_text(frame)}"
                )
        return _Layout("columns", prompt_column, target_column, f"columns {prompt_column} -> {target_column}")
    if "messages" in columns:
        return _Layout("messages", "messages", None, "chat messages")
    if {"instruction", "output"} <= columns:
        return _Layout("alpaca", "instruction", "output", "instruction/input/output")
    if {"prompt", "completion"} <= columns:
        return _Layout("columns", "prompt", "completion", "prompt/completion")
    return None


def is_prompt_data(
    frame: pd.DataFrame, objective: str, prompt_column: str | None, label_column: str | None, labelled: bool = False
) -> bool:
    """Whether the user's data is an LM task's prompt/target rows: named with --prompt-column, or a recognised
    layout in data without a label column (a labelled file keeps its head, or is verbalised with --objective lm);
    ``labelled``: a classification task's columns were named (--text-column and the like), so it is not."""
    if prompt_column is not None:
        return True
    if objective == CLASSIFICATION or labelled or (label_column or "label") in frame.columns:
        return False
    if _layout(frame, "the data", None, None) is not None:
        return True
    if objective == LM:
        raise UsageError(
            f"--objective lm: the data has no label column '{label_column or 'label'}' and {NO_LAYOUT}. "
            f"Its columns: {_columns_text(frame)}"
        )
    return False


def load_user_lm(
    spec: str,
    sources: dict[str, pd.DataFrame],
    train_size: int | None,
    eval_size: int | None,
    split_seed: int,
    prompt_column: str | None,
    target_column: str | None,
    val_size: int | None = None,
    val_file: str | None = None,
) -> TaskData:
    """The user's prompt/target rows as an LM task (module docstring); each file's rows are read into prompts and
    targets and checked (text, not empty) by their data row before the rows are split (``val_file``'s too, the
    validation split when given)."""
    layouts = {where: _layout(frame, where, prompt_column, target_column) for where, frame in sources.items()}
    first, layout = next(iter(layouts.items()))
    if layout is None:  # is_prompt_data found a layout in the first file, or --prompt-column names one
        raise UsageError(f"{first} has {NO_LAYOUT}. Its columns: {_columns_text(sources[first])}")
    tables = {}
    warnings: list[str] = []
    for where, frame in sources.items():
        if layouts[where] != layout:
            raise UsageError(
                f"{where} is laid out as {_name(layouts[where])}, not as {layout.name} like the training file"
            )
        require_columns(frame, (layout.prompt, layout.target), where)
        tables[where] = _rows(frame, layout, where)
        warnings += _empty_targets(tables[where]["target"].tolist(), where)
    train_frame, val_frame, eval_frame, how = split_frames(
        spec, tables, train_size, eval_size, split_seed, val_size, val_file
    )
    train, evaluation = (_split(frame) for frame in (train_frame, eval_frame))
    val = None if val_frame is None else _split(val_frame)
    return TaskData(
        spec,
        train,
        evaluation,
        0,
        None,
        ("rouge_l", "exact_match"),
        f"your data {spec}: prompt/target ({layout.name}), {how} ({sizes_text(train, val, evaluation)}, "
        f"split seed {split_seed})",
        warnings,
        objective=LM,
        answer="text",
        max_new_tokens=USER_MAX_NEW_TOKENS,
        val=val,
    )


def _name(layout: _Layout | None) -> str:
    return layout.name if layout else "no prompt/target layout"


def _rows(frame: pd.DataFrame, layout: _Layout, where: str) -> pd.DataFrame:
    """A file's rows as columns ``prompt``, ``target`` and (chat layouts) ``turns``, in file order; a prompt or
    target that is not text (a number is taken as its text) refused with its data row."""
    import pandas as pd  # as in the type hints: loaded with the frames

    if layout.kind == "messages":
        chats = [_chat(value, where, row) for row, value in enumerate(frame["messages"], start=1)]
        return pd.DataFrame(
            {
                "prompt": [_render(turns) for turns, _ in chats],
                "target": [t for _, t in chats],
                "turns": [c for c, _ in chats],
            }
        )
    prompts = _texts(frame[layout.prompt], where, layout.prompt)
    if layout.kind == "alpaca" and "input" in frame.columns:
        extra = _texts(frame["input"].fillna(""), where, "input")
        prompts = [f"{p}\n\n{x}" if x.strip() else p for p, x in zip(prompts, extra)]
    assert layout.target is not None  # only the messages layout keeps its targets in the turns
    return pd.DataFrame({"prompt": prompts, "target": _texts(frame[layout.target], where, layout.target)})


def _texts(column: pd.Series, where: str, name: str) -> list[str]:
    """A column's cells as text: strings as they are, numbers as their text; anything else (a JSON object or list
    a JSONL file holds, say) refused, naming its data row, rather than trained on as its Python text."""
    texts = []
    for row, value in enumerate(column, start=1):
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, numbers.Number) and not isinstance(value, bool):
            texts.append(str(value))
        else:
            raise UsageError(
                f"{where}: column '{name}' of data row {row} is {_kind(value)} ({shown(str(value)[:60])}), not text; "
                "prompts and targets are text (or numbers)"
            )
    return texts


def _kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", bool: "a boolean"}
    return kinds.get(type(value), f"a {type(value).__name__}")


# a file whose targets are empty at this share or more is refused: a model learns to answer nothing, and exact
# match scores the empty answer 1.0 against an empty reference
EMPTY_TARGETS_REFUSED = 0.9


def _empty_targets(targets: list[str], where: str) -> list[str]:
    """Refuse a file whose targets are (nearly) all empty; a warning that counts them where some are."""
    empty = [row for row, target in enumerate(targets, start=1) if not target.strip()]
    if not empty:
        return []
    counted = f"{len(empty)} of the {len(targets)} targets of {where} are empty (the first in data row {empty[0]})"
    if len(empty) >= EMPTY_TARGETS_REFUSED * len(targets):
        raise UsageError(
            f"{counted}: a model trained on them learns to answer nothing, and exact match scores an empty answer "
            "1.0; give each row its target text"
        )
    return [f"{counted}; those rows teach the model to answer nothing"]


def _split(frame: pd.DataFrame) -> Split:
    turns = frame["turns"].tolist() if "turns" in frame.columns else None
    return Split(frame["prompt"].tolist(), None, [], frame["target"].tolist(), turns)


def _chat(value: Any, where: str, row: int) -> tuple[list[dict[str, str]], str]:
    """(the prompt's turns, the target) of one ``messages`` cell: a list of role/content turns (or its JSON
    text) ending with an assistant's turn."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    turns = (
        list(value) if value is not None and not isinstance(value, (str, dict)) and hasattr(value, "__iter__") else None
    )
    bad = f"{where}: 'messages' of data row {row}"
    if not turns or not all(
        isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str) for t in turns
    ):
        raise UsageError(f"{bad} is not a list of turns with a role and a content")
    if turns[-1]["role"] != "assistant":
        raise UsageError(
            f"{bad} ends with a {shown(turns[-1]['role'])} turn; the last turn must be the assistant's reply "
            "(the target)"
        )
    if len(turns) < 2:
        raise UsageError(f"{bad} has no turn before the assistant's reply (the prompt)")
    prompt = [{"role": t["role"], "content": t["content"]} for t in turns[:-1]]
    return prompt, turns[-1]["content"]


def _render(turns: list[dict[str, str]]) -> str:
    """Prompt turns as plain text: a lone user turn as its content, else each turn as ``Role: content`` and a
    closing ``Assistant:``."""
    if len(turns) == 1 and turns[0]["role"] == "user":
        return turns[0]["content"]
    lines = [f"{turn['role'].capitalize()}: {turn['content']}" for turn in turns]
    return "\n\n".join([*lines, "Assistant:"])
