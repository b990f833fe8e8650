"""Causal self-attention with a positional encoding's score bias: every attention path of the
model behind one entry point, ``causal_attention(q, k, v, positions, encoding, dropout,
biases, content)``. It asks the encoding what bias it adds (``has_score_bias``,
``consecutive_bias``, ``score_bias``, ``has_key_bias``, ``key_bias``, ``content_bias``,
``content_bias_parts``, ``content_biases``, ``content_table``, ``has_transitions``,
``transitions``) and how far back it attends (``window``), never its name. Each path is a
module of this package (the list below the table).

Which path runs when (T tokens, H heads, blocks of n queries):

    condition                                 path
    ----------------------------------------  ------------------------------------------------
    q, k rotated twice by a position remap    remap_attention (remap.py): two fused calls merged
      (two_part_window: eval.position_remap)    by their log-sum-exps, or written out per block
    no score bias, no window shorter than T   unbiased_causal_attention
    transitions between key and query from    transition_attention
      the content (PaTH), no window
    a bias of the key alone from the content  key_bias_attention up to KEY_BIAS_LENGTH tokens;
      (key_bias: FoX) and no other, no window   longer, in evaluation on LOG_SUM_EXP_DEVICES
                                                (CPU), blocked_key_bias_attention
    a bias of the distance alone at           flex_attention_bias on FLEX_ATTENTION_DEVICES
      consecutive positions (consecutive_bias)  (CUDA) without dropout, else
                                              relative_bias_attention
    any other bias (of both positions, or     blocked_bias_attention; in evaluation on a CPU
      at positions with gaps, or of the         without a window its blocks take
      content: CoPE, FoX where the row above    past_and_diagonal_attention
      does not take it), or a window
    a bias that needs a gradient (a learned   explicit_attention,
      one, in training)                         from either of the two paths above

Why, and what each holds besides q, k, v and the output (a whole (H, T, T) tensor would be
gigabytes at evaluation lengths: 4 GiB for 4 heads at 16,384 tokens):

* unbiased_causal_attention: SDPA's fused causal kernel, the fastest, never builds a (T, T)
  mask. Nothing of (T, T). Every SDPA call takes bf16 inputs on a CPU cast up to float32
  (sdpa_dtype: its bf16 kernels are slower there), with or without a mask. Values narrower
  than q and k (PoPE's) are padded to their width for it, except in training on
  NARROW_VALUES_DEVICES (CPU) up to NARROW_VALUES_LENGTH tokens: narrow_values_attention,
  explicit_attention with the causal mask alone, at v's width.
* transition_attention: chunks of queries, each over the earlier keys carried forward to it
  through the transitions and its own (n, n) logits; in evaluation on a CPU the earlier keys on
  SDPA's fused kernel, merged by log-sum-exps. The carried keys (T, hs) and one chunk's (n, n);
  with gradients each chunk's scores over its keys, kept for the backward pass.
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
  biases of positions (QueryBlockBiases); with gradients a bias of the distance alone at
  consecutive positions is looked up per block from its table (distance_grid). One block's
  bias and scores (at most MAX_SCORE_ELEMENTS) and the shared biases (SHARED_BIAS_ELEMENTS);
  past_and_diagonal_attention spares the masked copy (the kernel masks the diagonal) and, for a
  content bias the same at every far key of a query (content_bias_parts: CoPE's), any mask for
  those keys. With a
  window of w tokens a block of n queries sees at most n + w - 1 keys: time and memory linear
  in T.
* explicit_attention: SDPA's fused CPU kernel gives no gradient for its mask; blocks of at most
  EXPLICIT_QUERY_BLOCK queries, written out, with a hand-written backward. Each block's mask
  and weights, kept for the backward pass.

Blocks run from the last (the most keys) to the first. ``attention_scratch_elements`` counts
the memory of the evaluation paths, for the model's estimate of what evaluation needs.

The modules, each path's own and what they share:

    fused.py          SDPA in the dtype it runs fastest: unbiased_causal_attention, and parts
                        merged by their log-sum-exps (merge_by_log_sum_exp)
    key_bias.py       key_bias_attention, blocked_key_bias_attention
    transitions.py    transition_attention
    flex.py           flex_attention_bias
    relative_bias.py  relative_bias_attention
    blocked_bias.py   blocked_bias_attention, past_and_diagonal_attention
    explicit.py       explicit_attention, narrow_values_attention
    blocks.py         query blocks: their size, their causal and window masks, joined outputs
    biases.py         QueryBlockBiases: the blocks' biases the layers of a forward pass share
    probabilities.py  the probabilities written out (posbench diagnose, a cached decode)
    scratch.py        attention_scratch_elements, wide_query_key_elements
    remap.py          remap_attention: eval.position_remap's near and far keys in one softmax
    bidirectional.py  model.causal=false's attention, every token over its whole row
    variants.py       weights other than a plain softmax (model.attn_sinks, model.attention:
                        sigmoid, stick_breaking), its own table of paths; causal_attention
                        hands them over before any path above; tiles.py, their evaluation
                        over tiles of keys

A constant lives in the module of the path it tunes; other modules read it as that module's
attribute (``blocks.QUERY_BLOCK``), so that a test or benchmark that sets it sets it for all.
"""

