"""The attention variants a model is built with, whatever its encoding: ``model.qk_norm``,
``model.attn_gate``, ``model.attn_sinks`` and ``model.attention`` (docs/attention.md).

This module holds the two that act on a layer's queries, keys and output, ``QKNorm`` and
``OutputGate``, and the checks of the four options (``check_attention_options``, which
ModelArgs runs: one PosbenchError line per mistake). How logits become weights (sinks, sigmoid,
stick-breaking) is posbench/model/attention/variants.py's.

    qk_norm      q and k of each head scaled to RMS 1 (no mean subtracted), then times a learned
                 gain per head and dimension (1 at the start), before the encoding's
                 ``queries_and_keys`` (RoPE rotates the normalised vectors); the logits keep
                 1/sqrt(hs). x-transformers' ``qk_norm=True, qk_norm_dim_scale=True``
                 (l2-normalised, gains from hs^(1/4), the same 1/sqrt(hs)) is this with its
                 gains sqrt(hs) times ours; its default ``qk_norm_dim_scale=False`` (no gains,
                 a fixed scale of 10) is not offered.
    attn_gate    Qiu et al. 2025 (arXiv 2505.06708), the gate after SDPA: the attention output
                 (B, T, C), before the output projection, times sigmoid(x W) with x the layer's
                 input (after its layer norm) and W (C, H) (``headwise``: one gate per head) or
                 (C, C) (``elementwise``), no bias; x-transformers' ``gate_values`` (and
                 ``gate_values_headwise``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posbench.errors import PosbenchError

ATTENTIONS = ("softmax", "sigmoid", "stick_breaking")  # model.attention
GATES = ("none", "headwise", "elementwise")  # model.attn_gate
# QKNorm's epsilon inside the root mean square (Qwen3's and OLMo 2's q/k norms use 1e-6).
QK_NORM_EPS = 1e-6


class QKNorm(nn.Module):
    """``model.qk_norm``: each head's q and k (B, H, T, hs) scaled to RMS 1 over its hs
    dimensions and times a learned gain of (H, hs), one for q and one for k, each 1 at the
    start. The gains are stored flat, (H * hs,): one-dimensional, they get no weight decay,
    as posbench's other norms' gains (posbench/train.py make_optimizer)."""

    def __init__(self, n_head: int, head_dim: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        self.q_gain = nn.Parameter(torch.ones(n_head * head_dim))
        self.k_gain = nn.Parameter(torch.ones(n_head * head_dim))

    def norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x, (self.head_dim,), eps=QK_NORM_EPS)  # (B, H, T, hs)
        return normed * gain.view(self.n_head, 1, self.head_dim).to(normed.dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.norm(q, self.q_gain), self.norm(k, self.k_gain)


class OutputGate(nn.Module):
    """``model.attn_gate``: the attention output y (B, T, C) of a layer whose input is x
    (B, T, C) (after its layer norm) times sigmoid(x W), W of (C, H) (``headwise``: each head's
    hs outputs share one gate) or (C, C) (``elementwise``), before the output projection. W is
    initialised as the model's other linear layers (normal, std 0.02): every gate starts near
    1/2."""

    def __init__(self, d_model: int, n_head: int, kind: str) -> None:
        super().__init__()
        self.n_head = n_head
        self.headwise = kind == "headwise"
        self.linear = nn.Linear(d_model, n_head if self.headwise else d_model, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.linear(x))  # (B, T, H) or (B, T, C)
        if not self.headwise:
            return y * gate
        B, T, C = y.shape
        gated = y.view(B, T, self.n_head, C // self.n_head) * gate[..., None]
        return gated.view(B, T, C)


def check_attention_options(
    attention: str, attn_gate: str, attn_sinks: bool, sigmoid_length: int | None, causal: bool
) -> None:
    """The attention options' one-line errors (ModelArgs runs it): an unknown choice, sigmoid
    attention without its length, sinks outside a softmax, stick-breaking both ways."""
    for key, value, allowed in (
        ("attention", attention, ATTENTIONS),
        ("attn_gate", attn_gate, GATES),
    ):
        if value not in allowed:
            raise PosbenchError(f"model.{key} must be one of {', '.join(allowed)} (got {value!r})")
    if attention == "sigmoid" and (sigmoid_length is None or sigmoid_length < 1):
        raise PosbenchError(
            "model.attention=sigmoid adds b = -ln(model.sigmoid_length) to every logit: "
            f"model.sigmoid_length must be a positive length (got {sigmoid_length})"
        )
    if attn_sinks and attention != "softmax":
        raise PosbenchError(
            f"model.attn_sinks adds a logit to the softmax's denominator; model.attention="
            f"{attention} has none: use model.attention=softmax or model.attn_sinks=false"
        )
    if attention == "stick_breaking" and not causal:
        raise PosbenchError(
            "model.attention=stick_breaking breaks the stick from the query back over the keys "
            "before it; model.causal=false needs model.attention=softmax or sigmoid"
        )
