"""DAPE: data-adaptive positional encoding (Zheng et al., NeurIPS 2024,
https://arxiv.org/abs/2405.14722; DAPE V2, https://arxiv.org/abs/2410.04798), an option of a
bias of positions (``encoding.dape=true`` on alibi, kerple and fire).

A small network reads, at every (query i, key j), the H heads' attention logits
z_ij = q_i . k_j / sqrt(d) and the H heads' bias of positions b_ij, and adds its H outputs to
the logits, which become

    z + b + f([z; b])

with f two convolutions over the key axis of the 2H channels [z; b] (each row of queries is a
one-pixel-high image of its keys): 2H -> ``dape_width`` -> H channels, kernels of 1 x
``dape_kernel`` zero-padded on both sides, a LeakyReLU (slope 0.01) between. The logits and the
bias at keys the query does not see (its future; outside a window) are set to 0 before f, as
the authors' code (github.com/chuanyang-Zheng/DAPE, positional_embeddings.py's
``Alibi_DAPEV2``) applies ``torch.tril``; f is then a function of the keys the query sees alone.
``dape_kernel`` 1 is DAPE (V1: an MLP over the heads at each (i, j), the code's ``AliBi_DAPE``);
3, the default, is DAPE V2's ``DAPE_{1x3}``, the variant its paper recommends (each key's
output also reads its two neighbours' logits), whose repository's configurations use it.

Each layer has its own f (the reference builds one per attention layer), so a model with DAPE
gives every layer its own instance of the encoding: KERPLE's and FIRE's parameters become per
layer too, as the reference's per-layer ``ParallelKerpleLog_DAPE`` and ``FIRE_DAPEV2`` have them.
The logits f reads are those before ``model.attention_scaling``, the ones a bias from the
content reads (posbench/model/model.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.errors import PosbenchError

# f's hidden layer is dape_width channels per (query, key): at most this many elements at once
# (64 MiB in float32); a block of queries is computed in rows that fit.
HIDDEN_ELEMENTS = 2**24


@dataclass
class DapeOptions(EncodingConfig):
    """The fields ``encoding.dape*`` that alibi's, kerple's and fire's configs add."""

    dape: bool = False  # add f([logits; bias]) to the logits (DAPE)
    dape_width: int = 32  # f's hidden channels
    dape_kernel: int = 3  # f's kernel along the keys: 1 (DAPE V1's MLP) or 3 (V2's 1x3) or more


class DapeNetwork(nn.Module):
    """f: logits and bias ([B|1], H, n, m) each -> (B, H, n, m), two convolutions along the keys,
    2H -> width -> H channels, LeakyReLU between."""

    def __init__(self, n_head: int, width: int, kernel: int) -> None:
        super().__init__()
        padding = (0, kernel // 2)  # the same number of keys out as in
        self.up = nn.Conv2d(2 * n_head, width, (1, kernel), padding=padding)
        self.down = nn.Conv2d(width, n_head, (1, kernel), padding=padding)

    def forward(self, logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        features = torch.cat((logits, bias.expand_as(logits).to(logits.dtype)), dim=1)
        # Channels last: the convolutions' CPU kernels took half the time (measured, 64 queries
        # over 4,096 keys, 8 -> 32 -> 4 channels, one thread: 0.23 s against 0.43 s).
        features = features.contiguous(memory_format=torch.channels_last)  # (B, 2H, n, m)
        return self.down(F.leaky_relu(self.up(features), 0.01))  # (B, H, n, m)


class DapeEncoding(PositionalEncoding):
    """A bias of positions that takes DAPE as an option (``config.dape``): f([z; b]) is this
    encoding's bias from the content (content_state: the layer's q, k and positions;
    content_bias: f of a block), added by attention to z + b as any content bias is."""

    def __init__(self, config: DapeOptions, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        self.dape: DapeNetwork | None = None
        if not config.dape:
            return
        if config.dape_width < 1:
            raise PosbenchError(f"encoding.dape_width must be positive (got {config.dape_width})")
        if config.dape_kernel < 1 or config.dape_kernel % 2 == 0:
            raise PosbenchError(
                "encoding.dape_kernel must be a positive odd number, so that each key's output "
                f"is centred on it (got {config.dape_kernel})"
            )
        self.dape = DapeNetwork(n_head, config.dape_width, config.dape_kernel)
        # f reads the causal logits of past keys only: no two-sided form.
        self.bidirectional = False

    @property
    def per_layer(self) -> bool:
        return self.dape is not None or super().per_layer

    @property
    def has_content_bias(self) -> bool:
        return self.dape is not None

    def content_state(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        return None if self.dape is None else (q, k, positions)

    def content_bias(self, state: Any, queries: slice, keys: slice) -> torch.Tensor:
        assert self.dape is not None, "content_bias without DAPE: content_state gave None"
        q, k, positions = state
        # f's output at a key reads the hidden layer `half` keys away, which reads the features
        # `half` keys further: the block's keys are widened by `half` on each side, those past
        # the sequence's last key zeros (the features past each query's diagonal are anyway).
        half = self.dape.up.kernel_size[1] // 2
        wide = slice(max(0, keys.start - half), min(k.shape[2], keys.stop + half))
        beyond = keys.stop + half - wide.stop  # zero keys past the sequence's last
        m, offset = keys.stop - keys.start, keys.start - wide.start
        rows = max(1, HIDDEN_ELEMENTS // (q.shape[0] * self.dape.up.out_channels * m))
        key_positions = positions[..., wide]
        parts = []
        for start in range(queries.start, queries.stop, rows):
            chunk = slice(start, min(start + rows, queries.stop))
            # z and b of these queries over the keys: (B, H, r, M) and ([B,] H, r, M)
            logits = q[:, :, chunk] @ k[:, :, wide].transpose(-1, -2) / math.sqrt(q.shape[-1])
            bias = self.score_bias(positions[..., chunk], key_positions)
            if bias.dim() == 3:
                bias = bias.unsqueeze(0)  # (1, H, r, M)
            hidden = unseen(chunk, wide, self.window, q.device)  # (r, M)
            logits, bias = (F.pad(t.masked_fill(hidden, 0), (0, beyond)) for t in (logits, bias))
            out = self.dape(logits, bias)
            parts.append(out[..., offset : offset + m])  # (B, H, r, m)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # (B, H, n, m)


def unseen(queries: slice, keys: slice, window: int | None, device: torch.device) -> torch.Tensor:
    """Which keys (token indices ``keys``) each query (``queries``) does not attend to: its future,
    and with a ``window`` the keys ``window`` or more tokens before it -> (n, m) bool."""
    query = torch.arange(queries.start, queries.stop, device=device)[:, None]
    key = torch.arange(keys.start, keys.stop, device=device)[None, :]
    hidden = key > query
    if window is not None:
        hidden |= query - key >= window
    return hidden
