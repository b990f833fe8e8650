"""Causal self-attention with a positional encoding's score bias: every attention path of the
model behind one entry point, ``causal_attention(q, k, v, positions, encoding, dropout,
biases, content)``. It asks the encoding what bias it adds (``has_score_bias``,
``consecutive_bias``, ``score_bias``, ``has_key_bias``, ``key_bias``, ``content_bias``,
``content_biases``) and how far back it attends (``window``), never its name.

Which path runs when (T tokens, H heads, blocks of n queries):

    condition                                 path
    ----------------------------------------  ------------------------------------------------
    no score bias, no window shorter than T   unbiased_causal_attention
    a bias of the key alone from the content  key_bias_attention up to KEY_BIAS_LENGTH tokens;
      (key_bias: FoX) and no other, no window   longer, in evaluation on LOG_SUM_EXP_DEVICES
                                                (CPU), blocked_key_bias_attention
    a bias of the distance alone at           flex_attention_bias on FLEX_ATTENTION_DEVICES
      consecutive positions (consecutive_bias)  (CUDA) without dropout, else
                                              relative_bias_attention
    any other bias (of both positions, or     blocked_bias_attention; in evaluation on a CPU
      at positions with gaps, or of the         without a window its blocks after the first
      content: CoPE, FoX where the row above    take past_and_diagonal_attention
      does not take it), or a window
    a bias that needs a gradient (a learned   explicit_attention (posbench/explicit_attention.py),
      one, in training)                         from either of the two paths above

Why, and what each holds besides q, k, v and the output (a whole (H, T, T) tensor would be
gigabytes at evaluation lengths: 4 GiB for 4 heads at 16,384 tokens):

* unbiased_causal_attention: SDPA's fused causal kernel, the fastest, never builds a (T, T)
  mask. Nothing of (T, T). Every SDPA call takes bf16 inputs on a CPU cast up to float32
  (sdpa_dtype: its bf16 kernels are slower there), with or without a mask.
* key_bias_attention: the same kernel with the key's bias as one more q/k dimension. Nothing
  of (T, T); q and k with that dimension, in float32. blocked_key_bias_attention: the same per
  block of KEY_BIAS_BLOCK queries, each relative to its own reference, in two calls merged by
  their log-sum-exps; q, k, v with that dimension and the blocks' outputs.
* flex_attention_bias: one compiled kernel adds the (H, T) bias table inside and skips the key
  blocks in the future; a learned table gets its gradient through the lookup. The table only.
* relative_bias_attention: one SDPA call per block of at most QUERY_BLOCK queries, its mask a
  strided (Hankel) view of one row of distances that the fused kernel reads in place. The
  reversed keys and values, the blocks' outputs and a padded (H, T + n) row.
* blocked_bias_attention: the encoding's score_bias (and content_bias) per block of queries,
  the causal mask (and the window's) folded in; in evaluation the layers share the blocks'
  biases of positions (QueryBlockBiases). One block's bias and scores (at most
  MAX_SCORE_ELEMENTS) and the shared biases (SHARED_BIAS_ELEMENTS);
  past_and_diagonal_attention spares the masked copy of all but the diagonal square. With a
  window of w tokens a block of n queries sees at most n + w - 1 keys: time and memory linear
  in T.
* explicit_attention: SDPA's fused CPU kernel gives no gradient for its mask; blocks of at most
  EXPLICIT_QUERY_BLOCK queries, written out, with a hand-written backward. Each block's mask
  and weights, kept for the backward pass.

Blocks run from the last (the most keys) to the first. ``attention_scratch_elements`` counts
the memory of the evaluation paths, for the model's estimate of what evaluation needs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from posbench.encodings import PositionalEncoding
from posbench.explicit_attention import explicit_attention

if TYPE_CHECKING:  # importing flex_attention imports torch._dynamo: seconds per process start
    from torch.nn.attention.flex_attention import BlockMask

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
# At most this many queries per block of explicit_attention (a bias that needs a gradient:
# training T5, KERPLE, FIRE). Each block computes, then discards, the scores of its future keys,
# twice in the backward pass, and the explicit path has no fused kernel to skip them: at 128
# tokens, blocks of 32 skip 3/8 of that work. One layer at 32 x 128 tokens, 4
# heads, forward and backward: 56.8 ms with blocks of 32, 63.9 with 64, 77.3 with one block
# (NoPE's fused kernel 53.1 ms); 32 was also the fastest at 8 x 512 and 64 x 64 tokens, and 16
# slower (more calls).
EXPLICIT_QUERY_BLOCK = 32
# The device types on which a bias of the distance alone takes flex_attention_bias (one fused
# kernel that torch.compile generates, reading the bias table) instead of relative_bias_attention.
# CPUs keep the SDPA paths: they were measured faster there, and in torch 2.13 flex_attention
# has no backward on a CPU. The one place the choice is made; tests override it.
FLEX_ATTENTION_DEVICES = frozenset({"cuda"})
# In evaluation the layers of a forward pass share its query blocks' biases, up to this many
# elements in all (64 MiB in float32: every block of 2,048 tokens with 4 heads). Computed in
# each layer, they took 2/3 of the forward pass of a 2-layer FIRE model with all 32 switch
# points inside (0, 1) at 2,048 tokens (shared: 0.28 s instead of 0.50 s). At longer lengths
# the blocks beyond it are computed in each layer: memory stays bounded.
SHARED_BIAS_ELEMENTS = 2**24
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
# The device types whose fused SDPA kernel returns the log-sum-exps of its rows
# (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu), so that attention can be merged
# from parts in evaluation (merge_by_log_sum_exp). The one place the choice is made.
LOG_SUM_EXP_DEVICES = frozenset({"cpu"})
# What a bias from the content (content_bias: FoX, CoPE) may hold per score of a query block
# while it is computed, for the memory estimate (attention_scratch_elements): CoPE's gates,
# positions, their floor and ceiling (int64: two elements each), the two gathered logits and
# the interpolated bias.
CONTENT_SCRATCH_PER_SCORE = 10


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


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
    biases: QueryBlockBiases | None = None,
    content: object | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + encoding's score bias + causal mask) v, for q, k, v of
    (B, H, T, hs) at increasing ``positions`` (T,) or (B, T) -> (B, H, T, hs); ``biases``: the
    query blocks' biases shared by the layers of a forward pass (blocked_bias_attention);
    ``content``: the layer's encoding.content_state (None: no bias from the content).

    The one entry point: the module's table says which path it takes. flex_attention lacks
    attention dropout, so dropout keeps a bias of the distance alone on the SDPA path.
    """
    T = q.shape[2]
    if content is not None and fuses_key_bias(encoding, T, merges_by_log_sum_exp(q, dropout)):
        if T <= KEY_BIAS_LENGTH:
            return key_bias_attention(q, k, v, encoding.key_bias(content), dropout)
        return blocked_key_bias_attention(q, k, v, encoding.key_bias(content))
    windowed = hiding_window(encoding, T) is not None
    if windowed or content is not None:
        return blocked_bias_attention(q, k, v, positions, encoding, dropout, biases, content)
    if not encoding.has_score_bias:
        return unbiased_causal_attention(q, k, v, dropout)
    if biases is None:
        biases = QueryBlockBiases(encoding, keep_elements=0)
    bias = biases.consecutive_bias(positions)
    if bias is not None:
        if q.device.type in FLEX_ATTENTION_DEVICES and not dropout:
            return flex_attention_bias(q, k, v, bias)
        return relative_bias_attention(q, k, v, bias, dropout)
    return blocked_bias_attention(q, k, v, positions, encoding, dropout, biases)


