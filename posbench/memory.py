"""Will an evaluation fit in memory? Checked before a length starts, so that a length that
cannot fit is reported (and a batch that cannot is shrunk) instead of the process being killed
by the out-of-memory killer halfway through.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from posbench.model import Transformer

log = logging.getLogger(__name__)
MEMINFO = Path("/proc/meminfo")


def available_memory(device: torch.device) -> int | None:
    """Bytes that new allocations on ``device`` can use now: free memory on a CUDA device,
    ``MemAvailable`` (free plus reclaimable page cache) on a Linux CPU; ``None`` when the
    platform does not say."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    try:
        match = re.search(r"^MemAvailable:\s+(\d+) kB", MEMINFO.read_text(), flags=re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def fitting_batch_size(
    model: Transformer,
    length: int,
    batch_size: int,
    device: torch.device,
    consecutive: bool = True,
) -> tuple[int, str | None]:
    """The largest batch, at most ``batch_size``, whose forward pass at ``length`` (at
    ``consecutive`` positions, or one row of positions per window) fits in the memory available
    now, and ``None``; or ``(0, reason)`` when not even one window fits."""
    available = available_memory(device)
    if available is None:
        return batch_size, None
    for batch in range(batch_size, 0, -1):
        if model.inference_memory_bytes(batch, length, consecutive) <= available:
            if batch < batch_size:
                log.warning(
                    "length %d: batch size %d -> %d to fit the %.1f GB available",
                    length,
                    batch_size,
                    batch,
                    available / 1e9,
                )
            return batch, None
    needed = model.inference_memory_bytes(1, length, consecutive)
    return 0, (
        f"one window of {length} tokens needs about {needed / 1e9:.1f} GB and only "
        f"{available / 1e9:.1f} GB is available on {device.type}; evaluate a shorter length "
        "or free memory"
    )
