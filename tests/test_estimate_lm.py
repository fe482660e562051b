"""``petlprof estimate --objective lm``: the decoder of an encoder-decoder reads only the target, the KV
cache per generated token against the formula and a real cache, a traced LM step against a measured one
(plain transformers), and bad values of the new options."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from petlprof.cli import main
from petlprof.estimate.core import Settings, estimate
from petlprof.estimate.gpus import DEFAULT_GPU, GPUS
from petlprof.estimate.model import resolve_backbone
from petlprof.estimate.roofline import GPU_BUSY_POWER_SHARE, DecodeStep, DeviceModel, generation
from petlprof.estimate.trace import lm_batch
from petlprof.meters import Window
from petlprof.meters.memory import static_breakdown
from petlprof.meters.tensors import CpuTensorMeter
from petlprof.models.backbones import backbone_config, set_depth
from petlprof.run.recipe import TrainRecipe

LM = Settings(batch_size=4, max_length=16, device="cpu", objective="lm", target_length=8)


def test_an_encoder_decoder_with_a_short_target_costs_far_less_than_its_classifier():
    """The defect the LM objective fixes: a T5 was priced as if its decoder read the whole input.  With
    5-token targets its decoder reads 5 positions, not 512, so the step is well below the classifier's."""
    resolved = resolve_backbone("t5-small", num_layers=2)
    classification = Settings(batch_size=8, max_length=512, device="cpu")
    lm = dataclasses.replace(classification, objective="lm", target_length=5)
    by_objective = {s.objective: estimate(resolved, "lora", {}, s) for s in (classification, lm)}
    assert (
        "lm" not in by_objective["classification"] and by_objective["classification"]["objective"] == "classification"
    )
    record = by_objective["lm"]
    assert record["status"] == "ok" and record["target_length"] == 5
    assert record["lm"]["logits_shape"] == [8 * 5, resolved.config.vocab_size]  # the decoder's 5 positions a row
    assert record["lm"]["loss_positions"] == 8 * 5
    peaks = {k: r["memory"]["peak_train_bytes"] for k, r in by_objective.items()}
    assert peaks["lm"] < 0.6 * peaks["classification"]
    assert record["flops"]["train_step"] < 0.6 * by_objective["classification"]["flops"]["train_step"]


def _cache_bytes(value) -> int:
    """Bytes of every tensor a transformers cache object holds (its layers' keys and values)."""
    seen: set[int] = set()

    def walk(item) -> int:
        if isinstance(item, torch.Tensor):
            return 0 if id(item) in seen or seen.add(id(item)) else item.numel() * item.element_size()
        if isinstance(item, (list, tuple)):
            return sum(walk(x) for x in item)
        if hasattr(item, "__dict__") and not isinstance(item, type):
            return sum(walk(x) for x in vars(item).values())
        return 0

    return walk(value)


def _real_cache(spec: str, batch: int, prompt: int, generated: int):
    """The KV cache of a real model of ``spec`` (2 layers) after reading ``prompt`` and ``generated`` tokens."""
    config = backbone_config(spec)
    set_depth(config, 2)
    torch.manual_seed(0)
    ids = torch.full((batch, prompt), 5)
    with torch.no_grad():
        if config.is_encoder_decoder:
            model = AutoModelForSeq2SeqLM.from_config(config).eval()
            start = torch.full((batch, generated), config.decoder_start_token_id)
            return model(input_ids=ids, decoder_input_ids=start, use_cache=True).past_key_values
        model = AutoModelForCausalLM.from_config(config).eval()
        return model(input_ids=torch.full((batch, prompt + generated), 5), use_cache=True).past_key_values


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-t5"])
def test_the_kv_cache_per_generated_token_is_the_formula_and_a_real_caches_growth(spec):
    record = estimate(resolve_backbone(spec, num_layers=2), "lora", {}, LM)
    kv = record["lm"]["kv_cache"]
    config = backbone_config(spec)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    assert (kv["layers"], kv["kv_heads"], kv["head_dim"], kv["dtype_bytes"]) == (2, kv_heads, head_dim, 4)
    assert kv["bytes_per_generated_token"] == 2 * 2 * kv_heads * head_dim * 4 * LM.batch_size
    if spec == "tiny-llama":
        assert kv_heads == heads // 2  # grouped-query attention: half the heads keep keys and values
    one, two = (_cache_bytes(_real_cache(spec, LM.batch_size, LM.max_length, n)) for n in (1, 2))
    assert two - one == kv["bytes_per_generated_token"]
    if config.is_encoder_decoder:  # cross-attention: the prompt's keys and values, once
        assert one == kv["cross_attention_bytes"] + kv["bytes_per_generated_token"]
    else:
        assert one == kv["bytes_per_generated_token"] * (LM.max_length + 1)
    bf16 = estimate(resolve_backbone(spec, num_layers=2), "lora", {}, dataclasses.replace(LM, precision="bf16"))
    assert bf16["lm"]["kv_cache"]["bytes_per_generated_token"] == kv["bytes_per_generated_token"] // 2


