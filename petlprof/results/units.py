"""Energy in the units a budget is written in: kilowatt-hours, grams of CO2-equivalent and money.

Joules are what the meters give; a budget is a kWh figure on a bill, a carbon allowance or a price.  Grams of
CO2e are kWh times a grid's carbon intensity (g CO2e per kWh), taken, first that applies:

1. ``--carbon-intensity`` (the user's figure: a contract, a supplier's disclosure, a live reading);
2. ``--country-code``: the country's figure in the table CodeCarbon ships (``global_energy_mix.json``, read from
   the installed package, offline; each country's row names its year);
3. CodeCarbon's own figure where it measured the runs (``--meters codecarbon``): its grams over its kWh;
4. none: no grams are shown, and the report says which option adds them.

Money is kWh times ``--price-per-kwh``, in that price's currency, and only when it is given: there is no
default price.  Each figure carries the sentence saying how it was obtained (:attr:`EnergyUnits.how`).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from petlprof.errors import UsageError, shown
from petlprof.values import J_PER_KWH, Number

MAX_PRICE_PER_KWH = 1e6  # no tariff comes near a million of any currency per kWh
MAX_G_PER_KWH = 5000.0  # coal, the dirtiest source, is about 1,000 g CO2e/kWh; no grid comes near five times it
PRICE_PER_KWH = Number(0.0, maximum=MAX_PRICE_PER_KWH, what="a positive price per kWh (any currency)", optional=True)
CARBON_INTENSITY = Number(
    0.0, maximum=MAX_G_PER_KWH, inclusive=True, what="a carbon intensity in g CO2e per kWh, 0 or more", optional=True
)
CODECARBON_TABLE = ("data", "private_infra", "global_energy_mix.json")  # inside the installed codecarbon package


@dataclass(frozen=True)
class GridIntensity:
    """A grid's carbon intensity and where it comes from."""

    g_per_kwh: float
    how: str


@dataclass(frozen=True)
class EnergyUnits:
    """How to turn joules into kWh, grams of CO2e (``carbon``, None: not known) and money (``price_per_kwh``,
    None: not given)."""

    carbon: GridIntensity | None = None
    price_per_kwh: float | None = None

    def co2_g(self, joules: float | None) -> float | None:
        """Grams of CO2e for ``joules``; None without an intensity or an energy."""
        return None if self.carbon is None or joules is None else kwh(joules) * self.carbon.g_per_kwh

    def money(self, joules: float | None) -> float | None:
        """The cost of ``joules`` in the price's currency; None without a price or an energy."""
        return None if self.price_per_kwh is None or joules is None else kwh(joules) * self.price_per_kwh

    @property
    def how(self) -> list[str]:
        """A sentence per unit: how the kWh, the grams and the money were obtained."""
        lines = [f"kWh: joules / {J_PER_KWH:,.0f} (1 kWh = 3.6 MJ)."]
        if self.carbon is None:
            lines.append(
                "g CO2e: not shown; give --carbon-intensity (g CO2e per kWh) or --country-code (CodeCarbon's table), "
                "or run with --meters codecarbon."
            )
        else:
            lines.append(f"g CO2e: kWh x {self.carbon.g_per_kwh:,.4g} g CO2e/kWh, {self.carbon.how}.")
        if self.price_per_kwh is None:
            lines.append("money: not shown; give --price-per-kwh (there is no default price).")
        else:
            lines.append(f"money: kWh x --price-per-kwh {self.price_per_kwh:g}, in that price's currency.")
        return lines


def kwh(joules: float) -> float:
    return joules / J_PER_KWH


def cost_text(value: float) -> str:
    """A cost in a price's currency: cents where it has them, two significant figures below a cent."""
    return f"{value:,.2f}" if value >= 0.01 else f"{value:.2g}" if value else "0"


def read_price(value: str | float | None) -> float | None:
    """``--price-per-kwh`` checked: a positive finite number (one line, exit 2, otherwise), or None."""
    price = None if value is None else PRICE_PER_KWH.read(value)
    PRICE_PER_KWH.check("price_per_kwh", price)
    return None if price is None else float(price)


