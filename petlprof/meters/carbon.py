"""``codecarbon``: emissions (g CO2-eq) and CodeCarbon's own energy breakdown for a window.

An extra meter (``--meters codecarbon``), off by default, that runs alongside the energy meter:
CodeCarbon's :class:`OfflineEmissionsTracker` (no network) is made in ``prepare`` (outside the
window) and started and stopped at the window's edges.  Its energy figures are CodeCarbon's —
from RAPL, NVML or its own TDP model, as it finds — and are recorded under ``codecarbon_*`` so
they never replace the figures of petlprof's own energy meter.  Emissions are energy × the
carbon intensity of the country given (``--country-code``, ISO 3166 alpha-3, default
:data:`DEFAULT_COUNTRY`).
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

from petlprof.meters.base import Meter, Provenance, Reading
from petlprof.results.figures import CO2, CODECARBON_CPU, CODECARBON_ENERGY_J, CODECARBON_GPU, CODECARBON_RAM
from petlprof.values import J_PER_KWH
from petlprof.vocabulary import ESTIMATED

if TYPE_CHECKING:
    from codecarbon import OfflineEmissionsTracker

DEFAULT_COUNTRY = "USA"


class CodecarbonMeter(Meter):
    name = "codecarbon"
    FIGURES = (CO2, CODECARBON_ENERGY_J)
    MORE_FIGURES = (CODECARBON_CPU, CODECARBON_GPU, CODECARBON_RAM)
    EXTRAS = ("co2eq_country", "codecarbon_cpu_model", "codecarbon_tracking_mode", "co2eq_source")

    def __init__(self, device: str = "cpu", country_code: str | None = None):
        super().__init__(device)
        self.country_code = (country_code or DEFAULT_COUNTRY).upper()
        self._tracker: OfflineEmissionsTracker | None = None

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            # codecarbon: slow to import, loaded only when used
            import codecarbon
        except ImportError as exc:
            return False, f"codecarbon is not installed: {exc}"
        return True, f"codecarbon {codecarbon.__version__} offline tracker (extra meter: --meters codecarbon)"

    def prepare(self) -> None:
        # codecarbon: slow to import, loaded only when used
        from codecarbon import OfflineEmissionsTracker

        logging.getLogger("codecarbon").setLevel(logging.ERROR)
        with warnings.catch_warnings():  # codecarbon 3 deprecates save_to_file, which 2.x needs
            warnings.simplefilter("ignore", DeprecationWarning)
            self._tracker = OfflineEmissionsTracker(
                country_iso_code=self.country_code, save_to_file=False, log_level="error", allow_multiple_runs=True
            )

    def _prepared(self) -> OfflineEmissionsTracker:
        if self._tracker is None:
            raise RuntimeError("the codecarbon meter was started without prepare()")
        return self._tracker

    def _begin(self) -> None:
        self._prepared().start()

    def _end(self) -> Reading:
        tracker = self._prepared()
        emissions_kg = tracker.stop()
        data = tracker.final_emissions_data
        return Reading(
            {
                CO2: None if emissions_kg is None else emissions_kg * 1000.0,
                CODECARBON_ENERGY_J: data.energy_consumed * J_PER_KWH,
                CODECARBON_CPU: data.cpu_energy * J_PER_KWH,
                CODECARBON_GPU: data.gpu_energy * J_PER_KWH,
                CODECARBON_RAM: data.ram_energy * J_PER_KWH,
            },
            provenance={CO2: Provenance(ESTIMATED)},
            extras={
                "co2eq_country": self.country_code,
                "codecarbon_cpu_model": data.cpu_model,
                "codecarbon_tracking_mode": data.tracking_mode,
                "co2eq_source": f"codecarbon {data.codecarbon_version} offline, grid intensity of {self.country_code}",
            },
        )