def _measured_lm_step(spec: str, settings: Settings) -> tuple[int, int, dict]:
    """(peak training bytes, peak inference bytes, static breakdown) of full fine-tuning of a plain
    transformers LM of ``spec`` (2 layers) with its own loss, by the cpu-tensors meter, after a warm-up step."""
    config = backbone_config(spec)
    set_depth(config, 2)
    torch.manual_seed(0)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_config(config)
    inputs, _ = lm_batch(
        settings.batch_size, settings.max_length, settings.target_length, 100, config.is_encoder_decoder
    )
    static = static_breakdown(model)
    recipe = TrainRecipe(lr=1e-3)
    optimizer, params = recipe.optimizer(model)
    model.train()

    def step():
        loss(model, inputs).backward()
        recipe.clip(params)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW's state exists from here on, as in the estimate's second traced step
    resident = static["total_bytes"] - static["gradients_bytes"]
    with Window([CpuTensorMeter("cpu", resident_bytes=resident)]) as train:
        step()
    model.eval()
    resident -= static["optimizer_state_bytes"]
    with torch.no_grad(), Window([CpuTensorMeter("cpu", resident_bytes=resident)]) as infer:
        model(**{k: v for k, v in inputs.items() if k != "labels"} | _decoder_inputs(model, inputs))
    return train.reading["peak_tensor_bytes"], infer.reading["peak_tensor_bytes"], static


def _decoder_inputs(model, inputs: dict) -> dict:
    """An encoder-decoder's decoder reads the targets; a decoder's LM head goes only on the positions that
    predict one (``logits_to_keep``), as the run's language model puts it."""
    if not model.config.is_encoder_decoder:
        return {"logits_to_keep": _scored(inputs["labels"])}
    return {"decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=inputs["labels"])}


def _scored(labels: torch.Tensor) -> torch.Tensor:
    """The positions of a full decoder batch (every row the same) whose logits predict a target token."""
    return (labels[0, 1:] != -100).nonzero().flatten()


def loss(model, inputs: dict) -> torch.Tensor:
    """The model's own loss on the target tokens, its LM head only where that loss reads it."""
    if model.config.is_encoder_decoder:
        return model(**inputs).loss
    labels = inputs["labels"]
    at = _scored(labels)
    logits = model(**{k: v for k, v in inputs.items() if k != "labels"}, logits_to_keep=at).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels[:, at + 1].flatten())


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-t5"])
def test_the_lm_estimate_agrees_with_a_measured_step(spec):
    """Within the classifier estimates' tolerance (5%) of a plain transformers step: the run's language
    model (its own LM head on the body's final states, the loss on the target tokens) costs what the
    model's own forward and loss cost."""
    record = estimate(resolve_backbone(spec, num_layers=2), "full", {}, LM)
    assert record["status"] == "ok", record["error"]
    train, infer, static = _measured_lm_step(spec, LM)
    memory = record["memory"]
    assert memory["weights_bytes"] == static["frozen_weights_bytes"] + static["trainable_weights_bytes"]
    assert memory["optimizer_bytes"] == static["optimizer_state_bytes"]
    assert memory["peak_train_bytes"] == pytest.approx(train, rel=0.05)
    assert memory["peak_inference_bytes"] == pytest.approx(infer, rel=0.05)


