"""pytest plugin (auto-loaded where petlprof is installed): the ``petlprof_bench`` fixture.

It lets any test suite guard a fine-tuning method's cost against a committed baseline::

    def test_my_method_stays_cheap(petlprof_bench):
        profile = petlprof_bench.profile("my_method", backbone="tiny-bert")
        petlprof_bench.check(profile)                                     # deterministic figures
        petlprof_bench.check_ratio("my_method", "full", backbone="tiny-bert")  # step time vs full

``pytest --petlprof-update-baseline`` writes the figures measured now into the baseline file
(``--petlprof-baseline``, default ``petlprof-baseline.json`` in the rootdir).  A figure with no
baseline entry yet is shown as a warning and does not fail, so a fresh clone or a new
method never fails for want of history.  A method whose training loss stops being a finite number
fails the test with the step it diverged at: its figures are not a result.  Importing this module does not import torch.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from petlprof.results.figures import EXACT, GROWTH, STEP_TIME_RATIO, Figure, checked_against_baseline

DETERMINISTIC_RTOL = 0.05  # allowed growth of parameter and byte counts (library versions move them a little)
RATIO_RTOL = 0.5  # allowed growth of a side-by-side time ratio on a noisy shared machine
RTOL = {EXACT: DETERMINISTIC_RTOL, GROWTH: RATIO_RTOL}  # the default tolerance of each baseline rule


def default_rtol(figure: Figure) -> float:
    """The tolerance of ``figure``'s baseline rule, when a test gives none."""
    if figure.baseline is None:
        raise ValueError(f"figure {figure.name} declares no baseline rule: petlprof_bench does not check it")
    return RTOL[figure.baseline]


def pytest_addoption(parser):
    group = parser.getgroup("petlprof", "petlprof cost regression checks")
    group.addoption(
        "--petlprof-baseline",
        default=None,
        help="baseline JSON for petlprof_bench checks (default: the petlprof_baseline ini "
        "option, else <rootdir>/petlprof-baseline.json)",
    )
    group.addoption(
        "--petlprof-update-baseline",
        action="store_true",
        default=False,
        help="write the figures measured now into the baseline instead of checking them",
    )
    parser.addini("petlprof_baseline", "baseline JSON for petlprof_bench checks, relative to the rootdir")


class PetlprofBench:
    """What the ``petlprof_bench`` fixture hands a test."""

    def __init__(self, baseline, update: bool, request):
        self.baseline, self.update, self.request = baseline, update, request
        self.failures: list[str] = []

    def profile(self, method: str, backbone: str = "tiny-bert", **kwargs):
        # petlprof.bench.profile (torch): pytest loads this plugin in every session; only benchmarks need torch
        from petlprof.bench.profile import Diverged, MethodStep

        try:
            return MethodStep(method, backbone, **kwargs).profile()
        except Diverged as diverged:
            pytest.fail(f"petlprof_bench: {diverged}; no figure of it is a result", pytrace=False)

    def _compare(
        self, key: str, value: float, rtol: float | None, default_rtol: float, two_sided: bool = False
    ) -> None:
        self.request.node.user_properties.append((key, value))
        if self.update:
            self.baseline.record(key, value, default_rtol if rtol is None else rtol)
        elif not self.baseline.has(key):
            warnings.warn(
                f"petlprof_bench: no baseline for {key} = {value:g}; recorded, not checked "
                "(run with --petlprof-update-baseline to add it)",
                stacklevel=3,
            )
        elif message := self.baseline.check(key, value, rtol, two_sided):
            self.failures.append(message)

    def check(self, profile, rtol: float | None = None) -> None:
        """Compare the exact counts of a profile (the figures declared with ``baseline=EXACT``: trainable
        params, tensor bytes) with the baseline, both ways."""
        prefix = f"{profile.method}/{profile.backbone}/b{profile.batch_size}x{profile.seq_len}"
        for figure in checked_against_baseline(EXACT):
            self._compare(f"{prefix}/{figure.name}", profile.figure(figure), rtol, default_rtol(figure), two_sided=True)
        self._raise_failures()

    def check_ratio(
        self,
        method: str,
        reference: str = "full",
        backbone: str = "tiny-bert",
        rounds: int = 10,
        rtol: float | None = None,
        **kwargs,
    ) -> float:
        """Time one training step of ``method`` and of ``reference`` in alternation; check the ratio."""
        # petlprof.bench.profile (torch): pytest loads this plugin in every session; only benchmarks need torch
        from petlprof.bench.profile import Diverged, MethodStep, paired_ratio, time_rounds

        steps = {name: MethodStep(name, backbone, **kwargs) for name in (method, reference)}
        try:
            samples = time_rounds({name: step.train_step for name, step in steps.items()}, rounds=rounds)
        except Diverged as diverged:
            pytest.fail(f"petlprof_bench: {diverged}; its step time is not a result", pytrace=False)
        ratio = paired_ratio(samples, method, reference)
        names = f"{steps[method].method}/{steps[reference].method}"  # a plug-in by its spec's name
        self._compare(f"{names}/{backbone}/{STEP_TIME_RATIO.name}", ratio, rtol, default_rtol(STEP_TIME_RATIO))
        self._raise_failures()
        return ratio

    def check_value(self, key: str, value: float, rtol: float | None = None) -> None:
        """Compare any other figure (lower is better) with the baseline."""
        self._compare(key, value, rtol, RTOL[GROWTH])
        self._raise_failures()

    def _raise_failures(self) -> None:
        if self.failures:
            failures, self.failures = self.failures, []
            pytest.fail("cost regression:\n" + "\n".join(failures), pytrace=False)


@pytest.fixture(scope="session")
def _petlprof_baseline(request):
    # petlprof.bench.profile (torch): pytest loads this plugin in every session; only benchmarks need torch
    from petlprof.bench.profile import Baseline

    option = request.config.getoption("--petlprof-baseline")
    ini = request.config.getini("petlprof_baseline")
    path = Path(option) if option else Path(request.config.rootpath) / (ini or "petlprof-baseline.json")
    update = request.config.getoption("--petlprof-update-baseline")
    if update and hasattr(request.config, "workerinput"):
        pytest.exit("--petlprof-update-baseline writes one file: run it without pytest-xdist (-n)", returncode=4)
    baseline = Baseline(path)
    yield baseline
    if update:
        baseline.save()


@pytest.fixture
def petlprof_bench(_petlprof_baseline, request):
    return PetlprofBench(_petlprof_baseline, request.config.getoption("--petlprof-update-baseline"), request)
