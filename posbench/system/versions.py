"""What code a run ran (results.json's ``versions``): posbench's version and, when it runs from a
git checkout, the commit and whether tracked files differ from it; torch's and Python's
versions. Runs of one config and seed give the same numbers only under the same code."""

from __future__ import annotations

import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # a clone's top, when posbench runs from one


def code_versions() -> dict[str, Any]:
    commit, dirty = git_state(SOURCE_ROOT)
    try:
        posbench_version = version("posbench")
    except PackageNotFoundError:  # run from a source tree that was never installed
        posbench_version = None
    return {
        "posbench": posbench_version,
        "git_commit": commit,
        "git_dirty": dirty,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """The commit checked out at ``root`` and whether tracked files differ from it, when
    ``root`` is the top of a git work tree (a clone, installed editable or run in place);
    (None, None) when it is not (installed from a wheel, possibly inside some other
    repository) or git cannot say (not installed, or it refuses the directory)."""

    def git(*args: str) -> str:
        ran = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=True
        )
        return ran.stdout

    try:
        if Path(git("rev-parse", "--show-toplevel").strip()).resolve() != root.resolve():
            return None, None
        commit = git("rev-parse", "HEAD").strip()
        return commit, bool(git("status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError):
        return None, None
