"""Training checkpoints: everything a stopped run needs to continue as if it never stopped.

    <run>/checkpoint.pt   model, optimizer and batch-sampler states, and the loop's progress

(Dropout's generators are seeded from the seed, the step and the rank at every step:
posbench.training.train_loop.seed_dropout.) ``Checkpointer`` writes it when it is due; which
checkpoint a run resumes from, and what it may change on resume, is resume.py's.

The file holds tensors and plain Python values only and is read with
``torch.load(weights_only=True)``, whose unpickler refuses anything else, so loading a
checkpoint never executes code from the file. It is written atomically (posbench/system/atomic.py):
a crash or a full disk mid-write leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench.errors import PosbenchError
from posbench.runs.directory import CHECKPOINT_FILE
from posbench.system import distributed
from posbench.system.atomic import atomic_path

FORMAT = "posbench-checkpoint-1"


@dataclass
class TrainProgress:
    """What the training loop accumulates besides model and optimizer state; restored on
    resume so the LR schedule, results.json and TensorBoard continue where they stopped."""

    step: int = 0  # optimisation steps completed
    recent_losses: list[float] = field(default_factory=list)  # the window behind final_loss
    tokens_seen: int = 0
    train_time: float = 0.0
    compile_time: float = 0.0  # torch.compile's warm-up (train.compile), apart from train_time
    val_loss: float | None = None  # the latest periodic validation
    # threads=auto's changes of thread count (posbench.system.threads.ThreadChange as dicts), those
    # before a resume included
    thread_changes: list[dict[str, Any]] = field(default_factory=list)


def save_checkpoint(
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: torch.Generator,
    progress: TrainProgress,
    precision: str = "fp32",
) -> Path:
    """Write ``run_dir/checkpoint.pt`` atomically; an OSError (disk full, ...) becomes a
    one-line PosbenchError and leaves the previous checkpoint intact."""
    state = {
        "format": FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.get_state(),  # batches (and randomized positions) draw from it
        "progress": asdict(progress),
        "precision": precision,  # the one used (train.precision=auto resolves per machine)
    }
    path = Path(run_dir) / CHECKPOINT_FILE
    try:
        with atomic_path(path) as tmp:
            torch.save(state, tmp)
    except OSError as err:
        raise PosbenchError(
            f"could not write the checkpoint {path} ({err.strerror or err}); the previous "
            "checkpoint is intact: free disk space, then resume the run"
        ) from err
    return path


@dataclass
class Checkpointer:
    """Writes the training state to ``run_dir/checkpoint.pt`` every ``every`` steps
    (``train.checkpoint_every``; 0: never in between) and after the ``last`` step, recording
    the ``precision`` the steps ran in."""

    run_dir: Path
    every: int
    last: int
    precision: str
    saved_step: int = 0  # the step of the checkpoint on disk (0: none yet)

    def due(self, step: int) -> bool:
        return step == self.last or (self.every > 0 and step % self.every == 0)

    def save(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: torch.Generator,
        progress: TrainProgress,
    ) -> None:
        """The ranks' states are equal: rank 0 writes one copy, and every rank waits (under the
        collective timeout) until it is on disk. After a stop they exit next, and a launcher
        that ends the others as soon as one rank exits must not kill rank 0 mid-write. A failed
        write stops the others too (PeerFailed)."""
        distributed.from_rank_zero(
            lambda: save_checkpoint(
                self.run_dir, model, optimizer, sampler, progress, self.precision
            )
        )
        self.saved_step = progress.step


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint without executing code from it; a one-line error naming the file if
    it is truncated, foreign, or would need code to load."""
    path = Path(path)
    if not path.is_file():
        raise PosbenchError(f"no checkpoint at {path}; it was never written or was removed")
    unreadable = PosbenchError(
        f"{path} is not a readable checkpoint (truncated or foreign); delete it, then "
        f"`posbench train --resume {path.parent}` trains the run again from the start"
    )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if refused is None:
            raise unreadable from None
        raise PosbenchError(
            f"refusing to load {path}: it asks to run {refused.group(1)}, but a checkpoint "
            "holds only tensors and plain values; delete it or restore a trusted copy"
        ) from None
    except Exception:  # garbage makes the unpickler fail in many ways; all mean the same here
        raise unreadable from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PosbenchError(f"{path} is not a posbench checkpoint; delete it or point elsewhere")
    return state


def trained_precision(state: dict[str, Any]) -> str:
    """The precision the checkpoint's steps ran in; checkpoints written before
    train.precision existed were all trained in fp32."""
    return state.get("precision", "fp32")


def restore_checkpoint(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: torch.Generator,
) -> TrainProgress:
    """Load ``state`` into the model, optimizer and batch sampler."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.set_state(state["sampler"])
    return TrainProgress(**state["progress"])
