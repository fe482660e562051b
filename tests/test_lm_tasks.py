"""The language-modelling objective's data side (issue 26): prompt/target layouts of the user's files, labelled
tasks verbalised, the reasoning-gym tasks, generation metrics, the LM options' identity, and LMBatches' masks.

Tables of cases fed to shared checks; the tokenizer is the tiny presets' own (all-MiniLM-L6-v2's WordPiece),
plus a copy of it given a small chat template, since none of the presets has one.
"""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch

from petlprof.errors import UsageError
from petlprof.models.backbones import minilm_path
from petlprof.models.families import DECODER, ENCODER_DECODER
from petlprof.models.lm_tokens import eos_id
from petlprof.run.lm_batches import LMBatches
from petlprof.sweep.spec import RunSpec
from petlprof.tasks.labelled import Split, generative_possible, load_task
from petlprof.tasks.metrics import METRIC_DIRECTIONS, METRIC_RANGES, canonical_number, normalise, score_generations
from petlprof.vocabulary import IGNORE_INDEX, LM

N = 10  # rows of each layout file: 8 train, 2 eval


def _rows(kind: str) -> list[dict]:
    if kind == "alpaca":
        return [{"instruction": f"p{i}", "input": "x" if i % 2 else "", "output": f"t{i}"} for i in range(N)]
    if kind == "completion":
        return [{"prompt": f"p{i}", "completion": f"t{i}"} for i in range(N)]
    if kind == "messages":
        turns = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"p{i}"}] for i in range(N)]
        return [{"messages": [*t, {"role": "assistant", "content": f"t{i}"}]} for i, t in enumerate(turns)]
    return [{"question": f"p{i}", "response": f"t{i}", "label": i % 2} for i in range(N)]


def _write(tmp_path, rows: list[dict], suffix: str):
    path = tmp_path / f"data{suffix}"
    frame = pd.DataFrame(rows)
    if suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".parquet":
        frame.to_parquet(path)
    else:
        if "messages" in frame:
            frame["messages"] = frame["messages"].map(json.dumps)
        frame.to_csv(path, index=False)
    return str(path)


LAYOUTS = [
    # (id, rows, suffix, load_task options, prompt of row i, layout named in the description)
    ("alpaca", "alpaca", ".jsonl", {}, lambda i: f"p{i}\n\nx" if i % 2 else f"p{i}", "instruction/input/output"),
    ("prompt/completion", "completion", ".csv", {}, lambda i: f"p{i}", "prompt/completion"),
    ("chat messages", "messages", ".jsonl", {}, lambda i: f"System: be brief\n\nUser: p{i}\n\nAssistant:", "chat"),
    (
        "messages as json text",
        "messages",
        ".csv",
        {},
        lambda i: f"System: be brief\n\nUser: p{i}\n\nAssistant:",
        "chat",
    ),
    ("named columns", "named", ".parquet", {"prompt_column": "question"}, lambda i: f"p{i}", "question -> response"),
    (
        "both columns named",
        "named",
        ".csv",
        {"prompt_column": "question", "target_column": "response"},
        lambda i: f"p{i}",
        "question -> response",
    ),
]


@pytest.mark.parametrize("rows, suffix, options, prompt, named", [c[1:] for c in LAYOUTS], ids=[c[0] for c in LAYOUTS])
def test_prompt_target_layouts_are_recognised(tmp_path, rows, suffix, options, prompt, named):
    task = load_task(_write(tmp_path, _rows(rows), suffix), **options)
    assert (task.objective, task.num_labels, task.majority_rate(), task.primary_metric) == (LM, 0, None, "rouge_l")
    assert named in task.description and (len(task.train), len(task.eval)) == (8, 2)
    for split in (task.train, task.eval):
        for text, target in zip(split.texts, split.targets):
            assert text == prompt(int(target[1:]))
    if rows == "messages":
        assert task.eval.messages[0][-1] == {"role": "user", "content": task.eval.targets[0].replace("t", "p")}


def test_a_labelled_file_keeps_its_head_under_auto(tmp_path):
    rows = [{"text": f"good {i}", "prompt": "x", "completion": "y", "label": i % 2} for i in range(N)]
    path = _write(tmp_path, rows, ".csv")
    assert load_task(path).objective == "classification" and not generative_possible("tweets")
    assert generative_possible(path) and generative_possible("arith")