def sdpa_dtype(q: torch.Tensor) -> torch.dtype:
    """The dtype SDPA runs in for inputs like ``q``: float32 for bf16 on a CPU, else q's own.

    SDPA's CPU kernels are slower in bf16 than in float32, with or without a mask, the backward
    most of all (benchmarks/precision.py attention, AMD EPYC Zen 4, avx512_bf16, one thread;
    forward and backward at the tiny model's (32, 4, 128, 32): NoPE's causal kernel 51.9 ms in
    bf16 against 27.3 ms on inputs cast up to float32, with ALiBi's mask 48.0 against 28.2 ms).
    In bf16 training ALiBi's steps ran at 0.69x NoPE's tokens/s, cast up at 0.98x
    (benchmarks/README.md). Casting q, k, v up and the output down costs little next to the
    (T, T) work, and is as accurate as float32 attention.
    """
    return torch.float32 if q.dtype == torch.bfloat16 and q.device.type == "cpu" else q.dtype


def mask_dtype(q: torch.Tensor, explicit: bool) -> torch.dtype:
    """The dtype of the bias masks (and of q, k, v on the SDPA path) for queries like ``q``:
    explicit_attention computes in float32 (float64 for float64 inputs) whatever q's dtype;
    SDPA runs in sdpa_dtype."""
    return torch.promote_types(q.dtype, torch.float32) if explicit else sdpa_dtype(q)


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
) -> torch.Tensor:
    """SDPA of queries q (B, H, n, hs) over keys and values k, v (B, H, m, hs), with a float
    ``mask`` ([B|1], H, n, m) in sdpa_dtype(q) or ``is_causal``, in sdpa_dtype(q) whether or
    not autocast is on -> (B, H, n, hs) in q's dtype. Callers that attend in blocks cast q, k
    and v once before (a cast per block would sum their gradients in bf16)."""
    dtype = sdpa_dtype(q)
    with torch.autocast(q.device.type, enabled=False):  # autocast would cast them to bf16
        y = F.scaled_dot_product_attention(
            q.to(dtype),
            k.to(dtype),
            v.to(dtype),
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=is_causal,
        )  # (B, H, n, hs)
    return y.to(q.dtype)


