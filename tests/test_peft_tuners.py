"""Every tuner PEFT registers, by name (``--methods peft:TYPE``): it trains on each tiny preset, or it is refused
up front with PEFT's reason; its config's fields are checked by their own types; PEFT's ``adapter_config.json``
runs as a method config.

* Tuner x preset: :data:`REFUSED` writes down each pair that is refused and a phrase of its reason.  The
  preflight (the config's checks, then ``unsupported_reason`` from the backbone's config alone, as ``petlprof
  run`` asks before any run) refuses exactly those, with the reason the method's apply then raises; every other
  pair trains three steps in-process: the loss falls, every parameter the tuner made trainable gets a nonzero
  gradient, no frozen one gets any, and the record says where the tuner went.  :data:`VARIANTS` shows a tuner
  refused for its default shape training once configured for the tiny one.
* The language-modelling objective: the tuners that train on tiny-llama (and a few on tiny-t5) train there too,
  and greedy decoding with the KV cache equals decoding without; the two the LM model cannot drive are refused.
* An ``adapter_config.json`` PEFT's ``save_pretrained`` wrote gives, through ``--method-config-file``, the
  trainable-parameter count of the PEFT model it was saved from.
* NaN, inf, negative, mistyped and out-of-range values of every tuner's numeric fields, and an unknown tuner,
  are refused in one line (exit 2 on the command line).
* The table of tuners in docs/methods.md is the one :func:`render_table` renders from the same outcome.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import re
import typing
import warnings
from pathlib import Path

import pytest
import torch
from test_lm_methods import language_model, lm_batch, loss_of
from test_method_configs import refused_numbers

from petlprof.cli import main
from petlprof.errors import UsageError
from petlprof.method_api import AnyOf, Items, Number, field_check
from petlprof.methods.peft_files import read_adapter_config
from petlprof.methods.peft_tuners import (
    NOT_LM,
    Tuner,
    peft_types,
    unsupported_reason,
)
from petlprof.methods.peft_tuners import (
    REFUSED as ALWAYS_REFUSED,
)
from petlprof.models.backbones import load_backbone
from petlprof.models.classifier import SequenceClassifier
from petlprof.models.language_model import greedy_generate
from petlprof.registry import get_method
from petlprof.sweep.config import build_options, expand

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = ("tiny-bert", "tiny-t5", "tiny-gpt2", "tiny-llama")
TUNERS = list(peft_types())
TEXTS = ["what a wonderful day", "this is terrible and I hate it", "love it", "worst thing ever made"]
LABELS = torch.tensor([1, 0, 1, 0])
# a value PEFT leaves unset that these need (refused without it: test_a_tuner_without_what_it_needs_is_refused)
NEEDS = {"peft:adalora": {"total_step": 3}, "peft:trainable_tokens": {"token_indices": "ids of the batch"}}
CONV1D = "Conv1D"  # GPT-2's projections are transformers' Conv1D layers, which these tuners do not implement
NO_TASK_IDS = "task id"
# (tuner, preset) pairs refused up front with their default config, and a phrase of the reason
REFUSED: dict[tuple[str, str], str] = {
    **{(f"peft:{t}", "tiny-gpt2"): CONV1D for t in "adamss beft boft c3a delora glora hra lily loha lokr".split()},
    **{(f"peft:{t}", "tiny-gpt2"): CONV1D for t in "miss oft peanut psoft road shira supertuning".split()},
    ("peft:osf", "tiny-gpt2"): "PEFT made none of its parameters trainable",
    **{("peft:adaption_prompt", p): "Unsupported model type for adaption prompt" for p in ("tiny-bert", "tiny-t5")},
    **{("peft:shadow", p): "Unable to automatically find a `nn.ModuleList`" for p in ("tiny-bert", "tiny-t5")},
    **{("peft:c3a", p): "block size should be a factor of the input size" for p in ("tiny-bert", "tiny-t5")},
    ("peft:c3a", "tiny-llama"): "block size should be a factor of the input size",
    **{("peft:vblora", p): "must be divisible by `vector_length` 256" for p in PRESETS},
    ("peft:road", "tiny-llama"): "must be divisible by group_size (64)",
    ("peft:shira", "tiny-llama"): "results in more shira params than the total number of params",
    ("peft:waveft", "tiny-llama"): "`n_frequency` should be less than or equal to the product",
    **{(t, p): "in-context examples" for t in ["peft:cpt"] for p in PRESETS},
    **{(t, p): NO_TASK_IDS for t in ["peft:poly", "peft:multitask_prompt_tuning"] for p in PRESETS},
    **{("peft:xlora", p): "adapters trained before" for p in PRESETS},
}
# a tuner refused for its default shape trains once it is configured for the tiny one
VARIANTS = [
    ("peft:vblora", "tiny-bert", {"vector_length": 16}),
    ("peft:c3a", "tiny-llama", {"block_size": 16}),
    ("peft:waveft", "tiny-llama", {"n_frequency": 128}),
    ("peft:shira", "tiny-llama", {"r": 4}),
]
CASES = [(t, p, {}) for t in TUNERS for p in PRESETS] + VARIANTS
# trainable parameters PEFT creates that no output of these models reaches (checked: they get no gradient)
UNREACHED = {
    ("peft:glora", "tiny-bert"): r"\.glora_D\.",  # D scales the layer's bias, all zero in a fresh BERT
    # the last layer's update: no later layer reads it; GPT-2's wte: PEFT drops a shadow backbone's embed_tokens
    # (it reads the base model's embeddings) but not GPT-2's wte, which stays trainable and unread
    ("peft:shadow", "tiny-gpt2"): r"\.h\.1\.shadow_update_|shadow_backbone\.default\.wte\.",
    ("peft:shadow", "tiny-llama"): r"\.layers\.1\.shadow_update_",
}
LR = {"peft:waveft": 1e-4}  # its default scaling (25) makes 1e-3 steps overshoot on tiny GPT-2
# the LM objective: one tuner of each family on each LM preset, and the three that need a decoder or refuse it
LM_TUNERS = "adalora boft cartridge dora fourierft ia3 ln_tuning loha oft prefix_tuning prompt_tuning p_tuning vera"
LM_CASES = [(f"peft:{t}", p) for t in LM_TUNERS.split() for p in ("tiny-llama", "tiny-t5")] + [
    ("peft:adaption_prompt", "tiny-llama"),
    ("peft:shadow", "tiny-llama"),
    ("peft:trainable_tokens", "tiny-llama"),
]


@functools.cache
def _loaded(preset: str):
    return load_backbone(preset)


def backbone_of(preset: str):
    """A fresh copy of the preset (its weights as load_backbone builds them), without loading it again."""
    loaded = _loaded(preset)
    return dataclasses.replace(loaded, model=copy.deepcopy(loaded.model), placement={})


def config_for(name: str, preset: str, extra: dict) -> dict:
    config = {**NEEDS.get(name, {}), **extra}
    if "token_indices" in config:  # tokens the batch holds, so their embeddings get gradients
        ids = _loaded(preset).tokenizer(TEXTS[0])["input_ids"]
        config["token_indices"] = sorted(set(ids[1:4]))
    return config


@functools.cache
def _preflight(name: str, preset: str, key: str) -> str | None:
    """What ``petlprof run`` says before any run: the config's refusal, else the backbone's (None: it may run)."""
    try:
        get_method(name).make_config(json.loads(key))
    except UsageError as exc:
        return str(exc)
    return unsupported_reason(name, preset, json.loads(key))


def preflight(name: str, preset: str, config: dict) -> str | None:
    return _preflight(name, preset, json.dumps(config, sort_keys=True))


def train(model, batch, lr: float, steps: int = 2) -> tuple[list[float], set[str]]:
    """The losses of ``steps`` AdamW steps on the batch, and the parameters that got a nonzero gradient (two
    steps reach a zero-initialised factor: the first moves the other factor off zero)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.eval()  # no dropout: the loss on a fixed batch must fall
    losses, moved = [], set()
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), LABELS)
        loss.backward()
        moved |= {n for n, p in model.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)}
        frozen = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
        assert not frozen, frozen[:5]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, moved


