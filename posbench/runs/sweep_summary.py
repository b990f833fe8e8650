"""The last lines of a sweep (``posbench train -m``): where its runs are, which jobs failed and
why, and what to run next.

A Hydra callback, so it runs in the process that started the sweep, after every job has
finished, whichever launcher ran them (jobs of joblib or SLURM run elsewhere). A job that fails
on a user's mistake records it in the sweep directory (``record_failed_job``) instead of
raising: Hydra would print its own three lines and a hint about HYDRA_FULL_ERROR for the first
failure only, and none for the others. The summary gives each failed job one line and makes
the sweep exit 2, as a single run's mistake does.

Two sweeps may share one directory, even at once (the randomized-positions sweep beside the
plain one): a record is named after its job's run directory, which differs between them, and
carries the id of the sweep that ran it, so each summary names its own failures only.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from posbench.runs.directory import RESULTS_FILE
from posbench.system.atomic import write_json

FAILED_JOB_PREFIX = ".failed_job_"  # hidden: `posbench report` reads only the runs' folders
# The running sweep's id, set by SweepSummary in the process that starts the sweep; its jobs
# inherit the environment (in that process, or a launcher's workers or SLURM jobs).
SWEEP_ID_VARIABLE = "POSBENCH_SWEEP_ID"


def record_failed_job(
    sweep_dir: Path, run_dir: Path, job: int, overrides: list[str], error: str
) -> None:
    """Note that sweep job number ``job`` (Hydra's job.num), writing ``run_dir``, with these
    overrides failed."""
    sweep = os.environ.get(SWEEP_ID_VARIABLE)
    record = {"job": job, "overrides": overrides, "error": error, "sweep": sweep}
    write_json(sweep_dir / f"{FAILED_JOB_PREFIX}{run_dir.name}.json", record)


def failed_jobs(sweep_dir: Path, sweep: str) -> list[dict[str, Any]]:
    """The records of ``record_failed_job`` in ``sweep_dir`` by the sweep ``sweep``, by job
    number."""
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"{FAILED_JOB_PREFIX}*.json")]
    return sorted((r for r in records if r.get("sweep") == sweep), key=lambda r: r["job"])


def failed_job_line(record: dict[str, Any]) -> str:
    """``error: job 1 (encoding=rope seed=1): <what went wrong and what to do>``."""
    return f"error: job {record['job']} ({' '.join(record['overrides'])}): {record['error']}"


class SweepSummary(Callback):
    """Prints the sweep directory, how many runs it holds, each failed job's error, and the
    command comparing the runs."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # A sweep run again in its directory (train.resume=true) starts with no failures: the
        # earlier run's records carry another id.
        os.environ[SWEEP_ID_VARIABLE] = self.sweep = uuid.uuid4().hex

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = len(list(sweep_dir.glob(f"*/{RESULTS_FILE}")))
        failed = failed_jobs(sweep_dir, self.sweep)
        failures = f", {len(failed)} failed" if failed else ""
        plural = "" if runs == 1 else "s"
        print(f"\nsweep finished: {runs} run{plural} in {sweep_dir}{failures}")
        if runs:
            print(f"compare them: posbench report {shlex.quote(str(sweep_dir))}")
        if failed:
            sys.stdout.flush()  # the summary before the errors, where both go to one terminal
            print("\n".join(failed_job_line(record) for record in failed), file=sys.stderr)
            raise SystemExit(2)