def unbiased_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + causal mask) v for q, k, v of (B, H, T, hs): SDPA's fused
    causal kernel, run in fp32 for bf16 inputs on a CPU (sdpa_dtype).

    (Plain bf16 products around an fp32 softmax measured as fast in whole training steps as
    SDPA's fp32 kernel on inputs cast up, but rounds the scores to bf16: 5x SDPA's error at
    peaked attention.)
    """
    return fused_attention(q, k, v, dropout=dropout, is_causal=True)


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


def fuses_key_bias(encoding: PositionalEncoding, length: int, merges: bool) -> bool:
    """Whether attention over ``length`` tokens folds the encoding's bias into SDPA's fused
    kernel (key_bias_attention, blocked_key_bias_attention): a bias of the key alone and no
    other, no window that hides keys, and at most KEY_BIAS_LENGTH tokens unless attention can
    be merged from parts (``merges``: merges_by_log_sum_exp)."""
    only_key_bias = encoding.has_key_bias and not encoding.has_score_bias
    unwindowed = hiding_window(encoding, length) is None
    return only_key_bias and unwindowed and (length <= KEY_BIAS_LENGTH or merges)


def merges_by_log_sum_exp(q: torch.Tensor, dropout: float) -> bool:
    """Whether attention of q can run as parts merged by their log-sum-exps
    (merge_by_log_sum_exp): on a LOG_SUM_EXP_DEVICES device, whose fused kernel returns them,
    without gradients (the log-sum-exp has none) and without dropout."""
    on_device = q.device.type in LOG_SUM_EXP_DEVICES
    return on_device and not (torch.is_grad_enabled() or dropout)


def merge_by_log_sum_exp(
    y_a: torch.Tensor, lse_a: torch.Tensor, y_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """The attention output over two disjoint sets of keys from each one's output y (B, H, n,
    hs) and log-sum-exp of the scores lse (B, H, n) -> (B, H, n, hs), exactly (as
    flash-decoding merges its key splits)."""
    lse = torch.logaddexp(lse_a, lse_b)[..., None]  # (B, H, n, 1)
    return y_a * (lse_a[..., None] - lse).exp() + y_b * (lse_b[..., None] - lse).exp()


def flex_attention_bias(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, compiled: bool = True
) -> torch.Tensor:
    """relative_bias_attention's result from one flex_attention call (FlexAttention, Dong et al.
    2024, https://arxiv.org/abs/2412.05496): q, k, v (B, H, T, hs) at consecutive positions and
    the bias table ``bias[h, i - j]`` at distances 0..T-1 (H, T), or ``bias[b, h, i - j]``
    (B, H, T) with a row per sequence (randomized distances) -> (B, H, T, hs).

    Its score_mod adds the table entry of each score's distance inside the fused kernel, and a
    causal BlockMask skips the key blocks wholly in a query block's future: no scores or bias of
    (T, T) are written, forward or backward, and a learned table (T5, KERPLE) gets its gradient
    through the lookup. The table stays float32 under bf16 autocast: rounded to bf16, ALiBi's
    flattest head's bias at 16,384 tokens (about -64) could move by 0.25. ``compiled=False``
    runs flex_attention's unfused implementation (tests), which writes the (B, H, T, T) scores.
    """
    from torch.nn.attention.flex_attention import flex_attention

    table = bias.float()  # ([B,] H, T)
    per_sequence = table.dim() == 3

    def add_bias(
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        # Future keys (negative distances) are masked by the block mask; clamped, their lookup
        # stays inside the table.
        distance = (q_idx - kv_idx).clamp(min=0)
        return score + (table[b, h, distance] if per_sequence else table[h, distance])

    # In a compiled model (train.compile) the model's compilation fuses flex_attention itself.
    fused = compiled and not torch.compiler.is_compiling()
    attention = compiled_flex_attention() if fused else flex_attention
    # The mask is built eagerly (and cached) even when called from a compiled model.
    mask = torch.compiler.disable(causal_block_mask)(q.shape[2], q.device)
    options = HALF_PRECISION_KERNEL_OPTIONS if q.is_cuda and q.element_size() == 2 else None
    return attention(q, k, v, score_mod=add_bias, block_mask=mask, kernel_options=options)


# flex_attention's CUDA block sizes for bf16 and fp16 inputs (forward: BLOCK_M queries by BLOCK_N
# keys; backward: BLOCK_M1 x BLOCK_N1 and BLOCK_M2 x BLOCK_N2). torch's default for heads of 64
# on an H100/H200 (128 x 128, 3 stages) needs 245,760 bytes of shared memory with the score_mod
# above, more than the chip's 232,448: the kernel failed to compile (torch 2.11, H200,
# 2026-12-04, model=small). These blocks, 2 stages, fit every head size up to 128. Float32 keeps
# torch's defaults, already sized for its 4-byte elements.
HALF_PRECISION_KERNEL_OPTIONS = {
    "BLOCK_M": 64,
    "BLOCK_N": 64,
    "BLOCK_M1": 32,
    "BLOCK_N1": 64,
    "BLOCK_M2": 64,
    "BLOCK_N2": 32,
    "num_stages": 2,
    "num_warps": 4,
}


# How many kernels torch.compile may keep for flex_attention (dynamo's default is 8 per function,
# past which it runs the function uncompiled). A run meets one shape per length, batch size,
# dtype and grad mode: training, validation, and at each evaluation length its full batches and
# its last one.
FLEX_RECOMPILE_LIMIT = 128


@functools.cache
def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process: uncompiled, it writes the whole (B, H, T, T)
    scores. torch.compile caches a kernel per score_mod code and input shapes, so every layer
    and step reuses it.

    Static shapes (``dynamic=False``): a kernel per shape, never one for any length. The
    dynamic-shape kernel that torch.compile builds once it has seen a second length failed to
    compile on a CPU (torch 2.13) and did not finish compiling in 100 s on an H200 for float32
    heads of 128 (torch 2.11, evaluating model=large at 2,512 tokens, 2026-12-04), where each
    static one took seconds. Raises dynamo's recompile limit to FLEX_RECOMPILE_LIMIT."""
    from torch.nn.attention.flex_attention import flex_attention

    config = torch._dynamo.config
    # recompile_limit since torch 2.7; cache_size_limit before it (an alias of it since).
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, limit, max(getattr(config, limit), FLEX_RECOMPILE_LIMIT))
    return torch.compile(flex_attention, dynamic=False)


