"""Every built-in method on the architectures people bring: it trains, or it is refused up front.

Small random models of common architectures (hidden 32, 2 layers, a 100-word tokenizer) are saved
to local folders and loaded as a user's ``--backbone ./my-model`` would be; the four tiny presets
join them.  For each method x architecture, :func:`petlprof.models.architecture.unsupported_reason` (from
the config alone, as a preflight would call it) either names a reason, and then applying the
method raises exactly that reason, or gives none, and then the method must train: the loss falls
over a few steps, only the method's own parameters get gradients (and all of them do), step 0
reproduces the plain classifier where the method promises it, and the record notes where the
method put its pieces.  The "Methods x architectures" table in docs/methods.md must be the one this
file renders from the same outcome.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from test_methods import logits, train_steps  # the same training loop and its step-0 gradient check

from petlprof.errors import UsageError
from petlprof.models.architecture import describe, describe_config, name_patterns, unsupported_reason
from petlprof.models.backbones import backbone_config, load_backbone
from petlprof.models.classifier import SequenceClassifier
from petlprof.registry import builtin_method_names, get_method

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = {"tiny-bert": "bert", "tiny-t5": "t5", "tiny-gpt2": "gpt2", "tiny-llama": "llama"}
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
# model_type -> a tiny config's fields (beyond vocabulary and special tokens)
ARCHITECTURES: dict[str, dict] = {
    "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64),
    "roberta": dict(SIZES, max_position_embeddings=40),
    "deberta-v2": SIZES,
    "albert": dict(SIZES, embedding_size=16),
    "mt5": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4),
    "gpt_neox": SIZES,
    "mistral": dict(SIZES, num_key_value_heads=2),
    "phi": SIZES,
    "gemma": dict(SIZES, num_key_value_heads=1, head_dim=8),
    "falcon": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4),  # multi-query attention
    "bart": dict(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    ),
    "opt": dict(SIZES, ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64),
    "bloom": dict(hidden_size=32, n_layer=2, n_head=4),  # fused query-key-value, ALiBi
}
ROWS = list(PRESETS) + list(ARCHITECTURES)
METHODS = [name for name in builtin_method_names() if "classification" in get_method(name).objectives]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<s>", "</s>"]
TEXTS = ["what a wonderful day", "this is terrible and I hate it", "love it", "worst thing ever made"]
# what each method lets train (besides the task head): a test on the parameter's name
OWN = {
    "full": lambda name: True,
    "linear_probe": lambda name: False,
    "bitfit": lambda name: name.endswith(".bias"),
    "lora": lambda name: "lora_" in name,
    "ia3": lambda name: "ia3_" in name,
    "prompt_tuning": lambda name: "prompt_encoder" in name,
    "prefix_tuning": lambda name: "prompt_encoder" in name,
    "adapter": lambda name: name.startswith("adapters."),
    "lst": lambda name: not name.startswith("classifier."),
    "read": lambda name: not name.startswith("classifier."),
}
STARTS_AS_BACKBONE = {"full", "linear_probe", "bitfit", "lora", "ia3", "adapter", "lst", "read"}


def _save_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for text in TEXTS for w in text.split()})
    vocab = SPECIALS + words + [f"w{i}" for i in range(100 - len(SPECIALS) - len(words))]
    model = models.WordLevel({word: i for i, word in enumerate(vocab)}, unk_token="[UNK]")
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(folder)


@pytest.fixture(scope="module")
def backbones(tmp_path_factory) -> dict[str, str]:
    """Row name -> what ``--backbone`` gets: a preset name, or a folder holding a saved tiny random model."""
    from transformers import AutoConfig, AutoModel

    out = dict(zip(PRESETS, PRESETS))
    for model_type, fields in ARCHITECTURES.items():
        folder = tmp_path_factory.mktemp(model_type)
        _save_tokenizer(folder)
        ids = {SPECIALS[i]: i for i in range(len(SPECIALS))}
        special = dict(pad_token_id=ids["[PAD]"], bos_token_id=ids["<s>"], eos_token_id=ids["</s>"])
        if model_type == "mt5":
            special["decoder_start_token_id"] = ids["[PAD]"]
        config = AutoConfig.for_model(model_type, vocab_size=100, **special, **fields)
        torch.manual_seed(0)
        AutoModel.from_config(config).save_pretrained(folder)
        out[model_type] = str(folder)
    return out


def build(backbone: str):
    torch.manual_seed(0)
    loaded = load_backbone(backbone)
    return loaded, SequenceClassifier(loaded, 2)


def check_placement(method: str, arch, placement: dict, model) -> None:
    """The record says where the method's pieces went, and that is where they are."""
    if method in ("lora", "ia3"):
        assert placement["method"] == method and placement["target_modules"], placement
        adapted = name_patterns(
            [n.removeprefix("backbone.base_model.model.").rsplit(f".{method}_", 1)[0] for n, _ in _own(model, method)]
        )
        assert adapted == placement["target_modules"]
        table_has_entry = "PEFT's table" in placement["targets_from"]
        assert table_has_entry or placement["targets_from"].startswith("architecture description")
    if method == "adapter":
        assert placement["hooks"] == name_patterns(arch.sublayer_outputs())
        width, bottleneck = arch.width, arch.width // 16
        expected = len(arch.sublayer_outputs()) * (2 * width * bottleneck + bottleneck + width)
        assert sum(p.numel() for n, p in _own(model, method)) == expected
    if method in ("prompt_tuning", "prefix_tuning"):
        assert placement["num_layers"] == arch.layers
        assert placement["token_dim"] == (arch.embedding_dim if method == "prompt_tuning" else arch.kv_width)


