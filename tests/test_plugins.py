"""Method plug-ins: the example package (examples/petlprof-normtune) by ``module:ATTR`` and by entry point
through a fresh worker and a 2-rank run (as Ray tasks in ``test_executors.py``, on its Ray instance);
``petlprof list``; the example in docs/plugins.md; the benchmark fixture; a third-party side-tuning method with
the hidden-state cache; and each way a plug-in can be broken, refused with one line and exit 2 before any run.

No package is installed into the environment: a ``.dist-info`` folder written from the example's
``pyproject.toml`` into a temporary folder on ``sys.path`` and ``PYTHONPATH`` stands for the installed
distribution, so every process of a run (worker, torchrun rank, Ray task) finds it as pip would.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from petlprof import registry
from petlprof.cli import main
from petlprof.execution.child import execute_in_subprocess
from petlprof.run.execute import execute
from petlprof.sweep.spec import RunSpec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # slow: processes and sweeps

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "petlprof-normtune"
REFERENCE, ENTRY_POINT = "petlprof_normtune:SPEC", "normtune"
# the inference phase's 10 repeats alone (its default 0.5 s per batch size is not what is tested here)
SMALL = dict(
    backbone="tiny-bert", train_size=16, eval_size=8, batch_size=8, max_steps=2, warmup_steps=1, inference_window_s=0.05
)
SMALL_CLI = ["--backbone", "tiny-bert", "--train-size", "16", "--eval-size", "8", "--batch-size", "8"]
SMALL_CLI += ["--inference-window-s", "0.05"]


def write_distribution(site: Path, name: str, entry_points: dict[str, str], version: str = "1.0") -> None:
    """What ``pip install`` leaves for importlib.metadata: a dist-info folder with the entry points."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{lines}")


def forget_plugins() -> None:
    registry.METHODS.forget()


