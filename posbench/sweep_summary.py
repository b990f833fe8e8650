"""The last lines of a sweep (``posbench train -m``): where its runs are and what to run next.

A Hydra callback, so it runs in the process that started the sweep, after every job has
finished, whichever launcher ran them (jobs of joblib or SLURM run elsewhere).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from posbench.runs import RESULTS_FILE


class SweepSummary(Callback):
    """Prints the sweep directory, how many runs it holds, and the command comparing them."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = len(list(sweep_dir.glob(f"*/{RESULTS_FILE}")))
        print(f"\nsweep finished: {runs} runs in {sweep_dir}")
        print(f"compare them: posbench report {shlex.quote(str(sweep_dir))}")
