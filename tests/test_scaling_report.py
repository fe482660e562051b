"""``reports/scaling/README.md`` as ``petlprof.estimate.scaling`` renders it from real ``petlprof estimate``
records of tiny-t5 at one and two layers (renamed to the sizes a section looks for): every method and
size in every table, cells equal to the records' figures and ratios, the largest model that fits at the
GiB boundaries, READ's T5-large saving, the header's settings, failed records, the optional files."""

from __future__ import annotations

import copy
import dataclasses
import json
import runpy
import sys
from dataclasses import dataclass

import pytest

from petlprof.estimate import scaling
from petlprof.estimate.command import GIB, flops, size
from petlprof.estimate.core import Settings, estimate
from petlprof.estimate.model import resolve_backbone
from petlprof.estimate.scaling import PAPER_READ_SAVING, write_report
from petlprof.method_api import MethodConfig, MethodSpec

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = Settings(batch_size=2, max_length=8)
METHODS = ["full", "lora", "read"]
# tiny-t5 at 1 and 2 layers stand for two sizes; the names sort against their sizes (large < small),
# so a table ordered by name instead of by parameters shows up
SIZES = {"t5-small": 1, "t5-large": 2}
TITLES = {
    "Peak training memory per step:": (lambda r: r["memory"]["peak_train_bytes"], size, False),
    "Peak training memory, ratio to `full`:": (lambda r: r["memory"]["peak_train_bytes"], None, True),
    "FLOPs of one training step:": (lambda r: r["flops"]["train_step"], flops, False),
    "FLOPs of one training step, ratio to `full`:": (lambda r: r["flops"]["train_step"], None, True),
}
FITS = "Largest model whose training step fits:"


@dataclass
class BrokenConfig(MethodConfig):
    """No options."""


def _apply_broken(classifier, config):
    raise RuntimeError("this method cannot be built")


BROKEN = MethodSpec(
    name="broken",
    description="a method whose model cannot be built (a failed estimate)",
    config_cls=BrokenConfig,
    apply=_apply_broken,
    default_lr=1e-3,
    lr_source="test",
)


@pytest.fixture(scope="module")
def estimates() -> dict:
    """{(backbone, method): record} at fp32 and cuda kernels, plus a bf16 and a cpu-kernels full record and a
    failed one, all made by ``estimate`` itself."""
    out = {}
    for name, depth in SIZES.items():
        resolved = resolve_backbone("tiny-t5", num_layers=depth)
        for method in METHODS:
            out[(name, method)] = {**estimate(resolved, method, {}, SETTINGS), "backbone": name}
    small = resolve_backbone("tiny-t5", num_layers=1)
    out["bf16"] = estimate(small, "full", {}, dataclasses.replace(SETTINGS, precision="bf16"))
    out["cpu"] = estimate(small, "full", {}, dataclasses.replace(SETTINGS, device="cpu"))
    out["failed"] = estimate(small, "test_scaling_report:BROKEN", {}, SETTINGS)
    assert all(r["status"] == "ok" for key, r in out.items() if key != "failed")
    assert out["failed"]["status"] == "failed"
    return out


def sweep(estimates: dict) -> list[dict]:
    """Copies of the fp32 records, safe to change."""
    return [copy.deepcopy(estimates[(name, method)]) for name in SIZES for method in METHODS]


def failed(estimates: dict, backbone: str, method: str) -> dict:
    return {**copy.deepcopy(estimates["failed"]), "backbone": backbone, "method": method}


def render(tmp_path, sweeps: dict[str, list[dict]], command: str | None = None, speed: str | None = None) -> str:
    for name, records in sweeps.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "estimates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        if command is not None:
            (tmp_path / name / "command.txt").write_text(command + "\n")
    if speed is not None:
        (tmp_path / "speed.md").write_text(speed + "\n")
    path = write_report(tmp_path, list(sweeps))
    assert path == tmp_path / "README.md"
    return path.read_text()


def tables(text: str) -> dict[str, tuple[list[str], dict[str, list[str]]]]:
    """{title: (column names, {row name: cells})} of the tables of one sweep's section."""
    lines, out = text.splitlines(), {}
    for i, line in enumerate(lines):
        if line.endswith(":") and i + 2 < len(lines) and lines[i + 2].startswith("| "):
            header = [c.strip() for c in lines[i + 2].strip("|").split("|")]
            rows = {}
            for row in lines[i + 4 :]:
                if not row.startswith("| "):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                rows[cells[0]] = cells[1:]
            out[line] = (header[1:], rows)
    return out


def sections(text: str) -> dict[str, str]:
    """{first line: text} of each ``## `` section."""
    return {part.splitlines()[0]: part for part in text.split("\n## ")[1:]}


def only_sweep(text: str) -> dict:
    (section,) = [s for title, s in sections(text).items() if title.startswith("t5:")]
    return tables(section)


