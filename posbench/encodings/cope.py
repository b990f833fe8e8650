"""CoPE: contextual position encoding (Golovneva et al. 2024, https://arxiv.org/abs/2405.18719).

Positions are counted by the content: query i gates every past key j by its attention logit,

    g_ij = sigmoid(q_i . k_j / sqrt(hs)),    p_ij = sum_{t=j..i} g_it,

so p_ij is how many keys between j and i (both included) the query counts, a fraction in
(0, i - j + 1], clamped at ``npos - 1``. Its logit gets q_i . e[p_ij], the learned position
embedding e (npos, hs) interpolated linearly between the integer positions floor(p) and
ceil(p): q_i . e[p] = (1 - w) q_i . e[floor p] + w q_i . e[ceil p] with w = p - floor(p), so
only the products q_i . e[n] per query are computed (n up to the largest count of its block),
and p gets a gradient through w.

As in facebookresearch/RAM (projects/cope/src/cope/context_position.py) e starts at zeros,
and each layer has its own e, shared by its heads. The bias is added to the logits after
their 1/sqrt(hs) scaling, as x-transformers' ``CoPE`` adds it and RAM does with
``--cope-nodiv``; RAM's default divides it too, which is this bias with e / sqrt(hs).

Future keys get the gate 0 (so a future key's p is 0). The counts are summed from the
diagonal back (keys reversed), so a short count near the diagonal never comes from the
difference of two long sums.

In training the bias is one autograd Function (CountedPositionBias) with a hand-written
backward: autograd's own spent most of a training step in the two gathers' scatter-add
backward (each into a zeroed table), the reversed cumulative sum's flips and the clamp, for
each block of queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register
from posbench.errors import PosbenchError


@dataclass
class CopeConfig(EncodingConfig):
    name: str = "cope"
    npos: int = 512  # positions 0..npos-1 (conf/encoding/cope.yaml: ${train.seq_len})


def block(
    state: tuple[torch.Tensor, torch.Tensor], queries: slice, keys: slice
) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries at indices ``queries`` (B, H, n, hs) and the keys at ``keys``, latest first
    (B, H, m, hs), of content_state's ``state``, in float32 (or float64): the counts' precision."""
    q, reversed_keys = state
    dtype = torch.promote_types(q.dtype, torch.float32)
    T = reversed_keys.shape[2]
    return q[:, :, queries].to(dtype), reversed_keys[:, :, T - keys.stop : T - keys.start].to(dtype)


def reversed_gates(
    q: torch.Tensor, reversed_keys: torch.Tensor, first_query: int, first_key: int
) -> torch.Tensor:
    """g = sigmoid(q . k / sqrt(hs)) of the queries q (B, H, n, hs) from index ``first_query``
    over the keys from index ``first_key``, given latest first (B, H, m, hs) -> (B, H, n, m),
    keys reversed, 0 at a query's future keys."""
    B, H, n, hs = q.shape
    m = reversed_keys.shape[2]
    # The scale inside the product (alpha), where scaling q first would be one more pass.
    logits = torch.baddbmm(
        q.new_empty(()).expand(B * H, n, m),
        q.reshape(B * H, n, hs),
        reversed_keys.reshape(B * H, m, hs).transpose(1, 2),
        beta=0,
        alpha=1 / math.sqrt(hs),
    ).view(B, H, n, m)
    # The first `ahead` reversed keys come after the block's first query: only they can be in a
    # query's future, whose gate is 0.
    last_key = first_key + m - 1
    ahead = min(m, max(0, last_key - first_query))
    query = torch.arange(first_query, first_query + n, device=q.device)
    key = torch.arange(last_key, last_key - ahead, -1, device=q.device)
    logits[..., :ahead].masked_fill_(key > query[:, None], float("-inf"))
    return logits.sigmoid_()


