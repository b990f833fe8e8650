"""Will an evaluation fit in memory? Checked before a length starts, so that a length that
cannot fit is reported (and a batch that cannot is shrunk) instead of the process being killed
by the out-of-memory killer halfway through.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch

from posbench.model.attention import (
    attention_scratch_elements,
    bidirectional,
    variants,
    wide_query_key_elements,
)
from posbench.model.loss import chunked_loss
from posbench.model.model import Transformer, unique

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


def inference_memory_bytes(
    model: Transformer, batch_size: int, length: int, consecutive: bool = True
) -> int:
    """An upper estimate of the memory one forward pass of ``model`` adds under inference mode
    (on top of the weights) for ``batch_size`` sequences of ``length`` tokens at ``consecutive``
    positions (else each at its own), so that evaluation can choose a batch that fits
    before it starts (benchmarks/long_eval_memory.py compares it with measured peaks).

    Terms, in elements: the live activations of one block (residual, layer-norm output,
    q/k/v and their rotated copies, attention output, the MLP's hidden layer and its GELU:
    at most 8*C + 2*hidden per token), the logits with the log-softmax of the loss (3*V
    per token; 3*C where ``next_token_nll`` takes them a chunk at a time, whose chunks of
    logits hold at most as many elements as its input), and what attention with the
    encoding's score bias holds besides
    (posbench.model.attention.attention_scratch_elements) and what queries and keys wider than
    the values add (wide_query_key_elements: PoPE, a remap), for the layer whose encoding holds
    the most.
    """
    a = model.args
    tokens = batch_size * length
    hidden = a.mlp_ratio * a.d_model
    device = model.lm_head.weight.device
    chunked = chunked_loss(tokens, a.d_model, a.vocab_size, device)
    logits = a.d_model if chunked else a.vocab_size
    elements = tokens * (8 * a.d_model + 2 * hidden + 3 * logits)
    scratch = attention_scratch_elements if a.causal else bidirectional.scratch_elements
    if not model.blocks[0].attn.variant.plain:  # sinks, sigmoid, stick-breaking: written out

        def scratch(encoding, batch_size, length, consecutive, device):
            return variants.scratch_elements(encoding, batch_size, length, a.attention)

    elements += max(
        scratch(encoding, batch_size, length, consecutive, device)
        + wide_query_key_elements(encoding, tokens)
        for encoding in unique(model.layer_encodings)
    )
    if a.attn_gate != "none":  # the gate's (B, T, C) beside the attention output
        elements += tokens * a.d_model
    return elements * model.lm_head.weight.element_size()


def fitting_batch_size(
    model: Transformer,
    length: int,
    batch_size: int,
    device: torch.device,
    consecutive: bool = True,
    then: Callable[[int, int], int] | None = None,
) -> tuple[int, str | None]:
    """The largest batch, at most ``batch_size``, whose forward pass at ``length`` (at
    ``consecutive`` positions, or one row of positions per window) fits in the memory available
    now, and ``None``; or ``(0, reason)`` when not even one window fits. ``then(batch, length)``:
    the bytes of what runs after each forward pass, once its memory is free (LongPPL's
    evaluator: KeyTokens.memory_bytes)."""
    available = available_memory(device)
    if available is None:
        return batch_size, None

    def needed(batch: int) -> int:
        own = inference_memory_bytes(model, batch, length, consecutive)
        return own if then is None else max(own, then(batch, length))

    for batch in range(batch_size, 0, -1):
        if needed(batch) <= available:
            if batch < batch_size:
                log.warning(
                    "length %d: batch size %d -> %d to fit the %.1f GB available",
                    length,
                    batch_size,
                    batch,
                    available / 1e9,
                )
            return batch, None
    return 0, (
        f"one window of {length} tokens needs about {needed(1) / 1e9:.1f} GB and only "
        f"{available / 1e9:.1f} GB is available on {device.type}; evaluate a shorter length "
        "or free memory"
    )
