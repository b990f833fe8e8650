"""Shared fixtures: a tiny but real configuration that trains in seconds on a CPU."""

import atexit
import fcntl
import getpass
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from forkserver import POSBENCH
from omegaconf import OmegaConf

# Tests never touch the network, and progress bars would only clutter the logs.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TQDM_DISABLE"] = "1"
# Inductor puts its cache directory into os.environ the first time a test compiles in this
# process: set here to the directory it would choose (torch's default_cache_dir), the session's
# environment has it from the start and a later command's does not differ from the server's.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), "torchinductor_" + getpass.getuser().replace("\\", "_")),
)
# The environment the fork server starts in (forked_python): the session's, not that of the
# test that happens to start it; one started under a test's monkeypatched TQDM_DISABLE or
# OMP_* would run every later command, whose environment differs, as a process of its own.
# Taken once the tests are collected: what their modules import sets variables too (OpenMP's
# KMP_INIT_AT_FORK), and a server without them ran every command as a process of its own.
SESSION_ENV: dict[str, str] = {}


def pytest_collection_finish(session) -> None:
    SESSION_ENV.update(os.environ)


# The module of posbench.train, the training function: tests that replace what it calls
# (train_steps, registered_threads) take it from here.
train_module = importlib.import_module("posbench.training.train")

# pytest-xdist runs one worker per core (pyproject's addopts). Each worker keeps to a core of
# its own, and so do the posbench processes it starts (threads=auto counts the affinity mask):
# two workers that each used every core would thrash, about 10x slower on two cores.
_worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
if _worker and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cores[int(_worker.removeprefix("gw")) % len(_cores)]})


# One layer, width 32, 16-token training windows: every encoding trains in a few seconds and
# still ends clearly below the data's unigram baseline. One thread: threads=auto would measure
# the machine, and a busy one would give a test another count than a quiet one (and adapt it
# while training); tests of auto name it.
TINY_RUN = [
    "threads=1",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "train.seq_len=16",
    "train.steps=40",
    "train.batch_size=16",
    "train.lr=1e-2",
    "train.min_lr=1e-3",
    "train.warmup_steps=5",
    "train.log_every=5",
    "train.val_every=20",
    "train.val_batches=2",
    "eval.lengths=[16,32,64]",
    "eval.max_tokens=4096",
]
# A small synthetic corpus: a sparser chain than the default's, which 40 steps learn, and
# documents short enough for its splits to hold dozens.
TINY_SYNTHETIC = [
    "data.train_tokens=40000",
    "data.val_tokens=8192",
    "data.successors=2",
    "data.document_length=512",
]
TINY = [*TINY_RUN, *TINY_SYNTHETIC]
# TINY_RUN evaluates corpus windows (eval.lengths): a task run sets eval.task_lengths instead.
TINY_TASK_RUN = [o for o in TINY_RUN if not o.startswith("eval.lengths=")]
# A task whose batches vary in width (problems of 1 to 10 bits, answers as long), scored at 10.
TINY_REVERSE_STRING = [
    *TINY_TASK_RUN,
    "data=reverse_string",
    "data.train_lengths=[1,10]",
    "data.val_examples=8",
    "train.seq_len=32",
    "eval.task_lengths=[10]",
]


