"""Data-parallel training across processes: torchrun on one node, SLURM tasks through submitit.

Every rank runs the same ``posbench train`` and trains the same model on its own slice of
each global batch (posbench/training/train_loop.py); DistributedDataParallel averages the
gradients. This module holds the plumbing, so the loop stays a loop:

* where the ranks come from: torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), or a submitit task's SLURM
  environment, which submitit's ``TorchDistributedEnvironment`` turns into the same variables
  (so threads.py divides the cores among the local ranks either way);
* the process group: gloo for CPU tensors, NCCL for CUDA ones, each rank on its own GPU;
* agreement: what rank 0 decides (the run directory, the data cache it builds, a setup
  error) reaches the others, so every rank does the same thing or stops.

A collective waits at most ``POSBENCH_DIST_TIMEOUT`` seconds (default 1800, torch's own
default) for the other ranks; after that the waiting rank fails instead of hanging. Rank 0's
evaluation after training counts against it: the other ranks wait for its results.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
from collections.abc import Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from posbench.errors import PosbenchError

log = logging.getLogger(__name__)

TIMEOUT_ENV = "POSBENCH_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800
T = TypeVar("T")


@dataclass(frozen=True)
class Launch:
    """This process's place among the ranks of one training run."""

    rank: int
    world_size: int
    local_rank: int  # among the ranks on this node: picks the GPU
    local_world_size: int  # ranks on this node: they share its cores
    master_addr: str
    master_port: int


class PeerFailed(Exception):
    """Another rank failed and has said why; this rank stops without repeating it."""


