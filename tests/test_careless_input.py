"""Careless input, round two (issue 28): each case is refused with exit code 2 and one line on stderr, its
control characters escaped, no traceback, and nothing written, before any model loads.

Each case is a command line and the files it names, fed to one shared check; a file's content ``FIFO``
makes a named pipe, ``FILE`` an empty file.  ``{tmp}`` in a command line is the case's own folder.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from petlprof import registry
from petlprof.cli import main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = str(ROOT / "reports" / "minilm-tweets-default")  # a store of real records, read only
TINY = ["--backbone", "tiny-bert", "--train-size", "32", "--eval-size", "16", "--max-steps", "3"]
RUN = ["run", "--methods", "bitfit", *TINY, "--output", "{tmp}/out"]
ESTIMATE = ["estimate", "--backbone", "tiny-bert", "--methods", "lora", "--max-length", "16", "--output", "{tmp}/out"]
FIFO, FILE = "FIFO", "FILE"
BERT = '"model_type": "bert", "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128'
CONFIG = {"cfg.json": f'{{{BERT}, "hidden_size": -1, "vocab_size": 30522}}'}
TOPICS = "topic,text,label\n" + "".join(f"{t},a headline number {i},{t}\n" for i, t in enumerate(["art", "war"] * 50))
CSI = "\x1b[2J"
BERT_7_HEADS = "{" + BERT.replace('"num_attention_heads": 4', '"num_attention_heads": 7') + ', "hidden_size": 64}'
LLAMA_KV = (
    '{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 3, '
    '"num_hidden_layers": 2, "intermediate_size": 128}'
)
LM_RUN = ["run", "--methods", "lora", "--backbone", "tiny-gpt2", "--train-size", "16", "--eval-size", "4"]
LM_RUN += ["--max-steps", "2", "--output", "{tmp}/out"]
BART_64 = (  # an encoder-decoder with learned positions (64 of them), built with random weights and MiniLM's tokens
    '{"model_type": "bart", "vocab_size": 30522, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, '
    '"encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, '
    '"max_position_embeddings": 64}'
)


def _estimate(path: str) -> list[str]:
    return [*ESTIMATE[:2], path, *ESTIMATE[3:]]


def _run_random(path: str) -> list[str]:
    return [*RUN, "--backbone", path, "--random-init"]


def _lm_run(backbone: str, *more: str) -> list[str]:
    """:data:`LM_RUN` on ``backbone`` (a folder's with ``--random-init``), with ``more`` options."""
    random_init = ["--random-init"] if backbone.startswith("{tmp}") else []
    return [*LM_RUN[:4], backbone, *LM_RUN[5:], *random_init, *more]


def _pairs(prompt: str, target: str) -> dict[str, str]:
    """A prompt/target file of 20 rows, each prompt ending in its row number."""
    return {"d.jsonl": _jsonl([{"prompt": f"{prompt} {i}".strip(), "completion": target} for i in range(20)])}


def _jsonl(rows: list[dict]) -> str:
    import json

    return "".join(json.dumps(row) + "\n" for row in rows)


def _chat(i: int, reply: str) -> dict:
    return {"messages": [{"role": "user", "content": f"p{i}"}, {"role": "assistant", "content": reply}]}


BAD = [
    # (id, command line, files (name: content), what the error line says)
    # D2: an output that cannot take the report or the estimates, found before anything is printed
    ("report into a file", ["report", RESULTS, "--output", "{tmp}/f"], {"f": FILE}, "output folder '"),
    ("report under a file", ["report", RESULTS, "--output", "{tmp}/f/sub"], {"f": FILE}, "is not writable"),
    ("estimate into a file", [*ESTIMATE[:-1], "{tmp}/f"], {"f": FILE}, "is not writable: File exists"),
    ("estimate under a file", [*ESTIMATE[:-1], "{tmp}/f/sub"], {"f": FILE}, "is not writable"),
    ("report where no folder can be made", ["report", RESULTS, "--output", "/proc/petlprof-no"], {}, "not writable"),
    # D3: a config's sizes, checked before a tensor is made of them
    ("hidden_size -1, estimate", [*ESTIMATE[:2], "{tmp}/cfg.json", *ESTIMATE[3:]], CONFIG, "hidden_size must be"),
    (
        "hidden_size -1, run --random-init",
        [*RUN, "--backbone", "{tmp}/cfg.json", "--random-init"],
        CONFIG,
        "'{tmp}/cfg.json': hidden_size must be a positive integer, got -1",
    ),
    (
        "a vocabulary of 10**12",
        [*ESTIMATE[:2], "{tmp}/cfg.json", *ESTIMATE[3:]],
        {"cfg.json": f'{{{BERT}, "hidden_size": 64, "vocab_size": {10**12}}}'},
        "vocab_size 1000000000000 is larger than",
    ),
    (
        "2.5 layers",
        [*ESTIMATE[:2], "{tmp}/cfg.json", *ESTIMATE[3:]],
        {"cfg.json": '{"model_type": "llama", "num_hidden_layers": 2.5, "hidden_size": 64}'},
        "num_hidden_layers must be a positive integer, got 2.5",
    ),
    (
        "no attention heads in a model folder",
        [*ESTIMATE[:2], "{tmp}/model", *ESTIMATE[3:]],
        {"model/config.json": '{"model_type": "llama", "num_attention_heads": 0, "hidden_size": 64}'},
        "num_attention_heads must be a positive integer, got 0",
    ),
    # D5: a size has a unit, and a run's memory limit a floor
    ("--max-memory without a unit", [*RUN, "--max-memory", "40"], {}, "--max-memory '40' has no unit"),
    ("--max-memory 1KiB", [*RUN, "--max-memory", "1KiB"], {}, "--max-memory '1KiB' is less than 512 MiB"),
    (
        "max_memory without a unit in a file",
        [*RUN, "--config", "{tmp}/s.toml"],
        {"s.toml": "max_memory = 40\n"},
        "no unit",
    ),
    ("--device-memory without a unit", [*ESTIMATE, "--device-memory", "40"], {}, "--device-memory '40' has no unit"),
    (
        "--cache-budget without a unit",
        ["run", "--methods", "read", *TINY, "--cache-hidden-states", "--cache-budget", "1024"],
        {},
        "--cache-budget '1024' has no unit",
    ),
    # D7: one option under two spellings in one file
    (
        "TOML train-size and train_size",
        [*RUN, "--config", "{tmp}/s.toml"],
        {"s.toml": "train-size = 32\ntrain_size = 64\n"},
        "gives option train_size twice, as 'train-size' and 'train_size'",
    ),
    (
        "YAML train_size and train-size",
        [*RUN, "--config", "{tmp}/s.yaml"],
        {"s.yaml": "train_size: 64\ntrain-size: 32\n"},
        "as 'train_size' and 'train-size'",
    ),
    # D8: control characters in a value are escaped where it is echoed
    ("a method named with escapes", ["run", "--methods", "read\x1b[31mRED\x07"], {}, r"'read\x1b[31mRED\x07'"),
    ("an output that clears the screen", [*RUN[:-1], "{tmp}/" + CSI], {CSI: FILE}, r"\x1b[2J' is not writable"),
    ("a backbone with escapes", [*ESTIMATE[:2], "x" + CSI, *ESTIMATE[3:]], {}, r"unknown backbone 'x\x1b[2J'"),
    # D9: a FIFO, device or folder where a file is read
    (
        "--task a FIFO",
        [*RUN, "--task", "{tmp}/x.csv"],
        {"x.csv": FIFO},
        "is a FIFO (named pipe), not a regular file or a folder",
    ),
    ("--task a device", [*RUN, "--task", "/dev/null"], {}, "'/dev/null' is a character device"),
    (
        "--config a FIFO",
        [*RUN, "--config", "{tmp}/s.toml"],
        {"s.toml": FIFO},
        "is a FIFO (named pipe), not a regular file",
    ),
    ("--config a folder", [*RUN, "--config", "{tmp}"], {}, "is a folder, not a regular file"),
    ("report a FIFO", ["report", "{tmp}/results.jsonl"], {"results.jsonl": FIFO}, "is a FIFO (named pipe)"),
    ("estimate a FIFO config", [*ESTIMATE[:2], "{tmp}/c.json", *ESTIMATE[3:]], {"c.json": FIFO}, "is a FIFO"),
    # D10: an option that acts only with another is refused when given, even at its default
    ("--cache-budget at its default", [*RUN, "--cache-budget", "1GiB"], {}, "--cache-budget acts only with"),
    ("cache_budget in a file", [*RUN, "--config", "{tmp}/s.toml"], {"s.toml": 'cache_budget = "1GiB"\n'}, "acts only"),
    ("--cache-dtype at its default", [*RUN, "--cache-dtype", "float16"], {}, "--cache-dtype acts only with"),
    (
        "--target-eval-size at its default",
        [*RUN, "--target-eval-size", "all"],
        {},
        "--target-eval-size acts only with --target-value or --eval-every, which were not given",
    ),
    # D12: the model must not read the column it is scored on
    (
        "text column is the label column",
        [*RUN, "--task", "{tmp}/d.csv", "--text-column", "topic", "--label-column", "topic"],
        {"d.csv": TOPICS},
        "the text column and the label column are both 'topic'",
    ),
    (
        "pair column is the label column",
        [*RUN, "--task", "{tmp}/d.csv", "--text-pair-column", "topic", "--label-column", "topic"],
        {"d.csv": TOPICS},
        "the text pair column and the label column are both 'topic'",
    ),
    (
        "default text column as label",
        [*RUN, "--task", "{tmp}/d.csv", "--label-column", "text"],
        {"d.csv": TOPICS},
        "'text'",
    ),
    # round three (issue 41): configs transformers refuses, or that are no JSON object, in estimate and run alike
    *(
        (f"{what}, {where}", [*command(path)], {name: content}, expected)
        for what, content, expected in (
            ("a config that is a JSON array", f'[{{{BERT}, "hidden_size": 64}}]', "holds a JSON array, not an object"),
            (
                "7 heads for a width of 64",
                BERT_7_HEADS,
                "The hidden size (64) is not a multiple of the number of attention heads (7)",
            ),
            ("3 key/value heads for 8 heads", LLAMA_KV, "num_key_value_heads 3 does not divide num_attention_heads 8"),
        )
        for where, name, path, command in (
            ("estimate a file", "c/config.json", "{tmp}/c/config.json", _estimate),
            ("estimate a folder", "c/config.json", "{tmp}/c", _estimate),
            ("run --random-init a file", "c/config.json", "{tmp}/c/config.json", _run_random),
            ("run --random-init a folder", "c/config.json", "{tmp}/c", _run_random),
        )
    ),
    # round three: the targets of prompt/target data
    (
        "a target of 3000 tokens on an encoder-decoder, whose targets no position limit cuts",
        [*LM_RUN[:4], "tiny-t5", *LM_RUN[5:], "--task", "{tmp}/d.jsonl", "--max-memory", "1GiB"],
        {
            "d.jsonl": _jsonl(
                [{"prompt": f"p{i}", "completion": "word " * 3000 if i == 5 else f"t{i}"} for i in range(20)]
            )
        },
        "(petlprof estimate's prediction), more than --max-memory gives a run (1.0 GiB)",
    ),
    (
        "a target that is a JSON object",
        [*LM_RUN, "--task", "{tmp}/d.jsonl"],
        {"d.jsonl": _jsonl([{"prompt": f"p{i}", "completion": {"a": i} if i == 3 else f"t{i}"} for i in range(20)])},
        "column 'completion' of data row 4 is an object",
    ),
    (
        "a target that is a list",
        [*LM_RUN, "--task", "{tmp}/d.jsonl", "--prompt-column", "q", "--target-column", "a"],
        {"d.jsonl": _jsonl([{"q": f"p{i}", "a": [i, i]} for i in range(20)])},
        "column 'a' of data row 1 is a list",
    ),
    (
        "a prompt that is a list in a folder's eval file",
        [*LM_RUN, "--task", "{tmp}/data"],
        {
            "data/train.jsonl": _jsonl([{"prompt": f"p{i}", "completion": f"t{i}"} for i in range(20)]),
            "data/test.jsonl": _jsonl([{"prompt": ["x"], "completion": "t"}]),
        },
        "test.jsonl: column 'prompt' of data row 1 is a list",
    ),
    (
        "every target empty",
        [*LM_RUN, "--task", "{tmp}/d.jsonl"],
        {"d.jsonl": _jsonl([{"prompt": f"p{i}", "completion": ""} for i in range(20)])},
        "20 of the 20 targets of {tmp}/d.jsonl are empty (the first in data row 1)",
    ),
    (
        "nineteen of twenty targets blank, chat messages",
        [*LM_RUN, "--task", "{tmp}/d.jsonl"],
        {"d.jsonl": _jsonl([_chat(i, "ok" if i == 7 else "  ") for i in range(20)])},
        "19 of the 20 targets",
    ),
    # round three: what the tokens decide, refused before the first run (not run by run)
    (
        "a target longer than --max-length, decoder",
        _lm_run("tiny-llama", "--task", "{tmp}/d.jsonl", "--max-length", "16"),
        _pairs("p", "word " * 20),
        "task '{tmp}/d.jsonl' on backbone 'tiny-llama', training split: the target of row 1 has 21 tokens with its "
        "end-of-text token, so --max-length 16 leaves no room for its prompt (targets are never truncated): raise "
        "--max-length to at least 22",
    ),
    (
        "--max-new-tokens 65536 past a decoder's positions",
        _lm_run("tiny-gpt2", "--task", "{tmp}/d.jsonl", "--max-new-tokens", "65536"),
        _pairs("question", "t"),
        "--max-new-tokens 65536 does not fit the 512 positions of backbone 'tiny-gpt2': the longest evaluation prompt "
        "of task '{tmp}/d.jsonl' (row 1) takes 4, and each new token but the last one more: use --max-new-tokens "
        "509 or less",
    ),
    (
        "the task's default new tokens past a decoder's positions",
        _lm_run("tiny-gpt2", "--task", "{tmp}/d.jsonl", "--max-length", "512"),
        _pairs("word " * 480, "t"),
        "the 64 new tokens task '{tmp}/d.jsonl' generates by default does not fit the 512 positions of backbone "
        "'tiny-gpt2': the longest evaluation prompt of task '{tmp}/d.jsonl' (row 1) takes 483, and each new token but "
        "the last one more: use --max-new-tokens 30 or less",
    ),
    (
        "--max-new-tokens past an encoder-decoder's decoder positions",
        _lm_run("{tmp}/bart", "--task", "{tmp}/d.jsonl", "--max-new-tokens", "100"),
        {"bart/config.json": BART_64, **_pairs("question", "t")},
        "--max-new-tokens 100 does not fit the 64 decoder positions of backbone '{tmp}/bart': its start token takes "
        "one, and each new token but the last one more: use --max-new-tokens 64 or less",
    ),
    (
        "a target past an encoder-decoder's decoder positions",
        _lm_run("{tmp}/bart", "--task", "{tmp}/d.jsonl", "--max-length", "32", "--max-new-tokens", "8"),
        {"bart/config.json": BART_64, **_pairs("question", "word " * 80)},
        "training split: the target of row 1 has 81 tokens with its end-of-text token, more than the 64 positions of "
        "the model's decoder (targets are never truncated)",
    ),
    # round three: a built-in method's target modules that match no module of the backbone, on both objectives
    (
        "lora target_modules of another architecture, classification",
        ["run", "--methods", "lora", *TINY, "--method-config", "lora.target_modules=[q_proj,v_proj]"],
        {},
        "lora on tiny-bert: target_modules 'q_proj', 'v_proj': no module of the bert model has these names (as its "
        "name or its last parts); its modules include query, key, value, dense",
    ),
    (
        "lora target_modules lm_head, classification",
        [
            "run",
            "--methods",
            "lora",
            *TINY[2:],
            "--backbone",
            "tiny-gpt2",
            "--method-config",
            "lora.target_modules=[lm_head]",
        ],
        {},
        "lora on tiny-gpt2: target_modules 'lm_head': no module of the gpt2 model has that name",
    ),
    (
        "lora target_modules of another architecture, encoder-decoder LM",
        _lm_run("tiny-t5", "--task", "{tmp}/d.jsonl", "--method-config", "lora.target_modules=[q_proj,v]"),
        _pairs("question", "t"),
        "lora on tiny-t5: target_modules 'q_proj': no module of the t5 model has that name (as its name or its last "
        "parts); its modules include q, k, v, o, wo",
    ),
    (
        "ia3 feedforward_modules outside its target_modules, decoder LM",
        _lm_run(
            "tiny-llama",
            "--task",
            "{tmp}/d.jsonl",
            "--methods",
            "ia3",
            "--method-config",
            "ia3.target_modules=[k_proj,v_proj]",
            "--method-config",
            "ia3.feedforward_modules=[down_proj]",
        ),
        _pairs("question", "t"),
        "ia3 on tiny-llama: feedforward_modules 'down_proj' are not among target_modules 'k_proj', 'v_proj'",
    ),
]


def make_files(folder: Path, files: dict[str, str], stack) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == FIFO:
            os.mkfifo(path)
            stack.append(_fifo_writer(path))
        else:
            path.write_text("" if content == FILE else content)


def _fifo_writer(path: Path):
    """A writer that closes at once, so code that reads the FIFO gets an end of file instead of hanging the
    test (and fails its check); the returned function releases the writer when nothing read it."""
    writer = threading.Thread(target=lambda: open(path, "w").close(), daemon=True)
    writer.start()

    def release() -> None:
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # held open until the writer has seen it
        writer.join(10)
        os.close(reader)

    return release


def tree(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


@pytest.mark.parametrize("argv, files, expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_careless_input_is_one_escaped_line_exit_2_nothing_written(
    argv, files, expected, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    if any(a.startswith("/proc/") for a in argv) and not Path("/proc").is_dir():
        pytest.skip("needs /proc, a file system that takes no new folders")
    releases: list = []
    make_files(tmp_path, files, releases)
    before = tree(tmp_path)
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    finally:
        for release in releases:
            release()
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, err[-500:]
    assert expected.replace("{tmp}", str(tmp_path)) in err, err
    assert err.count("\n") == 1 and err.startswith("petlprof: error: ") and "Traceback" not in err
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", err + captured.out), err  # nothing raw reaches the terminal
    assert captured.out == ""  # nothing printed before the refusal (a summary table, say)
    assert tree(tmp_path) == before  # no output folder, no results file


def test_a_progress_line_escapes_what_it_echoes(capsys):
    from petlprof.errors import say
    from petlprof.execution.sweep import _progress

    spec = SimpleNamespace(method="read", method_config={"hidden_size": 128}, backbone="b" + CSI, task="t\x07", seed=0)
    say(_progress(spec, 1, 2, 0.0, 0))
    assert capsys.readouterr().err == "[1/2] read hidden_size=128 on b\\x1b[2J / t\\x07, seed 0\n"


# --- D6: estimate resolves a plug-in as run does ----------------------------------------------------------


@pytest.fixture
def normtune_module(tmp_path, monkeypatch):
    """docs/plugins.md's normtune.py (the example package's module) in the current folder, by ``module:ATTR``."""
    module = "careless_normtune"
    shutil.copy(
        ROOT / "examples" / "petlprof-normtune" / "petlprof_normtune" / "__init__.py", tmp_path / f"{module}.py"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{module}:SPEC"
    registry.METHODS.forget()
    sys.modules.pop(module, None)


def test_estimate_takes_a_plugin_by_module_attr_as_run_does(normtune_module, capsys, tmp_path):
    import json

    argv = ["estimate", "--backbone", "tiny-bert", "--methods", f"{normtune_module},lora", "--max-length", "16"]
    code = main([*argv, "--method-config", "normtune.parts=gain", "--output", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = [json.loads(line) for line in (tmp_path / "out" / "estimates.jsonl").read_text().splitlines()]
    normtune = records[0]
    assert [r["method"] for r in records] == ["normtune", "lora"] and normtune["status"] == "ok"
    assert normtune["method_config"] == {"parts": "gain", "last": 0} and normtune["pareto_knob"] == "last"
    assert "normtune  last=0" in captured.out


# --- D12: training text that gives its label away is noted, ordinary text is not ----------------------------


@pytest.mark.parametrize(
    "rows, leaks",
    [
        ([(f"{t}", t) for t in ["art", "war"] * 20], True),  # a copy of the label column
        ([(f"{t.upper()} news", t) for t in ["art", "war"] * 20], True),  # the label written into the text
        ([(f"art and war {i}", t) for i, t in enumerate(["art", "war"] * 20)], False),  # names both labels
        (
            [
                (f"tweet {i}: so good" if t == "positive" else f"tweet {i}: awful", t)
                for i, t in enumerate(["positive", "negative"] * 20)
            ],
            False,
        ),
        ([(f"I feel {t}" if i % 5 else "meh", t) for i, t in enumerate(["positive", "negative"] * 20)], False),
    ],
    ids=["copy", "label in text", "both labels named", "ordinary text", "some rows name no label"],
)
def test_text_that_gives_the_label_away_is_noted_before_the_runs(rows, leaks, tmp_path):
    from petlprof.sweep.config import build_options, preflight

    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows))
    options = build_options(
        {}, {"methods": "bitfit", "backbone": "tiny-bert", "task": str(data), "train_size": 32, "eval_size": 8}
    )
    notes = preflight(options)
    assert any("gives the label away" in note for note in notes) == leaks, notes


def test_the_reference_tweets_raise_no_leak():
    from petlprof.tasks.labelled import leak_warnings, load_task

    task = load_task("tweets", train_size=2000, eval_size=10)
    assert leak_warnings(task.train, task.label_names) == []


# --- round three: what fits is not refused ------------------------------------------------------------------


@pytest.mark.parametrize(
    "backbone, values, files",
    [
        ("tiny-t5", {"max_new_tokens": 65536, "max_length": 16}, _pairs("p", "word " * 20)),
        ("tiny-gpt2", {"max_new_tokens": 509}, _pairs("question", "t")),
        ("tiny-gpt2", {"max_length": 22}, _pairs("p", "word " * 20)),
        ("{tmp}/bart", {"max_new_tokens": 64, "random_init": True}, {"bart/config.json": BART_64, **_pairs("q", "t")}),
        (
            "tiny-gpt2",
            {"method_config": {"lora": {"target_modules": ["lm_head", "transformer.h.0.attn.c_attn"]}}},
            _pairs("question", "t"),
        ),
    ],
    ids=[
        "T5's relative positions, targets kept whole",
        "the largest --max-new-tokens a decoder's refusal names",
        "the --max-length a long target's refusal names",
        "the largest --max-new-tokens an encoder-decoder's refusal names",
        "the LM objective's module names, under the LM head's wrapper",
    ],
)
def test_what_fits_passes_the_preflight(backbone, values, files, tmp_path):
    from petlprof.sweep.config import build_options, preflight

    make_files(tmp_path, files, [])
    given = {"methods": "lora", "task": str(tmp_path / "d.jsonl"), "train_size": 16, "eval_size": 4, **values}
    options = build_options({}, {**given, "backbone": backbone.replace("{tmp}", str(tmp_path))})
    preflight(options)  # refuses nothing (its notes are about the small data)
