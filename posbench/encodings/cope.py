"""CoPE: contextual position encoding (Golovneva et al. 2024, https://arxiv.org/abs/2405.18719).

Positions are counted by the content: query i gates every past key j by its attention logit,

    g_ij = sigmoid(q_i . k_j / sqrt(hs)),    p_ij = sum_{t=j..i} g_it,

so p_ij is how many keys between j and i (both included) the query counts, a fraction in
(0, i - j + 1], clamped at ``npos - 1``. Its logit gets q_i . e[p_ij], the learned position
embedding e (npos, hs) interpolated linearly between the integer positions floor(p) and
ceil(p): q_i . e[p] = (1 - w) q_i . e[floor p] + w q_i . e[ceil p] with w = p - floor(p), so
only npos products q_i . e[n] per query are computed, and p gets a gradient through w.

As in facebookresearch/RAM (projects/cope/src/cope/context_position.py) e starts at zeros,
and each layer has its own e, shared by its heads. The bias is added to the logits after
their 1/sqrt(hs) scaling, as x-transformers' ``CoPE`` adds it and RAM does with
``--cope-nodiv``; RAM's default divides it too, which is this bias with e / sqrt(hs).

Future keys get the gate 0 (so a future key's p is 0). The counts are summed from the
diagonal back (keys reversed), so a short count near the diagonal never comes from the
difference of two long sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register
from posbench.errors import PosbenchError


@dataclass
class CopeConfig(EncodingConfig):
    name: str = "cope"
    npos: int = 512  # positions 0..npos-1 (conf/encoding/cope.yaml: ${train.seq_len})


@register("cope")
class ContextualPositions(PositionalEncoding):
    Config = CopeConfig

    def __init__(self, config: CopeConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if config.npos < 1:
            raise PosbenchError(f"encoding.npos must be positive (got {config.npos})")
        self.position_embedding = nn.Parameter(torch.zeros(config.npos, self.head_dim))

    @property
    def per_layer(self) -> bool:
        return True  # one e per layer, as in the paper

    def content_state(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def counts(self, q: torch.Tensor, k: torch.Tensor, queries: slice, keys: slice) -> torch.Tensor:
        """p_ij = sum_{t=j..i} g_it, unclamped, of the queries at indices ``queries`` over the
        keys at ``keys``, from q, k (B, H, T, hs) -> (B, H, n, m) with the keys reversed (the
        latest first), in which order each row is a running sum: nondecreasing, 0 over the
        query's future keys."""
        q, k = q[:, :, queries], k[:, :, keys].flip(2)  # (B, H, n, hs), (B, H, m, hs)
        n, m = q.shape[2], k.shape[2]
        logits = (q / math.sqrt(self.head_dim)) @ k.transpose(-1, -2)  # (B, H, n, m)
        # The first `ahead` reversed keys come after the block's first query: only they can be
        # in a query's future, whose gate is 0.
        ahead = min(m, max(0, keys.stop - 1 - queries.start))
        query = torch.arange(queries.start, queries.start + n, device=q.device)
        key = torch.arange(keys.stop - 1, keys.stop - 1 - ahead, -1, device=q.device)
        logits[..., :ahead].masked_fill_(key > query[:, None], float("-inf"))
        gates = logits.sigmoid_()
        # Without gradients, summed in place: a fresh tensor of tens of MB per query block has
        # its pages zeroed by the operating system again, which took longer than the sum.
        return gates.cumsum(-1) if torch.is_grad_enabled() else gates.cumsum_(-1)

    def content_bias(
        self, state: tuple[torch.Tensor, torch.Tensor], queries: slice, keys: slice
    ) -> torch.Tensor:
        q, k = state
        last = self.config.npos - 1  # the largest position
        dtype = torch.promote_types(q.dtype, torch.float32)  # counts in float32 (or float64)
        with torch.autocast(q.device.type, enabled=False):
            q, k = q.to(dtype), k.to(dtype)
            counts = self.counts(q, k, queries, keys)  # (B, H, n, m), keys reversed
            # q_i . e[n], and its step to q_i . e[n + 1] (0 at the last, where weight is 0).
            table = q[:, :, queries] @ self.position_embedding.to(dtype).T  # (B, H, n, npos)
            steps = F.pad(table.diff(dim=-1), (0, 1))
            m = counted = counts.shape[-1]
            if not torch.is_grad_enabled():
                # In evaluation, past the training length, the far keys of every query count
                # to the last position (the bias is q_i . e[npos - 1] there): interpolate only
                # the nearest `counted` keys, those below it for some query (a running sum:
                # searchsorted finds where each row reaches it).
                reached = torch.searchsorted(counts, counts.new_full((*counts.shape[:-1], 1), last))
                counted = int(reached.max())
            near = counts[..., :counted].clamp(max=last)  # p, interpolated
            below = near.long()  # floor(p), for p >= 0
            weight = near - below  # the share of ceil(p), with p's gradient
            bias = torch.addcmul(table.gather(-1, below), steps.gather(-1, below), weight)
            if counted == m:
                return bias.flip(-1)  # (B, H, n, m), keys in order
            far = table[..., last, None].expand(*table.shape[:-1], m - counted)
            return torch.cat([far, bias.flip(-1)], dim=-1)  # (B, H, n, m), keys in order