# --- the tables ---------------------------------------------------------------------------------------


def check_tables(found: dict, records: list[dict], backbones: list[str], methods: list[str]) -> None:
    """Every method a row, every backbone a column (smallest first), each cell the records' figure or ratio
    to full at that backbone, ``-`` where the record is missing or failed."""
    cell = {(r["backbone"], r["method"]): r for r in records if r["status"] == "ok"}
    for title, (value, show, ratio) in TITLES.items():
        columns, rows = found[title]
        assert columns == backbones, title
        assert sorted(rows) == sorted(methods), title
        for method in methods:
            for backbone, shown in zip(backbones, rows[method], strict=True):
                record, full = cell.get((backbone, method)), cell.get((backbone, "full"))
                if record is None or (ratio and full is None):
                    assert shown == "-", (title, backbone, method)
                elif ratio:
                    assert float(shown) == pytest.approx(value(record) / value(full), abs=0.005), (title, method)
                else:
                    assert shown == show(value(record)), (title, backbone, method)


def test_every_method_and_size_is_in_every_table_with_the_records_figures(tmp_path, estimates):
    records = sweep(estimates)
    check_tables(only_sweep(render(tmp_path, {"t5": records})), records, ["t5-small", "t5-large"], METHODS)
    # the records differ from method to method, so a ratio or figure taken from the wrong record shows
    assert len({r["memory"]["peak_train_bytes"] for r in records}) == len(records)
    assert len({r["flops"]["train_step"] for r in records}) == len(records)


def _with_failure(estimates: dict, backbone: str, method: str, first: bool = False) -> list[dict]:
    records = [r for r in sweep(estimates) if (r["backbone"], r["method"]) != (backbone, method)]
    broken = failed(estimates, backbone, method)
    return [broken, *records] if first else [*records, broken]


FAILURES = [  # (backbone, method) whose estimate failed, and whether its record comes first in the file
    ("t5-large", "lora", False),
    ("t5-small", "read", True),
    ("t5-large", "full", False),  # no ratio there, but the other methods at that size keep their column
    ("t5-small", "full", True),
]


@pytest.mark.parametrize(("backbone", "method", "first"), FAILURES)
def test_a_failed_estimate_is_a_dash_and_its_error_is_listed(tmp_path, estimates, backbone, method, first):
    records = _with_failure(estimates, backbone, method, first)
    text = render(tmp_path, {"t5": records})
    check_tables(only_sweep(text), records, ["t5-small", "t5-large"], METHODS)
    assert f"`{method}` on `{backbone}`: RuntimeError: this method cannot be built" in text
    assert "t5: batch 2 x 8 tokens, float32, cuda kernels" in sections(text)  # from an ok record, whichever comes first


def test_a_method_that_failed_at_every_size_keeps_its_row(tmp_path, estimates):
    records = [*sweep(estimates), *(failed(estimates, name, "broken") for name in SIZES)]
    found = only_sweep(render(tmp_path, {"t5": records}))
    check_tables(found, records, ["t5-small", "t5-large"], [*METHODS, "broken"])
    assert found[FITS][1]["broken"] == ["-", "-", "-"]  # not estimated, which is not "fits nowhere"


# --- the largest model that fits -------------------------------------------------------------------------

FIT_CASES = [  # peak training bytes of (t5-small, t5-large) -> the largest fitting at 24, 80, 141 GiB
    ((1 * GIB, 24 * GIB), ["t5-large", "t5-large", "t5-large"]),  # exactly at the boundary fits
    ((1 * GIB, 24 * GIB + 1), ["t5-small", "t5-large", "t5-large"]),  # one byte over does not
    ((24 * GIB + 1, 80 * GIB), ["none", "t5-large", "t5-large"]),
    ((24 * GIB, 80 * GIB + 1), ["t5-small", "t5-small", "t5-large"]),
    ((80 * GIB + 1, 141 * GIB), ["none", "none", "t5-large"]),
    ((141 * GIB, 141 * GIB + 1), ["none", "none", "t5-small"]),
    ((141 * GIB + 1, 200 * GIB), ["none", "none", "none"]),
]


@pytest.mark.parametrize(("peaks", "expected"), FIT_CASES)
def test_the_largest_model_that_fits_each_gpu_size(tmp_path, estimates, peaks, expected):
    records = sweep(estimates)
    for record in records:
        if record["method"] == "lora":
            record["memory"]["peak_train_bytes"] = dict(zip(SIZES, peaks, strict=True))[record["backbone"]]
    columns, rows = only_sweep(render(tmp_path, {"t5": records}))[FITS]
    assert columns == ["24 GiB", "80 GiB", "141 GiB"]
    assert rows["lora"] == expected
    assert rows["full"] == ["t5-large"] * 3  # tiny-t5's real peaks are a few MiB
    assert sorted(rows) == METHODS


