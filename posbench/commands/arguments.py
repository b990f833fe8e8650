"""The argparse pieces ``posbench eval`` and ``posbench diagnose`` share: a parser whose errors
are one line, the types of their numeric flags, and ``--run DIR``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from posbench.commands.exits import fail
from posbench.evaluation.reevaluate import default_run
from posbench.system.threads import AUTO


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (argparse prints usage first by default)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def threads_setting(text: str) -> int | str:
    """``--threads``: auto or a positive integer, as the ``threads`` config key."""
    if text == AUTO:
        return AUTO
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected auto or a positive integer, got {text!r}"
        ) from None


def scale_factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def add_run_argument(parser: argparse.ArgumentParser) -> None:
    """``--run DIR``; ``chosen_run`` turns its absence into the newest run."""
    parser.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="run directory (default: the newest run under ./outputs)",
    )


def chosen_run(options: argparse.Namespace) -> Path:
    """``--run``, else the newest run under outputs/, after saying which one and why."""
    if options.run is not None:
        return options.run
    run_dir, why = default_run()
    print(why)
    return run_dir
