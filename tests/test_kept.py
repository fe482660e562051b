"""The backbone a holder reads once per sweep (petlprof.run.kept): which runs take it, and when it is refused.

The fork itself (the same metrics, losses and peaks as a fresh process's reading) is tested in test_warm.py; here
the rules, in this process: what is kept, that a run takes only its own backbone and only once, that the first run
is charged the reading and the later ones are not, and that a reading which draws random numbers (a weight missing
from the checkpoint, initialised at load) or would not fit twice in memory is refused with its reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from petlprof.models import backbones
from petlprof.models.backbones import minilm_path
from petlprof.run import kept
from petlprof.sweep.spec import RunSpec


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch):
    monkeypatch.setattr(kept, "_kept", None)
    monkeypatch.setattr(kept, "_why_not", None)


def _hold(spec: RunSpec) -> str | None:
    """What a holder does for ``spec``'s backbone, here in this process."""
    key = kept.key_of(spec)
    assert key is not None
    return kept.hold(key)


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({}, kept.BackboneKey("minilm", None, False)),
        ({"num_layers": 2}, kept.BackboneKey("minilm", 2, False)),
        ({"task": "arith"}, kept.BackboneKey("minilm", None, True)),
        ({"objective": "lm"}, kept.BackboneKey("minilm", None, True)),  # a labelled task verbalised
        ({"backbone": "smollm2", "task": "gsm"}, kept.BackboneKey("smollm2", None, True)),
        ({"random_init": True}, None),  # random weights: seeded per run
        ({"backbone": "tiny-bert"}, None),  # a tiny preset has random weights too
        ({"quantize": "int8"}, None),  # quantising runs kernels in the warm worker
        ({"device": "cuda"}, None),  # never forked
        ({"nproc": 2}, None),  # torchrun's ranks
        ({"task": "data/my.csv"}, None),  # --objective auto on the user's file: only its columns tell
        ({"task": "data/my.csv", "objective": "classification"}, kept.BackboneKey("minilm", None, False)),
    ],
)
def test_which_runs_backbone_is_kept_and_by_what_key(fields, key):
    assert kept.key_of(RunSpec(method="lora", **{"backbone": "minilm", **fields})) == key


def test_the_first_run_is_charged_the_reading_a_later_run_takes_it_free_and_only_its_own():
    spec = RunSpec(method="lora", backbone="minilm")
    assert _hold(spec) is None
    assert kept.inherited_bytes() > 0  # the reading's memory, which a fresh run holds only after its baseline
    first = kept.take(spec)
    assert first is not None and first.source == kept.READ_FOR_THIS_RUN and first.charged_s > 0
    assert kept.take(spec) is None  # taken once: a second load in the process reads its own
    assert _hold(spec) is None
    kept.forked()  # the holder forked the first run: the next takes it kept
    later = kept.take(spec)
    assert later is not None and later.source == kept.KEPT and later.charged_s == 0.0
    assert _hold(spec) is None
    assert kept.take(RunSpec(method="lora", backbone="minilm", num_layers=2)) is None  # another backbone: its own
    assert kept.inherited_bytes() == 0  # nothing left to inherit once taken


def test_the_kept_backbone_has_the_weights_a_fresh_reading_has(lm_folder):
    spec = RunSpec(method="full", backbone=lm_folder, task="arith")  # with its LM head
    assert _hold(spec) is None
    taken = kept.take(spec)
    assert taken is not None
    torch.manual_seed(0)
    fresh = backbones.load_backbone(lm_folder, lm_head=True)
    assert type(taken.backbone.model) is type(fresh.model)
    ours, theirs = taken.backbone.model.state_dict(), fresh.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_a_run_that_reads_its_own_says_why_its_backbone_was_not_kept():
    kept.reads_own(None)
    assert kept.not_kept() == kept.READ_HERE  # not one to keep: nothing to explain
    kept.reads_own("reading it draws random numbers")
    assert kept.not_kept() == f"{kept.READ_HERE} (the warm worker did not keep it: reading it draws random numbers)"


@pytest.fixture
def missing_weight(tmp_path) -> Path:
    """MiniLM's folder with one attention weight left out of its checkpoint: transformers initialises it at load
    from the random number generator."""
    for path in minilm_path().iterdir():
        if path.is_file():
            (tmp_path / path.name).write_bytes(path.read_bytes())
    weights = load_file(tmp_path / "model.safetensors")
    missing = next(name for name in weights if name.endswith("attention.self.query.weight"))
    save_file({name: t for name, t in weights.items() if name != missing}, tmp_path / "model.safetensors")
    return tmp_path


def test_a_reading_that_draws_random_numbers_is_not_kept(missing_weight):
    spec = RunSpec(method="lora", backbone=str(missing_weight))
    assert "draws random numbers" in (_hold(spec) or "")
    assert kept.take(spec) is None


def test_a_reading_too_large_to_hold_twice_is_not_kept(monkeypatch):
    monkeypatch.setattr(kept, "available_memory_bytes", lambda: 1)  # the machine's free memory, as /proc says
    spec = RunSpec(method="lora", backbone="minilm")
    assert "no room for two" in (_hold(spec) or "")
    assert kept.take(spec) is None


def test_a_reading_that_fails_leaves_the_run_to_fail_on_it_itself(tmp_path):
    spec = RunSpec(method="lora", backbone=str(tmp_path))  # an empty folder: no config
    assert _hold(spec)
    assert kept.take(spec) is None


def test_the_reading_leaves_torchs_thread_count_and_transformers_progress_bars_as_they_were():
    from transformers.utils import logging as hf_logging

    threads, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    assert _hold(RunSpec(method="lora", backbone="minilm")) is None
    assert (torch.get_num_threads(), hf_logging.is_progress_bar_enabled()) == (threads, bars)


def test_a_local_backbone_is_keyed_by_where_it_resolves_and_its_files(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    spec = RunSpec(method="lora", backbone="model")
    here = kept.key_of(spec, str(tmp_path))
    assert here is not None and here.where == str(folder.resolve()) and [f[0] for f in here.files] == ["config.json"]
    assert kept.key_of(spec, str(tmp_path / "elsewhere")).where == ""  # not there: what the run resolves itself
    (folder / "config.json").write_text('{"changed": true}')  # new weights in the same folder: read again
    assert kept.key_of(spec, str(tmp_path)) != here
    monkeypatch.chdir(tmp_path)
    assert kept.key_of(spec) == kept.key_of(spec, str(tmp_path))  # a run resolves in its own working directory


def test_a_run_with_a_memory_cap_is_not_forked_from_a_holder(tmp_path):
    from petlprof.execution.worker import KEEPER

    job = tmp_path / "spec.json"
    job.write_text(json.dumps({"spec": RunSpec(method="lora", backbone="minilm").to_dict(), "max_memory_bytes": None}))
    assert KEEPER.key(job, str(tmp_path)) is not None
    job.write_text(json.dumps({"spec": RunSpec(method="lora", backbone="minilm").to_dict(), "max_memory_bytes": 2**30}))
    assert KEEPER.key(job, str(tmp_path)) is None
