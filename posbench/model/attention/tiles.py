"""Attention variants in evaluation over tiles of keys, nearest first, for
posbench/model/attention/variants.py's evaluated_block: sigmoid attention (``sigmoid_block``: no
normalisation, each tile's weights times its values added up) and stick-breaking
(``stick_breaking_block``: the stick each query has left carried from tile to tile, the tiles
stopped once every query's is spent). Without gradients; queries scaled by 1/sqrt(hs) already.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posbench.model.attention.blocks import causal_bias, outside_window

# Keys per tile of evaluated_block: a block of 256 queries' logits over 512 keys in 4 heads
# (2 MiB in float32) stay in a core's caches through the few passes over them, where a whole
# block's over 16,384 keys (64 MiB) went to memory and back at each. Sigmoid at 2,048 / 16,384
# tokens, as a multiple of NoPE's time (the tiny model, one thread, Zen 4, loaded): tiles of
# 64 keys 1.34 / 1.24, 128 1.13 / 1.22, 512 1.04 / 1.14. Stick-breaking makes more passes (its
# softplus, running sum and exp), and smaller tiles suit it (without its early stop, each
# farther tile computed: 512 keys 3.57 / 6.23, 256 - / 5.84, 128 1.85 / 3.38, 64 2.25 / 2.81).
KEY_TILE = 512
STICK_TILE = 128


def sigmoid_block(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor | None,
    query_start: int,
    key_start: int,
    window: int | None,
    sigmoid_bias: float,
) -> torch.Tensor:
    """Sigmoid attention of queries (B, H, n, hs), scaled, from token ``query_start`` over keys
    and values (B, H, m, hs) from ``key_start`` with the encoding's ``bias`` ([B|1], H, n, m) or
    None, causal and within ``window`` tokens: sum over tiles of sigmoid(z + b) v
    -> (B, H, n, hs)."""
    n, m = queries.shape[2], keys.shape[2]
    out = queries.new_zeros(*queries.shape[:-1], values.shape[-1])  # (B, H, n, hs)
    for tile_end in range(m, 0, -KEY_TILE):
        tile_start = max(0, tile_end - KEY_TILE)
        tile = slice(tile_start, tile_end)
        scores = torch.matmul(queries, keys[:, :, tile].transpose(-1, -2))  # (B, H, n, t)
        if bias is not None:
            scores += bias[..., tile]
        first_key = key_start + tile_start
        if key_start + tile_end - 1 > query_start:  # a key after some query: the diagonal
            scores = causal_bias(scores, query_start, first_key)
        if window is not None and query_start + n - 1 - first_key >= window:
            scores = outside_window(scores, query_start, first_key, window)
        sigmoid = torch.sigmoid_(scores.add_(sigmoid_bias))
        out += torch.matmul(sigmoid, values[:, :, tile])
    return out


def stick_breaking_block(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    own_values: torch.Tensor,
    bias: torch.Tensor | None,
    query_start: int,
    key_start: int,
    window: int | None,
) -> torch.Tensor:
    """evaluated_block for stick-breaking: its arguments -> (B, H, n, hs). The keys and values
    are reversed once (nearest first), so that a tile's running sum of softplus(z) =
    -ln(1 - sigmoid(z)) is a cumsum in place; a tile's weights are e^(z - that sum), at most
    sigmoid(z), times the stick the nearer tiles left, e^carried, applied to their product
    with the values (one multiply per query instead of per key)."""
    n, m = queries.shape[2], keys.shape[2]
    finfo = torch.finfo(queries.dtype)
    spent = math.log(finfo.tiny) + math.log(finfo.eps) - 5  # e^spent rounds to 0
    reversed_keys, reversed_values = keys.flip(2), values.flip(2)  # key m - 1 - c at c
    query = torch.arange(query_start, query_start + n, device=queries.device)[:, None]  # (n, 1)
    out = queries.new_zeros(*queries.shape[:-1], values.shape[-1])  # (B, H, n, hs)
    carried = queries.new_zeros(*queries.shape[:-1], 1)  # log of the stick left: (B, H, n, 1)
    for tile_start in range(0, m, STICK_TILE):
        tile_end = min(tile_start + STICK_TILE, m)
        tile = slice(tile_start, tile_end)
        scores = torch.matmul(queries, reversed_keys[:, :, tile].transpose(-1, -2))  # (B, H, n, t)
        if bias is not None:
            scores += bias[..., m - tile_end : m - tile_start].flip(-1)
        nearest, farthest = key_start + m - 1 - tile_start, key_start + m - tile_end
        causal = nearest >= query_start  # some query's own or a later key: hidden
        windowed = window is not None and query_start + n - 1 - farthest >= window
        if causal or windowed:
            key = key_start + m - 1 - torch.arange(tile_start, tile_end, device=query.device)
            hidden = key[None, :] >= query  # (n, t)
            if windowed:
                hidden |= query - key[None, :] >= window
            scores.masked_fill_(hidden, float("-inf"))
        broken = F.softplus(scores).cumsum_(-1)  # -ln of the stick each key and nearer ones keep
        weights = torch.exp_(scores.sub_(broken))
        out.addcmul_(carried.exp(), torch.matmul(weights, reversed_values[:, :, tile]))
        carried = carried - broken[..., -1:]
        if carried.max() < spent:  # every farther weight is below e^carried: 0
            break
    return out.addcmul_(carried.exp(), own_values)