def _own(model, method: str):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad and OWN[method](n) and "head." not in n]


CASES = [(method, row) for row in ROWS for method in METHODS]


@pytest.mark.parametrize("method, row", CASES, ids=[f"{m}-{r}" for m, r in CASES])
def test_method_trains_or_is_refused_up_front(method, row, backbones):
    spec = get_method(method)
    reason = unsupported_reason(method, backbone_config(backbones[row]))  # the preflight's question
    backbone, classifier = build(backbones[row])
    arch = describe(backbone.model)
    if reason is not None:
        with pytest.raises(UsageError, match=re.escape(reason)):
            spec.build()(classifier, spec.make_config({}))
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = spec.build()(classifier, spec.make_config({}))
    bias_free = not arch.bias_terms
    if method == "bitfit" and bias_free:  # today's explicit warning, and only the head trains
        assert any("has no bias terms" in str(w.message) for w in caught)
    batch = backbone.tokenizer(TEXTS, padding=True, return_tensors="pt")

    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all(OWN[method](n) or n.startswith(("head.", "classifier.head.")) for n in trainable), trainable[:5]
    own = _own(model, method)
    assert bool(own) == (method not in ("linear_probe",) and not (method == "bitfit" and bias_free)), method
    check_placement(method, arch, backbone.placement, model)

    if method in STARTS_AS_BACKBONE:
        _, plain = build(backbones[row])
        plain.head.load_state_dict(classifier.head.state_dict())
        model.eval(), plain.eval()
        with torch.no_grad():
            torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=1e-5)

    losses = train_steps(model, batch, method)
    assert losses[-1] < losses[0] - 0.05, f"{method} on {row} did not learn: {losses}"
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
    assert not frozen, frozen[:5]


def render_matrix() -> str:
    """docs/methods.md's table: one row per architecture, one column per method; a refusal is a numbered note."""
    notes: list[str] = []
    header = "| architecture | " + " | ".join(METHODS) + " |"
    lines = [header, "|" + "---|" * (len(METHODS) + 1)]
    for row in ROWS:
        config = backbone_config(row) if row in PRESETS else _tiny_config(row)
        arch = describe_config(config)
        cells = []
        for method in METHODS:
            reason = unsupported_reason(method, arch)
            if reason is None:
                cells.append("✓ head only" if method == "bitfit" and not arch.bias_terms else "✓")
            else:
                if reason not in notes:
                    notes.append(reason)
                cells.append(f"✗ ({notes.index(reason) + 1})")
        name = f"{PRESETS[row]} (`{row}`)" if row in PRESETS else row
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"({i}) {note}" for i, note in enumerate(notes, 1)]
    lines.append("")
    lines.append("head only: the model has no bias terms, so BitFit trains the task head alone (and warns)")
    return "\n".join(lines)


def _tiny_config(model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=100, pad_token_id=0, **ARCHITECTURES[model_type])


def test_readme_matrix_is_the_tested_outcome():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    table = render_matrix()
    message = "docs/methods.md's 'Methods x architectures' table is out of date; it should read:\n\n"
    assert table in readme, message + table


@pytest.mark.parametrize("preset", PRESETS)
def test_generic_path_finds_what_the_explicit_entries_name(preset):
    """The four explicit families, described as if unknown, give the same adapter points and LoRA targets."""
    import dataclasses

    from petlprof.models.architecture import lora_targets, peft_table

    arch = describe_config(backbone_config(preset))
    generic = dataclasses.replace(arch, model_type=f"unknown-{arch.model_type}", path="generic")
    assert generic.sublayer_outputs() == arch.sublayer_outputs()
    assert generic.sublayer_outputs(attention=False) == arch.sublayer_outputs(attention=False)
    table, _ = peft_table("lora", arch.model_type)
    assert lora_targets(generic) == [n for n in arch.module_names if any(n.endswith("." + t) for t in table)]