@pytest.mark.parametrize("name, preset, extra", CASES, ids=[f"{t}-{p}{'-' if c else ''}{c or ''}" for t, p, c in CASES])
def test_tuner_trains_or_is_refused_up_front(name, preset, extra):
    config = config_for(name, preset, extra)
    reason = preflight(name, preset, config)
    expected = None if extra else REFUSED.get((name, preset))
    assert (reason is None) == (expected is None), reason
    spec = get_method(name)
    if expected is not None:
        assert expected in reason
        if spec.peft_type not in ALWAYS_REFUSED:  # a config refused is never applied
            torch.manual_seed(0)
            with pytest.raises(UsageError, match=re.escape(reason)):
                spec.build()(SequenceClassifier(backbone_of(preset), 2), spec.make_config(config))
        return
    torch.manual_seed(0)
    backbone = backbone_of(preset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = spec.build()(SequenceClassifier(backbone, 2), spec.make_config(config))
    tuned = {n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")}
    assert tuned, name
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    losses, moved = train(model, batch, LR.get(name, 1e-3))
    assert losses[-1] < losses[0], losses
    unreached = {n for n in tuned if re.search(UNREACHED.get((name, preset), "^$"), n)}
    assert tuned - unreached == moved - {"head.weight", "head.bias"}, sorted((tuned - unreached) ^ moved)[:5]
    assert backbone.placement["method"] == name
    assert "targets_from" in backbone.placement or "shape_from" in backbone.placement, backbone.placement


@pytest.mark.parametrize("name, preset", LM_CASES, ids=[f"{t}-{p}" for t, p in LM_CASES])
def test_tuner_on_the_lm_objective(name, preset):
    """Where a tuner trains on the preset's classifier it trains its language model too (the loss of the target
    tokens falls over four steps), and decodes the same with the KV cache as without; the tuners the LM model
    cannot drive are refused by their declared objectives."""
    config = config_for(name, preset, {})
    if preflight(name, preset, config) is not None:
        return  # refused up front, as the classification case shows
    spec = get_method(name)
    task_model = language_model(preset)
    if spec.peft_type in NOT_LM:
        with pytest.raises(UsageError, match=f"method '{re.escape(name)}' does not support the 'lm' objective"):
            spec.build()(task_model, spec.make_config(config))
        return
    if "token_indices" in config:  # tokens of the LM batch
        config["token_indices"] = sorted(set(lm_batch(task_model.family)["input_ids"][0, 2:5].tolist()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = spec.build()(task_model, spec.make_config(config)).eval()
    batch = lm_batch(task_model.family)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(4):
        loss = loss_of(model, batch, task_model.family)
        losses.append(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0], losses
    prompt = {
        k: batch[k][:, :4] if task_model.family == "decoder" else batch[k] for k in ("input_ids", "attention_mask")
    }
    cached = greedy_generate(model, **prompt, max_new_tokens=3, eos_token_id=task_model.eos_token_id)
    again = greedy_generate(model, **prompt, max_new_tokens=3, eos_token_id=task_model.eos_token_id, use_cache=False)
    assert cached == again


def test_adalora_adds_its_regulariser_before_each_step_and_allocates_ranks_after_it():
    """PEFT's recipe, run by whichever optimiser trains the model: before a step, the gradient of orth_reg_weight x
    the mean over the factors of ||A A^T - I|| and ||B^T B - I|| (Frobenius) joins the loss's; after it,
    update_and_allocate scores the ranks' importance."""
    spec = get_method("peft:adalora")
    torch.manual_seed(0)
    backbone = backbone_of("tiny-bert")
    model = spec.build()(SequenceClassifier(backbone, 2), spec.make_config({"total_step": 3, "orth_reg_weight": 0.5}))
    factors = {n: p for n, p in model.named_parameters() if p.requires_grad and ("lora_A" in n or "lora_B" in n)}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")
    torch.nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), LABELS).backward()
    of_loss = {n: p.grad.clone() for n, p in factors.items()}
    gaps = [
        torch.linalg.matrix_norm(p @ p.T - torch.eye(p.shape[0]) if "lora_A" in n else p.T @ p - torch.eye(p.shape[1]))
        for n, p in factors.items()
    ]
    regulariser = dict(zip(factors, torch.autograd.grad(0.5 * torch.stack(gaps).mean(), list(factors.values()))))
    stepped = {}
    optimizer.register_step_pre_hook(lambda *_: stepped.update({n: p.grad.clone() for n, p in factors.items()}))
    allocator = model.backbone.base_model.rankallocator
    assert not allocator.ipt
    optimizer.step()
    for name in factors:
        torch.testing.assert_close(stepped[name], of_loss[name] + regulariser[name])
    adapted = {name.split("base_model.model.")[-1].rsplit("lora_A", 1)[0] for name in factors if "lora_A" in name}
    assert {name.rsplit("lora_A", 1)[0] for name in allocator.ipt if "lora_A" in name} == adapted


# tuners that run on a --quantize'd backbone: PEFT has bitsandbytes layers for them, or they wrap no linear layer
QUANTIZED = "adalora cartridge dora hira ia3 ln_tuning lora p_tuning prefix_tuning prompt_tuning pvera randlora road"
QUANTIZED_CASES = [f"peft:{t}" for t in QUANTIZED.split()] + ["peft:trainable_tokens"]


def test_the_tuners_that_declare_quantised_backbones_are_those_with_bitsandbytes_layers_or_none():
    assert [t for t in TUNERS if "nf4" in get_method(t).quantize] == sorted(QUANTIZED_CASES)
    assert get_method("peft:vera").quantize == ("none",)  # PEFT 0.21 has no bitsandbytes VeRA layer


@pytest.mark.parametrize("name", QUANTIZED_CASES)
def test_a_tuner_declared_for_quantised_backbones_trains_on_an_nf4_one(name):
    pytest.importorskip("bitsandbytes")
    from petlprof.models.quantization import Quantization

    config = config_for(name, "tiny-llama", {})
    if preflight(name, "tiny-llama", config) is not None:
        return  # refused for the tiny shape, quantised or not (RoAd)
    spec = get_method(name)
    torch.manual_seed(0)
    backbone = load_backbone("tiny-llama", quantization=Quantization("nf4", double_quant=True))
    model = spec.build()(SequenceClassifier(backbone, 2), spec.make_config(config))
    tuned = {n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")}
    losses, moved = train(model, backbone.tokenizer(TEXTS, padding=True, return_tensors="pt"), 1e-3)
    assert losses[-1] < losses[0] and tuned and tuned <= moved, (losses, sorted(tuned - moved)[:5])


# --- adapter_config.json ------------------------------------------------------------------------------------


def _peft_configs():
    import peft

    return [
        ("tiny-bert", peft.VeraConfig(r=16, target_modules=["query", "key", "value"])),
        ("tiny-llama", peft.LoraConfig(r=4, use_dora=True, lora_alpha=8, rank_pattern={"q_proj": 2})),
        ("tiny-t5", peft.LoKrConfig(r=4, target_modules=["q", "v", "wo"], decompose_both=True)),
        ("tiny-llama", peft.IA3Config(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"])),
        ("tiny-bert", peft.FourierFTConfig(n_frequency=50, target_modules=["query"], modules_to_save=None)),
        ("tiny-gpt2", peft.PrefixTuningConfig(task_type="FEATURE_EXTRACTION", num_virtual_tokens=5)),
    ]


@pytest.mark.parametrize("preset, peft_config", _peft_configs(), ids=lambda c: getattr(c, "peft_type", c))
def test_an_adapter_config_written_by_peft_runs_with_the_same_trainable_parameters(preset, peft_config, tmp_path):
    import peft

    torch.manual_seed(0)
    saved = peft.get_peft_model(backbone_of(preset).model, peft_config)
    saved.save_pretrained(tmp_path)
    options = build_options({}, {"method_config_file": [str(tmp_path)], "backbone": [preset]})
    name = f"peft:{str(peft_config.peft_type.value).lower()}"
    assert options.methods == [name]
    (spec,) = expand(options, "cpu")
    assert spec.method == name
    method = get_method(name)
    model = method.build()(SequenceClassifier(backbone_of(preset), 2), method.make_config(spec.method_config))
    ours = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head."))
    assert ours == saved.get_nb_trainable_parameters()[0] > 0


def test_the_file_defines_the_method_beside_others_and_the_command_line_sets_its_fields(tmp_path):
    import peft

    peft.get_peft_model(backbone_of("tiny-bert").model, peft.LoHaConfig(r=4, target_modules=["query"])).save_pretrained(
        tmp_path
    )
    options = build_options(
        {}, {"methods": ["lora"], "method_config_file": [str(tmp_path)], "method_config": {"peft:loha": {"r": 2}}}
    )
    assert options.methods == ["lora", "peft:loha"]
    assert options.method_config["peft:loha"]["r"] == 2 and options.method_config["peft:loha"]["target_modules"] == [
        "query"
    ]


BAD_FILES = [
    ({"peft_type": "NOSUCH"}, "adapter_config.json: unknown peft_type 'NOSUCH'"),
    ({"peft_type": "VERA", "vera_dropout": math.nan}, "peft:vera vera_dropout must be a number in [0, 1), got nan"),
    ({"peft_type": "LORA", "r": -4}, "peft:lora r must be a positive integer, got -4"),
    ({"peft_type": "LORA", "no_such_field": 1}, "adapter_config.json: unknown field of LoraConfig 'no_such_field'"),
    ({"peft_type": "LORA", "loftq_config": {"loftq_bits": 4}}, "loftq_config={'loftq_bits': 4} cannot be run by"),
]


@pytest.mark.parametrize("data, message", BAD_FILES, ids=[m[:24] for _, m in BAD_FILES])
def test_a_bad_adapter_config_stops_the_sweep_before_any_run(data, message, tmp_path, capsys):
    file = tmp_path / "adapter_config.json"
    file.write_text(json.dumps(data))  # json writes NaN as the literal PEFT's own files may hold
    out = tmp_path / "out"
    assert main(["run", "--method-config-file", str(file), "--backbone", "tiny-bert", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not out.exists(), err


def test_the_fields_petlprof_decides_are_left_to_it_with_a_note(tmp_path):
    file = tmp_path / "adapter_config.json"
    data = {"peft_type": "PROMPT_TUNING", "base_model_name_or_path": "org/model", "task_type": "CAUSAL_LM"}
    file.write_text(json.dumps({**data, "token_dim": 768, "num_virtual_tokens": 8, "inference_mode": True}))
    name, fields, notes = read_adapter_config(str(file))
    assert name == "peft:prompt_tuning" and fields == {"num_virtual_tokens": 8}
    assert [note.split(": ")[1].split("=")[0] for note in notes] == [
        "base_model_name_or_path",
        "task_type",
        "token_dim",
    ]
    assert all("left to petlprof: " in note for note in notes)


# --- bad values --------------------------------------------------------------------------------------------


def _number_fields() -> list[tuple[str, str, Number]]:
    """(tuner, field, its Number check) for every numeric field of every tuner that can run."""
    out = []
    for name in TUNERS:
        spec = get_method(name)
        if spec.peft_type in ALWAYS_REFUSED:
            continue
        for f in dataclasses.fields(spec.config_cls):
            if isinstance(field_check(f), Number):
                out.append((name, f.name, field_check(f)))
    return out


def test_every_numeric_field_of_every_tuner_is_checked():
    """A PEFT field annotated int or float is carried with a Number check (alone, in a list or in a union)."""
    for name in TUNERS:
        spec = get_method(name)
        hints = typing.get_type_hints(Tuner(name, spec.peft_type).peft_cls)
        for f in dataclasses.fields(spec.config_cls):
            check = field_check(f)
            if re.search(r"\b(int|float)\b", str(hints[f.name])) and "dict" not in str(hints[f.name]):
                inner = [*getattr(check, "checks", ()), getattr(check, "item", None), check]
                assert any(isinstance(c, (Number, Items, AnyOf)) for c in inner), f"{name}.{f.name}: {check}"


def test_numeric_fields_refuse_nan_inf_and_out_of_range_values():
    for name, field, check in _number_fields():
        spec = get_method(name)
        for value in refused_numbers(check):
            with pytest.raises(UsageError) as info:
                spec.make_config({**config_for(name, "tiny-bert", {}), field: value})
            message = str(info.value)
            assert message.startswith(f"{name} {field} must be "), message
            assert "\n" not in message and len(message) < 200, message  # 10**400 is not echoed in full


CLI_CASES = [
    ("peft:vera.vera_dropout=.nan", "peft:vera vera_dropout must be a number in [0, 1), got nan"),
    ("peft:vera.r=-1", "peft:vera r must be a positive integer, got -1"),
    ("peft:loha.alpha=.inf", "peft:loha alpha must be a non-negative integer, got inf"),
    ("peft:dora.lora_dropout=1.0", "peft:dora lora_dropout must be a number in [0, 1), got 1.0"),
    ("peft:fourierft.scaling=-.inf", "peft:fourierft scaling must be a number"),
    ("peft:oft.use_cayley_neumann=1", "peft:oft use_cayley_neumann 1 is not one of True, False"),
    ("peft:lora.bias=some", "peft:lora bias 'some' is not one of none, all, lora_only"),
    ("peft:vera.target_modules=[1]", "peft:vera target_modules must be a list of module names"),
    ("peft:boft.boft_block_size=4", "peft:boft: PEFT refuses this configuration: You can only specify either"),
    ("peft:dora.init_lora_weights=eva", "peft:dora init_lora_weights=eva cannot run in petlprof: EVA initialises"),
]


@pytest.mark.parametrize("item, message", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_tuner_values_on_the_command_line_stop_before_any_run(item, message, tmp_path, capsys):
    out = tmp_path / "out"
    name = item.split(".")[0]
    extra = ["--method-config", "peft:boft.boft_block_num=2"] if name == "peft:boft" else []
    args = ["run", "--methods", name, "--method-config", item, *extra, "--backbone", "tiny-bert"]
    assert main([*args, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0 and not out.exists(), err


@pytest.mark.parametrize("name", ["peft:adalora", "peft:trainable_tokens"])
def test_a_tuner_without_what_it_needs_is_refused(name):
    with pytest.raises(UsageError, match="total_step|token_indices must be given"):
        get_method(name).make_config({})


def test_an_unknown_tuner_is_one_line_naming_the_known_ones(tmp_path, capsys):
    assert main(["run", "--methods", "peft:nosuch", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown PEFT tuner 'peft:nosuch'" in err and "peft:vera" in err and "peft:dora" in err
    assert "\n" not in err


def test_an_unsupported_pair_stops_the_sweep_with_peft_reason(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--methods", "peft:loha,peft:vera", "--backbone", "tiny-gpt2", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "1 method/backbone pair(s) cannot run" in err and "peft:loha on tiny-gpt2: Target module of type" in err
    values = {"methods": ["peft:loha", "peft:vera"], "backbone": ["tiny-gpt2", "tiny-llama"], "skip_unsupported": True}
    runs = expand(build_options(values, {}), "cpu")  # --skip-unsupported: the rest run
    assert sorted((s.method, s.backbone) for s in runs) == [
        ("peft:loha", "tiny-llama"),
        ("peft:vera", "tiny-gpt2"),
        ("peft:vera", "tiny-llama"),
    ]


# --- the table in docs/methods.md ------------------------------------------------------------------------------------


LM_REFUSAL = "petlprof's LM task model runs the backbone's body itself; PEFT runs this tuner in its own forward"


def render_table() -> str:
    """One row per tuner, one column per preset and one for the LM objective; a refusal is a numbered note."""
    notes: list[str] = []

    def cell(reason: str | None) -> str:
        if reason is None:
            return "✓"
        reason = re.sub(r"^peft:\w+ (cannot run in petlprof: )?", "", reason).replace("<", "&lt;")
        notes.append(reason) if reason not in notes else None
        return f"✗ ({notes.index(reason) + 1})"

    lines = ["| tuner | " + " | ".join(f"`{p}`" for p in PRESETS) + " | LM objective |", "|---" * 6 + "|"]
    for name in TUNERS:
        cells = [cell(preflight(name, p, config_for(name, p, {}))) for p in PRESETS]
        spec = get_method(name)
        lm = cells[0] if spec.peft_type in ALWAYS_REFUSED else "✓"
        lm = lm if "lm" in spec.objectives else cell(LM_REFUSAL)
        extra = " (" + ", ".join(f"{k}=…" for k in NEEDS[name]) + ")" if name in NEEDS else ""
        lines.append(f"| `{name}`{extra} | " + " | ".join(cells) + f" | {lm} |")
    return "\n".join(lines + [""] + [f"({i}) {note}" for i, note in enumerate(notes, 1)])


def test_readme_table_of_tuners_is_the_tested_outcome():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    table = render_table()
    assert table in readme, "docs/methods.md's table of PEFT tuners is out of date; it should read:\n\n" + table
