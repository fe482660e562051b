"""Entry point of the fresh process a run executes in: ``python -m petlprof.worker SPEC OUT``."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from petlprof.runner import RunSpec, execute


def main(argv: list[str]) -> int:
    spec_path, out_path = (Path(p) for p in argv)
    # PEFT calls a transformers API that transformers 5 deprecated; the warning is not the user's to act on
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    record = execute(RunSpec(**json.loads(spec_path.read_text())))
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
