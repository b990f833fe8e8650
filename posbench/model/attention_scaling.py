"""Attention scaling for any encoding: a factor on each query before its dot products with the
keys, chosen with ``model.attention_scaling`` (``none``, the default, ``ssmax`` or ``llama4``).

``CausalSelfAttention`` applies it after the encoding's ``queries_and_keys`` and
``content_state`` and before attention, so it multiplies the q.k term of the logits only: a
bias of positions or content (ALiBi, T5, FoX, CoPE, ...) is added afterwards, unscaled, and
CoPE's gates and counts read the query before scaling. Both scalings count tokens of the
sequence, not positions. Each layer has its own instance.

    ssmax   q_i * s_h * log n_i     Scalable-Softmax (Nakanishi 2025,
                                    https://arxiv.org/abs/2501.19399): softmax of
                                    (s log n) z is the paper's n^(s z) normalised. n_i is the
                                    number of keys query i sees: i + 1 for the token at index i
                                    of the sequence (tokens, not positions), at most the
                                    encoding's ``window``. s is learned, one per head and layer.
    llama4  q_i * (log(floor((i + 1) / floor_scale) + 1) * scale + 1)
                                    Llama 4's attention temperature tuning, as HF transformers'
                                    Llama4TextAttention computes it (its config's
                                    ``floor_scale``, 8192, and ``attn_scale``, 0.1: here
                                    ``model.attention_floor_scale`` and ``model.attention_scale``)
                                    for the token at index i: HF counts tokens
                                    (arange(T) + past_seen_tokens), never position_ids, so
                                    randomized positions leave it as it is. Llama 4 tunes only
                                    its layers without RoPE; here every layer, whatever its
                                    encoding. It ignores windows.

On top of either (or none), ``temperature`` multiplies every query by a fixed beta (1: as
trained), which evaluation sets per length (``Transformer.set_logit_temperature``: DroPE's
fitted logit temperature, posbench/evaluation/temperature.py); training never sets it.

SSMax's s starts at 1 in every head (SSMAX_INIT): the paper learns s from the start of
pre-training; the value it starts from is this module's choice. At the first query, log 1 = 0
zeroes q: a single visible key gets all the attention anyway.
"""

from __future__ import annotations

import torch
from torch import nn

SCALINGS = ("none", "ssmax", "llama4")
SSMAX_INIT = 1.0  # s of every head at initialisation


class AttentionScaling(nn.Module):
    """No scaling (``model.attention_scaling=none``): queries are returned as they are. Subclasses
    give each query a ``factor``; the module holds no parameters, so a model without scaling
    saves exactly the weights it did before the option existed."""

    temperature: float = 1.0  # beta on every query: evaluation's logit temperature (1: none)

    def factor(self, indices: torch.Tensor, window: int | None) -> torch.Tensor | None:
        """The factor of the queries at token ``indices`` (T,) of their sequence (0 for its first
        token), attending to at most ``window`` recent tokens (None: all), broadcastable against
        their queries (B, H, T, hs); ``None``: no scaling."""
        return None

    def forward(self, q: torch.Tensor, window: int | None, first: int = 0) -> torch.Tensor:
        """The queries (B, H, n, hs) of a sequence's tokens first..first+n-1 -> (B, H, n, hs),
        each times its ``factor`` (first > 0: a cached decode's newest tokens)."""
        indices = torch.arange(first, first + q.shape[2], device=q.device)  # (n,)
        factor = self.factor(indices, window)
        if self.temperature != 1.0:
            q = q * self.temperature  # a Python float keeps q's dtype
        if factor is None:
            return q
        # In q's dtype: a float32 factor would promote bf16 queries past their keys' dtype.
        return q * factor.to(q.dtype)


class ScalableSoftmax(AttentionScaling):
    """SSMax: query i times s_h * log n_i, n_i the keys it sees, s_h learned per head."""

    def __init__(self, n_head: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.full((n_head,), SSMAX_INIT))  # (H,)

    def log_keys_seen(self, indices: torch.Tensor, window: int | None) -> torch.Tensor:
        """log n_i of the queries at token ``indices`` i (T,) -> (T,) float32: n_i = i + 1
        tokens, at most ``window``."""
        seen = indices.to(torch.float32) + 1.0  # (T,)
        if window is not None:
            seen = seen.clamp(max=window)
        return seen.log()

    def factor(self, indices: torch.Tensor, window: int | None) -> torch.Tensor:
        log_n = self.log_keys_seen(indices, window)  # (T,)
        return (self.s[:, None] * log_n)[:, :, None]  # (H, T, 1)


class Llama4Temperature(AttentionScaling):
    """Llama 4's temperature tuning: the query of the token at index i times
    log(floor((i + 1) / floor_scale) + 1) * scale + 1, fixed (no parameters)."""

    def __init__(self, floor_scale: int, scale: float) -> None:
        super().__init__()
        self.floor_scale = floor_scale
        self.scale = scale

    def factor(self, indices: torch.Tensor, window: int | None) -> torch.Tensor:
        # float32 as HF's positions.float(): exact for indices below 2^24.
        i = indices.to(torch.float32)  # (T,)
        factor = torch.log1p(torch.floor((i + 1.0) / self.floor_scale)) * self.scale + 1.0
        return factor[:, None]  # (T, 1)


def build_attention_scaling(
    name: str, n_head: int, floor_scale: int, scale: float
) -> AttentionScaling:
    """The scaling ``name`` (one of SCALINGS; ModelArgs checks it) of one layer of ``n_head``
    heads; ``floor_scale`` and ``scale`` are llama4's."""
    if name == "ssmax":
        return ScalableSoftmax(n_head)
    if name == "llama4":
        return Llama4Temperature(floor_scale, scale)
    assert name == "none", f"unknown attention scaling {name!r}"
    return AttentionScaling()
