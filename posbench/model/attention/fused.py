"""SDPA's fused kernel, as every path but the explicit one calls it: in the dtype it runs fastest
(``sdpa_dtype``), causal without a bias (``unbiased_causal_attention``, the fastest path), and
attention merged exactly from parts by their log-sum-exps where the device's kernel returns them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posbench.model.attention.explicit import narrow_values_attention

# The device types whose fused SDPA kernel returns the log-sum-exps of its rows
# (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu), so that attention can be merged
# from parts in evaluation (merge_by_log_sum_exp). The one place the choice is made.
LOG_SUM_EXP_DEVICES = frozenset({"cpu"})
# Values narrower than q and k (PoPE's) are attended written out (narrow_values_attention) rather
# than padded for SDPA's fused kernel in training on these device types, up to this many tokens
# (the fused kernel was as fast from 2,048 tokens on, and the written-out weights grow as T^2).
NARROW_VALUES_DEVICES = frozenset({"cpu"})
NARROW_VALUES_LENGTH = 1024


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
    """SDPA of queries q (B, H, n, d) over keys k (B, H, m, d) and values v (B, H, m, hs), hs <= d
    (PoPE's q and k are wider), with a float ``mask`` ([B|1], H, n, m) in sdpa_dtype(q) or
    ``is_causal``, in sdpa_dtype(q) whether or not autocast is on -> (B, H, n, hs) in q's dtype.
    Callers that attend in blocks cast q, k and v once before (a cast per block would sum their
    gradients in bf16)."""
    dtype = sdpa_dtype(q)
    hs = v.shape[-1]
    # The fused kernels take one width: narrower values fell back to SDPA's unfused path, which
    # writes the (n, m) scores (4 GiB at 16,384 tokens; 5.5x NoPE's time at 2,048). Zeros pad v
    # to q's width, their outputs 0, cut off below.
    values = F.pad(v, (0, q.shape[-1] - hs)) if hs < q.shape[-1] else v
    with torch.autocast(q.device.type, enabled=False):  # autocast would cast them to bf16
        y = F.scaled_dot_product_attention(
            q.to(dtype),
            k.to(dtype),
            values.to(dtype),
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=is_causal,
        )  # (B, H, n, d)
    return y[..., :hs].to(q.dtype)


def unbiased_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + causal mask) v for q, k, v of (B, H, T, hs): SDPA's fused
    causal kernel, run in fp32 for bf16 inputs on a CPU (sdpa_dtype).

    (Plain bf16 products around an fp32 softmax measured as fast in whole training steps as
    SDPA's fp32 kernel on inputs cast up, but rounds the scores to bf16: 5x SDPA's error at
    peaked attention.)

    With gradients, values narrower than q and k (PoPE's), up to NARROW_VALUES_LENGTH tokens on
    a NARROW_VALUES_DEVICES device: narrow_values_attention, at v's own width.
    """
    narrow = v.shape[-1] < q.shape[-1] and q.shape[2] <= NARROW_VALUES_LENGTH
    if narrow and torch.is_grad_enabled() and q.device.type in NARROW_VALUES_DEVICES:
        return narrow_values_attention(q, k, v, dropout)
    return fused_attention(q, k, v, dropout=dropout, is_causal=True)


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
    return merged_with_log_sum_exp(y_a, lse_a, y_b, lse_b)[0]


def merged_with_log_sum_exp(
    y_a: torch.Tensor, lse_a: torch.Tensor, y_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_by_log_sum_exp's output, and the log-sum-exp (B, H, n) of the two sets of keys
    together: what a merge with a third set needs."""
    lse = torch.logaddexp(lse_a, lse_b)
    y = y_a * (lse_a - lse)[..., None].exp() + y_b * (lse_b - lse)[..., None].exp()
    return y, lse


def attention_with_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of q (B, H, n, hs) over k, v (B, H, m, hs) with a float ``mask``
    ([B|1], H, n, m) and a sink logit per head, ``sinks`` (H,), joining each row's denominator
    with a value of 0 -> (B, H, n, hs): SDPA's CPU flash kernel's output times
    sigmoid(lse - s), its row's log-sum-exp against the sink's (attention/variants.py).
    On a LOG_SUM_EXP_DEVICES device without gradients; q, k, v and the mask in one dtype."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    y, lse = flash(q, k, v, attn_mask=mask)  # (B, H, n, hs), (B, H, n)
    return y * torch.sigmoid(lse - sinks.to(lse.dtype)[:, None])[..., None]
