"""How a command ends when it cannot go on: one line on stderr and the exit code a shell
expects (2 for a mistake, 128 + the signal for Ctrl-C or SIGTERM), for every command alike."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import NoReturn

from posbench.system import distributed


def fail(message: str) -> NoReturn:
    say(f"error: {message}")
    raise SystemExit(2)


def say(message: str) -> None:
    """``message`` on stderr; from rank 0 only when torchrun or SLURM runs several ranks: they
    all meet the same mistakes, and one that rank 0 alone meets stops the others quietly
    (distributed.PeerFailed)."""
    if distributed.is_main():
        print(message, file=sys.stderr)


def debugging() -> bool:
    """``--debug`` sets HYDRA_FULL_ERROR, so Hydra shows full tracebacks too."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def report(err: BaseException) -> NoReturn:
    """``err`` as one line (and its traceback first under --debug), exit 2."""
    if debugging():
        traceback.print_exception(err)
    fail(str(err) or type(err).__name__)


def stop(message: str, exit_code: int) -> NoReturn:
    """A deliberate stop (a signal): one line, the shell's exit code for that signal."""
    say(message)
    raise SystemExit(exit_code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, SLURM pre-emption) outside the training loop, which handles it
    itself: it unwinds like Ctrl-C, so the same clean-up runs, and exits 143."""


def raise_terminated(signum: int, frame: object) -> NoReturn:
    raise Terminated


def stop_interrupted(err: KeyboardInterrupt, detail: str = "") -> NoReturn:
    """One line for Ctrl-C (exit 130) or SIGTERM (exit 143), ``detail`` appended."""
    if isinstance(err, Terminated):
        stop(f"terminated{detail}", 128 + signal.SIGTERM)
    stop(f"interrupted{detail}", 128 + signal.SIGINT)