REFUSED = [
    # (id, rows, options, what the one line says; a wrong column's line lists the columns there are)
    (
        "unknown prompt column",
        "completion",
        {"prompt_column": "promt"},
        "--prompt-column 'promt': {path} has no such column; its columns: prompt, completion",
    ),
    (
        "unknown target column",
        "named",
        {"prompt_column": "question", "target_column": "answr"},
        "--target-column 'answr': {path} has no such column; its columns: question, response, label",
    ),
    (
        "no default target",
        "completion",
        {"prompt_column": "completion"},
        "none of the default target columns ['target', 'completion', 'output', 'response', 'answer']; name one "
        "with --target-column. Its columns: prompt, completion",
    ),
    ("target without prompt", "completion", {"target_column": "completion"}, "acts only with --prompt-column"),
    ("prompt is target", "named", {"prompt_column": "question", "target_column": "question"}, "both 'question'"),
    ("classification prompt", "named", {"prompt_column": "question", "objective": "classification"}, "cannot be"),
    ("label with prompt", "named", {"prompt_column": "question", "label_column": "label"}, "--label-column names"),
    (
        "lm without layout",
        "plain",
        {"objective": "lm"},
        "name its columns with --prompt-column and --target-column. Its columns: a, b",
    ),
    ("chat template on a head", "labelled", {"chat_template": "none"}, "--chat-template none acts only"),
    ("text column on a layout", "completion", {"text_column": "prompt"}, "{path} has no column 'label'; its columns"),
    ("regression as text", "scores", {"objective": "lm"}, "is a regression"),
    ("labels one word apart", "cased", {"objective": "lm"}, "not told apart"),
    ("unknown objective", "completion", {"objective": "lmm"}, "unknown objective 'lmm'; did you mean 'lm'"),
]
EXTRA_ROWS = {
    "plain": [{"a": f"p{i}", "b": f"t{i}"} for i in range(N)],
    "labelled": [{"text": f"p{i}", "label": i % 2} for i in range(N)],
    "scores": [{"text": f"p{i}", "label": i / 3} for i in range(N)],
    "cased": [{"text": f"p{i}", "label": "Yes" if i % 2 else "yes"} for i in range(N)],
}


