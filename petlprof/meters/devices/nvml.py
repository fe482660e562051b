"""NVML access: a session, GPU handles by UUID, the energy counter, the power fields, processes.

Every caller (the energy meter, the power sampler process, the idle baseline, ``petlprof meters``)
goes through these functions, so start-up and shutdown, the UUID spellings CUDA accepts and the
capability probes are written once.  ``pynvml`` is imported when a session opens, so a machine
without it only loses the GPU meters.

CUDA and NVML number GPUs differently (CUDA fastest first, NVML by PCI bus), so a GPU is always
found by its UUID.  ``CUDA_VISIBLE_DEVICES`` may name GPUs by index, by full UUID or by any unique
prefix of one (``GPU-8f3a``, as CUDA allows): prefixes are resolved against every GPU NVML sees.
MIG instances are refused with :class:`MigNotSupported`: NVML has no energy counter or power
reading per MIG instance, so a figure would silently be the whole GPU's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def start():
    """Initialise NVML and return the ``pynvml`` module; pair with :func:`stop`."""
    # pynvml: slow to import, loaded only when used
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def stop(nvml) -> None:
    nvml.nvmlShutdown()


class MigNotSupported(RuntimeError):
    """A MIG instance was named: NVML reads energy and power only for the whole GPU."""


@contextmanager
def session() -> Iterator:
    """``with session() as nvml:`` — NVML initialised for the block, shut down after it."""
    nvml = start()
    try:
        yield nvml
    finally:
        stop(nvml)


def nvml_uuid(text: str) -> str:
    """The UUID as NVML spells it (torch gives it without the ``GPU-`` prefix)."""
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def cuda_uuid(device: str) -> str:
    """UUID of the CUDA device torch calls ``device``."""
    # torch: slow to import, loaded only when used
    import torch

    index = torch.device(device).index
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    return nvml_uuid(str(props.uuid))


def all_uuids(nvml) -> list[str]:
    return [uuid_of(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]


def resolve_uuid(nvml, text: str) -> str:
    """The full UUID of the GPU ``text`` names (a full UUID or a unique prefix, with or without
    ``GPU-``); :class:`MigNotSupported` for a MIG instance, LookupError when none or several match."""
    text = text.strip()
    if text.startswith("MIG-"):
        raise MigNotSupported(
            f"{text} is a MIG instance: NVML has no energy counter or power reading per MIG instance (only "
            "for the whole GPU), so petlprof does not meter MIG; use a whole GPU or --energy-meter estimate"
        )
    wanted = nvml_uuid(text)
    matches = [uuid for uuid in all_uuids(nvml) if uuid.startswith(wanted)]
    if len(matches) != 1:
        what = "no GPU" if not matches else f"{len(matches)} GPUs ({', '.join(matches)})"
        raise LookupError(f"GPU '{text}' (CUDA_VISIBLE_DEVICES or torch) matches {what} that NVML sees")
    return matches[0]


def handle(nvml, uuid: str):
    """The NVML handle of the GPU ``uuid`` names (full or a unique prefix)."""
    return nvml.nvmlDeviceGetHandleByUUID(resolve_uuid(nvml, uuid))


def visible_handles(nvml) -> list:
    """Handles of the GPUs ``CUDA_VISIBLE_DEVICES`` names (indices, UUIDs or UUID prefixes), all if unset."""
    count = nvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for item in (x.strip() for x in visible.split(",")):
        if item.isdigit():
            if int(item) < count:
                handles.append(nvml.nvmlDeviceGetHandleByIndex(int(item)))
        elif item:
            handles.append(handle(nvml, item))
    return handles


def uuid_of(nvml, gpu) -> str:
    return str(nvml.nvmlDeviceGetUUID(gpu))


def has_counter(nvml, handles) -> bool:
    """Whether every GPU has the total-energy counter (Volta and later)."""
    try:
        for gpu in handles:
            nvml.nvmlDeviceGetTotalEnergyConsumption(gpu)
    except nvml.NVMLError:
        return False
    return True


def energy_mj(nvml, handles) -> list[int]:
    """The total-energy counters (mJ since the driver loaded)."""
    return [int(nvml.nvmlDeviceGetTotalEnergyConsumption(gpu)) for gpu in handles]


def instant_power_mw(nvml, gpu) -> int | None:
    """The instantaneous power field (``NVML_FI_DEV_POWER_INSTANT``), None where the driver has none."""
    value = nvml.nvmlDeviceGetFieldValues(gpu, [nvml.NVML_FI_DEV_POWER_INSTANT])[0]
    return None if value.nvmlReturn != 0 else int(value.value.uiVal)


def average_power_mw(nvml, gpu) -> int:
    """``nvmlDeviceGetPowerUsage``: on Ampere and later a 1 s moving average."""
    return int(nvml.nvmlDeviceGetPowerUsage(gpu))


def temperature_c(nvml, gpu) -> int | None:
    """The GPU die's temperature (°C), None where the driver does not give it."""
    try:
        return int(nvml.nvmlDeviceGetTemperature(gpu, nvml.NVML_TEMPERATURE_GPU))
    except nvml.NVMLError:
        return None