def example_pythonpath(site: Path) -> list[str]:
    """The paths on which the example package is installed, with its dist-info written from its pyproject.toml."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    write_distribution(site, project["name"], project["entry-points"]["petlprof.methods"], project["version"])
    return [str(site), str(EXAMPLE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]


@pytest.fixture
def example_installed(tmp_path, monkeypatch):
    """The example package as if pip-installed, for this process and every process it starts."""
    paths = example_pythonpath(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    for path in reversed(paths):
        monkeypatch.syspath_prepend(path)
    forget_plugins()
    yield
    sys.modules.pop("petlprof_normtune", None)
    forget_plugins()


def norm_and_head_params(record_spec: dict, parts: str = "both") -> int:
    """The parameters NormTune trains, counted from BERT's parameter names (not by the plug-in's rule)."""
    from petlprof.models.backbones import load_backbone

    backbone = load_backbone(record_spec["backbone"])
    suffixes = {"both": ("LayerNorm.weight", "LayerNorm.bias"), "gain": ("LayerNorm.weight",)}[parts]
    norms = sum(p.numel() for n, p in backbone.model.named_parameters() if n.endswith(suffixes))
    return norms + backbone.hidden_size * 2 + 2  # + the 2-class head


def check_plugin_record(record: dict, given: str, parts: str = "both") -> None:
    assert record["status"] == "ok", record.get("error")
    assert record["method"] == "normtune" and record["spec"]["method"] == given
    assert record["method_config"] == {"parts": parts, "last": 0} and record["pareto_knob"] == "last"
    assert record["trainable_params"] == norm_and_head_params(record["spec"], parts)


# --- end to end: a fresh worker, two ranks ------------------------------------------------------------


@pytest.mark.parametrize(
    "given, nproc", [(REFERENCE, 1), (ENTRY_POINT, 2)], ids=["module:ATTR, one rank", "entry point, two ranks"]
)
def test_a_plugin_runs_in_fresh_worker_processes(example_installed, given, nproc):
    spec = RunSpec(method=given, nproc=nproc, method_config={"parts": "gain", "last": 0}, **SMALL)
    record = execute_in_subprocess(spec, timeout_s=600)
    check_plugin_record(record, given, parts="gain")
    if nproc > 1:
        assert record["distributed"]["world_size"] == 2


# --- the command line ---------------------------------------------------------------------------------


def test_list_shows_an_installed_plugin_with_its_options(example_installed, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    line = (
        r"^  normtune +LayerNorm/RMSNorm gains and biases .*; knob last \(grid 1, 4, 0; --tune normtune.last\); "
        r"lr 0.001 \(--tune lr: 0.0001\.\.0\.01\); classification$"
    )
    assert re.search(line, out, re.M)
    assert "normtune.parts=both  which parameters of each norm layer train; one of gain, bias, both" in out
    assert "normtune.last=0  train only the last N norm layers (0: all of them); a non-negative integer" in out


def load_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_method_config_and_grid_address_a_module_attr_plugin_by_its_name(example_installed, tmp_path):
    out = tmp_path / "out"
    args = ["run", "--methods", REFERENCE, *SMALL_CLI, "--max-steps", "1", "--output", str(out), "--in-process"]
    assert main([*args, "--method-config", "normtune.parts=bias", "--method-grid", "normtune.last=1,2"]) == 0
    records = load_records(out / "results.jsonl")
    assert sorted(r["method_config"]["last"] for r in records) == [1, 2]
    assert {(r["method"], r["spec"]["method"], r["method_config"]["parts"]) for r in records} == {
        ("normtune", REFERENCE, "bias")
    }


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """The example plug-in as a module of the current folder, ``mytune`` (no entry point: reachable as
    ``mytune:SPEC`` alone, its spec named ``normtune``)."""
    (tmp_path / "mytune.py").write_text((EXAMPLE / "petlprof_normtune" / "__init__.py").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_plugins()
    if ENTRY_POINT in registry.method_names():
        pytest.skip("petlprof-normtune is installed here: its name would not need the sweep's methods")
    yield "mytune:SPEC"
    sys.modules.pop("mytune", None)
    forget_plugins()


def test_a_module_attr_plugins_knob_is_tuned_by_its_specs_name(plugin_module, tmp_path, capsys):
    """``--tune normtune.last`` where normtune is known only through ``--methods mytune:SPEC``: its declared grid
    searched on validation, the final run at the chosen value."""
    out = tmp_path / "out"
    args = ["run", "--methods", plugin_module, *SMALL_CLI, "--max-steps", "3", "--val-size", "8", "--in-process"]
    assert main([*args, "--tune", "normtune.last", "--output", str(out)]) == 0, capsys.readouterr().err[-2000:]
    trials = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert sorted(t["method_config"]["last"] for t in trials) == [0, 1, 4]  # the plug-in's default_grid
    (record,) = load_records(out / "results.jsonl")
    assert record["spec"]["method"] == plugin_module and record["tuning"]["target"] == ["normtune.last"]
    assert record["method_config"]["last"] == record["tuning"]["chosen"]["normtune.last"]


@pytest.mark.parametrize(
    "target, message",
    [
        ("normtune.parts", "'normtune.parts': normtune's Pareto knob is searched as normtune.last"),
        ("normtun.last", "normtun is not among --methods mytune:SPEC (their knobs: normtune.last; or lr)"),
    ],
)
def test_a_module_attr_plugins_wrong_knob_is_one_line(plugin_module, tmp_path, capsys, target, message):
    out = tmp_path / "out"
    code = main(["run", "--methods", plugin_module, *SMALL_CLI, "--tune", target, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err[-1500:]
    assert not out.exists()


def readme_example() -> tuple[str, list[str]]:
    """docs/plugins.md's plug-in module (the block after 'normtune.py:') and its `petlprof run` command."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text.split("## Adding your own method", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"`normtune\.py`:\s*\n+```python\n(.*?)```", section, re.S).group(1)
    command = re.search(r"```(?:bash|console)?\n(petlprof run --methods [^\n]*normtune:SPEC[^\n]*)\n", section)
    return code, command.group(1).split()[1:]


def test_the_readme_example_is_the_example_package_and_runs_from_its_folder(tmp_path, monkeypatch):
    code, command = readme_example()
    assert code == (EXAMPLE / "petlprof_normtune" / "__init__.py").read_text()
    (tmp_path / "normtune.py").write_text(code)
    monkeypatch.chdir(tmp_path)  # the sweep and its fresh workers find a module in the current folder
    monkeypatch.delenv("PYTHONPATH", raising=False)
    forget_plugins()
    if ENTRY_POINT in registry.method_names():
        pytest.skip("petlprof-normtune is installed here: its 'normtune' and the README's normtune.py clash by design")
    try:  # the README's command, made tiny: later flags win
        assert main([*command, *SMALL_CLI, "--max-steps", "1", "--output", "demo"]) == 0
    finally:
        sys.modules.pop("normtune", None)
        forget_plugins()
    records = load_records(tmp_path / "demo" / "results.jsonl")
    assert sorted(r["method"] for r in records) == ["lora", "normtune", "read"]
    assert all(r["status"] == "ok" for r in records)


