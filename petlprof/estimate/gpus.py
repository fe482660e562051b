"""Common GPUs: memory and peak dense throughput, with the vendor document each figure comes from.

A step's time at a GPU's peak throughput (FLOPs / peak FLOP/s) is a *lower bound*: real steps
reach a fraction of peak (memory-bound element-wise work, kernel launches, the optimiser).  FP32
figures are the CUDA-core peak (PyTorch runs float32 matrix products without TF32 unless told
to); bfloat16/float16 figures are the dense tensor-core peak (the sparse figure is twice that and
not used).  Memory is the vendor's nominal capacity; what a program can use is somewhat less
(the CUDA context and the allocator's fragmentation take some).
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import unknown_choice

GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    fp32_tflops: float  # CUDA cores, dense
    bf16_tflops: float  # tensor cores, dense (float16 the same on these parts)
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_flops(self, dtype: str) -> float:
        return (self.fp32_tflops if dtype == "float32" else self.bf16_tflops) * 1e12


GPUS: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu("rtx4090-24gb", 24, 82.6, 165.2, "NVIDIA Ada Lovelace GPU architecture whitepaper v2.1, table 2"),
        Gpu("a10-24gb", 24, 31.2, 125.0, "NVIDIA A10 Tensor Core GPU datasheet"),
        Gpu("a100-40gb", 40, 19.5, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (SXM)"),
        Gpu("l40s-48gb", 48, 91.6, 362.05, "NVIDIA L40S GPU datasheet"),
        Gpu("a100-80gb", 80, 19.5, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (SXM)"),
        Gpu("h100-80gb", 80, 67.0, 989.4, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
        Gpu("h200-141gb", 141, 67.0, 989.4, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    )
}
DEFAULT_GPU = "a100-80gb"


def get_gpu(name: str) -> Gpu:
    if name not in GPUS:
        raise unknown_choice("GPU", name, GPUS)
    return GPUS[name]


def fits(peak_bytes: int | None, device_memory_bytes: int | None) -> dict[str, bool | None]:
    """Whether ``peak_bytes`` fits each table GPU's nominal memory (and ``device_memory`` when given)."""
    out: dict[str, bool | None] = {
        name: None if peak_bytes is None else peak_bytes <= gpu.memory_bytes for name, gpu in GPUS.items()
    }
    if device_memory_bytes is not None:
        out["device_memory"] = None if peak_bytes is None else peak_bytes <= device_memory_bytes
    return out


def throughput_table() -> list[dict]:
    """The table's rows, for printing and for the report."""
    return [
        {
            "gpu": gpu.name,
            "memory_gib": gpu.memory_gib,
            "fp32_tflops": gpu.fp32_tflops,
            "bf16_tflops": gpu.bf16_tflops,
            "source": gpu.source,
        }
        for gpu in GPUS.values()
    ]
