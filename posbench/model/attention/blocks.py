"""Query blocks, which every biased path attends in: how many queries per call
(``query_block_size``), the causal and window masks of a block, and the blocks' outputs joined
back in query order.
"""

from __future__ import annotations

import torch

from posbench.encodings import PositionalEncoding

# A score bias cannot use SDPA's fused causal kernel: SDPA takes it as a float mask of (H, queries,
# keys). A bias of the distance alone (ALiBi, T5, KERPLE: the encoding's relative_bias) never
# needs that tensor written (relative_bias_attention). Any other bias is built per block of
# queries, each block's bias and scores kept under this many elements (64 MiB in float32): at
# evaluation lengths a whole (H, T, T) tensor is gigabytes (4 heads at 16,384 tokens: 4 GiB).
MAX_SCORE_ELEMENTS = 2**24
# At most this many queries per SDPA call with a bias: each call also computes the future half
# of its block's diagonal square (and the bias there), so smaller blocks waste less work,
# larger ones make fewer calls.
QUERY_BLOCK = 256
# At most this many queries per block of a bias from the content attended in parts in evaluation
# (CoPE's counts: blocked_bias_attention's past_and_diagonal_attention). A block's counts run
# from each query over its block's later keys (zeros) before the keys it counts, so their width
# is the block's height plus the keys that reach the last position: at 2,048 tokens, 4 heads,
# the untrained `tiny` CoPE ran at 0.46x NoPE's tokens/s in blocks of 256, 0.56x in blocks of
# 128 and 0.54x in blocks of 64 (more calls), while FIRE's bias of positions ran at 0.83x, 0.80x
# and 0.74x (one thread, AMD EPYC Zen 3, 2026-12-07).
CONTENT_QUERY_BLOCK = 128
# At most this many queries per block of explicit_attention (a bias that needs a gradient:
# training T5, KERPLE, FIRE). Each block computes, then discards, the scores of its future keys,
# twice in the backward pass, and the explicit path has no fused kernel to skip them: at 128
# tokens, blocks of 32 skip 3/8 of that work. One layer at 32 x 128 tokens, 4
# heads, forward and backward: 56.8 ms with blocks of 32, 63.9 with 64, 77.3 with one block
# (NoPE's fused kernel 53.1 ms); 32 was also the fastest at 8 x 512 and 64 x 64 tokens, and 16
# slower (more calls).
EXPLICIT_QUERY_BLOCK = 32


def hiding_window(encoding: PositionalEncoding, length: int) -> int | None:
    """The encoding's window (in tokens) when it hides keys of a sequence of ``length`` tokens
    from some query; None when every query sees all its keys (no window, or one that long)."""
    window = encoding.window
    return window if window is not None and window < length else None


def query_block_size(batch: int, n_head: int, length: int, explicit: bool = False) -> int:
    """Queries per attention call with a bias: at most QUERY_BLOCK (EXPLICIT_QUERY_BLOCK for
    ``explicit`` attention), and few enough that their scores over ``length`` keys fit
    MAX_SCORE_ELEMENTS."""
    most = EXPLICIT_QUERY_BLOCK if explicit else QUERY_BLOCK
    return max(1, min(length, most, MAX_SCORE_ELEMENTS // (batch * n_head * length)))


def causal_bias(bias: torch.Tensor, query_start: int = 0, key_start: int = 0) -> torch.Tensor:
    """Fold the causal mask into an additive score bias (..., Tq, Tk) of the queries from token
    ``query_start`` on and the keys from ``key_start`` on: a key after its query gets -inf.

    Token order, as every fused path masks: where positions increase it is their order, and the
    padding of a row at randomized positions, which repeats the row's last position
    (posbench/model/random_positions.py), stays in the future of every token before it."""
    n, m = bias.shape[-2:]
    query = torch.arange(query_start, query_start + n, device=bias.device)
    key = torch.arange(key_start, key_start + m, device=bias.device)
    future = key[None, :] > query[:, None]  # (Tq, Tk), the same for every sequence and head
    # One pass, where masked_fill copies first.
    return torch.where(future, float("-inf"), bias)


def outside_window(mask: torch.Tensor, start: int, first: int, window: int) -> torch.Tensor:
    """``mask`` (..., n, m) of queries from index ``start`` over keys from index ``first`` with
    -inf at the keys ``window`` or more tokens before their query."""
    n, m = mask.shape[-2:]
    query = torch.arange(start, start + n, device=mask.device)
    key = torch.arange(first, first + m, device=mask.device)
    too_far = query[:, None] - key[None, :] >= window  # (n, m)
    return mask.masked_fill(too_far, float("-inf"))


def join_blocks(outputs: list[torch.Tensor]) -> torch.Tensor:
    """The outputs (B, H, n, hs) of query blocks computed last to first, joined in query order
    -> (B, H, T, hs); one block (training lengths) is returned as it is, where cat would copy it
    (forward and backward)."""
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs[::-1], dim=2)