def sm_clock_mhz(nvml, gpu) -> int | None:
    """The SM clock now (MHz), None where the driver does not give it."""
    try:
        return int(nvml.nvmlDeviceGetClockInfo(gpu, nvml.NVML_CLOCK_SM))
    except nvml.NVMLError:
        return None


def power_limit_mw(nvml, gpu) -> int:
    """The GPU's power limit now (mW)."""
    return int(nvml.nvmlDeviceGetPowerManagementLimit(gpu))


def power_limit_range_mw(nvml, gpu) -> tuple[int, int]:
    """(lowest, highest) power limit the GPU takes (mW)."""
    low, high = nvml.nvmlDeviceGetPowerManagementLimitConstraints(gpu)
    return int(low), int(high)


def set_power_limit_mw(nvml, gpu, milliwatts: int) -> None:
    """Set the GPU's power limit (needs root or CAP_SYS_ADMIN: NVMLError otherwise)."""
    nvml.nvmlDeviceSetPowerManagementLimit(gpu, int(milliwatts))


def compute_processes(nvml, gpu) -> list[tuple[int, int]]:
    """(pid, device bytes) of every compute process on the GPU."""
    return [(int(p.pid), int(p.usedGpuMemory or 0)) for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu)]


def availability() -> tuple[bool, str]:
    """(usable, why) for GPU energy: a counter, or at least a power reading, on every visible GPU."""
    try:
        nvml = start()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False, f"NVML not usable: {exc}"
    try:
        handles = visible_handles(nvml)
        if not handles:
            return False, "no NVIDIA GPU visible (CUDA_VISIBLE_DEVICES)"
        counter = has_counter(nvml, handles)
        if not counter:
            for gpu in handles:
                average_power_mw(nvml, gpu)
    except (MigNotSupported, LookupError) as exc:
        return False, str(exc)
    except nvml.NVMLError as exc:
        return False, f"GPU energy counter and power reading not supported: {exc}"
    finally:
        stop(nvml)
    what = "total-energy counter + power timeline" if counter else "power timeline only (no energy counter)"
    return True, f"NVML {what} on {len(handles)} GPU(s)"


def gpu_details() -> list[str]:
    """One line per visible GPU for ``petlprof meters``: energy counter, power field, other processes."""
    try:
        nvml = start()
    except Exception:  # NVML absent: the meter status already says why
        return []
    lines = []
    try:
        for gpu in visible_handles(nvml):
            name, uuid = nvml.nvmlDeviceGetName(gpu), uuid_of(nvml, gpu)
            counter = "energy counter" if has_counter(nvml, [gpu]) else "NO energy counter (integrated power)"
            power = "instantaneous power field" if instant_power_mw(nvml, gpu) is not None else "averaged power only"
            others = [pid for pid, _ in compute_processes(nvml, gpu)]
            busy = f"; busy: pids {others}" if others else ""
            lines.append(f"{name} {uuid}: {counter}, {power}{busy}")
    except (nvml.NVMLError, MigNotSupported, LookupError) as exc:
        lines.append(f"NVML error while listing GPUs: {exc}")
    finally:
        stop(nvml)
    return lines