@pytest.mark.parametrize("rows, options, says", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_bad_lm_options_are_one_line(tmp_path, rows, options, says):
    path = _write(tmp_path, EXTRA_ROWS.get(rows) or _rows(rows), ".csv")
    with pytest.raises(UsageError) as error:
        load_task(path, **options)
    assert says.format(path=path) in str(error.value) and "\n" not in str(error.value)


def test_registered_tasks_take_no_columns_and_generative_ones_no_head():
    with pytest.raises(UsageError, match="applies only to your own data"):
        load_task("arith", prompt_column="q")
    with pytest.raises(UsageError, match="runs with --objective lm"):
        load_task("arith", objective="classification")


def test_labels_are_verbalised(tmp_path):
    task = load_task("tweets", objective="lm", train_size=20, eval_size=10)
    assert (task.objective, task.num_labels, task.metric_names, task.label_names) == (
        LM,
        0,
        ("exact_match",),
        ["negative", "positive"],
    )
    assert "Sentiment (negative or positive):" in task.description
    for split in (task.train, task.eval):
        assert all(t.endswith("\nSentiment (negative or positive):") for t in split.texts)
        assert split.targets == [task.label_names[i] for i in split.labels]
    rows = [{"sentence1": f"a{i}", "sentence2": f"b{i}", "label": ["not_same", "same"][i % 2]} for i in range(N)]
    pair = load_task(_write(tmp_path, rows, ".csv"), objective="lm", text_pair_column="sentence2")
    assert pair.label_names == ["not same", "same"]
    assert pair.eval.texts[0].endswith("\nLabel (not same or same):") and pair.eval.texts[0].count("\n") == 2
    assert pair.score_generations(["Same.\nmore text", "not same"], ["same", "same"]) == {"exact_match": 0.5}


@pytest.mark.parametrize("name", ["arith", "gsm"])
def test_generative_tasks_are_seeded_disjoint_and_scored(name):
    task = load_task(name, train_size=40, eval_size=20)
    again = load_task(name, train_size=10, eval_size=30)
    assert (len(task.train), len(task.eval), task.objective, task.primary_metric) == (40, 20, LM, "exact_match")
    assert again.train.texts == task.train.texts[:10] and again.eval.texts[:20] == task.eval.texts
    assert not set(task.train.texts) & set(load_task(name, eval_size=1000, train_size=200).eval.texts)
    assert load_task(name, train_size=5, eval_size=5, split_seed=1).eval.texts != task.eval.texts[:5]
    assert all(text.endswith("\nAnswer:") for text in task.eval.texts)
    references = task.eval.targets
    assert task.score_generations(references, references) == {"exact_match": 1.0}
    wrong = ["#### 1000001" if name == "gsm" else "1000001" for _ in references]
    assert task.score_generations(wrong, references) == {"exact_match": 0.0}
    answers = [r.rsplit("####", 1)[-1].strip() if name == "gsm" else r for r in references]
    if name == "gsm":  # no '####': the last number generated
        spelled = [f"Adding 2 and 3 gives {a}.0 in all" for a in answers]
    else:  # the last number of the first line
        spelled = [f"The answer is {a}.0\nCalculate 2 + 2 = 4" for a in answers]
    assert task.score_generations(spelled, references) == {"exact_match": 1.0}


def test_arith_is_two_short_terms_with_plus_and_minus():
    task = load_task("arith", train_size=200, eval_size=50)
    for text, target in zip(task.train.texts, task.train.targets):
        left, op, right = text.removeprefix("Calculate ").split(".\n")[0].split(" ")
        assert op in "+-" and 0 <= int(left) <= 100 and 0 <= int(right) <= 100
        assert int(target) == (int(left) + int(right) if op == "+" else int(left) - int(right))
    assert "2 terms of 0-10 or 0-100, + and -" in task.description and task.max_new_tokens == 16


NUMBERS = [
    # (prediction, reference, equal after normalisation)
    ("12.0", "12", True),
    (" 12 ", "12", True),
    ("-3", "-3", True),
    ("-3", "3", False),
    ("+12", "12", True),
    ("1,200", "1200", True),
    ("-0", "0", True),
    ("0.50", ".5", True),
    ("1e3", "1000", True),
    (str(10**30), str(10**30), True),
    (str(10**30), str(10**30 + 1), False),
    ("1e400", "1E+400", True),
    ("nan", "nan", True),
    ("nan", "0", False),
    ("inf", "Inf", True),
    ("inf", str(10**400), False),
    ("Positive.", "positive", True),
    ("the cat", "The  Cat", True),
]


@pytest.mark.parametrize("prediction, reference, equal", NUMBERS)
def test_exact_match_normalises(prediction, reference, equal):
    assert score_generations(["exact_match"], [prediction], [reference]) == {"exact_match": float(equal)}


def test_number_forms_and_metric_table():
    assert [canonical_number(t) for t in ("12.0", "nan", "-inf", "1.2.3", "")] == ["12", None, None, None, None]
    assert len(canonical_number("1e999999999")) < 20 and normalise("  A  b ") == "a b"
    scores = score_generations(["rouge_l", "exact_match"], ["the cat sat", "a dog"], ["the cat sat down", "a dog"])
    assert scores["rouge_l"] == pytest.approx((2 * 0.75 * 1 / 1.75 + 1) / 2) and scores["exact_match"] == 0.5
    for name, direction in (("exact_match", "higher"), ("rouge_l", "higher"), ("perplexity", "lower")):
        assert METRIC_DIRECTIONS[name] == direction and name in METRIC_RANGES
    with pytest.raises(ValueError):
        score_generations(["exact_match"], [], [])


NEW_FIELDS = {"objective": "lm", "prompt_column": "q", "target_column": "a", "chat_template": "none"}


def test_default_lm_options_leave_run_keys_alone():
    spec = RunSpec(method="read")
    assert spec.run_key == "3eaec3a38967b4f0"  # the key before the options existed
    assert not set(NEW_FIELDS) & set(spec.identity()) and "max_new_tokens" not in spec.identity()
    keys = {RunSpec(method="read", **{name: value}).run_key for name, value in NEW_FIELDS.items()}
    keys.add(RunSpec(method="read", max_new_tokens=8).run_key)
    assert len(keys) == 5 and spec.run_key not in keys


def test_target_column_needs_prompt_column_in_a_sweep():
    from petlprof.sweep.config import build_options

    with pytest.raises(UsageError, match="--target-column acts only with --prompt-column"):
        build_options({}, {"methods": ["lora"], "target_column": "answer"})
    with pytest.raises(UsageError, match="--max-new-tokens"):
        build_options({}, {"methods": ["lora"], "max_new_tokens": 10**6})


# --- LMBatches ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(minilm_path())  # what the tiny presets tokenise with
    chat = copy.deepcopy(plain)
    chat.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return {"plain": plain, "chat": chat}


SPLIT = Split(
    ["Calculate 1 + 2.\nAnswer:", "hello there, a longer prompt of words"], None, [], ["3", "good day to you"]
)
BATCHES = [
    # (id, family, tokenizer, chat_template, the first row's prompt as decoded)
    ("decoder", DECODER, "plain", True, "[CLS] calculate 1 + 2. answer : [SEP]"),
    ("decoder, chat template", DECODER, "chat", True, "< user > calculate 1 + 2. answer : < assistant >"),
    ("decoder, template off", DECODER, "chat", False, "[CLS] calculate 1 + 2. answer : [SEP]"),
    ("seq2seq", ENCODER_DECODER, "plain", True, "[CLS] calculate 1 + 2. answer : [SEP]"),
    ("seq2seq, chat template", ENCODER_DECODER, "chat", True, "< user > calculate 1 + 2. answer : < assistant >"),
]


@pytest.mark.parametrize("family, which, chat, prompt", [c[1:] for c in BATCHES], ids=[c[0] for c in BATCHES])
def test_only_target_tokens_and_eos_carry_labels(tokenizers, family, which, chat, prompt):
    tokenizer = tokenizers[which]
    batches = LMBatches.from_split(SPLIT, tokenizer, 2, 64, family, chat_template=chat)
    (inputs, labels), eos = next(batches.iterate("cpu")), eos_id(tokenizer)
    assert len(batches) == 1 and batches.references == SPLIT.targets
    for row, target in enumerate(SPLIT.targets):
        marked = labels[row][labels[row] != IGNORE_INDEX].tolist()
        assert marked[-1] == eos and tokenizer.decode(marked[:-1]) == target
        real = inputs["attention_mask"][row].bool()
        if family == DECODER:  # labels are the input ids where set; right padding, never labelled
            ids, marks = inputs["input_ids"][row], labels[row] != IGNORE_INDEX
            assert torch.equal(labels[row][marks], ids[marks]) and not (marks & ~real).any()
            assert real[: int(real.sum())].all() and ids[real].tolist()[-len(marked) :] == marked
            seen = ids[real].tolist()[: -len(marked)]
        else:
            assert torch.equal(inputs["labels"], labels) and marked == batches.encodings[row]["target"]
            seen = inputs["input_ids"][row][real].tolist()
        assert seen == batches.encodings[row]["prompt"]
    assert tokenizer.decode(batches.encodings[0]["prompt"]) == prompt
    prompts, rows = next(batches.prompt_batches("cpu", batch_size=2))
    mask = prompts["attention_mask"]
    assert rows.tolist() == [0, 1] and mask.shape == prompts["input_ids"].shape
    short = int(mask.sum(1).argmin())
    if family == DECODER:  # left-padded: every row's last position is real
        assert mask[:, -1].all() and not mask[short, 0]
    else:
        assert mask[:, 0].all() and not mask[short, -1]
    assert tokenizer.decode(prompts["input_ids"][0][mask[0].bool()]) == prompt


@pytest.mark.parametrize("family", [DECODER, ENCODER_DECODER])
def test_prompts_are_cut_from_the_left_and_targets_never(tokenizers, family):
    tokenizer = tokenizers["plain"]
    batches = LMBatches.from_split(SPLIT, tokenizer, 1, 8, family, chat_template=False)
    row = batches.encodings[1]
    assert tokenizer.decode(row["target"][:-1]) == "good day to you"
    assert len(row["prompt"]) == (8 - len(row["target"]) if family == DECODER else 8)
    assert row["prompt"][0] == tokenizer.cls_token_id and tokenizer.decode(row["prompt"][1:]).endswith("words [SEP]")
    capped = LMBatches.from_split(SPLIT, tokenizer, 1, 8, family, chat_template=False, max_target_length=2)
    assert capped.encodings[1]["target"] == row["target"][:2] and capped.longest_target == 2
    assert len(batches.head(1).encodings) == 1 and batches.head(1).references == ["3"]


def test_a_target_longer_than_max_length_is_refused(tokenizers):
    with pytest.raises(UsageError, match="row 2 has 5 tokens .* raise --max-length to at least 6"):
        LMBatches.from_split(SPLIT, tokenizers["plain"], 1, 5, DECODER, chat_template=False)


def test_a_wrong_column_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    from petlprof.cli import main

    path = _write(tmp_path, _rows("named"), ".jsonl")
    command = ["run", "--methods", "lora", "--backbone", "tiny-llama", "--task", path, "--prompt-column", "nope"]
    assert main([*command, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"petlprof: error: --prompt-column 'nope': {path} has no such column; its columns: question, response, label"
    )
    assert not (tmp_path / "out").exists()
