"""Training checkpoints: everything a stopped run needs to continue as if it never stopped.

    <run>/checkpoint.pt   model, optimizer and batch-sampler states, and the loop's progress

(Dropout's generators are seeded from the seed, the step and the rank at every step:
posbench.train.seed_dropout.)

The file holds tensors and plain Python values only and is read with
``torch.load(weights_only=True)``, whose unpickler refuses anything else, so loading a
checkpoint never executes code from the file. It is written atomically (posbench/atomic.py):
a crash or a full disk mid-write leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from posbench.atomic import atomic_path
from posbench.errors import PosbenchError

CHECKPOINT_FILE = "checkpoint.pt"
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


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint without executing code from it; a one-line error naming the file if
    it is truncated, foreign, or would need code to load."""
    path = Path(path)
    if not path.is_file():
        raise PosbenchError(f"no checkpoint at {path}; it was never written or was removed")
    unreadable = PosbenchError(
        f"{path} is not a readable checkpoint (truncated or foreign); delete it to start the "
        "run afresh"
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
