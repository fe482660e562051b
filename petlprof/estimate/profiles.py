"""Device profiles (``petlprof calibrate``'s output): where they are kept, whose they are, and reading one back.

A profile is a JSON file under :func:`profile_dir`, named by the device (the CPU's model or the GPU's name), with the
machine, torch's version and the intra-op thread count it was measured with.  A profile from another machine, torch
version or thread count is *stale*: named, not used; one that cannot be read is one error line.  This module imports
torch only to read or name a GPU, or to check a profile that exists, so a sweep on a CPU without a profile pays
nothing for asking.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, TypedDict

from petlprof.errors import UsageError, shown
from petlprof.estimate.roofline import DeviceModel
from petlprof.meters.cpu_power_model import cpu_topology
from petlprof.values import MAX_WATTS, Number, is_number

PROFILE_VERSION = 3  # 2: the cost of drawing a random number; 3: the optimiser's time by tensor size, fresh memory
PROFILE_ENV = "PETLPROF_PROFILE_DIR"


def profile_dir() -> Path:
    """Where profiles are kept: ``$PETLPROF_PROFILE_DIR``, else ``~/.cache/petlprof/device-profiles``."""
    return Path(os.environ.get(PROFILE_ENV) or Path.home() / ".cache" / "petlprof" / "device-profiles")


def device_name(device: str) -> str:
    """The device as its profile is named: the GPU's name, or the CPU's model (``cpu: <model>``)."""
    if device.startswith("cuda"):
        import torch  # torch: slow to import, only to name a GPU

        return torch.cuda.get_device_name(device)
    return f"cpu: {cpu_topology().name or platform.processor() or 'unknown'}"


class MachineFacts(TypedDict):
    """What makes a profile this machine's (a profile measured elsewhere, or under another torch, is stale)."""

    machine: str  # host name
    torch: str  # torch's version
    threads: int  # intra-op threads


class Profile(MachineFacts):
    """A device profile as ``petlprof calibrate`` saves it."""

    version: int  # PROFILE_VERSION
    device: str  # cpu or cuda
    model: dict[str, Any]  # the DeviceModel, field by field (JSON)