def test_the_command_prints_the_lm_columns_and_records_the_lm_section(tmp_path, capsys):
    argv = ["estimate", "--backbone", "tiny-t5", "--methods", "lora", "--objective", "lm", "--target-length", "4"]
    assert main([*argv, "--batch-size", "2", "--max-length", "8", "--output", str(tmp_path)]) == 0
    (record,) = [json.loads(line) for line in (tmp_path / "estimates.jsonl").read_text().splitlines()]
    assert record["objective"] == "lm" and record["target_length"] == 4 and "num_labels" not in record
    assert record["lm"]["reads"].startswith("encoder: the 8 prompt tokens; decoder: the 4 target tokens")
    out = capsys.readouterr().out
    assert "(8 prompt + 4 target tokens)" in out and "the loss counts the 4 target positions" in out
    assert all(column in out for column in ("logits", "kv_cache/token", "kv_cache_at_end"))


BAD = [
    (["--objective", "lm", "--target-length", "0"], "--target-length must be an integer >= 1, got 0"),
    (["--objective", "lm", "--target-length", "nan"], "--target-length must be an integer >= 1, got 'nan'"),
    (["--objective", "lm", "--target-length", str(10**30)], f"--target-length must be at most {2**27}"),
    (["--objective", "lm", "--target-length", "abc"], "got 'abc'"),
    (["--objective", "lm", "--batch-size", "abc"], "--batch-size must be an integer >= 1, got 'abc'"),
    (["--objective", "lm", "--target-length", str(2**26), "--batch-size", "2"], "+ --target-length 67108864"),
    (["--objective", "lm", "--target-length", "600"], "--target-length 600 (a decoder reads --max-length 16 + it)"),
    (["--objective", "lmm"], "did you mean 'lm'"),
    (["--objective", "classification", "--target-length", "5"], "classifier head: use --objective lm"),
    (["--objective", "lm", "--backbone", "tiny-bert"], "'tiny-bert' is an encoder"),
]


