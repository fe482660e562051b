"""Tables of rows from files: reading a CSV/TSV/JSON Lines/Parquet file, finding a folder's train and eval
files, checking columns, and splitting or subsampling the rows with a seed.

Shared by the labelled tasks (:mod:`petlprof.tasks.labelled`: the user's files, GLUE's local files) and the
prompt/target tasks (:mod:`petlprof.tasks.generative`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from petlprof.errors import UsageError
from petlprof.values import check_file

if TYPE_CHECKING:
    import pandas as pd

# Fraction of the rows held out for evaluation when one pool of data has to be split.
EVAL_FRACTION = 0.2
FILE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")
USER_EVAL_STEMS = ("validation", "dev", "test")


def read_sources(data_path: str, val_file: str | None = None) -> dict[str, pd.DataFrame]:
    """The user's data as frames by where they come from: the one file, or a folder's train and eval files
    (in that order), then the validation file ``val_file`` when one is given (under :func:`val_key`)."""
    path = Path(data_path)
    if path.is_dir():
        train_path = find_split_file(path, ("train",), "train")
        eval_path = find_split_file(path, USER_EVAL_STEMS, "eval")
        sources = {str(train_path): read_table(train_path), str(eval_path): read_table(eval_path)}
    else:
        sources = {data_path: read_table(path)}
    if val_file is None:
        return sources
    validation = Path(val_file)
    if not validation.exists():
        raise UsageError(f"--val-file '{val_file}': no such file")
    if any(validation.resolve() == Path(where).resolve() for where in sources):
        raise UsageError(
            f"--val-file '{val_file}' is one of the task's own data files: the validation split must be disjoint "
            "from the training and evaluation examples"
        )
    check_file(validation, "--val-file")  # a FIFO or a device would never end
    return {**sources, val_key(val_file): read_table(validation)}


def shared_rows(first: pd.DataFrame, second: pd.DataFrame) -> int:
    """Rows of ``first`` equal, in every column both frames have, to a row of ``second``."""
    columns = [c for c in first.columns if c in second.columns]
    if not columns:
        return 0
    seen = set(second[columns].astype(str).itertuples(index=False, name=None))
    return sum(row in seen for row in first[columns].astype(str).itertuples(index=False, name=None))


def val_key(val_file: str) -> str:
    """Where the validation file's frame stands among the sources (its path as given, normalised)."""
    return str(Path(val_file))


def split_frames(
    data_path: str,
    sources: dict[str, pd.DataFrame],
    train_size: int | None,
    eval_size: int | None,
    split_seed: int,
    val_size: int | None = None,
    val_file: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame, str]:
    """(train frame, validation frame or None, eval frame, how they were split) of the user's data: a folder's
    files each subsampled, or one file split EVAL_FRACTION with ``split_seed``; the validation rows come out of
    the training pool (:func:`take_train`), or are ``val_file``'s (all, or ``val_size`` drawn with ``split_seed``),
    the training rows then being those of a run without a validation split."""
    if val_file is not None:
        sources = dict(sources)
        validation = subsample(sources.pop(val_key(val_file)), val_size, split_seed).reset_index(drop=True)
        train, _, evaluation, how = split_frames(data_path, sources, train_size, eval_size, split_seed)
        shared = shared_rows(validation, evaluation)
        if shared:
            raise UsageError(
                f"--val-file '{val_file}' shares {shared} row(s) with the evaluation split: every decision read from "
                "it would read examples the runs are scored on; remove them from the file (or give another one)"
            )
        return train, validation, evaluation, f"{how}, validation file {Path(val_file).name}"
    if len(sources) == 2:
        train, evaluation = sources.values()
        train_name, eval_name = (Path(where).name for where in sources)
        return (
            *take_train(train, train_size, val_size, split_seed, data_path),
            subsample(evaluation, eval_size, split_seed),
            f"{train_name}/{eval_name}",
        )
    first = next(iter(sources.values()))
    if len(first) < 2:
        raise UsageError(
            f"{data_path} has {len(first)} row; a single data file needs at least 2 "
            f"(it is split {1 - EVAL_FRACTION:.0%}/{EVAL_FRACTION:.0%} into train and eval)"
        )
    train_pool, eval_pool = pool_split(first, split_seed)
    how = f"{1 - EVAL_FRACTION:.0%}/{EVAL_FRACTION:.0%} split"
    return (
        *take_train(train_pool, train_size, val_size, split_seed, data_path, shuffled=True),
        eval_pool.iloc[:eval_size],
        how,
    )