from __future__ import annotations

import torch

from posbench.encodings import PositionalEncoding

# key_bias.KEY_BIAS_LENGTH as an attribute: set in one place for the entry and fuses_key_bias
from posbench.model.attention import key_bias
from posbench.model.attention.biases import QueryBlockBiases, layer_biases, of_layer
from posbench.model.attention.blocked_bias import blocked_bias_attention
from posbench.model.attention.blocks import hiding_window
from posbench.model.attention.flex import flex_attention_bias
from posbench.model.attention.fused import merges_by_log_sum_exp, unbiased_causal_attention
from posbench.model.attention.key_bias import (
    blocked_key_bias_attention,
    fuses_key_bias,
    key_bias_attention,
)
from posbench.model.attention.probabilities import attention_probabilities, query_probabilities
from posbench.model.attention.relative_bias import relative_bias_attention
from posbench.model.attention.remap import remap_attention
from posbench.model.attention.scratch import attention_scratch_elements, wide_query_key_elements
from posbench.model.attention.transitions import transition_attention
from posbench.model.attention.variants import AttentionVariant, variant_attention

__all__ = [  # the entry point, and what the model, memory, diagnose and the decode cache use
    "AttentionVariant",
    "QueryBlockBiases",
    "attention_probabilities",
    "attention_scratch_elements",
    "causal_attention",
    "layer_biases",
    "of_layer",
    "query_probabilities",
    "unbiased_causal_attention",
    "wide_query_key_elements",
]

# The device types on which a bias of the distance alone takes flex_attention_bias (one fused
# kernel that torch.compile generates, reading the bias table) instead of relative_bias_attention.
# CPUs keep the SDPA paths: they were measured faster there, and in torch 2.13 flex_attention
# has no backward on a CPU. The one place the choice is made; tests override it.
FLEX_ATTENTION_DEVICES = frozenset({"cuda"})


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
    biases: QueryBlockBiases | None = None,
    content: object | None = None,
    variant: AttentionVariant | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + encoding's score bias + causal mask) v, for q, k, v of
    (B, H, T, hs) at increasing ``positions`` (T,) or (B, T) -> (B, H, T, hs); ``biases``: the
    query blocks' biases shared by the layers of a forward pass (blocked_bias_attention);
    ``content``: the layer's encoding.content_state (None: no bias from the content);
    ``variant``: the layer's weights (None or ``plain``: the softmax; else variants.py's paths).

    The one entry point: the package's table says which path it takes. flex_attention lacks
    attention dropout, so dropout keeps a bias of the distance alone on the SDPA path.
    """
    if encoding.two_part_window is not None:  # eval.position_remap (remap.py)
        return remap_attention(q, k, v, encoding.two_part_window, dropout)
    if variant is not None and not variant.plain:
        return variant_attention(q, k, v, positions, encoding, dropout, biases, content, variant)
    T = q.shape[2]
    if content is not None and encoding.has_transitions and hiding_window(encoding, T) is None:
        return transition_attention(q, k, v, encoding.transitions(content), dropout)
    if content is not None and fuses_key_bias(encoding, T, merges_by_log_sum_exp(q, dropout)):
        if T <= key_bias.KEY_BIAS_LENGTH:
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