def test_the_benchmark_fixture_profiles_a_plugin_by_name(example_installed, petlprof_bench):
    profile = petlprof_bench.profile(ENTRY_POINT, backbone="tiny-bert", batch_size=4, seq_len=16)
    assert profile.trainable_params == norm_and_head_params({"backbone": "tiny-bert"})
    assert profile.saved_activation_bytes > 0


# --- a third-party side-tuning method -----------------------------------------------------------------

SIDE_PLUGIN = '''
from dataclasses import dataclass

from petlprof import MethodConfig, MethodSpec, SideTunedModel


@dataclass
class Config(MethodConfig):
    pass


class LastLayerHead(SideTunedModel):
    """The head on the frozen final layer, read from backbone_states: a linear probe as a side network."""

    def __init__(self, classifier, config):
        super().__init__(classifier)

    def side_forward(self, states, input_ids, attention_mask):
        return self.classifier.classify(states["layers"][:, :, -1], attention_mask)


SPEC = MethodSpec(
    name="lasthead", description="task head on the final layer", config_cls=Config, apply=LastLayerHead,
    default_lr=1e-2, lr_source="a test", side_tuning=True,
)
'''


def test_a_side_tuning_plugin_gets_the_hidden_state_cache(tmp_path, monkeypatch):
    (tmp_path / "side_plugin.py").write_text(SIDE_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_plugins()
    spec = RunSpec(method="side_plugin:SPEC", **{**SMALL, "max_steps": None, "epochs": 2}, cache_hidden_states=True)
    record = execute(spec)
    forget_plugins()
    assert record["status"] == "ok", record.get("error")
    assert record["method"] == "lasthead" and record["trainable_params"] == 64 * 2 + 2
    assert record["train"]["cache_examples"] == 16
    assert record["train"]["cache_hit_rate"] == 0.5  # epoch 1 fills the cache, epoch 2 reads only from it


# --- broken plug-ins: one line, exit 2, nothing written -----------------------------------------------


def spec_module(name: str, *, default: int = 4, lr: str = "1e-3", apply: str = "apply", side: bool = False) -> str:
    return textwrap.dedent(
        f"""
        from dataclasses import dataclass

        from petlprof import MethodConfig, MethodSpec, SideTunedModel, integer


        @dataclass
        class Config(MethodConfig):
            size: int = integer({default}, "a size")


        def apply(classifier, config):
            return classifier.freeze_backbone()


        class Side(SideTunedModel):
            def side_forward(self, states, input_ids, attention_mask):
                return self.classifier.classify(states["layers"][:, :, -1], attention_mask)


        SPEC = MethodSpec(
            name={name!r}, description="head only", config_cls=Config, apply={apply}, default_lr={lr},
            lr_source="a test", side_tuning={side},
        )
        """
    )


BROKEN = [
    # (id, modules {name: source}, distributions {name: {entry point: value}}, --methods, what the line says)
    (
        "entry point named like a built-in",
        {"clash_ep": spec_module("lora")},
        {"clash-dist": {"lora": "clash_ep:SPEC"}},
        "read,lora",
        ["plug-in method 'lora'", "clash-dist 1.0", "clashes with the built-in method 'lora'"],
    ),
    (
        "module:ATTR named like a built-in",
        {"clash_ref": spec_module("read")},
        {},
        "clash_ref:SPEC",
        ["plug-in method 'clash_ref:SPEC'", "not from an installed distribution", "clashes with the built-in"],
    ),
    (
        "two distributions, one name",
        {"twin_a": spec_module("twin"), "twin_b": spec_module("twin")},
        {"dist-a": {"twin": "twin_a:SPEC"}, "dist-b": {"twin": "twin_b:SPEC"}},
        "twin",
        ["'twin' is declared by several distributions (dist-a 1.0, dist-b 1.0)"],
    ),
    (
        "its import fails",
        {"needs_dep": "import no_such_dependency_xyz\n"},
        {"dep-dist": {"needy": "needs_dep:SPEC"}},
        "needy",
        ["'needy'", "dep-dist 1.0", "import of 'needs_dep' failed: ModuleNotFoundError: No module named", "python -c"],
    ),
    (
        "no such module",
        {},
        {},
        "no_such_module_xyz:SPEC",
        ["'no_such_module_xyz:SPEC'", "import of 'no_such_module_xyz' failed"],
    ),
    (
        "not a MethodSpec",
        {"not_spec": "SPEC = {'name': 'x'}\n"},
        {},
        "not_spec:SPEC",
        ["malformed spec: 'SPEC' is a dict, not a petlprof.MethodSpec"],
    ),
    ("no such attribute", {"no_attr": "X = 1\n"}, {}, "no_attr:SPEC", ["module 'no_attr' has no attribute 'SPEC'"]),
    (
        "a non-finite default learning rate",
        {"bad_lr": spec_module("badlr", lr="float('nan')")},
        {"lr-dist": {"badlr": "bad_lr:SPEC"}},
        "badlr",
        ["lr-dist 1.0", "malformed spec", "default_lr must be a positive finite number, got nan"],
    ),
    (
        "a config default its own check refuses",
        {"bad_default": spec_module("baddefault", default=0)},
        {},
        "bad_default:SPEC",
        ["malformed spec", "config defaults fail its own checks: size must be a positive integer, got 0"],
    ),
    (
        "side-tuning model without the flag",
        {"side_flag": spec_module("sideflag", apply="Side")},
        {},
        "side_flag:SPEC",
        ["malformed spec", "gives a side-tuning model (Side) but does not declare side_tuning=True"],
    ),
    (
        "entry point and spec named differently",
        {"renamed": spec_module("other")},
        {"rn-dist": {"mine": "renamed:SPEC"}},
        "mine",
        ["rn-dist 1.0", "malformed spec: it is named 'other'; the entry point must use the same name"],
    ),
    (
        "entry point that is not module:ATTR",
        {},
        {"odd-dist": {"odd": "just_a_module"}},
        "odd",
        ["entry point 'odd = just_a_module'", "malformed entry point"],
    ),
    (
        "one method under two names",
        {"twice": spec_module("twice")},
        {"twice-dist": {"twice": "twice:SPEC"}},
        "twice,twice:SPEC",
        ["--methods names method 'twice' twice (twice and twice:SPEC)"],
    ),
]


@pytest.fixture
def plugin_site(tmp_path, monkeypatch):
    """A folder on sys.path to write plug-in modules and distributions into."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    forget_plugins()
    yield site
    forget_plugins()


def install(site: Path, modules: dict[str, str], distributions: dict[str, dict[str, str]]) -> None:
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
        sys.modules.pop(name, None)
    for name, entry_points in distributions.items():
        write_distribution(site, name, entry_points)


@pytest.mark.parametrize(
    "modules, distributions, methods, expected",
    [c[1:] for c in BROKEN],
    ids=[c[0] for c in BROKEN],
)
def test_a_broken_plugin_is_one_line_and_exit_2_before_any_run(
    plugin_site, tmp_path, capsys, modules, distributions, methods, expected
):
    install(plugin_site, modules, distributions)
    out = tmp_path / "out"
    assert main(["run", "--methods", methods, *SMALL_CLI, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("petlprof: error: ") and err.count("\n") == 1, err
    for fragment in expected:
        assert fragment in err
    assert not out.exists()


def test_list_names_a_broken_installed_plugin(plugin_site, capsys):
    install(plugin_site, {"needs_dep": "import no_such_dependency_xyz\n"}, {"dep-dist": {"needy": "needs_dep:SPEC"}})
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plug-in method 'needy'" in err and "dep-dist 1.0" in err


def test_side_tuning_flag_is_checked_on_apply(plugin_site):
    """A function's result is known only when it runs (a class ``apply`` is checked when the spec is made)."""
    install(plugin_site, {"flag_side": spec_module("flagside", side=True)}, {})
    record = execute(RunSpec(method="flag_side:SPEC", **SMALL))
    assert record["status"] == "failed"
    assert "declares side_tuning=True, but its apply gives a SequenceClassifier" in record["error"]