def causal(
    b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    """flex_attention's mask_mod of causal attention: a query sees its own and earlier keys."""
    return q_idx >= kv_idx


@functools.lru_cache(maxsize=16)
def causal_block_mask(length: int, device: torch.device) -> BlockMask:
    """The causal BlockMask of ``length`` queries and keys, shared by every batch and head
    (create_block_mask evaluates ``causal`` on the whole (T, T) grid once, hence the cache)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(causal, None, None, length, length, device=device)


def relative_bias_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """Causal attention of q, k, v (B, H, T, hs) at consecutive positions with the score bias
    ``bias[h, i - j]`` given at distances 0..T-1 (H, T), or ``bias[b, h, i - j]`` (B, H, T) with
    a row per sequence (randomized distances) -> (B, H, T, hs).

    With the keys in reverse order, the bias of query a and reversed key c of a block is a
    function of a + c (a Hankel matrix), which is a strided view of one row of distances
    (``unfold``): no (H, Tq, Tk) tensor is ever written, and SDPA's fused kernel reads the view.
    Softmax does not depend on the order of the keys. Each block of queries [s, e) attends to
    keys [0, e); the future keys of its diagonal square get distances below 0, whose bias is
    -inf: the causal mask comes with the same view. A bias that needs a gradient (a learned
    one, in training) is written out in key order instead, for explicit_attention.
    """
    B, H, T, _ = q.shape
    trainable = torch.is_grad_enabled() and bias.requires_grad
    block = query_block_size(B, H, T, explicit=trainable)
    dtype = mask_dtype(q, explicit=trainable)
    bias = bias.to(dtype)  # ([B,] H, T)
    future = bias.new_full((*bias.shape[:-1], block - 1), float("-inf"))
    # ([B,] H, block - 1 + T): distances -(block - 1)..T-1
    padded = torch.cat([future, bias], dim=-1)

    def hankel(start: int, end: int) -> torch.Tensor:
        # Query start + a and key end - 1 - c are a + c - (n - 1) apart: row a of the mask is
        # the distances from a - (n - 1) on.
        distances = padded[..., block - (end - start) : block - 1 + end]  # ([B,] H, n - 1 + end)
        mask = distances.unfold(-1, end, 1)  # ([B,] H, n, end), strides (..., 1, 1)
        return mask if mask.dim() == 4 else mask[None]

    starts = range(0, T, block)
    if trainable:  # keys 0 .. end - 1, each block's bias written out: (1, H, n, end)
        masks = [hankel(start, min(start + block, T)).flip(-1) for start in starts]
        return explicit_attention(q, k, v, masks, dropout)
    # Key T - 1 - c at index c; q, k, v in sdpa_dtype: (B, H, T, hs) each.
    queries, keys, values = q.to(dtype), k.flip(2).to(dtype), v.flip(2).to(dtype)
    outputs = []
    for start in reversed(starts):  # the last block first (see blocked_bias_attention)
        end = min(start + block, T)
        outputs.append(
            fused_attention(
                queries[:, :, start:end],
                keys[:, :, T - end :],
                values[:, :, T - end :],
                hankel(start, end),
                dropout,
            )
        )
    return join_blocks(outputs).to(q.dtype)


def blocked_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
    biases: QueryBlockBiases | None = None,
    content: object | None = None,
) -> torch.Tensor:
    """causal_attention for any score bias, from the encoding's score_bias and content_bias
    (``content``: its content_state; with gradients content_biases, every block's at once):
    each block of queries [s, e) attends to keys [0, e) only (later keys are all in its future;
    with a window of w tokens, keys [s - w + 1, e)), with the bias and the causal mask folded
    into one float mask of (1, H, e - s, e), or (B, H, e - s, e) for positions (B, T) or a bias
    from the content. The blocks' biases of positions come from ``biases`` (shared by the
    layers of one forward pass; by default, this call's own).

    Blocks run from the last (the most keys) to the first: each block's temporaries then fit
    in memory the previous block freed, where growing ones made glibc's heap grow (measured at
    16,384 tokens: 0.7-1.0 GB added by the forward pass in first-to-last order, 0.4 GB now).
    """
    B, H, T, _ = q.shape
    window = hiding_window(encoding, T)
    # A bias of trained parameters (or of q and k), in training: explicit_attention.
    explicit = torch.is_grad_enabled() and (
        content is not None or any(p.requires_grad for p in encoding.parameters())
    )
    dtype = mask_dtype(q, explicit)
    most_keys = T if window is None else min(T, QUERY_BLOCK + window - 1)
    block = query_block_size(B, H, most_keys, explicit)
    if biases is None:
        biases = QueryBlockBiases(encoding, keep_elements=0)
    assert biases.distances is None, "randomized distances take relative_bias_attention"
    # Attended in the masks' dtype (explicit_attention casts them itself): (B, H, T, hs) each.
    attended = (q, k, v) if explicit else tuple(t.to(dtype) for t in (q, k, v))
    # Past keys need no mask but the bias when every one of them is in view (no window).
    in_parts = window is None and merges_by_log_sum_exp(q, dropout)
    # Each block's queries [start, end) and first key, the last block first.
    spans = [
        (start, min(start + block, T), 0 if window is None else max(0, start - window + 1))
        for start in reversed(range(0, T, block))
    ]
    # With gradients every block's bias from the content is kept for the backward: asked at once.
    from_content = None
    if explicit and content is not None:
        blocks = [(slice(start, end), slice(first, end)) for start, end, first in spans]
        from_content = encoding.content_biases(content, blocks)
    outputs, masks, key_starts = [], [], []
    for index, (start, end, first) in enumerate(spans):
        query_positions, key_positions = positions[..., start:end], positions[..., first:end]
        # ([B|1], H, n, m); a buffer for the bias of a block of queries holds H * block * T.
        # Only an encoding with a bias of positions is asked for one: the default score_bias reads
        # the positions' range (a device sync, and a graph break under torch.compile) for None.
        bias = None
        if encoding.has_score_bias:
            bias = biases.bias(start, query_positions, key_positions, dtype, H * block * T)
        if content is not None:  # (B, H, n, m)
            extra = (
                from_content[index]
                if from_content is not None
                else encoding.content_bias(content, slice(start, end), slice(first, end))
            )
            bias = extra.to(dtype) if bias is None else bias + extra.to(dtype)
        if bias is None and window is None:  # the encoding adds no bias at all: no mask
            return unbiased_causal_attention(q, k, v, dropout)
        if bias is None:  # only the window's mask
            bias = q.new_zeros(1, H, end - start, end - first, dtype=dtype)
        q_in, k_in, v_in = attended
        queries, keys, values = q_in[:, :, start:end], k_in[:, :, first:end], v_in[:, :, first:end]
        if in_parts and start:  # only the diagonal square [s, e) needs the causal mask
            diagonal = causal_bias(bias[..., start:], start, start)
            outputs.append(past_and_diagonal_attention(queries, keys, values, bias, diagonal))
            continue
        mask = causal_bias(bias, start, first)
        if window is not None:  # keys w or more tokens before a query are out of view
            mask = outside_window(mask, start, first, window)
        if explicit:
            masks.append(mask)
            key_starts.append(first)
        else:
            outputs.append(fused_attention(queries, keys, values, mask, dropout))
    if explicit:
        return explicit_attention(q, k, v, masks[::-1], dropout, key_starts[::-1])
    return join_blocks(outputs).to(q.dtype)


def outside_window(mask: torch.Tensor, start: int, first: int, window: int) -> torch.Tensor:
    """``mask`` (..., n, m) of queries from index ``start`` over keys from index ``first`` with
    -inf at the keys ``window`` or more tokens before their query."""
    n, m = mask.shape[-2:]
    query = torch.arange(start, start + n, device=mask.device)
    key = torch.arange(first, first + m, device=mask.device)
    too_far = query[:, None] - key[None, :] >= window  # (n, m)
    return mask.masked_fill(too_far, float("-inf"))


def distance_bias(encoding: PositionalEncoding, distances: torch.Tensor) -> torch.Tensor:
    """The encoding's bias of the distance alone at randomized ``distances`` (B, T), int64:
    row b's bias between tokens d apart is its relative_bias at distances[b, d]
    (posbench/random_positions.py) -> (B, H, T)."""
    B, T = distances.shape
    bias = encoding.relative_bias(distances.flatten())  # (H, B * T)
    assert bias is not None, "randomized distances need a bias of the distance alone"
    return bias.view(-1, B, T).transpose(0, 1)  # (B, H, T)


class QueryBlockBiases:
    """Where blocked_bias_attention gets each query block's score bias, as an attention mask of
    ([B|1], H, n, e) without the causal part: from the encoding, or from an earlier layer.

    One instance serves the layers of one forward pass, which share one encoding instance, so a
    block's bias is the same in each (with an encoding per layer, or randomized positions drawn
    per layer, each layer's attention has its own). With randomized ``distances`` (B, T)
    (posbench/random_positions.py) it holds the bias of the distance alone at them
    (distance_bias) instead, for relative_bias_attention.

    Without gradients, the biases of the first layer are kept, up to ``keep_elements`` in all
    (by default SHARED_BIAS_ELEMENTS; the blocks run from the largest), for the layers after
    it, and each bias not kept is written into one buffer (the encoding's score_bias(out=)): a fresh
    tensor of tens of MB per block at long lengths had its pages zeroed again by the operating
    system every time, which took longer than computing FIRE's bias (one layer at 16,384
    tokens: 1.8 s of page faults for 0.46 s of writing). With gradients every bias is computed
    afresh, for autograd (out= records none).
    """

    def __init__(
        self,
        encoding: PositionalEncoding,
        keep_elements: int | None = None,
        distances: torch.Tensor | None = None,
    ) -> None:
        self.encoding = encoding
        self.distances = distances
        self.keep_elements = SHARED_BIAS_ELEMENTS if keep_elements is None else keep_elements
        self.kept: dict[int, torch.Tensor] = {}  # by the block's first query
        self.kept_elements = 0
        self.workspace: torch.Tensor | None = None
        self.table: tuple[torch.Tensor | None] | None = None  # consecutive_bias's, once asked

    def consecutive_bias(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The encoding's bias of the distance alone, (H, T), when ``positions`` (the forward
        pass's, the same in every layer) are consecutive and it has one; else None. With
        randomized distances, its bias at them, (B, H, T) (the positions are 0..T-1 then).
        Computed at the first layer's call for all: the check reads the positions back (a device
        sync per layer on a GPU) and a learned table (T5's buckets, FIRE's MLP) would be
        recomputed."""
        if self.table is None and self.distances is not None:
            assert self.distances.shape[-1] == positions.shape[-1], "a distance per token"
            self.table = (distance_bias(self.encoding, self.distances),)
        if self.table is None:
            consecutive = bool((positions.diff() == 1).all())
            self.table = (self.encoding.consecutive_bias(positions) if consecutive else None,)
        return self.table[0]

    def bias(
        self,
        start: int,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        dtype: torch.dtype,
        largest: int,
    ) -> torch.Tensor | None:
        """The bias of the block of queries at ``query_positions`` (from the ``start``-th query)
        and keys at ``key_positions``, in ``dtype``, of at most ``largest`` elements per
        sequence; ``None``: the encoding adds none."""
        if start in self.kept:
            return self.kept[start]
        shape = (self.encoding.n_head, query_positions.shape[-1], key_positions.shape[-1])
        size = math.prod(query_positions.shape[:-1]) * math.prod(shape)
        fresh = torch.is_grad_enabled()
        keep = not fresh and self.kept_elements + size <= self.keep_elements
        # Positions shared by the batch: out= is laid out as that bias, (H, n, e).
        reuse = not (fresh or keep) and query_positions.dim() == 1
        out = self.workspace[:size].view(shape) if reuse and self.workspace is not None else None
        bias = self.encoding.score_bias(query_positions, key_positions, out=out)
        if bias is None:
            return None
        if reuse and self.workspace is None:  # in the dtype the encoding computes its bias in
            self.workspace = bias.new_empty(largest)
        bias = bias.to(dtype)
        if bias.dim() == 3:  # SDPA's CPU kernel takes a 4-D mask fused, a 3-D one 5x slower
            bias = bias[None]
        if keep:
            self.kept[start] = bias
            self.kept_elements += size
        return bias


def of_layer(draw: torch.Tensor | None, layer: int) -> torch.Tensor | None:
    """The positions or distances ``layer`` attends at: its row of a draw per layer
    (n_layer, B, T), else the draw itself (or None)."""
    return draw[layer] if draw is not None and draw.dim() == 3 else draw


def layer_biases(
    encodings: list[PositionalEncoding],
    positions: torch.Tensor,
    distances: torch.Tensor | None,
    make: Callable[..., Any] = QueryBlockBiases,
) -> list[Any]:
    """The QueryBlockBiases (or what ``make(encoding, distances=...)`` builds: a bidirectional
    model's TwoSidedBiases) of each layer of a forward pass whose layers attend with
    ``encodings`` at ``positions`` and randomized ``distances`` (None, or (B, T)) or a draw of
    either per layer ((n_layer, B, T)): layers that share an encoding instance share one,
    unless they attend at draws of their own, whose blocks' biases differ."""
    if positions.dim() == 3 or (distances is not None and distances.dim() == 3):
        return [make(e, distances=of_layer(distances, layer)) for layer, e in enumerate(encodings)]
    shared = {id(e): make(e, distances=distances) for e in encodings}
    return [shared[id(e)] for e in encodings]


def past_and_diagonal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, diagonal: torch.Tensor
) -> torch.Tensor:
    """Attention of a block of queries q (B, H, n, hs) and keys k, v (B, H, Tk, hs)
    whose mask is ``bias`` (1, H, n, Tk) except over the last n keys, where it is ``diagonal``
    (1, H, n, n), the bias with the causal mask -> (B, H, n, hs), without writing that mask.

    The past keys (bias only, read in place) and the diagonal square are two SDPA calls whose
    outputs are merged exactly by their log-sum-exps (merge_by_log_sum_exp). CPU only (SDPA's
    CPU flash kernel returns the log-sum-exp), without gradients; q, k, v in the masks' dtype.
    """
    past = k.shape[2] - q.shape[2]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    y_past, lse_past = flash(q, k[:, :, :past], v[:, :, :past], attn_mask=bias[..., :past])
    y_diag, lse_diag = flash(q, k[:, :, past:], v[:, :, past:], attn_mask=diagonal)
    return merge_by_log_sum_exp(y_past, lse_past, y_diag, lse_diag)


