"""Shared fixtures: the hub is never reached from tests, and tiny presets are cached per session.

Under ``pytest -n N`` (pytest-xdist; ``-n auto``: one worker more than the cores) each worker, and every
process its tests start, gets the machine's cores divided by N (at least 1) as its thread count
(``OMP_NUM_THREADS``, unless set), and the slow tests are handed out first, so the workers finish together
instead of one waiting for another's last Ray test.  What collection imported is frozen out of the garbage
collector's scans, and every test starts with the signal mask it would have in a fresh process.
"""

from __future__ import annotations

import gc
import os
import signal
import warnings

import pytest

from petlprof.run.libraries import gc_paused

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker more than the cores.  Many slow tests wait on processes they start (sweeps, Ray
    instances, torchrun ranks); a third worker on 2 cores fills those waits (the suite took 393 s with 3 workers,
    431 s with 2, measured alone on 2 cores)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):  # pytest-xdist's own override, kept
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return len(os.sched_getaffinity(0)) + 1


def threads_per_worker() -> int | None:
    """The cores each of pytest-xdist's workers may use (at least 1); None outside a worker.  Without it,
    every worker's torch spins a pool as large as the whole machine: on 2 cores with 2 workers, tests
    took 2-3x the CPU time."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return None
    return max(1, len(os.sched_getaffinity(0)) // int(workers))


if (_threads := threads_per_worker()) is not None:  # before torch is imported, so its pool is sized once
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, str(_threads))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``--dist loadscope`` (pyproject's addopts) without ``-n``: no distribution, as pytest-xdist itself
    reads ``-n 0``.  Left as given, pytest-benchmark took the run for a distributed one and disabled every
    benchmark (each timed once, no statistics, no ``--benchmark-json``), under ``pytest tests/benchmarks
    --benchmark-enable`` too."""
    if not getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") != "no":
        config.option.dist = "no"


def pytest_configure(config):
    """A process that runs tests imports the run's libraries the way a run's process does
    (:func:`petlprof.run.libraries.import_runtime_libraries`: bitsandbytes' kernels compiled on first use, not
    at import); the xdist controller, which runs none, imports nothing."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        from petlprof.run.libraries import import_runtime_libraries

        import_runtime_libraries(freeze=True)  # they live as long as this process, as in a run's worker


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Collection with the garbage collector paused (as a run's imports are: petlprof.run.libraries.gc_paused): the
    test modules' imports and the 3,500 items made collections that scanned everything imported so far, 2.5 s of
    each process's 10 s of collection, measured here.  What it made lives as long as this process: frozen out of the
    collector's scans before the pause ends (as a run's worker freezes its imports, import_runtime_libraries), so no
    collection scans it again (a run collects garbage before each phase, and each collection walked half a million
    objects, 0.25 s: 15-20 % of the CPU time of modules that run in this process), nor once at the end of the pause
    (a collection, then the freeze, took 0.6 s of each process's collection)."""
    with gc_paused():
        yield
        gc.freeze()


# slow modules whose tests share no module- or class-scoped fixture: under ``--dist loadscope`` their tests are
# handed out one by one, not as one module to one worker (the three Ray driver kills alone took 2-3 minutes on
# one worker while the others had finished)
EACH_TEST_APART = frozenset(
    f"tests/{name}.py"
    for name in (
        "test_contention",
        "test_estimate_speed",
        "test_faults",
        "test_libraries",
        "test_notebook",
        "test_random_init",
        "test_ray_driver",
        "test_sweep",
    )
)


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``loadscope`` scheduling, with each test of :data:`EACH_TEST_APART` a scope of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class SlowTestsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::", 1)[0] in EACH_TEST_APART:
                return nodeid
            return super()._split_scope(nodeid)

    return SlowTestsApart(config, log)


def pytest_collection_modifyitems(config, items):
    import torch

    if os.environ.get("PYTEST_XDIST_WORKER"):  # the slow modules first (a stable sort keeps each module whole)
        items.sort(key=lambda item: "slow" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from a thread pool, and on a shared 2-core machine its spinning costs
    up to 10x: modules of tiny-model tests use this (``pytestmark = pytest.mark.usefixtures(...)``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _quiet_known_warnings():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


@pytest.fixture(autouse=True)
def _signal_mask_as_it_was():
    """``execute_in_subprocess`` returns with SIGINT/SIGTERM held for its caller (a sweep releases them once
    the record is stored).  A test that calls it directly would leave them blocked in this process, and
    every process a later test starts would inherit the block: its ``terminate()`` then did nothing (a
    stopped run went on for seconds, until a timeout's SIGKILL or its own end)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(autouse=True)
def _no_device_profile_of_the_developers(tmp_path_factory, monkeypatch):
    """Device profiles (``petlprof calibrate``) from a folder of the test session's own, empty unless a test makes
    one: a developer's calibrated profile in ~/.cache would otherwise make every test sweep predict its runs (and
    carry ``predicted`` in its records), where CI's fresh machine predicts nothing."""
    monkeypatch.setenv("PETLPROF_PROFILE_DIR", str(tmp_path_factory.getbasetemp() / "device-profiles"))


@pytest.fixture(scope="session")
def lm_folder(tmp_path_factory) -> str:
    """A model folder as a user brings one: a tiny random Llama with its LM head and a word-level tokenizer, saved
    by transformers (safetensors): pretrained weights to petlprof, so its runs take the backbone the warm worker
    kept."""
    # tokenizers, transformers, torch: slow to import, and only the tests that use the folder need them
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    vocab = ["[PAD]", "[UNK]", "<s>", "</s>", *"0123456789+-=", *[f"w{i}" for i in range(83)]]
    word_level = Tokenizer(models.WordLevel({word: i for i, word in enumerate(vocab)}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)