@pytest.mark.parametrize("args, words", BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_bad_lm_values_are_one_line_and_exit_2(tmp_path, capsys, args, words):
    argv = ["estimate", "--backbone", "tiny-llama", "--methods", "lora", "--max-length", "16"]
    assert main([*argv, "--output", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "out").exists()


DEVICE = DeviceModel("test", {"float32": 1e9}, 1e8, 1e-3, 50.0, 5.0, True, "test", "test meter")


@pytest.mark.parametrize(
    "step, time_s, memory_bound",
    [  # weights 1e8 B at 1e8 B/s: 1 s a step; the cache adds 1e6 B a position; 100 kernels at 1 ms: 0.1 s a step
        (DecodeStep(10**8, 10, 1, 10**6, 0, 100, 4, 10, 2), (1.0 + 0.10 + 0.1) + (1.0 + 0.11 + 0.1), 2),
        # a cross-attention cache read every step, and a decoder that starts empty
        (DecodeStep(10**8, 10, 1, 10**6, 10**7, 0, 4, 0, 2), (1.0 + 0.1) + (1.0 + 0.01 + 0.1), 2),
        # 1e9 FLOPs a row x 4 rows at 1e9 FLOP/s: 4 s a step, more than its reads: compute-bound
        (DecodeStep(10**8, 10**9, 0, 0, 0, 0, 4, 10, 3), 3 * 4.0, 0),
    ],
)
def test_generation_is_a_roofline_per_step_summed_over_the_generated_tokens(step, time_s, memory_bound):
    generated = generation(step, DEVICE, "float32")
    assert generated["time_s"] == pytest.approx(time_s)
    assert generated["tokens"] == step.batch * step.target_length
    assert generated["tokens_per_s"] == pytest.approx(generated["tokens"] / time_s)
    assert generated["energy_per_token_j"] == pytest.approx(50.0 * time_s / generated["tokens"])
    assert generated["memory_bound_steps"] == memory_bound


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-gpt2", "tiny-t5"])
def test_a_decode_steps_flops_and_bytes_are_what_a_real_cached_step_counts_and_holds(spec):
    """Against plain transformers: torch's FLOP counter over one cached generation step (a token a row, after the
    prompt), and the bytes of the parameters that step's forward uses (each tensor an op reads)."""
    from torch.utils.flop_counter import FlopCounterMode

    settings = dataclasses.replace(LM, device_model=DEVICE)
    record = estimate(resolve_backbone(spec, num_layers=2), "full", {}, settings)
    step = record["predicted"]["generation"]["step"]
    config = backbone_config(spec)
    set_depth(config, 2)
    torch.manual_seed(0)
    batch, prompt = LM.batch_size, LM.max_length
    with torch.no_grad():
        if config.is_encoder_decoder:
            model = AutoModelForSeq2SeqLM.from_config(config).eval()
            encoded = model.get_encoder()(input_ids=torch.full((batch, prompt), 5))
            first = torch.full((batch, 1), config.decoder_start_token_id)
            cache = model(encoder_outputs=encoded, decoder_input_ids=first, use_cache=True).past_key_values
            position = 1  # the decoder's own: one token cached
            with FlopCounterMode(display=False) as counter:
                model(encoder_outputs=encoded, decoder_input_ids=first, past_key_values=cache, use_cache=True)
        else:
            model = AutoModelForCausalLM.from_config(config).eval()
            cache = model(input_ids=torch.full((batch, prompt), 5), use_cache=True).past_key_values
            position = prompt
            with FlopCounterMode(display=False) as counter:
                model(input_ids=torch.full((batch, 1), 5), past_key_values=cache, use_cache=True)
    predicted = batch * (step["flops_per_row"] + step["attention_flops_per_position"] * (position + 1))
    assert predicted == pytest.approx(counter.get_total_flops(), rel=0.02)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = model.get_output_embeddings().weight
    encoder = {id(p) for p in model.get_encoder().parameters()} if config.is_encoder_decoder else set()
    cached = [m for name, m in model.named_modules() if name.endswith(("EncDecAttention.k", "EncDecAttention.v"))]
    assert bool(cached) is bool(config.is_encoder_decoder)  # T5's cross-attention keys and values: cached, not read
    encoder |= {id(p) for m in cached for p in m.parameters()}
    read = [p for p in model.parameters() if p is head or (id(p) not in embeddings and id(p) not in encoder)]
    assert step["weights_bytes"] == sum(p.numel() * p.element_size() for p in read)


def test_an_lm_estimate_predicts_generation_and_prints_it(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["estimate", "--backbone", "tiny-llama", "--methods", "lora", "--max-length", "16", "--target-length", "8"]
    assert main([*args, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "generation_predicted" in printed and "tokens/s" in printed and "energy/token_predicted" in printed
    [record] = [json.loads(line) for line in (out / "estimates.jsonl").read_text().splitlines()]
    generated = record["predicted"]["generation"]
    assert generated["tokens"] == record["batch_size"] * 8
    busy_w = GPUS[DEFAULT_GPU].tdp_w * GPU_BUSY_POWER_SHARE  # the default GPU of the table, uncalibrated
    assert generated["energy_per_token_j"] * generated["tokens"] == pytest.approx(generated["time_s"] * busy_w)


# a small mT5/T0-like config.json: the file unties the LM head, the transformers config class ties it anyway
_UNTIED = {"vocab_size": 320, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}


@pytest.mark.parametrize("model_type", ["mt5", "t5"])
@pytest.mark.parametrize("tie", [False, True, None], ids=["untied in the file", "tied in the file", "not said"])
def test_a_config_that_unties_its_lm_head_keeps_the_head_in_the_estimate_and_the_built_model(tmp_path, model_type, tie):
    """mT5, mT0 and T0 checkpoints hold an LM head of their own; transformers 5's config classes tie it whatever
    config.json says, and a pretrained load keeps both.  A model built from such a config (every estimate, a
    random-init run) has the head of its own, its encoder and decoder embeddings still shared: vocab x width more
    parameters than the tied model, priced in the weights."""
    from petlprof.models.families import model_from_config

    values = {"model_type": model_type, **_UNTIED, **({} if tie is None else {"tie_word_embeddings": tie})}
    (tmp_path / "config.json").write_text(json.dumps(values))
    tied_values = {**values, "tie_word_embeddings": True}
    (tmp_path / "tied.json").write_text(json.dumps(tied_values))
    resolved, tied = (resolve_backbone(str(tmp_path / name)) for name in ("config.json", "tied.json"))
    with torch.device("meta"):
        model = model_from_config(resolved.config, lm_head=True)
    separate = tie is False
    assert (model.lm_head.weight is model.shared.weight) is not separate
    assert model.encoder.embed_tokens.weight is model.shared.weight is model.decoder.embed_tokens.weight
    record, tied_record = (estimate(r, "full", {}, LM) for r in (resolved, tied))
    head = _UNTIED["vocab_size"] * _UNTIED["d_model"]
    assert record["total_params"] - tied_record["total_params"] == (head if separate else 0)
    weights = record["memory"]["weights_bytes"] - tied_record["memory"]["weights_bytes"]
    assert weights == (4 * head if separate else 0)
