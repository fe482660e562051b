"""Common GPUs: memory and peak dense throughput, with the vendor document each figure comes from.

A step's time at a GPU's peak throughput (FLOPs / peak FLOP/s) is a *lower bound*: real steps
reach a fraction of peak (memory-bound element-wise work, kernel launches, the optimiser).  FP32
figures are the CUDA-core peak (PyTorch runs float32 matrix products without TF32 unless told
to); bfloat16/float16 figures are the dense tensor-core peak (the sparse figure is twice that and
not used).  Memory is the vendor's nominal capacity; what a training step's tensors can use is less,
and a fit verdict counts it (:func:`usable_bytes`):

* the CUDA context (driver, the kernels loaded, library handles): :data:`CUDA_CONTEXT_BYTES`, 426 MiB
  as measured with PyTorch 2.10 + CUDA 13 on an RTX 6000 Ada (unslothai/unsloth-zoo pull request 1053:
  ``nvidia-smi`` after ``torch.cuda.mem_get_info``); PyTorch's own measurements with lazy module loading
  (pytorch/pytorch pull request 86509: 287,047,680 bytes) and its maintainers' figure of about 400 MB
  (pytorch/pytorch issue 109888) are of the same size; kernels a step loads lazily add to it;
* the caching allocator's slack: it reserves more than the live tensors hold (block rounding, cached
  and split blocks), :data:`ALLOCATOR_SLACK` = 15% of what it reserves, the average fragmentation
  ``(reserved - allocated) / reserved`` of PyTorch's allocator over eight LLM fine-tuning workloads on an
  A100-80GB (GMLake, Guo et al., ASPLOS 2024, arXiv 2401.08156; up to 33% there).

So a peak of live tensor bytes fits when it is at most ``(memory - context) x (1 - slack)``: 20.0 GiB
of a 24 GiB card.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from petlprof.errors import unknown_choice

GIB = 1024**3
MIB = 1024**2
CUDA_CONTEXT_BYTES = 426 * MIB
CUDA_CONTEXT_SOURCE = (
    "426 MiB: the CUDA context measured with PyTorch 2.10 + CUDA 13 on an RTX 6000 Ada (unslothai/unsloth-zoo "
    "pull request 1053); pytorch/pytorch pull request 86509 measured 287 MB with lazy module loading, issue 109888 "
    "says about 400 MB"
)
ALLOCATOR_SLACK = 0.15
ALLOCATOR_SLACK_SOURCE = (
    "15% of reserved memory: PyTorch's caching allocator's average fragmentation (reserved - allocated) / reserved "
    "over eight LLM fine-tuning workloads on an A100-80GB (GMLake, Guo et al., ASPLOS 2024, arXiv 2401.08156; up "
    "to 33%)"
)


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    fp32_tflops: float  # CUDA cores, dense
    bf16_tflops: float  # tensor cores, dense (float16 the same on these parts)
    source: str
    bandwidth_gb_s: float = 0.0  # memory bandwidth, nominal (the same document)
    tdp_w: float = 0.0  # board power (TDP / max power; the same document)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_flops(self, dtype: str) -> float:
        return (self.fp32_tflops if dtype == "float32" else self.bf16_tflops) * 1e12


GPUS: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu(
            "rtx4090-24gb", 24, 82.6, 165.2, "NVIDIA Ada Lovelace GPU architecture whitepaper v2.1, table 2", 1008, 450
        ),
        Gpu("a10-24gb", 24, 31.2, 125.0, "NVIDIA A10 Tensor Core GPU datasheet", 600, 150),
        Gpu("a100-40gb", 40, 19.5, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (SXM)", 1555, 400),
        Gpu("l40s-48gb", 48, 91.6, 362.05, "NVIDIA L40S GPU datasheet", 864, 350),
        Gpu("a100-80gb", 80, 19.5, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (SXM)", 2039, 400),
        Gpu("h100-80gb", 80, 67.0, 989.4, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)", 3350, 700),
        Gpu("h200-141gb", 141, 67.0, 989.4, "NVIDIA H200 Tensor Core GPU datasheet (SXM)", 4800, 700),
    )
}
DEFAULT_GPU = "a100-80gb"


def get_gpu(name: str) -> Gpu:
    if name not in GPUS:
        raise unknown_choice("GPU", name, GPUS)
    return GPUS[name]


def usable_bytes(memory_bytes: int) -> int:
    """What a step's live tensors can use of ``memory_bytes`` of GPU memory: less the CUDA context, less the
    allocator's slack (the module docstring gives both figures and their sources)."""
    return max(0, int((memory_bytes - CUDA_CONTEXT_BYTES) * (1 - ALLOCATOR_SLACK)))


class Headroom(TypedDict):
    """What a fit verdict counts besides the peak (:func:`headroom`), with the sources of both figures."""

    rule: str
    cuda_context_bytes: int
    cuda_context_source: str
    allocator_slack: float
    allocator_slack_source: str


def headroom() -> Headroom:
    """The record's statement of what a fit verdict counts besides the peak."""
    return {
        "rule": "fits when peak live tensor bytes <= (memory - cuda_context_bytes) x (1 - allocator_slack)",
        "cuda_context_bytes": CUDA_CONTEXT_BYTES,
        "cuda_context_source": CUDA_CONTEXT_SOURCE,
        "allocator_slack": ALLOCATOR_SLACK,
        "allocator_slack_source": ALLOCATOR_SLACK_SOURCE,
    }


def fits(peak_bytes: int | None, device_memory_bytes: int | None) -> dict[str, bool | None]:
    """Whether ``peak_bytes`` fits what a step can use (:func:`usable_bytes`) of each table GPU's nominal memory
    (and of ``device_memory`` when given)."""
    out: dict[str, bool | None] = {
        name: None if peak_bytes is None else peak_bytes <= usable_bytes(gpu.memory_bytes) for name, gpu in GPUS.items()
    }
    if device_memory_bytes is not None:
        out["device_memory"] = None if peak_bytes is None else peak_bytes <= usable_bytes(device_memory_bytes)
    return out
