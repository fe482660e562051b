"""The scaling report (``reports/scaling/README.md``) from ``petlprof estimate`` records.

``python -m petlprof.estimate.scaling FOLDER SWEEP...`` reads ``FOLDER/SWEEP/estimates.jsonl`` for
each sweep (one family of backbones, every method) and writes ``FOLDER/README.md``: peak training
memory and FLOPs per step of each method at each size, their ratios to full fine-tuning, the largest
model each method fits on 24, 80 and 141 GiB, and READ's predicted memory saving on T5-large beside
the READ paper's claim.  Every number in it comes from the records; the commands that made them are
read from ``FOLDER/SWEEP/command.txt``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from petlprof.estimate.command import GIB, flops, size
from petlprof.vocabulary import FP32

FIT_GIB = (24, 80, 141)
PAPER_READ_SAVING = -0.56  # READ (arXiv 2305.15348): 56% less training memory than full fine-tuning on T5-large


def load(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "estimates.jsonl").read_text().splitlines() if line.strip()]


def _grid(records: list[dict]) -> tuple[list[str], list[str], dict]:
    """(backbones by size, methods, {(backbone, method): record}): every backbone with an ok record and
    every method, failed ones included, so a failed estimate is a ``-`` cell rather than a missing row or
    column."""
    ok = [r for r in records if r["status"] == "ok"]
    sizes: dict[str, int] = {}  # a backbone's size: its parameters under full fine-tuning, else its fewest
    for r in sorted(ok, key=lambda r: (r["method"] != "full", r["total_params"])):
        sizes.setdefault(r["backbone"], r["total_params"])
    backbones = sorted(sizes, key=lambda backbone: sizes[backbone])
    methods = sorted({r["method"] for r in records})
    return backbones, methods, {(r["backbone"], r["method"]): r for r in ok}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def sweep_section(records: list[dict]) -> list[str]:
    backbones, methods, cell = _grid(records)

    def rows(figure, ratio: bool) -> list[list[str]]:
        out = []
        for method in methods:
            row = [method]
            for backbone in backbones:
                record, full = cell.get((backbone, method)), cell.get((backbone, "full"))
                if record is None or (ratio and full is None):
                    row.append("-")
                elif ratio:
                    row.append(f"{figure(record) / figure(full):.2f}")
                else:
                    row.append(figure.show(record))
            out.append(row)
        return out

    peak = _Figure(lambda r: r["memory"]["peak_train_bytes"], lambda r: size(r["memory"]["peak_train_bytes"]))
    step = _Figure(lambda r: r["flops"]["train_step"], lambda r: flops(r["flops"]["train_step"]))
    header = ["method", *backbones]
    lines = ["Peak training memory per step:", "", *_table(header, rows(peak, False)), ""]
    lines += ["Peak training memory, ratio to `full`:", "", *_table(header, rows(peak, True)), ""]
    lines += ["FLOPs of one training step:", "", *_table(header, rows(step, False)), ""]
    lines += ["FLOPs of one training step, ratio to `full`:", "", *_table(header, rows(step, True)), ""]
    fit_rows = []
    for method in methods:
        row = [method]
        for gib in FIT_GIB:
            fitting = [b for b in backbones if (b, method) in cell and peak(cell[(b, method)]) <= gib * GIB]
            estimated = any((b, method) in cell for b in backbones)
            row.append(fitting[-1] if fitting else "none" if estimated else "-")
        fit_rows.append(row)
    lines += ["Largest model whose training step fits:", ""]
    lines += [*_table(["method", *(f"{gib} GiB" for gib in FIT_GIB)], fit_rows), ""]
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        lines += ["Failed estimates (`-` above):", ""]
        lines += [*(f"- `{r['method']}` on `{r['backbone']}`: {r['error']}" for r in failed), ""]
    return lines


class _Figure:
    def __init__(self, value, show):
        self.value, self.show = value, show

    def __call__(self, record: dict) -> float:
        return self.value(record)


def read_vs_paper(records: list[dict]) -> list[str]:
    _, _, cell = _grid(records)
    read, full = cell.get(("t5-large", "read")), cell.get(("t5-large", "full"))
    if read is None or full is None:
        return []
    saving = read["memory"]["peak_train_bytes"] / full["memory"]["peak_train_bytes"] - 1
    return [
        "## READ on T5-large against the paper's claim",
        "",
        *_table(
            ["", "full", "read", "READ vs full"],
            [
                [
                    "predicted here (peak training memory)",
                    size(full["memory"]["peak_train_bytes"]),
                    size(read["memory"]["peak_train_bytes"]),
                    f"{saving:+.0%}",
                ],
                ["READ paper (arXiv 2305.15348)", "", "", f"{PAPER_READ_SAVING:+.0%}"],
            ],
        ),
        "",
        f"Predicted here: batch {full['batch_size']} x {full['max_length']} tokens, {_numerics(full)}, peak live "
        "tensor bytes (no allocator cache, no CUDA context). The paper measured the GPU memory of its own GLUE runs, "
        "at its own batch sizes and lengths, so the two figures answer the same question in different settings.",
        "",
    ]


def _numerics(record: dict) -> str:
    """The dtype the step computes in and whose kernels it assumes, as the record says."""
    precision = record.get("precision", FP32)
    dtype = record.get("dtype") if precision == FP32 else f"{precision} autocast, float32 weights"
    return f"{dtype}, {record.get('kernels', 'cuda')} kernels"


def write_report(folder: Path, sweeps: list[str]) -> Path:
    lines = ["# Scaling: every method's memory and compute from T5-small to T5-11B and LLaMA 1B to 70B", ""]
    lines += [
        "Made by `petlprof estimate` (meta-device trace, no weights; see docs/estimating.md for what each figure",
        f"is) and rendered by `python -m petlprof.estimate.scaling {folder} {' '.join(sweeps)}`.",
        "",
    ]
    everything = []
    for sweep in sweeps:
        records = load(folder / sweep)
        everything += records
        first = next((r for r in records if r["status"] == "ok"), records[0])  # a failed record has no dtype
        lines += [f"## {sweep}: batch {first['batch_size']} x {first['max_length']} tokens, {_numerics(first)}", ""]
        command = folder / sweep / "command.txt"
        if command.exists():
            lines += ["```bash", command.read_text().strip(), "```", ""]
        lines += sweep_section(records)
    lines += read_vs_paper(everything)
    speed = folder / "speed.md"  # how long the estimates took, measured separately
    if speed.exists():
        lines += [speed.read_text().strip(), ""]
    path = folder / "README.md"
    path.write_text("\n".join(lines))
    return path


if __name__ == "__main__":
    print(write_report(Path(sys.argv[1]), sys.argv[2:]))
