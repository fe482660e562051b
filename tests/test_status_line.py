"""The status lines of long work without a progress bar (loading a backbone, generating): one line, rewritten in
place, on a terminal; nothing in a log."""

from __future__ import annotations

import io
import sys

import pytest

from petlprof.errors import StatusLine
from petlprof.run.execute import execute
from petlprof.sweep.spec import RunSpec

pytestmark = pytest.mark.usefixtures("one_thread")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_status_line_is_one_rewritten_line_on_a_terminal_and_nothing_in_a_log():
    terminal, log = Terminal(), io.StringIO()
    for stream in (terminal, log):
        with StatusLine("lora s0 load: backbone \x1b[31mred", stream) as line:
            line.update("reading")
            line.update("x")
    text = terminal.getvalue()
    assert log.getvalue() == ""
    assert text.count("\n") == 1 and text.endswith("\n") and text.count("\r") == 4
    last = text.rsplit("\r", 1)[1]
    assert last.startswith("lora s0 load: backbone \\x1b[31mred: done in ") and " s" in last  # control chars escaped
    # a shorter text covers the longer one before it
    updates = text.split("\r")[1:]
    assert all(len(b) >= len(a.rstrip()) for a, b in zip(updates, updates[1:]))


def test_a_line_not_shown_writes_nothing_even_on_a_terminal():
    """A rank of several but the first (``shown=False``) leaves the terminal to the first's line."""
    terminal = Terminal()
    with StatusLine("lora s0 load: backbone tiny-bert", terminal, shown=False) as line:
        line.update("reading")
    assert terminal.getvalue() == ""


def test_a_failed_block_says_it_stopped():
    terminal = Terminal()
    with pytest.raises(RuntimeError), StatusLine("load", terminal):
        raise RuntimeError("boom")
    assert "load: stopped in" in terminal.getvalue()


def test_a_generative_run_shows_its_load_and_generation_on_a_terminal_and_names_the_method(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    spec = RunSpec(
        method="lora",
        backbone="tiny-llama",
        task="arith",
        train_size=8,
        eval_size=4,
        batch_size=4,
        max_steps=2,
        warmup_steps=1,
        max_new_tokens=2,
        inference_window_s=0.0,
    )
    record = execute(spec)
    assert record["status"] == "ok", record.get("error")
    lines = [part.rsplit("\r", 1)[-1] for part in terminal.getvalue().split("\n")]
    assert any(line.startswith("lora s0 load: backbone tiny-llama: done in ") for line in lines), lines
    assert any(line.startswith("lora s0 generation, batch 1: done in ") for line in lines), lines
    assert any(line.startswith("lora s0 generation, batch 4: done in ") for line in lines), lines
