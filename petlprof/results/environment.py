"""Environment provenance stored with every result: versions, hardware, git commit."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

from petlprof.results.records import Environment


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """Commit of the petlprof source tree when it is petlprof's own git checkout (editable installs);
    None for an installed copy, even one that sits inside somebody else's repository."""
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != here.parent:
            return None
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() or None if head.returncode == 0 else None


# the C allocator's settings: glibc's heap keeps freed chunks and adapts its mmap threshold to the sizes
# freed, so these decide how much of a CPU phase's peak resident memory is allocator slack
_ALLOCATOR_VARIABLES = ("GLIBC_TUNABLES", "LD_PRELOAD")


def allocator_settings(env: dict[str, str] | None = None) -> str:
    """The allocator settings in ``env``, "defaults" if none.  By default, those this process started with:
    the C library reads them only then, so a run forked from the warm worker has the worker's, whatever
    its ``os.environ`` says now."""
    env = startup_environment() if env is None else env
    names = sorted(k for k in env if k.startswith("MALLOC_") or k in _ALLOCATOR_VARIABLES)
    return ", ".join(f"{name}={env[name]}" for name in names) or "defaults"


def startup_environment() -> dict[str, str]:
    """The environment this process's program was started with (Linux: ``/proc/self/environ``, which
    a fork inherits and ``os.environ`` changes leave alone); ``os.environ`` where that cannot be read."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def environment(device: str) -> Environment:
    """The record's ``env``: the versions of the packages a run's figures depend on (None: not installed), the
    interpreter, the hardware and the source's commit."""
    # torch: slow to import, loaded only when used
    import torch

    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {
        "petlprof": _version("petlprof"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "datasets": _version("datasets"),
        "nvidia-ml-py": _version("nvidia-ml-py"),
        "codecarbon": _version("codecarbon"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "allocator": allocator_settings(),
        "gpu": gpu,
        "cuda": torch.version.cuda,
        "git_commit": git_commit(),
        "hostname": socket.gethostname(),
    }