@pytest.mark.parametrize(
    "model_type, method, reason",
    [
        ("distilbert", "prefix_tuning", "the distilbert model takes no cache"),
        ("mistral", "prefix_tuning", None),  # a full-size (7B) config: described on the meta device, no weights
        ("xlnet", "lora", "PEFT has no lora targets for 'xlnet' and no stack of transformer blocks was found"),
        ("xlnet", "adapter", "no stack of transformer blocks found in this xlnet model"),
        ("mixtral", "adapter", "no feed-forward output projection found in block 'layers.0' of the mixtral model"),
        ("mixtral", "lora", None),  # PEFT's table has it
        ("bert", "read", None),
    ],
)
def test_unsupported_reason_from_a_config_alone(model_type, method, reason):
    from transformers import AutoConfig

    got = unsupported_reason(method, AutoConfig.for_model(model_type))
    assert (got is None) if reason is None else (reason in got), got


def test_explicit_target_modules_lift_the_projection_requirement():
    from transformers import AutoConfig

    assert unsupported_reason("lora", AutoConfig.for_model("xlnet"), {"target_modules": ["layer_1"]}) is None


@pytest.mark.parametrize(
    "row, path, config, source, targets",
    [
        ("tiny-bert", "explicit (bert)", {}, "PEFT's table (bert)", ["encoder.layer.*.attention.self.query"]),
        ("distilbert", "generic", {}, "architecture description (generic): PEFT has no lora entry", None),
        (
            "distilbert",
            "generic",
            {"target_modules": ["k_lin"]},
            "method config",
            ["transformer.layer.*.attention.k_lin"],
        ),
    ],
)
def test_record_says_which_path_and_where(row, path, config, source, targets, backbones):
    backbone, classifier = build(backbones[row])
    get_method("lora").build()(classifier, get_method("lora").make_config({"r": 2, **config}))
    info = backbone.info()
    assert info["architecture"]["path"] == path
    assert info["placement"]["targets_from"].startswith(source)
    if targets is not None:
        assert set(targets) <= set(info["placement"]["target_modules"])


def test_a_sweep_with_an_unsupported_pair_stops_before_any_run(backbones, capsys, tmp_path):
    from petlprof.cli import main

    out = tmp_path / "out"
    args = ["run", "--backbone", f"{backbones['distilbert']},{backbones['albert']}", "--output", str(out)]
    code = main([*args, "--methods", "lora,prefix_tuning,read"])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "2 method/backbone pair(s) cannot run (--skip-unsupported runs the rest)" in err
    for row in ("distilbert", "albert"):
        assert f"prefix_tuning on {backbones[row]}: prefix tuning puts trained keys and values" in err


def test_skip_unsupported_runs_the_rest_and_names_what_it_left_out(backbones, capsys, tmp_path, monkeypatch):
    import petlprof.run.execute
    from petlprof.cli import main

    seen = []

    def fake_execute(spec, **limits):  # the runs themselves are tested above; here: which runs are made
        seen.append((spec.method, spec.backbone))
        return {"schema_version": 1, "run_key": spec.run_key, "status": "failed", "error": "-", "method": spec.method}

    monkeypatch.setattr(petlprof.run.execute, "execute", fake_execute)
    distilbert, neox = backbones["distilbert"], backbones["gpt_neox"]
    args = ["run", "--backbone", f"{distilbert},{neox}", "--methods", "lora,prefix_tuning", "--in-process"]
    assert main([*args, "--skip-unsupported", "--output", str(tmp_path / "out")]) == 1  # the fake runs "failed"
    err = capsys.readouterr().err
    assert sorted(seen) == sorted([("lora", distilbert), ("lora", neox), ("prefix_tuning", neox)])
    line = f"skipped (--skip-unsupported): prefix_tuning on {distilbert}: prefix tuning puts"
    assert err.count(line) == 2  # before the runs (a note) and after them, with the summary


@pytest.mark.parametrize("method", METHODS)
def test_a_projected_last_state_sizes_the_head_or_refuses_side_networks(method):
    """OPT-350m's decoder projects its last state from 1024 to 512 (``project_out``): the task head reads 512
    wide; READ and LST, whose side networks read every layer's states at one width, are refused up front."""
    backbone = load_backbone("opt-350m", num_layers=1, random_init=True)
    spec = get_method(method)
    reason = unsupported_reason(method, backbone.model)
    if method in ("read", "lst"):
        assert "from width 1024 to 512" in reason
        with pytest.raises(UsageError, match="from width 1024 to 512"):
            spec.build()(SequenceClassifier(backbone, 2), spec.make_config({}))
        return
    assert reason is None
    model = spec.build()(SequenceClassifier(backbone, 2), spec.make_config({}))
    out = model(input_ids=torch.full((2, 8), 100), attention_mask=torch.ones(2, 8, dtype=torch.long))
    assert out.shape == (2, 2)
    out.sum().backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)