def launch(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """How this process was started as one of several ranks: torchrun's variables, else a
    submitit task's (SLURM's, or submitit's local executor's); None for a single process."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return Launch(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ.get("LOCAL_RANK", "0")),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", "1")),
            master_addr=environ.get("MASTER_ADDR", "localhost"),
            master_port=int(environ.get("MASTER_PORT", "29500")),
        )
    if environ.get("SUBMITIT_EXECUTOR"):
        # Present whenever submitit started this process (the `launchers` extra). It reads
        # SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NUM_NODES, SLURM_JOB_NODELIST
        # (the first node hosts rank 0) and derives the port from SLURM_JOB_ID.
        from submitit.helpers import TorchDistributedEnvironment

        task = TorchDistributedEnvironment()
        if task.world_size > 1:  # a job of one task per run is a plain sweep job
            return Launch(
                task.rank,
                task.world_size,
                task.local_rank,
                task.local_world_size,
                task.master_addr,
                task.master_port,
            )
    return None


def export(ranks: Launch, environ: MutableMapping[str, str] = os.environ) -> None:
    """Put ``ranks`` into torchrun's variables, which ``init_process_group``'s env:// reads."""
    environ.update(
        RANK=str(ranks.rank),
        WORLD_SIZE=str(ranks.world_size),
        LOCAL_RANK=str(ranks.local_rank),
        LOCAL_WORLD_SIZE=str(ranks.local_world_size),
        MASTER_ADDR=ranks.master_addr,
        MASTER_PORT=str(ranks.master_port),
    )


def timeout(environ: Mapping[str, str] = os.environ) -> timedelta:
    """How long a collective waits for the other ranks (``POSBENCH_DIST_TIMEOUT`` seconds)."""
    text = environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise PosbenchError(
            f"{TIMEOUT_ENV} must be a positive number of seconds (got {text!r}); e.g. "
            f"{TIMEOUT_ENV}=3600 when rank 0's evaluation takes longer than the default 1800"
        )
    return timedelta(seconds=seconds)


def setup() -> None:
    """Join the other ranks when this process is one of several (once; nothing for a single
    process). Ranks other than 0 then log errors only: rank 0 speaks for the run. Called
    again after Hydra has configured logging, it quiets them again."""
    ranks = launch()
    if ranks is None:
        return
    if not dist.is_initialized():
        export(ranks)
        backend = "gloo"
        if torch.cuda.is_available():
            # NCCL for the gradients of a model on the GPU, gloo for anything on the CPU.
            backend = "cpu:gloo,cuda:nccl"
            torch.cuda.set_device(gpu_index(ranks.local_rank))
        dist.init_process_group(backend, timeout=timeout())
        atexit.register(dist.destroy_process_group)
    if ranks.rank != 0:
        quiet_logging()


def gpu_index(local_rank: int) -> int:
    """This rank's GPU: one per local rank; where each task sees only its own GPU (SLURM's
    per-task binding), that one."""
    return local_rank % torch.cuda.device_count()


def quiet_logging() -> None:
    """Errors only, and none into the run's log file (Hydra's ``train.log``): rank 0 logs
    for the run, and a warning about the machine would only repeat once per rank."""
    root = logging.getLogger()
    root.setLevel(logging.ERROR)
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def rank() -> int:
    """This process's rank: from the process group, else from how it was launched, else 0."""
    if dist.is_initialized():
        return dist.get_rank()
    ranks = launch()
    return ranks.rank if ranks is not None else 0


def world_size() -> int:
    """How many ranks train this run: from the process group, else from how this process was
    launched (for checks before it exists), else 1."""
    if dist.is_initialized():
        return dist.get_world_size()
    ranks = launch()
    return ranks.world_size if ranks is not None else 1


def is_main() -> bool:
    """Rank 0, or the only process: it writes the run's files and speaks for all ranks."""
    return rank() == 0


def local_device(device: torch.device) -> torch.device:
    """``device`` for this rank: its own GPU under CUDA."""
    if device.type == "cuda" and dist.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def rank_zero_first(work: Callable[[], T]) -> T:
    """``work()`` on rank 0, then on the other ranks once it succeeded (it may create what they
    read: a directory, a data cache). If it fails on rank 0, the others raise PeerFailed
    instead of running it, so the error is reported once."""
    if world_size() == 1:
        return work()
    result = on_rank_zero(work, send_result=False)
    return result if is_main() else work()


def from_rank_zero(work: Callable[[], T]) -> T:
    """``work()``'s result on rank 0, sent to every rank, which wait for it; if it fails there,
    the others raise PeerFailed."""
    if world_size() == 1:
        return work()
    return on_rank_zero(work, send_result=True)


def on_rank_zero(work: Callable[[], T], send_result: bool) -> T | None:
    """Run ``work`` on rank 0 and tell the others whether it succeeded (and its result)."""
    if is_main():
        try:
            result = work()
        except BaseException:
            broadcast((False, None))
            raise
        broadcast((True, result if send_result else None))
        return result
    succeeded, result = broadcast(None)
    if not succeeded:
        raise PeerFailed("rank 0 failed")
    return result


def lost_contact(err: BaseException) -> str | None:
    """Why this rank lost the others, when ``err`` says so (a rank died, a collective timed
    out), else None. Gloo reports it as a plain RuntimeError naming its own source file."""
    text = str(err).strip()
    if not (isinstance(err, dist.DistError) or (isinstance(err, RuntimeError) and "gloo" in text)):
        return None
    reason = re.sub(r"^\[[^\]]*\] ", "", text.splitlines()[0] if text else type(err).__name__)
    return reason.split(". ")[0]


def wait_for_all() -> None:
    """Until every rank arrives here (nothing for one process)."""
    if world_size() > 1:
        dist.barrier()


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` (any picklable object) on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_over_ranks(value: float) -> float:
    """The sum of ``value`` over all ranks (itself for one process), in float64."""
    if world_size() == 1:
        return value
    total = torch.tensor(value, dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.item()


def data_parallel(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` wrapped so that backward averages its gradients over the ranks (the model
    itself when there is one process). DDP first sends rank 0's weights to all ranks."""
    if not dist.is_initialized():
        return model
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def sync_gradients(model: nn.Module, last: bool) -> AbstractContextManager:
    """Around a micro-batch's backward: only the last one of a step averages the gradients
    over the ranks (DDP's ``no_sync``); the earlier ones only accumulate locally."""
    if isinstance(model, DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()


def rows_of_rank(batch_size: int, grad_accum: int) -> tuple[slice, int]:
    """This rank's rows of a global batch of ``batch_size`` and its micro-batch size: each rank
    takes ``batch_size / world_size`` consecutive rows, in ``grad_accum`` micro-batches."""
    ranks = world_size()
    check_divisible(batch_size, ranks, grad_accum)
    per_rank = batch_size // ranks
    start = rank() * per_rank
    return slice(start, start + per_rank), per_rank // grad_accum


def check_divisible(batch_size: int, ranks: int, grad_accum: int) -> None:
    if batch_size % (ranks * grad_accum):
        raise PosbenchError(
            f"train.batch_size ({batch_size}) must be divisible by the number of ranks ({ranks}) "
            f"x train.grad_accum ({grad_accum}); it is the global batch, split among them"
        )


def agree_on_stop(signum: int | None) -> int | None:
    """The stop signal any rank received (SIGTERM before SIGINT), or None: all ranks stop after
    the same step, so none is left waiting for the others at the next one."""
    if world_size() == 1:
        return signum
    received = torch.tensor(signum or 0)
    dist.all_reduce(received, op=dist.ReduceOp.MAX)
    return int(received) or None
