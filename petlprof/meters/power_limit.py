"""The GPUs' power limit as a sweep axis (``--power-limit 300W,450W``): checked before any run, set before each run,
put back after it.

A limit is set on every GPU the sweep sees (``CUDA_VISIBLE_DEVICES``) through NVML, which needs root or
``CAP_SYS_ADMIN``; :func:`check_power_limits` refuses, in one line, a sweep whose process may not set it (probed by
setting each GPU's current limit to itself, which changes nothing) or a limit outside a GPU's range.  The sweep
holds a :class:`PowerLimiter` around its runs: before a run it sets the run's limit (the GPUs' own limits for a
run without one), and when the sweep ends — finished, failed, interrupted — it puts back the limits the GPUs had
before.  Those originals are written to a file in the output folder (:data:`STATE_FILE`) before the first
change and removed once restored, so a sweep killed with ``kill -9`` leaves them behind and the next sweep into
that folder (a resume) restores them first.  A run's process killed with ``kill -9`` changes nothing here: the
sweep that started it restores the limits as it would after any run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from petlprof.errors import UsageError, say
from petlprof.meters.devices import nvml as nvml_dev

STATE_FILE = "power-limits.json"  # in the output folder while a sweep has changed a limit


def _gpus(nvml) -> dict[str, object]:
    """UUID -> handle of every GPU the sweep sees."""
    return {nvml_dev.uuid_of(nvml, gpu): gpu for gpu in nvml_dev.visible_handles(nvml)}


def check_power_limits(limits_w: Sequence[float]) -> None:
    """One line (a :class:`UsageError`) where a limit cannot be set on this machine's GPUs: no NVML, no GPU, a
    limit outside a GPU's range, or a process without the right to set it."""
    ok, why = nvml_dev.availability()
    if not ok:
        raise UsageError(f"--power-limit needs NVIDIA GPUs read through NVML: {why}")
    with nvml_dev.session() as nvml:
        for uuid, gpu in _gpus(nvml).items():
            low, high = (mw / 1000 for mw in nvml_dev.power_limit_range_mw(nvml, gpu))
            outside = [w for w in limits_w if not low <= w <= high]
            if outside:
                raise UsageError(
                    f"--power-limit {', '.join(f'{w:g}W' for w in outside)}: GPU {uuid} takes limits from "
                    f"{low:g} W to {high:g} W"
                )
            try:  # the current limit set to itself: changes nothing, and fails without the right to set it
                nvml_dev.set_power_limit_mw(nvml, gpu, nvml_dev.power_limit_mw(nvml, gpu))
            except nvml.NVMLError as error:
                raise UsageError(
                    f"--power-limit: this process may not set GPU {uuid}'s power limit (NVML: {error}); run the sweep "
                    "as root or with CAP_SYS_ADMIN"
                ) from None


class PowerLimiter:
    """Sets the sweep's GPUs to each run's power limit and puts their own limits back (see the module).

    ``out_dir``: the sweep's output folder, where the originals wait in :data:`STATE_FILE` while changed."""

    def __init__(self, out_dir: Path):
        self.state = Path(out_dir) / STATE_FILE
        self.original_mw: dict[str, int] = {}  # UUID -> its limit before this sweep changed it
        self.current_w: float | None = None

    def restore_left_behind(self) -> str | None:
        """Put back the limits a sweep killed mid-run left in the state file; what was done, or None."""
        if not self.state.exists():
            return None
        try:
            left = {str(k): int(v) for k, v in json.loads(self.state.read_text()).items()}
        except (OSError, ValueError, TypeError, AttributeError) as error:
            return f"could not read the power limits a killed sweep left in {self.state} ({error}); set them by hand"
        if not self._set_each(left):
            return f"the power limits in {self.state} could not all be put back (said above)"
        self.state.unlink()
        shown = ", ".join(f"{uuid} {mw / 1000:g} W" for uuid, mw in left.items())
        return f"restored the power limits a killed sweep left changed: {shown}"

    def set(self, watts: float | None) -> None:
        """Every GPU at ``watts`` (None: its own limit from before the sweep)."""
        if watts == self.current_w:
            return
        if watts is None:
            self.restore()
            return
        with nvml_dev.session() as nvml:
            gpus = _gpus(nvml)
            if not self.original_mw:  # remembered, and on disk, before the first change
                self.original_mw = {uuid: nvml_dev.power_limit_mw(nvml, gpu) for uuid, gpu in gpus.items()}
                self._write_state()
            for uuid, gpu in gpus.items():
                try:
                    nvml_dev.set_power_limit_mw(nvml, gpu, round(watts * 1000))
                except nvml.NVMLError as error:  # checked up front, so the driver changed its mind mid-sweep
                    raise UsageError(
                        f"--power-limit {watts:g}W: NVML would not set GPU {uuid}'s power limit now ({error}); the "
                        "runs recorded so far are kept and the GPUs' own limits are put back"
                    ) from None
        self.current_w = watts

    def restore(self) -> None:
        """Every GPU back at its limit from before the sweep; the state file removed once every one is (a GPU that
        refuses is named, and the file kept for the next sweep into the folder to try again)."""
        if self.original_mw and not self._set_each(self.original_mw):
            return
        self.current_w = None
        self.state.unlink(missing_ok=True)

    def _set_each(self, limits_mw: dict[str, int]) -> bool:
        """Each GPU named at its limit; whether every one took it (those that did not are said, one line each)."""
        done = True
        with nvml_dev.session() as nvml:
            gpus = _gpus(nvml)
            for uuid, mw in limits_mw.items():
                if uuid not in gpus:
                    continue
                try:
                    nvml_dev.set_power_limit_mw(nvml, gpus[uuid], mw)
                except nvml.NVMLError as error:
                    say(
                        f"petlprof: could not put GPU {uuid}'s power limit back to {mw / 1000:g} W ({error}); set it "
                        f"by hand (nvidia-smi -i {uuid} -pl {mw / 1000:g})"
                    )
                    done = False
        return done

    def _write_state(self) -> None:
        temporary = self.state.with_name(f".{self.state.name}.{os.getpid()}")
        temporary.write_text(json.dumps(self.original_mw))
        os.replace(temporary, self.state)  # whole or not at all: a kill mid-write leaves no half file

    def __enter__(self) -> PowerLimiter:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
