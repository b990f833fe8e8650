"""A bias of the key alone (``key_bias``: FoX) folded into SDPA's fused causal kernel as one more
q/k dimension: ``key_bias_attention`` up to KEY_BIAS_LENGTH tokens, ``blocked_key_bias_attention``
past it (in evaluation, where parts can be merged by their log-sum-exps).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posbench.encodings import PositionalEncoding
from posbench.model.attention.blocks import hiding_window, join_blocks
from posbench.model.attention.fused import merge_by_log_sum_exp

# A bias of the key alone (key_bias: FoX) takes SDPA's fused causal kernel up to this many
# tokens, taken relative to the first key's, the one key every query sees (a later reference
# would let a query's rounding depend on the tokens after it): its values then span T tokens'
# worth of it (FoX: T log-gates, |log f| = 0.69 at f = 1/2: 1,420 at 2,048 tokens, which
# float32 rounds by 6e-5; measured against float64 at 2,048 tokens, the initial gates: outputs
# within 1.6e-4 over three draws, tests/test_fox.py). Longer sequences take blocks of
# queries, each relative to its own reference.
KEY_BIAS_LENGTH = 2048
# Queries per block of blocked_key_bias_attention: a block's logits are float32 values of the
# bias relative to its first query, up to KEY_BIAS_BLOCK tokens' worth (FoX, gates near 1/2:
# 88 at 128), whose rounding stays in the output. Measured at 16,384 tokens against float64
# (tests/test_fox.py): 9.5e-6 with blocks of 128, 1.3e-5 with 256.
KEY_BIAS_BLOCK = 128


def fuses_key_bias(encoding: PositionalEncoding, length: int, merges: bool) -> bool:
    """Whether attention over ``length`` tokens folds the encoding's bias into SDPA's fused
    kernel (key_bias_attention, blocked_key_bias_attention): a bias of the key alone and no
    other, no window that hides keys, and at most KEY_BIAS_LENGTH tokens unless attention can
    be merged from parts (``merges``: merges_by_log_sum_exp)."""
    only_key_bias = encoding.has_key_bias and not encoding.has_score_bias
    unwindowed = hiding_window(encoding, length) is None
    return only_key_bias and unwindowed and (length <= KEY_BIAS_LENGTH or merges)


def key_bias_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + b_j + causal mask) v for q, k, v (B, H, T, hs) and a bias of
    each key ``key_bias`` b (B, H, T) -> (B, H, T, hs), on SDPA's fused causal kernel: q gets
    one more dimension of sqrt(hs) and k one of b, so the scaled product q'.k' / sqrt(hs) is
    q.k / sqrt(hs) + b, and no (T, T) mask is written, forward or backward (b gets its gradient
    through k's). v gets a dimension of zeros too: SDPA's fused CPU kernel takes v only at q's
    width (measured at 2,048 tokens: 15 ms at hs + 1 against 190 ms on the unfused path a
    narrower v takes). Computed in float32 (float64 for float64 inputs), b taken relative to the
    first key's (KEY_BIAS_LENGTH says why, and how precise that is)."""
    hs = q.shape[-1]
    with torch.autocast(q.device.type, enabled=False):  # autocast would round q', k' down
        relative = key_bias - key_bias[..., :1]  # (B, H, T)
        queries, keys, values = with_key_bias_dimension(q, k, v, relative)  # (B, H, T, hs + 1)
        y = F.scaled_dot_product_attention(
            queries, keys, values, dropout_p=dropout, is_causal=True, scale=1 / math.sqrt(hs)
        )  # (B, H, T, hs + 1)
    return y[..., :hs].to(q.dtype)


def with_key_bias_dimension(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, T, hs) with one more dimension each, in float32 (float64 for float64
    inputs): sqrt(hs) for q, ``key_bias`` (B, H, T) for k, 0 for v -> (B, H, T, hs + 1) each,
    so that q'.k' / sqrt(hs) = q.k / sqrt(hs) + the key's bias."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    q_extra = q.new_full((*q.shape[:-1], 1), math.sqrt(q.shape[-1]), dtype=dtype)
    queries = torch.cat([q.to(dtype), q_extra], dim=-1)  # (B, H, T, hs + 1)
    keys = torch.cat([k.to(dtype), key_bias.to(dtype)[..., None]], dim=-1)  # (B, H, T, hs + 1)
    values = F.pad(v.to(dtype), (0, 1))  # (B, H, T, hs + 1), the last dimension 0
    return queries, keys, values


def blocked_key_bias_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor
) -> torch.Tensor:
    """key_bias_attention's result past KEY_BIAS_LENGTH, in evaluation on a CPU
    (merges_by_log_sum_exp): q, k, v (B, H, T, hs) and a bias of each key b (B, H, T)
    -> (B, H, T, hs).

    One reference key for the whole sequence leaves b's far values too large for float32 (FoX at
    16,384 tokens: 11,000, rounded by 1e-3). Here each block of KEY_BIAS_BLOCK queries [s, e)
    takes b relative to its first query's (a key every query of the block sees): small for the
    keys near the block, which carry its weight, and the far keys' weights underflow to 0 as
    they should. The block is two calls of SDPA's fused CPU kernel, with b as one more q/k
    dimension (key_bias_attention): over the keys before it (no mask) and over its diagonal
    square (causal), merged by their log-sum-exps. No (T, T) tensor is written, nor a mask of
    the block.

    The keys are in reverse order, so that the kernel reads a block's past keys nearest first:
    farthest first, each later chunk of keys raises the kernel's running maximum, and its sums
    rescaled by e^-87 to e^-104 become subnormal floats, whose arithmetic is slow (one layer at
    16,384 tokens, FoX's initial gates near 1/2: 1.47 s, against 0.92 s with subnormals
    flushed to zero, or with the keys nearest first, or with a bias of 0).
    """
    T, hs = q.shape[2:]
    scale = 1 / math.sqrt(hs)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    reversed_bias = key_bias.flip(-1)  # (B, H, T): key T - 1 - c's at index c
    with torch.autocast(q.device.type, enabled=False):  # autocast would round q', k' down
        # Key T - 1 - c at index c; each block writes the bias of its keys [0, e) in k's last
        # dimension: (B, H, T, hs + 1) each.
        queries, keys, values = with_key_bias_dimension(q, k.flip(2), v.flip(2), reversed_bias)
        outputs = []
        for start in reversed(range(0, T, KEY_BIAS_BLOCK)):
            end = min(start + KEY_BIAS_BLOCK, T)
            reference = key_bias[..., start, None]  # (B, H, 1): the first query's key
            keys[:, :, T - end :, hs] = reversed_bias[..., T - end :] - reference
            block = queries[:, :, start:end]  # (B, H, n, hs + 1)
            # The diagonal square back in key order, for the causal mask: (B, H, n, hs + 1).
            diagonal = [t[:, :, T - end : T - start].flip(2) for t in (keys, values)]
            y, lse = flash(block, *diagonal, is_causal=True, scale=scale)
            if start:  # the keys before the block, nearest first
                past = [t[:, :, T - start :] for t in (keys, values)]  # (B, H, s, hs + 1)
                y = merge_by_log_sum_exp(*flash(block, *past, scale=scale), y, lse)
            outputs.append(y[..., :hs])
    return join_blocks(outputs).to(q.dtype)
