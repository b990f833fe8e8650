"""``attention_scratch_elements``: an upper estimate of the memory causal_attention's paths hold in
evaluation, for the model's estimate of what evaluation needs (posbench/evaluation/memory.py).
"""

from __future__ import annotations

import torch

from posbench.encodings import PositionalEncoding
from posbench.encodings.path import CHUNK

# Their constants as attributes: set in one place for every path (the package's docstring).
from posbench.model.attention import biases, blocks, fused
from posbench.model.attention.blocks import hiding_window, query_block_size
from posbench.model.attention.key_bias import fuses_key_bias

# What a bias from the content (content_bias: FoX, CoPE) may hold per score of a query block
# while it is computed, for the memory estimate (attention_scratch_elements): CoPE's gates,
# positions, their floor and ceiling (int64: two elements each), the two gathered logits and
# the interpolated bias.
CONTENT_SCRATCH_PER_SCORE = 10


def wide_query_key_elements(encoding: PositionalEncoding, tokens: int) -> int:
    """The elements that queries and keys wider than the values (``query_key_width``: PoPE's
    polar vectors, a remap's [near | far] halves) add for ``tokens`` tokens of one layer: their
    extra width, and what attention writes because of it. A remap (remap_attention) writes two
    fused calls' outputs and log-sum-exps, their merge and join, and copies of the far halves
    and the values the far call may take contiguous (6*C + 2*H per token); one wide pair
    (fused_attention) writes the values padded to its width and an output as wide."""
    extra = encoding.query_key_width - 1
    if not extra:
        return 0
    C, H = encoding.d_model, encoding.n_head
    remapped = encoding.two_part_window is not None
    written = 6 * C + 2 * H if remapped else 2 * extra * C
    return tokens * (2 * extra * C + written)


def attention_scratch_elements(
    encoding: PositionalEncoding,
    batch_size: int,
    length: int,
    consecutive: bool,
    device: torch.device,
) -> int:
    """An upper estimate of the elements causal_attention holds under inference mode, besides
    q, k, v and its output, for ``batch_size`` sequences of ``length`` tokens with
    ``encoding``'s score bias, at ``consecutive`` positions (else each at its own).

    Without a bias, none: the fused kernel writes nothing of (T, T). Transitions
    (transition_attention: PaTH) add w, the keys carried in place, the padded values and the
    chunks' outputs, in float32 (16*(C + H) per token, a 16-bit model's counted twice). A bias
    of the key alone (key_bias_attention, blocked_key_bias_attention) adds q, k, v with its
    dimension and the blocks' outputs in float32, and k, v reversed and cast while they are
    made: at most 10*(C + H) per token (5 in float32, counted twice for a 16-bit model). A bias
    of the distance alone at consecutive positions (relative_bias_attention) adds the reversed
    keys and values and the query blocks' outputs before they are joined (3*C per token) and its
    bias row per head (twice, with its padded copy), counted per sequence (randomized distances
    give each its own). Any other score bias adds the attention scratch of one query block (the
    bias, its masked copy, SDPA's scores and probabilities, and the encoding's own
    intermediates: at most 6 per score, and CONTENT_SCRATCH_PER_SCORE more for a bias from the
    content), which query_block_size keeps bounded at any length, and the blocks' biases the
    layers share (at most SHARED_BIAS_ELEMENTS). A window bounds the keys of a block. Both of
    the last two may cast q, k and v up to float32 (bf16 on a CPU: sdpa_dtype), 3*C per token,
    counted twice for a 16-bit model (the estimate does not know the precision).
    """
    H, C = encoding.n_head, encoding.d_model
    first = torch.zeros(1, dtype=torch.long, device=device)
    window = hiding_window(encoding, length)
    content = encoding.has_content_bias
    windowed = window is not None
    if content and fuses_key_bias(encoding, length, device.type in fused.LOG_SUM_EXP_DEVICES):
        return 10 * batch_size * length * (C + H)
    if content and encoding.has_transitions and not windowed:
        # transition_attention: w, the carried keys, the padded values and the chunks' outputs,
        # q, k, v cast up (float32, 8*(C + H) per token, twice for a 16-bit model); where the
        # chunks are not merged by log-sum-exps, one chunk's scores and weights over every key.
        merged = device.type in fused.LOG_SUM_EXP_DEVICES
        scores = 0 if merged else 3 * batch_size * H * CHUNK * length
        return 16 * batch_size * length * (C + H) + scores
    if consecutive and not (windowed or content) and encoding.relative_bias(first) is not None:
        return 9 * batch_size * length * C + 2 * batch_size * H * (length + blocks.QUERY_BLOCK)
    position_bias = encoding.score_bias(first, first) is not None
    if not (position_bias or windowed or content):
        return 0
    keys = length if window is None else min(length, blocks.QUERY_BLOCK + window - 1)
    block = query_block_size(batch_size, H, keys)
    per_score = 6 + (CONTENT_SCRATCH_PER_SCORE if content else 0)
    cast_up = 6 * batch_size * length * C  # q, k, v in float32
    scratch = per_score * batch_size * H * block * keys + cast_up
    if position_bias:
        every_block = H * length * (keys + block) // 2  # (H, n, m) for each block
        scratch += min(biases.SHARED_BIAS_ELEMENTS, every_block)
    return scratch