def read_intensity(value: str | float | None) -> float | None:
    """``--carbon-intensity`` checked: g CO2e per kWh, finite, 0 up to :data:`MAX_G_PER_KWH`; or None."""
    intensity = None if value is None else CARBON_INTENSITY.read(value)
    CARBON_INTENSITY.check("carbon_intensity", intensity)
    return None if intensity is None else float(intensity)


@functools.cache
def _codecarbon_table() -> tuple[str, dict[str, dict]]:
    """CodeCarbon's version and its country table (ISO alpha-3 -> row), read from the installed package without
    importing it (its import takes seconds); a UsageError when CodeCarbon or its table is missing."""
    spec = importlib.util.find_spec("codecarbon")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = next(
        (Path(f).joinpath(*CODECARBON_TABLE) for f in folders if Path(f).joinpath(*CODECARBON_TABLE).is_file()), None
    )
    if path is None:
        raise UsageError("--country-code reads CodeCarbon's table of grid intensities, and codecarbon is not installed")
    return version("codecarbon"), json.loads(path.read_text(encoding="utf-8"))


def country_intensity(code: str) -> GridIntensity:
    """The grid intensity of the country ``code`` (ISO 3166 alpha-3, any case) in CodeCarbon's table."""
    release, table = _codecarbon_table()
    row = table.get(code.strip().upper(), {}) if isinstance(code, str) else {}
    value = row.get("carbon_intensity")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        given = code.strip().upper() if isinstance(code, str) else str(code)
        close = difflib.get_close_matches(given, sorted(table), n=3, cutoff=0.6) if len(given) <= 8 else []
        hint = f"; did you mean {', '.join(close)}?" if close else "."
        raise UsageError(
            f"unknown --country-code {shown(code)}{hint} Give an ISO 3166 alpha-3 code from CodeCarbon's table "
            f"({len(table)} countries, e.g. USA, FRA, DEU, GBR, IND, CHN)"
        )
    year = row.get("year")
    return GridIntensity(
        float(value),
        f"the {row.get('country_name') or code.upper()} grid"
        + (f" in {year}" if year else "")
        + f" from CodeCarbon {release}'s country table (--country-code {code.strip().upper()})",
    )


def measured_intensity(pairs: Iterable[tuple[float | None, float | None, str | None]]) -> GridIntensity | None:
    """CodeCarbon's own intensity over the windows it measured: (grams, its joules, its source) per window; None
    when it measured none."""
    grams = joules = 0.0
    sources: set[str] = set()
    for g, j, source in pairs:
        if g is not None and j and math.isfinite(g) and math.isfinite(j):
            grams, joules = grams + g, joules + j
            sources.add(source or "codecarbon")
    if not joules:
        return None
    return GridIntensity(
        grams / kwh(joules), "CodeCarbon's own over the windows it measured (" + "; ".join(sorted(sources)) + ")"
    )


def energy_units(
    country_code: str | None = None,
    carbon_intensity: str | float | None = None,
    price_per_kwh: str | float | None = None,
    measured: GridIntensity | None = None,
) -> EnergyUnits:
    """The units a report shows energy in, from the options (each checked: one line, exit 2) and CodeCarbon's
    ``measured`` intensity (:func:`measured_intensity`), in the order the module docstring gives."""
    given = read_intensity(carbon_intensity)
    if given is not None and country_code is not None:
        raise UsageError("give --carbon-intensity or --country-code, not both: both set the grid's g CO2e per kWh")
    if given is not None:
        carbon: GridIntensity | None = GridIntensity(given, f"given (--carbon-intensity {given:g})")
    elif country_code is not None:
        if not isinstance(country_code, str) or not country_code.strip():
            raise UsageError(
                f"--country-code must be an ISO 3166 alpha-3 code such as USA, FRA or DEU, got {shown(country_code)}"
            )
        carbon = country_intensity(country_code)
    else:
        carbon = measured
    return EnergyUnits(carbon, read_price(price_per_kwh))


__all__ = [
    "CARBON_INTENSITY",
    "EnergyUnits",
    "GridIntensity",
    "PRICE_PER_KWH",
    "cost_text",
    "country_intensity",
    "energy_units",
    "kwh",
    "measured_intensity",
    "read_intensity",
    "read_price",
]
