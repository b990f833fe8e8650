"""The tests' forked ``posbench`` and ``python -c`` (tests/forkserver.py) do what the
installed command and a fresh interpreter do: the same output and exit status, a stop signal
passed on, and a process of their own where an import would read the environment differently."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import conftest
from conftest import forked_posbench, forked_python
from forkserver import POSBENCH, ask
from test_faults import ENDLESS, start_training, wait_for_checkpoint

from posbench.runs.directory import CHECKPOINT_FILE


def run(command: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def test_the_server_runs_in_the_sessions_environment_whichever_test_starts_it(monkeypatch):
    """A server started under this test's environment would run every later command (which
    has TQDM_DISABLE=1 again) as a process of its own: 2.5 s of imports each."""
    monkeypatch.delenv("TQDM_DISABLE")
    forked_python()  # starts the server where no test of this worker has yet
    server = Path(f"/proc/{conftest._forkservers[()].pid}/environ").read_bytes().split(b"\0")
    assert b"TQDM_DISABLE=1" in server


def test_a_forked_command_prints_and_exits_as_the_installed_command_does():
    bad_length = ["eval", "--length", "0"]
    forked, installed = run([*forked_posbench(), *bad_length]), run(["posbench", *bad_length])
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        installed.returncode,
        installed.stdout,
        installed.stderr,
    )
    assert forked.returncode == 2


def test_an_environment_read_at_import_gets_a_process_of_its_own():
    """OMP_NUM_THREADS is read when torch loads OpenMP, in the server long before: a command
    with another value must start afresh, one with the same may fork, and so may one with the
    variables torchrun sets for a rank that are read at run time only."""
    command = forked_posbench()
    name = command[command.index("--socket") + 1]
    with open(os.devnull, "r+") as devnull:
        streams = [devnull.fileno()] * 3
        help = [*POSBENCH, "--help"]
        other = ask(name, help, {**os.environ, "OMP_NUM_THREADS": "3"}, streams)
        assert other.readline() == "own process\n"
        rank = {"TORCHELASTIC_RUN_ID": "run", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
        for env in (dict(os.environ), {**os.environ, **rank}):
            same = ask(name, help, env, streams)
            assert int(same.readline()) > 0  # the forked child's pid
            assert int(same.readline()) == 0  # its wait status: exited 0


def test_forked_python_code_prints_and_exits_as_a_fresh_interpreter_does(tmp_path):
    """A docs page's python block (tests/test_docs.py): its output, its exit status, its
    traceback's last lines, its ``__main__`` and imports from its working directory."""
    (tmp_path / "nearby.py").write_text("WHERE = 'working directory'\n")
    code = (
        "import sys, nearby\n"
        "print(__name__, sys.argv, nearby.WHERE)\n"
        "print('to stderr', file=sys.stderr)\n"
        "if sys.argv[1:] == ['fail']:\n"
        "    1 / 0\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    for argument in ("0", "3", "fail"):
        forked = subprocess.run(
            [*forked_python(), "-c", code, argument], cwd=tmp_path, capture_output=True, text=True
        )
        fresh = subprocess.run(
            [sys.executable, "-c", code, argument], cwd=tmp_path, capture_output=True, text=True
        )
        assert forked.returncode == fresh.returncode
        assert forked.stdout == fresh.stdout == f"__main__ ['-c', '{argument}'] working directory\n"
        assert forked.stderr.splitlines()[-2:] == fresh.stderr.splitlines()[-2:]
    assert fresh.returncode == 1 and fresh.stderr.endswith("ZeroDivisionError: division by zero\n")


def test_a_stop_signal_reaches_the_forked_run(tmp_path, cache_dir):
    """SIGTERM to the command (as `kill` or SLURM sends it) stops the run after a checkpoint:
    exit 143, as tests/test_faults.py checks of the installed command."""
    run_dir = tmp_path / "run"
    process = start_training(
        tmp_path,
        *ENDLESS,
        "train.checkpoint_every=5",
        f"hydra.run.dir={run_dir}",
        command=forked_posbench(),
    )
    wait_for_checkpoint(run_dir / CHECKPOINT_FILE, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