def test_the_largest_fitting_model_ignores_a_size_whose_estimate_failed(tmp_path, estimates):
    records = _with_failure(estimates, "t5-large", "lora")
    assert only_sweep(render(tmp_path, {"t5": records}))[FITS][1]["lora"] == ["t5-small"] * 3


# --- READ against the paper ------------------------------------------------------------------------------

READ_SECTION = "READ on T5-large against the paper's claim"


@pytest.mark.parametrize("scale", [1.0, 0.3, 2.5])  # READ's peak as given, and made a saving and a cost
def test_read_on_t5_large_is_shown_beside_the_papers_claim(tmp_path, estimates, scale):
    records = sweep(estimates)
    at_large = {r["method"]: r for r in records if r["backbone"] == "t5-large"}
    read, full = at_large["read"], at_large["full"]
    read["memory"]["peak_train_bytes"] = int(read["memory"]["peak_train_bytes"] * scale)
    saving = read["memory"]["peak_train_bytes"] / full["memory"]["peak_train_bytes"] - 1
    section = sections(render(tmp_path, {"t5": records}))[READ_SECTION]
    _, rows = tables("x:\n\n" + section.split("\n\n", 1)[1])["x:"]
    assert rows["predicted here (peak training memory)"] == [
        size(full["memory"]["peak_train_bytes"]),
        size(read["memory"]["peak_train_bytes"]),
        f"{saving:+.0%}",
    ]
    assert rows["READ paper (arXiv 2305.15348)"] == ["", "", f"{PAPER_READ_SAVING:+.0%}"] == ["", "", "-56%"]
    assert "batch 2 x 8 tokens, float32, cuda kernels" in section


@pytest.mark.parametrize("missing", ["read", "full"])
def test_no_read_section_without_both_t5_large_records(tmp_path, estimates, missing):
    for folder in ("failed", "absent"):
        (tmp_path / folder).mkdir()
    assert READ_SECTION not in render(tmp_path / "failed", {"t5": _with_failure(estimates, "t5-large", missing)})
    absent = [r for r in sweep(estimates) if (r["backbone"], r["method"]) != ("t5-large", missing)]
    assert READ_SECTION not in render(tmp_path / "absent", {"t5": absent})
    assert READ_SECTION in render(tmp_path, {"t5": sweep(estimates)})


# --- the header and the optional files --------------------------------------------------------------------

HEADERS = [  # which record heads the sweep -> its settings as the section's title shows them
    ("fp32", "t5: batch 2 x 8 tokens, float32, cuda kernels"),
    ("bf16", "t5: batch 2 x 8 tokens, bf16 autocast, float32 weights, cuda kernels"),
    ("cpu", "t5: batch 2 x 8 tokens, float32, cpu kernels"),
]


@pytest.mark.parametrize(("which", "title"), HEADERS)
def test_the_section_title_shows_the_records_batch_length_precision_and_kernels(tmp_path, estimates, which, title):
    head = copy.deepcopy(estimates[("t5-small", "full")] if which == "fp32" else estimates[which])
    head["backbone"] = "t5-small"
    records = [head, *(r for r in sweep(estimates) if r["method"] != "full" or r["backbone"] != "t5-small")]
    assert title in sections(render(tmp_path, {"t5": records}))


@pytest.mark.parametrize("command", [None, "petlprof estimate --backbone t5-small,t5-large --output reports/x"])
@pytest.mark.parametrize("speed", [None, "## How long the estimates take\n\nsome minutes"])
def test_command_and_speed_are_shown_when_present(tmp_path, estimates, command, speed):
    text = render(tmp_path, {"t5": sweep(estimates)}, command=command, speed=speed)
    assert ("```bash\n" + command + "\n```" in text) if command else "```" not in text
    assert (speed in text) if speed else "How long" not in text


def test_the_module_renders_each_sweep_in_the_order_given(tmp_path, estimates, monkeypatch, capsys):
    for name in ("t5", "llama"):
        (tmp_path / name).mkdir()
        records = sweep(estimates) if name == "t5" else [{**estimates["bf16"], "backbone": "llama-3.2-1b"}]
        (tmp_path / name / "estimates.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    monkeypatch.setattr(sys, "argv", ["scaling", str(tmp_path), "t5", "llama"])
    runpy.run_path(scaling.__file__, run_name="__main__")
    assert capsys.readouterr().out.strip() == str(tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    assert f"`python -m petlprof.estimate.scaling {tmp_path} t5 llama`" in text.replace("\n", " ")
    titles = list(sections(text))
    assert titles[:2] == [
        "t5: batch 2 x 8 tokens, float32, cuda kernels",
        "llama: batch 2 x 8 tokens, bf16 autocast, float32 weights, cuda kernels",
    ]
    assert titles[2] == READ_SECTION
    assert tables(sections(text)[titles[1]])[FITS][1] == {"full": ["llama-3.2-1b"] * 3}