def causal_bias(bias: torch.Tensor, query_start: int = 0, key_start: int = 0) -> torch.Tensor:
    """Fold the causal mask into an additive score bias (..., Tq, Tk) of the queries from token
    ``query_start`` on and the keys from ``key_start`` on: a key after its query gets -inf.

    Token order, as every fused path masks: where positions increase it is their order, and the
    padding of a row at randomized positions, which repeats the row's last position
    (posbench/random_positions.py), stays in the future of every token before it."""
    n, m = bias.shape[-2:]
    query = torch.arange(query_start, query_start + n, device=bias.device)
    key = torch.arange(key_start, key_start + m, device=bias.device)
    future = key[None, :] > query[:, None]  # (Tq, Tk), the same for every sequence and head
    # One pass, where masked_fill copies first.
    return torch.where(future, float("-inf"), bias)


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    content: object | None,
    start: int,
    end: int,
    distances: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention probabilities of queries [start, end) over keys [0, end) that
    causal_attention attends with, for q, k (B, H, T, hs) at ``positions`` (T,) or (B, T)
    -> (B, H, n, e), written out (posbench diagnose): the encoding's biases of positions (at
    the randomized ``distances`` (B, T) where given: distance_bias) and of the content
    (``content``: its content_state), 0 at future keys and outside a window."""
    keys = k[:, :, :end]
    return query_probabilities(q[:, :, start:end], keys, positions, encoding, content, distances)


def query_probabilities(
    queries: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    content: object | None,
    distances: torch.Tensor | None = None,
) -> torch.Tensor:
    """attention_probabilities of the last n queries (B, H, n, hs) of a sequence over its keys
    k (B, H, e, hs) at ``positions`` (e,) or (B, e) (or longer), at randomized ``distances``
    (B, e) (or longer) where given -> (B, H, n, e): what a cached decode's step attends with
    (posbench/kv_cache.py)."""
    end = k.shape[2]
    start = end - queries.shape[2]
    scores = queries @ k.transpose(-1, -2) / math.sqrt(queries.shape[-1])
    if distances is None:  # ([B,] H, n, e) or None
        bias = encoding.score_bias(positions[..., start:end], positions[..., :end])
    else:  # the table at each pair's distance in tokens (future keys: 0's, masked below)
        apart = torch.arange(start, end)[:, None] - torch.arange(end)[None, :]  # (n, e)
        table = distance_bias(encoding, distances[..., :end])  # (B, H, e)
        bias = table[..., apart.clamp(min=0).to(queries.device)]  # (B, H, n, e)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if content is not None:
        scores = scores + encoding.content_bias(content, slice(start, end), slice(0, end))
    scores = causal_bias(scores, start)
    if encoding.window is not None:
        scores = outside_window(scores, start, 0, encoding.window)
    return F.softmax(scores, dim=-1)


def join_blocks(outputs: list[torch.Tensor]) -> torch.Tensor:
    """The outputs (B, H, n, hs) of query blocks computed last to first, joined in query order
    -> (B, H, T, hs); one block (training lengths) is returned as it is, where cat would copy it
    (forward and backward)."""
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs[::-1], dim=2)


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

    Without a bias, none: the fused kernel writes nothing of (T, T). A bias of the key alone
    (key_bias_attention, blocked_key_bias_attention) adds q, k, v with its dimension and the
    blocks' outputs in float32, and k, v reversed and cast while they are made: at most
    10*(C + H) per token (5 in float32, counted twice for a 16-bit model). A bias of the distance
    alone at consecutive positions (relative_bias_attention) adds the reversed keys and values
    and the query blocks' outputs before they are joined (3*C per token) and its bias row per
    head (twice, with its padded copy), counted per sequence (randomized distances give each
    its own). Any other score bias adds the attention scratch of one query block (the bias,
    its masked copy, SDPA's scores and probabilities, and the encoding's own intermediates:
    at most 6 per score, and CONTENT_SCRATCH_PER_SCORE more for a bias from
    the content), which query_block_size keeps bounded at any length, and the blocks' biases
    the layers share (at most SHARED_BIAS_ELEMENTS). A window bounds the keys of a block. Both
    of the last two may cast q, k and v up to float32 (bf16 on a CPU: sdpa_dtype), 3*C per
    token, counted twice for a 16-bit model (the estimate does not know the precision).
    """
    H, C = encoding.n_head, encoding.d_model
    first = torch.zeros(1, dtype=torch.long, device=device)
    window = hiding_window(encoding, length)
    content = encoding.has_content_bias
    windowed = window is not None
    if content and fuses_key_bias(encoding, length, device.type in LOG_SUM_EXP_DEVICES):
        return 10 * batch_size * length * (C + H)
    if consecutive and not (windowed or content) and encoding.relative_bias(first) is not None:
        return 9 * batch_size * length * C + 2 * batch_size * H * (length + QUERY_BLOCK)
    position_bias = encoding.score_bias(first, first) is not None
    if not (position_bias or windowed or content):
        return 0
    keys = length if window is None else min(length, QUERY_BLOCK + window - 1)
    block = query_block_size(batch_size, H, keys)
    per_score = 6 + (CONTENT_SCRATCH_PER_SCORE if content else 0)
    cast_up = 6 * batch_size * length * C  # q, k, v in float32
    scratch = per_score * batch_size * H * block * keys + cast_up
    if position_bias:
        every_block = H * length * (keys + block) // 2  # (H, n, m) for each block
        scratch += min(SHARED_BIAS_ELEMENTS, every_block)
    return scratch