def position_logits(
    q: torch.Tensor, embedding: torch.Tensor, reach: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q_i . e[n] of the queries q (B, H, n, hs) at the positions n = 0..reach, and their steps
    q_i . (e[n + 1] - e[n]), 0 at the last position of the embedding e (npos, hs), which
    nothing follows -> (table, steps), each (B, H, n, reach + 1): both from one product with
    e[:reach + 2] (the next position's row gives the last step)."""
    extended = q @ embedding[: reach + 2].T  # (B, H, n, reach + 2), or npos at the last
    steps = extended.diff(dim=-1)
    if extended.shape[-1] == reach + 1:  # reach is the last position
        steps = F.pad(steps, (0, 1))
    return extended[..., : reach + 1], steps


def interpolated(
    table: torch.Tensor, steps: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q_i . e[p] from the ``table`` of q_i . e[n] and its ``steps`` (B, H, n, N) at the
    positions ``counts`` p (B, H, n, m), at most N - 1, which become their fractions w
    (in place) -> (bias, floor(p), w, the step at floor(p)), each (B, H, n, m)."""
    below = counts.long()  # floor(p), for p >= 0
    weight = counts.frac_()  # the share of ceil(p)
    stepped = steps.gather(-1, below)
    return table.gather(-1, below).addcmul_(stepped, weight), below, weight, stepped


class CountedPositionBias(torch.autograd.Function):
    """The bias q_i . e[p_ij] of a block of queries q (B, H, n, hs) from index ``first_query``
    over the keys from index ``first_key``, given latest first (B, H, m, hs), with the rows
    e[:reach + 2] of the embedding (reach: the largest floor(p) of the block) -> (B, H, n, m),
    keys in order; ``last``: the position the counts are clamped at.

    Forward: the gates with the keys reversed, their running sums turned to key order once,
    and the interpolation. Backward, in key order: the count's gradient is
    dp_ij = dbias_ij * (q_i . e step at floor p_ij) (0 where p is clamped: the step there is
    0), and g_it is in every p_ij with j <= t, so its gradient is the running sum of dp from
    the first key, computed in key order without a flip; the table's gradient is two
    scatter-adds of dbias, split into e[floor p] and e[ceil p] by w.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        reversed_keys: torch.Tensor,
        embedding: torch.Tensor,
        first_query: int,
        first_key: int,
        last: int,
    ) -> torch.Tensor:
        gates = reversed_gates(q, reversed_keys, first_query, first_key)  # (B, H, n, m)
        counts = gates.cumsum(-1).flip(-1)  # (B, H, n, m), keys in order
        # Only a key j before the block's last query by more than `last` can count past it.
        clamped = max(0, first_query + q.shape[2] - last - first_key)
        counts[..., :clamped].clamp_(max=last)
        reach = min(last, first_query + q.shape[2] - first_key)  # the largest count
        table, steps = position_logits(q, embedding, reach)
        bias, below, weight, stepped = interpolated(table, steps, counts)
        ctx.save_for_backward(q, reversed_keys, embedding, gates, below, weight, stepped)
        ctx.reach = reach
        return bias

    @staticmethod
    @once_differentiable  # its gradients are not recorded for a second derivative
    def backward(ctx: Any, dbias: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, reversed_keys, embedding, gates, below, weight, stepped = ctx.saved_tensors
        B, H, n, m = gates.shape
        hs = q.shape[-1]
        columns = min(ctx.reach + 2, len(embedding))  # position_logits' product's
        dextended = dbias.new_zeros(B, H, n, columns)
        dextended[..., : ctx.reach + 1].scatter_add_(-1, below, dbias)  # through the table
        dsteps = dbias.new_zeros(B, H, n, ctx.reach + 1).scatter_add_(-1, below, dbias * weight)
        dsteps = dsteps[..., : columns - 1]  # the 0 step past the last position has none
        dextended[..., :-1] -= dsteps
        dextended[..., 1:] += dsteps
        dgates = (dbias * stepped).cumsum(-1).flip(-1)  # (B, H, n, m), keys reversed
        dlogits = torch.ops.aten.sigmoid_backward(dgates, gates).view(B * H, n, m)
        scale = 1 / math.sqrt(hs)
        q3, keys3 = q.reshape(B * H, n, hs), reversed_keys.reshape(B * H, m, hs)
        dq = (dextended @ embedding[:columns]).view(B * H, n, hs)
        dq.baddbmm_(dlogits, keys3, alpha=scale)
        dkeys = torch.baddbmm(
            q.new_empty(()).expand(B * H, m, hs), dlogits.transpose(1, 2), q3, beta=0, alpha=scale
        )
        dembedding = torch.zeros_like(embedding)
        dembedding[:columns] = dextended.view(-1, columns).T @ q3.reshape(-1, hs)
        return dq.view(B, H, n, hs), dkeys.view(B, H, m, hs), dembedding, None, None, None


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
        # The keys latest first, the order each query's counts are summed in: one flip per
        # layer, not one per block of queries.
        return q, k.flip(2)  # (B, H, T, hs) each

    def content_bias(
        self, state: tuple[torch.Tensor, torch.Tensor], queries: slice, keys: slice
    ) -> torch.Tensor:
        last = self.config.npos - 1  # the largest position
        q, reversed_keys = block(state, queries, keys)
        with torch.autocast(q.device.type, enabled=False):
            embedding = self.position_embedding.to(q.dtype)
            if torch.is_grad_enabled():
                return CountedPositionBias.apply(
                    q, reversed_keys, embedding, queries.start, keys.start, last
                )
            # p_ij unclamped, keys reversed: each row a running sum, nondecreasing, 0 over the
            # query's future keys. Summed in place: a fresh tensor of tens of MB per query
            # block has its pages zeroed by the operating system again, which took longer
            # than the sum.
            gates = reversed_gates(q, reversed_keys, queries.start, keys.start)
            counts = gates.cumsum_(-1)  # (B, H, n, m)
            m = counts.shape[-1]
            # In evaluation, past the training length, the far keys of every query count to
            # the last position (the bias is q_i . e[npos - 1] there): interpolate only the
            # nearest `counted` keys, those below it for some query (searchsorted finds where
            # each row reaches it).
            reached = torch.searchsorted(counts, counts.new_full((*counts.shape[:-1], 1), last))
            counted = int(reached.max())
            reach = min(last, queries.stop - keys.start)  # the largest count
            table, steps = position_logits(q, embedding, reach)
            near = counts[..., :counted].clamp_(max=last)  # p, interpolated
            bias = interpolated(table, steps, near)[0].flip(-1)
            if counted == m:
                return bias  # (B, H, n, m), keys in order
            far = table[..., last, None].expand(*table.shape[:-1], m - counted)
            return torch.cat([far, bias], dim=-1)  # (B, H, n, m), keys in order