def read_table(path: Path) -> pd.DataFrame:
    """One CSV/TSV/JSON Lines/Parquet file as a frame; only empty cells count as missing.  Text files are read as
    UTF-8 with or without a byte-order mark (Windows editors write one)."""
    # pandas: slow to import, loaded only when used
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise UsageError(
            f"cannot read '{path}': unsupported file type '{suffix or path.name}'; "
            f"supported: {', '.join(FILE_SUFFIXES)}"
        )
    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(path)
        elif suffix == ".jsonl":
            frame = pd.read_json(path, lines=True, dtype=False, encoding="utf-8-sig")
        else:
            sep = "\t" if suffix == ".tsv" else ","
            frame = pd.read_csv(path, sep=sep, keep_default_na=False, na_values=[""], encoding="utf-8-sig")
    except (ValueError, OSError) as exc:
        raise UsageError(f"cannot read '{path}' as {suffix[1:].upper()}: {exc}") from exc
    if frame.empty:
        raise UsageError(f"'{path}' has no rows")
    return frame


def find_split_file(folder: Path, stems: tuple[str, ...], role: str) -> Path:
    """The single ``<stem>.<suffix>`` file in ``folder``, trying ``stems`` in order."""
    for stem in stems:
        found = [path for path in (folder / f"{stem}{suffix}" for suffix in FILE_SUFFIXES) if path.is_file()]
        if len(found) > 1:
            raise UsageError(
                f"folder '{folder}' has several {stem} files ({', '.join(p.name for p in found)}); keep one"
            )
        if found:
            return found[0]
    wanted = ", ".join(f"{stem}.*" for stem in stems)
    present = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
    raise UsageError(
        f"folder '{folder}' has no {role} file: expected one of {wanted} "
        f"({'/'.join(FILE_SUFFIXES)}); it holds {present}"
    )


def require_columns(frame: pd.DataFrame, columns, where: str) -> None:
    """Each named column (None entries skipped) must exist and have no empty cells."""
    for column in filter(None, columns):
        if column not in frame.columns:
            raise UsageError(f"{where} has no column '{column}'; its columns: {', '.join(map(str, frame.columns))}")
        missing = frame[column].isna().to_numpy()
        if missing.any():
            raise UsageError(
                f"{where}: column '{column}' has {int(missing.sum())} empty cells "
                f"(the first in data row {int(missing.argmax()) + 1})"
            )


def pool_split(frame: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Shuffle once with ``seed``; the last EVAL_FRACTION is the eval pool, the rest the train pool."""
    # numpy: slow to import, loaded only when used
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(frame))
    n_eval = max(1, round(len(frame) * EVAL_FRACTION))
    shuffled = frame.iloc[order].reset_index(drop=True)
    return shuffled.iloc[:-n_eval], shuffled.iloc[-n_eval:]


def check_val_size(val_size: int, pool: int, task: str) -> None:
    """A validation split must leave at least one training example in the pool it is carved from."""
    if val_size >= pool:
        raise UsageError(
            f"--val-size {val_size} leaves no training data: the training pool of '{task}' has {pool} "
            f"example{'s' if pool != 1 else ''}" + (f"; give at most {pool - 1}" if pool > 1 else "")
        )


def take_train(
    pool: pd.DataFrame, size: int | None, val_size: int | None, seed: int, task: str, shuffled: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(training rows, validation rows or None) of a training ``pool``.  Without ``val_size`` the training rows
    are those of today: ``subsample``'s, or the first ``size`` of a pool already ``shuffled``.  With it, the
    validation rows are the last ``val_size`` of the pool's ``seed``-seeded order (a shuffled pool's own order),
    and the training rows the first ``size`` of the rest: the same rows as without a validation split whenever
    the pool holds both, so a run that adds one trains on the data it trained on before."""
    # numpy: slow to import, loaded only when used
    import numpy as np

    if not val_size:
        return (pool.iloc[:size] if shuffled else subsample(pool, size, seed)), None
    check_val_size(val_size, len(pool), task)
    keep = len(pool) - val_size
    order = np.arange(len(pool)) if shuffled else np.random.default_rng(seed).permutation(len(pool))
    if size is not None and size <= keep:
        train = pool.iloc[order[:size]]
    else:  # all the rest, in the pool's order (as subsample keeps every row in file order)
        train = pool.iloc[np.sort(order[:keep])]
    return train.reset_index(drop=True), pool.iloc[order[keep:]].reset_index(drop=True)


def subsample(frame: pd.DataFrame, size: int | None, seed: int) -> pd.DataFrame:
    """All rows in file order, or a seeded random ``size`` of them (larger sizes keep all)."""
    # numpy: slow to import, loaded only when used
    import numpy as np

    if size is None or size >= len(frame):
        return frame
    return frame.iloc[np.random.default_rng(seed).permutation(len(frame))[:size]].reset_index(drop=True)
