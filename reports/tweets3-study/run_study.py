"""Regenerate the tweets3 reference study (README.md in this folder says what it shows).

    python reports/tweets3-study/run_study.py [--output reports/tweets3-study] [--fraction 0.95]

Three sweeps, one after the other, each resumable (an interrupted study re-run with the same command
skips the runs it already has):

1. ``curve/``  — full fine-tuning with a check every 4 steps over the whole fixed budget (curve.toml):
   shows that its held-out accuracy has stopped rising within the budget;
2. ``budget/`` — every built-in method's default configuration and the Pareto grids of read, lora and
   lst for that fixed budget (budget.toml): accuracy against cost;
3. ``.``       — every method's default configuration trained until it reaches a target set from
   full fine-tuning's mean accuracy in ``budget/`` (``--fraction`` of it, rounded down to 3 decimals),
   or for at most the same budget (target.toml): time and energy to the target, with and without the
   checks' own cost.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from petlprof.api import load_results
from petlprof.cli import main as petlprof

HERE = Path(__file__).resolve().parent


def full_accuracy(store: Path) -> float:
    """Mean accuracy of full fine-tuning's ok runs in ``store``."""
    runs = load_results(store)
    full = runs[(runs["method"] == "full") & (runs["status"] == "ok")]
    if full.empty:
        raise SystemExit(f"no ok run of full fine-tuning in {store}: cannot set the target")
    return float(full["quality"].mean())


def sweep(config: str, output: Path, *extra: str) -> None:
    code = petlprof(["run", "--config", str(HERE / config), "--output", str(output), *extra])
    if code != 0:
        raise SystemExit(f"petlprof run --config {config} exited with {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=HERE, help="study folder (default: this folder)")
    parser.add_argument("--fraction", type=float, default=0.95, help="target = this x full's accuracy (0.95)")
    args = parser.parse_args(argv)
    sweep("curve.toml", args.output / "curve")
    sweep("budget.toml", args.output / "budget")
    accuracy = full_accuracy(args.output / "budget")
    target = math.floor(args.fraction * accuracy * 1000) / 1000
    print(f"target accuracy {target:.3f} = {args.fraction:g} x full fine-tuning's mean {accuracy:.4f} (budget/)")
    sweep("target.toml", args.output, "--target-value", f"{target:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
