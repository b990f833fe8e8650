"""``posbench eval``: which run to re-evaluate, and where its new records go (results.json and
its logger's view: TensorBoard's, rewritten together so that they always agree, or a W&B run of
its own)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from posbench.errors import PosbenchError
from posbench.evaluation.run import ROPE_SCALING_NEEDS_ROPE
from posbench.runs.directory import WEIGHTS_FILE, latest_run, sweep_of
from posbench.runs.loggers import open_logger
from posbench.runs.results import append_eval_results
from posbench.runs.tensorboard_log import TrainedLengths
from posbench.system.machine import ran
from posbench.system.versions import code_versions


def default_run(root: Path = Path("outputs")) -> tuple[Path, str]:
    """The run ``posbench eval`` takes without ``--run``, and one line saying why that one."""
    run_dir = latest_run(root)
    why = (
        f"no --run given: evaluating the newest run under {root}/ (the one whose {WEIGHTS_FILE} "
        f"was written last): {run_dir}"
    )
    sweep = sweep_of(run_dir)
    if sweep is not None:
        why += f", the last job of the sweep {sweep}"
    return run_dir, why + "; pass --run DIR to choose another"


def check_rope_run(cfg: DictConfig, run_dir: Path, root: Path = Path("outputs")) -> None:
    """``--rope-scaling`` of a run trained with another encoding (the newest run, after a sweep
    whose last job was not rope): one line naming the newest rope run to pass with ``--run``."""
    if cfg.encoding.name == "rope":
        return
    try:
        rope_run = latest_run(root, encoding="rope")
    except PosbenchError:
        fix = "train one with `posbench train encoding=rope` and pass --run DIR"
    else:
        fix = f"the newest rope run is {rope_run}: pass --run {rope_run}"
    raise PosbenchError(f"{ROPE_SCALING_NEEDS_ROPE}; {run_dir} used {cfg.encoding.name!r}; {fix}")


def record_eval(
    run_dir: Path,
    cfg: DictConfig,
    records: Sequence[dict[str, Any]],
    trained: TrainedLengths,
    command: str | None = None,
) -> dict[str, Any]:
    """Add ``records`` to the run's results.json (replacing those of the same length, stride
    and scaling method; an algorithmic task's summary past its ``trained`` lengths, see
    append_eval_results) and log all the records it now holds to the logger of the run's
    ``cfg`` (posbench/runs/loggers/: TensorBoard redraws the run's evaluation, W&B starts an
    ``eval`` run). Each record names the code that computed it (``versions``, as results.json
    names the training's), and the ``command``, machine and day (``ran``): a re-evaluation
    may run other code, elsewhere, later than the training did. Returns the new results."""
    longest_trained = trained.hi if trained.problem_lengths else None
    stamp = {"versions": code_versions(), "ran": ran(command)}
    stamped = [{**record, **stamp} for record in records]
    results = append_eval_results(run_dir, stamped, longest_trained)
    with open_logger(cfg, run_dir, job_type="eval") as logger:
        logger.log_evaluation(results["eval"], trained)
    return results
