"""The loss of next-token prediction: ``next_token_nll``, the negative log-likelihood of each
target under the model's output layer, taken a chunk of rows at a time where the logits are
large (``chunked_loss``), so that the (N, vocab) logits are never held whole.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

# Where the loss is computed by F.linear_cross_entropy's chunked path: on these devices, for
# logits of at least CHUNKED_LOSS_MIN_ELEMENTS. A CPU's logits way writes several (N, vocab)
# float tensors a step; past glibc's largest mmap threshold (32 MiB) each is fresh memory the
# kernel faults in, step after step. Measured (benchmarks/README.md, "The loss at a large
# vocabulary", Zen 4): at a vocabulary of 8,192 the chunked path trained tiny at 1.24x (fp32)
# and 1.29x (bf16) the logits way's tokens/s, small at 1.07x and 0.98x, with 35-45 % less
# peak memory; at bytes' 256 and d_model 128 (logits of 4 MiB) it cost about 1 %, so small
# logits keep the logits way. CUDA keeps it too until it is measured there.
CHUNKED_LOSS_DEVICES = frozenset({"cpu"})
CHUNKED_LOSS_MIN_ELEMENTS = 2**23  # 32 MiB of float32 logits


def chunked_loss(rows: int, width: int, vocab: int, device: torch.device) -> bool:
    """Whether ``next_token_nll`` takes the logits of ``rows`` x ``width`` hidden states over
    ``vocab`` classes a chunk of rows at a time (F.linear_cross_entropy), on ``device``."""
    return (
        device.type in CHUNKED_LOSS_DEVICES
        and hasattr(F, "linear_cross_entropy")
        and rows * vocab >= CHUNKED_LOSS_MIN_ELEMENTS
        # Torch's advice (LinearCrossEntropyOptions): chunks pay only with more rows and classes
        # than features.
        and rows >= width
        and vocab > width
    )


def next_token_nll(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    reduction: Literal["sum", "none"] = "sum",
) -> torch.Tensor:
    """The negative log-likelihood (float32) of ``targets`` (N,) under the logits ``hidden``
    (N, C) @ ``weight``.T (vocab, C): summed (``reduction="sum"``, a scalar) or one per target
    (``"none"``, (N,)); a target of -100 is not scored (F.cross_entropy's ignore_index,
    posbench.data.IGNORE), its NLL 0.

    Large logits on CHUNKED_LOSS_DEVICES: F.linear_cross_entropy (torch 2.13) computes it a
    chunk of rows at a time, with the gradients of ``hidden`` and ``weight`` in the same pass,
    so the (N, vocab) logits are never held whole. It computes in float32 also under bf16
    autocast (a custom op, which autocast leaves alone), where the logits way rounds the
    logits to bf16: gradients as close to float32's (tests/test_model.py).
    """
    dtype = torch.promote_types(hidden.dtype, torch.float32)  # float32; float64 stays float64
    rows, width = hidden.shape
    if chunked_loss(rows, width, weight.shape[0], hidden.device):
        # Under torch.compile the op needs allow_retain_graph (it warns and sets it otherwise).
        options = nn.LinearCrossEntropyOptions(allow_retain_graph=torch.compiler.is_compiling())
        return F.linear_cross_entropy(
            hidden.to(dtype), weight.to(dtype), targets, reduction=reduction, options=options
        )
    logits = F.linear(hidden, weight).to(dtype)  # (N, vocab): bf16 under autocast, cast up
    return F.cross_entropy(logits, targets, reduction=reduction)