def machine_facts() -> MachineFacts:
    """What makes a profile this machine's: host, torch's version, intra-op threads."""
    import torch  # torch: slow to import, only once a profile is measured or found

    return {"machine": platform.node(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def profile_path(device: str) -> Path:
    slug = "".join(c if c.isalnum() else "-" for c in device_name(device)).strip("-").lower()
    return profile_dir() / f"{slug or 'device'}.json"


def save_profile(profile: Profile, device: str) -> Path:
    path = profile_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(profile, indent=2))
    os.replace(temporary, path)
    return path


def _model_of(data: dict, path: Path) -> DeviceModel:
    """The :class:`DeviceModel` of a profile's JSON; a :class:`UsageError` naming the file, and the field with its
    value and what it may be, where it is not one."""
    try:
        model = data["model"]
        if not isinstance(model, dict) or not isinstance(model.get("flops_per_s"), dict) or not model["flops_per_s"]:
            raise ValueError("model.flops_per_s is not an object of dtype -> FLOP/s")
        flops = {
            str(k): _figure(f"flops_per_s.{shown(str(k), quote=False)}", v, FLOPS)
            for k, v in model["flops_per_s"].items()
        }
        figures = {name: _figure(name, model.get(name, default), kind) for name, (kind, default) in FIGURES.items()}
        if figures["idle_w"] > figures["busy_w"]:
            raise ValueError(f"idle_w ({figures['idle_w']:g} W) is above busy_w ({figures['busy_w']:g} W)")
        name, source, power = str(model["name"]), str(model["source"]), str(model["power_source"])
        measure = str(data.get("device", "")) == "cpu"  # a CPU's products are timed at a step's shapes too
        return DeviceModel(
            name,
            flops,
            figures["bytes_per_s"],
            figures["kernel_overhead_s"],
            figures["busy_w"],
            figures["idle_w"],
            True,
            source,
            power,
            figures["random_s_per_number"],
            measure,
            _optimizer_table(model.get("optimizer_s", [])),
            figures["fresh_s_per_byte"],
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as error:
        raise UsageError(
            f"device profile {path} is not a petlprof profile ({error}); run `petlprof calibrate` again"
        ) from None


def _figure(name: str, value: Any, kind: Number) -> float:
    """A profile's number ``name``, else a ValueError naming it, its value (cut short) and what it may be."""
    problem = kind.problem(value)
    if problem:
        raise ValueError(f"model.{name} {problem}")
    return float(value)


def load_profile(device: str) -> tuple[DeviceModel | None, str]:
    """(this machine's profile of ``device``, what was found): None with why where there is none or it is stale."""
    path = profile_path(device)
    if not path.exists():
        return None, f"no profile of {device_name(device)} ({path}): run `petlprof calibrate --device {device}`"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"device profile {path} cannot be read ({error}); run `petlprof calibrate` again") from None
    if not isinstance(data, dict):
        raise UsageError(f"device profile {path} is not a petlprof profile (not a JSON object)")
    model = _model_of(data, path)
    facts = machine_facts()
    stale = [f"{k} {data.get(k)!r}, now {v!r}" for k, v in facts.items() if data.get(k) != v]
    if data.get("version") != PROFILE_VERSION:
        stale.append(f"profile version {data.get('version')!r}, now {PROFILE_VERSION}")
    if stale:
        return None, f"stale profile {path} ({'; '.join(stale)}): run `petlprof calibrate --device {device}` again"
    return model, f"profile {path}"


MAX_FRESH_S_PER_BYTE = 1e-6  # a MB a second: slower than any machine maps its memory
MAX_OPTIMIZER_S = 60.0  # one tensor's clipping and AdamW step
MAX_ELEMENTS = 2**50
# a profile's figures, bounded far past any device (an H200: about 1e15 FLOP/s dense, 4.8e12 B/s, 700 W), so that a
# corrupt or hand-edited profile is refused, not turned into an infinite or negative prediction
FLOPS = Number(minimum=0, maximum=1e18)  # FLOP/s
FIGURES: dict[str, tuple[Number, float | None]] = {  # name -> (what it may be, its value where a profile has none)
    "bytes_per_s": (Number(minimum=0, maximum=1e15), None),
    "kernel_overhead_s": (Number(minimum=0, maximum=1.0), None),
    "busy_w": (Number(minimum=0, maximum=MAX_WATTS), None),
    "idle_w": (Number(minimum=0, inclusive=True, maximum=MAX_WATTS), None),
    "random_s_per_number": (Number(minimum=0, inclusive=True, maximum=1e-3), 0.0),
    "fresh_s_per_byte": (Number(minimum=0, inclusive=True, maximum=MAX_FRESH_S_PER_BYTE, below=True), 0.0),
}


def _optimizer_table(value) -> tuple[tuple[int, float], ...]:
    """A profile's ``optimizer_s``: (whole elements from 1 to :data:`MAX_ELEMENTS`, seconds above 0 and under
    :data:`MAX_OPTIMIZER_S`) pairs, each size once, else a ValueError (or OverflowError) saying why."""
    if not isinstance(value, list):
        raise ValueError("optimizer_s is not a list")
    table: dict[int, float] = {}
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and all(is_number(v) for v in pair)):
            raise ValueError(f"optimizer_s holds {shown(pair)}, not an (elements, seconds) pair of numbers")
        elements, seconds = pair
        if not (1 <= elements <= MAX_ELEMENTS and float(elements).is_integer()):
            raise ValueError(
                f"optimizer_s holds {shown(pair)}: its elements are not a whole number from 1 to {MAX_ELEMENTS:,}"
            )
        if not 0 < seconds < MAX_OPTIMIZER_S:
            raise ValueError(
                f"optimizer_s holds {shown(pair)}: its seconds are not above 0 and under {MAX_OPTIMIZER_S:g}"
            )
        if int(elements) in table:
            raise ValueError(f"optimizer_s holds {int(elements):,} elements twice")
        table[int(elements)] = float(seconds)
    return tuple(sorted(table.items()))