def chunked_calls(monkeypatch, min_elements: int = 0) -> list[int]:
    """One entry per call of F.linear_cross_entropy from now on (its rows), which posbench's
    NLL (posbench.model.loss.next_token_nll) takes for logits of ``min_elements`` or more (0: the
    tests' small ones too)."""
    import torch

    import posbench.model.loss

    monkeypatch.setattr(posbench.model.loss, "CHUNKED_LOSS_MIN_ELEMENTS", min_elements)
    calls = []
    chunked = torch.nn.functional.linear_cross_entropy

    def counted(hidden, *args, **kwargs):
        calls.append(len(hidden))
        return chunked(hidden, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", counted)
    return calls


def terabyte_split() -> np.ndarray:
    """A read-only uint8 split of 2**40 bytes (all 7) that takes no memory: code that copies
    the whole split fails with MemoryError, code that reads windows of it passes."""
    return np.lib.stride_tricks.as_strided(
        np.full(1, 7, dtype=np.uint8), shape=(1 << 40,), strides=(0,), writeable=False
    )


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One data cache for the whole session, also used by CLI subprocesses."""
    path = tmp_path_factory.mktemp("posbench-cache")
    os.environ["POSBENCH_CACHE"] = str(path)
    return path


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory ``name`` as ``build(directory)`` fills it, built once in the whole test
    session: pytest-xdist's workers (which share the parent of their temporary directories)
    take it from the first worker that asks, which builds it while the others wait. For runs
    that tests read and never write: copy one to change it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (path / ".built").is_file():
            shutil.rmtree(path, ignore_errors=True)  # a build that failed half way
            path.mkdir()
            build(path)
            (path / ".built").touch()
    return path


@pytest.fixture
def tiny(cache_dir):
    """Overrides for a tiny run with the session's data cache."""
    return [*TINY, f"data.cache_dir={cache_dir}"]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA GPU: without one they are skipped (on a GPU,
    benchmarks/gpu_check.sh runs them with ``-m cuda``)."""
    cuda_tests = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_tests:
        return
    import torch  # only when there are CUDA tests to decide on

    if not torch.cuda.is_available():
        for item in cuda_tests:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


def finished_run(path: Path, encoding: str, results: dict, seed: int = 0) -> Path:
    """A run directory as a report reads it: a config.yaml of a one-layer run trained at 16
    tokens with ``encoding`` and ``seed``, and ``results`` as its results.json."""
    path.mkdir(parents=True)
    config = {
        "seed": seed,
        "encoding": {"name": encoding},
        "model": {"n_layer": 1, "d_model": 8},
        "train": {"seq_len": 16, "steps": 1},
    }
    OmegaConf.save(OmegaConf.create(config), path / "config.yaml")
    (path / "results.json").write_text(json.dumps(results))
    return path


def error_line(capsys, *args: str) -> str:
    """What ``posbench ARGS`` (run in this process, through posbench.cli.main) prints on its one
    error line, exit code 2."""
    from posbench.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(args))
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ")
    return line.removeprefix("error: ")


FORKSERVER = Path(__file__).with_name("forkserver.py")
# The fork servers started by this worker, by the variables read at import that they set over
# the session's environment (forked_python): none for most commands, a rank's for torchrun's.
_forkservers: dict[tuple[tuple[str, str], ...], subprocess.Popen] = {}
# What torchrun sets for its ranks that an import reads: OMP_NUM_THREADS, to 1 where unset.
RANK_ENV = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def forked_posbench(env: dict[str, str] | None = None) -> list[str]:
    """The command that runs ``posbench ARGS`` forked from this worker's warm interpreter
    (tests/forkserver.py: the same program without 2.5 s of imports a command); the server
    starts on first use and ends with the worker. ``env``: as forked_python's."""
    return [*forked_python(env), *POSBENCH]


def forked_python(env: dict[str, str] | None = None) -> list[str]:
    """The command that stands for ``python``: ``python ARGS`` forked likewise where ARGS run
    posbench, ``-c`` code or a script (``SCRIPT.py ...``), else a process of its own. ``env``:
    variables read at import that the commands' environment sets over the session's (a torchrun
    rank's RANK_ENV): those that differ from the session's get a server started with them."""
    key = tuple(sorted((k, v) for k, v in (env or {}).items() if SESSION_ENV.get(k) != v))
    name = "-".join([f"{os.getpid()}", *(f"{k}={v}" for k, v in key)])
    if key not in _forkservers:
        server = subprocess.Popen(
            [sys.executable, str(FORKSERVER), "--serve", name],
            stdout=subprocess.PIPE,
            text=True,
            env={**SESSION_ENV, **dict(key)},
        )
        assert server.stdout.readline().strip() == "ready", "the fork server did not start"
        atexit.register(server.terminate)
        _forkservers[key] = server
    return [sys.executable, "-I", "-S", str(FORKSERVER), "--socket", name, "--"]


def child_processes(parent: int) -> Iterator[Path]:
    """The /proc directories of the processes whose parent is ``parent`` (Linux); one that
    exits while they are read is left out."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                yield stat.parent
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile


def command_pid(client: subprocess.Popen, cwd: Path) -> int | None:
    """The pid of the process that runs the command ``client`` (started with forked_python's
    command in ``cwd``) stands for: the fork server's child in ``cwd``, or ``client`` itself
    once it runs the command as a process of its own; None until it is one or the other
    (Linux: read from /proc)."""
    for server in _forkservers.values():
        for child in child_processes(server.pid):
            try:
                if (child / "cwd").resolve(strict=True) == cwd.resolve():
                    return int(child.name)
            except OSError:
                continue  # exited meanwhile
    try:
        own = b"--socket" not in Path(f"/proc/{client.pid}/cmdline").read_bytes()
    except OSError:
        return None
    return client.pid if own else None


def posbench(
    *args, cwd, check: bool = True, env: dict | None = None, executable: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``posbench ARGS`` (str() of each) in ``cwd``, with ``env`` over this environment;
    with ``check``, a failure fails the test with the command's stderr. ``executable``: a
    ``posbench`` of another install (else this one's, forked: ``forked_posbench``)."""
    command = [executable] if executable else forked_posbench()
    result = subprocess.run(
        [*command, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"posbench {' '.join(map(str, args))} failed:\n{result.stderr}")
    return result
