"""PoPE: polar coordinate positional embeddings (Gopalakrishnan et al. 2025,
https://arxiv.org/abs/2509.10534).

RoPE rotates pairs of a query's dimensions, so each pair's angle mixes what (the pair's own
angle) and where (the position). PoPE keeps the two apart: each of the d dimensions c of a
query or key becomes a magnitude mu_c = softplus(x_c) >= 0 (what) at the angle i * theta_c
(where), with d frequencies theta_c = base^(-c/d) (RoPE has d/2). A key gets a learned phase
delta_hc per head and dimension on top, clamped to [-2 pi, 0]. The logit of query i and key j
is the real part of the complex product of the query and the conjugate key:

    sum_c mu_q,c mu_k,c cos((i - j) theta_c - delta_hc) / sqrt(d)

a function of i - j alone, as RoPE's. It is computed as the dot product of two 2d-dimensional
vectors (mu cos, mu sin) per query and key, as x-transformers' ``PolarEmbedding`` and
``apply_polar_pos_emb`` compute it: this encoding's ``queries_and_keys`` returns q and k of
(B, H, T, 2 * hs), twice the head dimension of the values.

Every attention path divides q.k by the square root of q's last dimension (SDPA's default
scale), here 2d: the queries are multiplied by sqrt(2), so the logits are divided by sqrt(d),
the head dimension, as the paper and x-transformers divide them.
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
from posbench.encodings.rope import shared_by_heads
from posbench.errors import PosbenchError

PHASE_INITS = ("zero", "uniform")


@dataclass
class PopeConfig(EncodingConfig):
    name: str = "pope"
    base: float = 10000.0  # theta_c = base^(-c/d), c = 0 .. d-1
    phase_init: str = "zero"  # the keys' phases delta: zero | uniform (on [-2 pi, 0])


def pope_frequencies(dim: int, base: float) -> torch.Tensor:
    """theta_c = base^(-c/dim) for each of the ``dim`` dimensions -> (dim,) float64."""
    return base ** -(torch.arange(dim, dtype=torch.float64) / dim)


@register("pope")
class PolarPositionalEncoding(PositionalEncoding):
    Config = PopeConfig
    # The logit is a function of i - j of either sign: two-sided by nature, as RoPE.
    bidirectional = True
    query_key_width = 2  # the polar vectors (mu cos, mu sin)

    def __init__(self, config: PopeConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if config.phase_init not in PHASE_INITS:
            raise PosbenchError(
                f"encoding.phase_init must be one of {', '.join(PHASE_INITS)} "
                f"(got {config.phase_init!r})"
            )
        if not config.base > 1:
            raise PosbenchError(f"encoding.base must be > 1 (got {config.base})")
        # Each head's phase per dimension, shared by the layers (as x-transformers shares its
        # PolarEmbedding); only keys carry it.
        self.phase = nn.Parameter(torch.zeros(n_head, self.head_dim))  # (H, d)
        if config.phase_init == "uniform":
            with torch.no_grad():
                self.phase.uniform_(-2 * math.pi, 0.0)

    def queries_and_keys(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(q.dtype, torch.float32)  # bf16 would blur the angles
        theta = pope_frequencies(self.head_dim, self.config.base).to(positions.device)
        # cos and sin of float64 angles, then cast: i * theta_c at 16k positions keeps its
        # precision (x-transformers' float32 angles lose 1e-3 rad there), a float64 model is exact.
        angles = shared_by_heads(positions.to(torch.float64)[..., None] * theta, positions)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)  # ([B, 1,] T, d) each
        # The keys' phase acts in [-2 pi, 0] only, as x-transformers clamps it (no gradient
        # outside); their angles j theta_c + delta_hc by the angle-sum identities.
        phase = self.phase.to(dtype).clamp(-2 * math.pi, 0)[:, None]  # (H, 1, d)
        key_cos = cos * phase.cos() - sin * phase.sin()  # ([B,] H, T, d)
        key_sin = sin * phase.cos() + cos * phase.sin()
        # sqrt(2) on the queries: attention divides by sqrt(2d), the width of the polar vectors,
        # where the paper divides by sqrt(d).
        query_angles = torch.stack((cos, sin), dim=-2) * math.sqrt(2)  # ([B, 1,] T, 2, d)
        key_angles = torch.stack((key_cos, key_sin), dim=-2)  # ([B,] H, T, 2, d)
        return polar(q, query_angles), polar(k, key_angles)


def polar(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Queries or keys ``x`` (B, H, T, d) as magnitudes softplus(x) times ``angles`` (..., T, 2, d),
    the cos and sin of their angles (broadcast to x's shape, in the dtype x is computed in)
    -> (B, H, T, 2d) in x's dtype: (mu cos, mu sin); computed in float32 at least, as
    x-transformers computes it."""
    return PolarVectors.apply(x.to(angles.dtype), angles).to(x.dtype)


class PolarVectors(torch.autograd.Function):
    """polar's magnitudes times angles, with a hand-written backward: autograd's multiplied the
    incoming gradient, strided, by the angles (the attention's backward writes q's gradient in
    the projection's (B, T, H, 2d) order), which took about five times as long as a copy of it
    and the product on the copy (0.5 + 0.8 ms against 6.2 ms for one layer's queries at
    32 x 128 tokens, 4 heads, one thread); this copies it once and writes mu's gradient in one
    product of each half."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        # x is a transposed view of the projection: softplus on it took twice as long as a
        # copy and softplus on the copy (and compiled training's backward, torch 2.13, viewed
        # softplus's gradient as contiguous where eager kept x's strides).
        x = x.contiguous()
        magnitude = F.softplus(x)  # (B, H, T, d)
        # The angles' gradient (the keys' phases) needs the magnitudes again.
        ctx.save_for_backward(x, angles, magnitude if ctx.needs_input_grad[1] else None)
        return (magnitude.unsqueeze(-2) * angles).flatten(-2)  # (B, H, T, 2d)

    @staticmethod
    @once_differentiable  # its gradients are not recorded for a second derivative
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, angles, magnitude = ctx.saved_tensors
        grad = grad.contiguous().unflatten(-1, (2, -1))  # (B, H, T, 2, d)
        dx = dangles = None
        if ctx.needs_input_grad[0]:
            # mu's gradient grad . (cos, sin), times softplus's derivative sigmoid(x) (one pass)
            dmagnitude = torch.addcmul(
                grad[..., 0, :] * angles[..., 0, :], grad[..., 1, :], angles[..., 1, :]
            )  # (B, H, T, d)
            dx = torch.ops.aten.softplus_backward(dmagnitude, x, 1.0, 20.0)
        if ctx.needs_input_grad[1]:  # summed over what the angles are broadcast across
            dangles = (grad * magnitude.unsqueeze(-2)).sum_to_size(angles.shape)
        return dx, dangles
