"""``posbench`` commands (and Python programs) for the tests, each forked from one interpreter
that imported posbench.

A ``posbench ...`` that a test or a docs block runs would otherwise start a Python process
that spends about 2.5 s of CPU importing torch, Hydra and posbench before a run that is often
shorter; so would a docs page's ``python`` block or a benchmark script. Here a server imports
them once, then forks a child per command; the child takes the caller's arguments, working
directory, environment and standard streams (their file descriptors, passed over a Unix
socket) and runs ``posbench.cli.main`` as ``python -m posbench`` would, or the code or script
as ``python`` would. The caller runs the client (this file with ``--socket``), which stands
for the interpreter: it forwards the signals a shell or a test sends (SIGINT, SIGTERM, ...)
to the child and exits as the child exited.

What a fresh process would do differently, and how it is kept out:

* an import reads some environment variables once (OpenMP's and torch's, Python's, Hugging
  Face's, matplotlib's): where the caller's values of those differ from the server's, the
  client runs the command as a process of its own instead;
* a client killed with SIGKILL cannot pass it on, so tests that kill with it kill the command's
  own process (conftest.command_pid, tests/test_faults.py);
* the child's parent is the server, not the caller: posbench never reads its parent.

    python tests/forkserver.py --serve NAME     # the server (conftest.py starts one per worker)
    python -I -S tests/forkserver.py --socket NAME -- -m posbench.cli ARGS...  # posbench ARGS
    python -I -S tests/forkserver.py --socket NAME -- -c CODE [ARGS...]        # python -c CODE
    python -I -S tests/forkserver.py --socket NAME -- SCRIPT.py [ARGS...]      # python SCRIPT.py
"""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import types

# Environment variables read at import time by what the server imports, by prefix (tqdm's
# TQDM_* become its defaults when it is imported).
READ_AT_IMPORT = (
    "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA_", "PYTHON",
    "LD_", "MALLOC_", "HF_", "MPL", "TOKENIZERS_", "TQDM_",
)  # fmt: skip
# What torchrun sets for its ranks that matches READ_AT_IMPORT but is read at run time only (the
# elastic agent's run id, restarts and error file; NCCL's error handling when a process group
# starts): a rank forks from a server whose environment lacks them.
READ_AT_RUN_TIME = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
HEADER = struct.Struct("!I")  # the length of the request's JSON, sent with the three streams
POSBENCH = ["-m", "posbench.cli"]  # the interpreter's arguments that run posbench


def read_at_import(env: dict[str, str]) -> dict[str, str]:
    return {
        key: value
        for key, value in env.items()
        if key.startswith(READ_AT_IMPORT) and not key.startswith(READ_AT_RUN_TIME)
    }


def address(name: str) -> str:
    """An abstract Unix socket (Linux): no file to clean up, no path-length limit to meet."""
    return "\0posbench-forkserver-" + name


# ------------------------------------------------------------------------------ the client


def forks(argv: list[str]) -> bool:
    """Whether the server runs ``python ARGV`` itself: posbench's command, ``-c`` code or a
    script."""
    script = bool(argv) and argv[0].endswith(".py")
    return argv[:2] == POSBENCH or (argv[:1] == ["-c"] and len(argv) > 1) or script


def run_as_own_process(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def ask(name: str, argv: list[str], env: dict[str, str], streams: list[int]):
    """Send the server a command, ``python ARGV``; its replies, a line each: the child's pid
    then its wait status, or "own process". Raises OSError where no server listens."""
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": env}).encode()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.connect(address(name))
    socket.send_fds(server, [HEADER.pack(len(request))], streams)
    server.sendall(request)
    return server.makefile("r")


def client(name: str, argv: list[str]) -> None:
    try:
        replies = ask(name, argv, dict(os.environ), [0, 1, 2])
    except OSError:  # no server (it ended, or none was started): the command on its own
        run_as_own_process(argv)
    reply = replies.readline().strip()
    if reply == "own process":
        run_as_own_process(argv)
    child = int(reply)
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, lambda signum, _frame: os.kill(child, signum))
    status = int(replies.readline())
    if os.WIFSIGNALED(status):  # die as the child died, as a shell reports it (128 + signal)
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    sys.exit(os.waitstatus_to_exitcode(status))


# ------------------------------------------------------------------------------ the server


def warm_up() -> None:
    """Import what the commands import on their way, so that no child imports it again.
    torch._dynamo among them: a run's optimizer imports it (torch.optim's add_param_group), 860
    modules with sympy, 1.2 of the 2.6 CPU-s a child spent on a 40-step tiny run before."""
    import matplotlib.pyplot  # noqa: F401
    import torch._dynamo
    import torch.utils.tensorboard  # noqa: F401

    import posbench.cli
    import posbench.evaluation.diagnose
    import posbench.evaluation.run
    import posbench.report.figures
    import posbench.training.train  # noqa: F401
    from posbench.config import register_schemas

    register_schemas()  # once a process: cli.main's first step


def run_command(argv: list[str], cwd: str, env: dict[str, str], streams: list[int]) -> None:
    """In the forked child: become ``python ARGV`` (``-m posbench.cli ARGS``, ``-c CODE ...``
    or ``SCRIPT.py ...``) in the caller's place; never returns."""
    import atexit
    import threading
    import traceback

    for target, stream in enumerate(streams):
        os.dup2(stream, target)
        os.close(stream)
    # New stream objects: a fresh interpreter buffers stdout by line only for a terminal.
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""  # python -c imports from the working directory first
            sys.modules["__main__"] = main = types.ModuleType("__main__")
            exec(compile(argv[1], "<string>", "exec"), vars(main))
        elif argv[0].endswith(".py"):
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # the script's neighbours
            runpy.run_path(argv[0], run_name="__main__")
        else:
            from posbench.cli import main

            args = argv[len(POSBENCH) :]
            sys.argv = [os.path.join(os.path.dirname(sys.executable), "posbench"), *args]
            main(args)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (exit.code is not None)
        if isinstance(exit.code, str):
            print(exit.code, file=sys.stderr)
    except BaseException as error:  # as the interpreter prints it: from the code, not from here
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = 1
    threading._shutdown()  # what an interpreter does on its way out: threads, atexit, flush
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(name: str) -> None:
    warm_up()
    own_env = read_at_import(dict(os.environ))
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(name))
    listener.listen(64)
    print("ready", flush=True)
    waiting = {}  # child pid -> the connection its status goes back on
    while os.getppid() == parent:  # the worker that started it is gone: so is the server
        if select.select([listener], [], [], 0.05)[0]:
            connection, _ = listener.accept()
            header, streams, _, _ = socket.recv_fds(connection, HEADER.size, 3)
            (length,) = HEADER.unpack(header)
            data = b""
            while len(data) < length:
                data += connection.recv(length - len(data))
            request = json.loads(data)
            if forks(request["argv"]) and read_at_import(request["env"]) == own_env:
                child = os.fork()
                if child == 0:
                    listener.close()
                    connection.close()
                    for other in waiting.values():
                        other.close()
                    run_command(request["argv"], request["cwd"], request["env"], streams)
                connection.sendall(f"{child}\n".encode())
                waiting[child] = connection
            else:
                connection.sendall(b"own process\n")
                connection.close()
            for stream in streams:  # the caller's, now the child's alone
                os.close(stream)
        while waiting:
            child, status = os.waitpid(-1, os.WNOHANG)
            if child == 0:
                break
            connection = waiting.pop(child)
            connection.sendall(f"{status}\n".encode())
            connection.close()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:  # --socket NAME -- ARGV...
        client(sys.argv[2], sys.argv[4:])
