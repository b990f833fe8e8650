"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis", https://arxiv.org/abs/2212.10356).

Sinusoidal positions whose only trace in attention is their inner product: of the four terms
of (W_q(e_i + p_i))^T (W_k(e_j + p_j)) the paper keeps q.k and p_i^T p_j and drops the cross
terms. For sinusoids of dimension d' the inner product is a function of the distance alone,

    p_i^T p_j = sum_{k=1}^{d'/2} cos((i - j) / base^(2k/d')),

which is d'/2 at distance 0 and falls, roughly like a logarithm, with the distance (the
pattern KERPLE and T5 learn). Head h = 1..H adds it, shifted to 0 at distance 0 and compressed
by ALiBi's per-head range h * 8/H, to the logit of query i and key j:

    bias_h(i, j) = (p_i^T p_j - d'/2) / (h * 8 / H)

so the first head decays fastest and the last one, at H * 8/H = 8, slowest. It has no
parameters. Options: ``dim`` (d', 128) and ``base`` (10000). The bias lies in
[-d' / (h * 8/H), 0] at every distance, so it stays finite and bounded at any length.

NVIDIA NeMo's SandwichRelativePositionEmbedding computes the same sum and compression, with two
differences: its d' is the model's per-head hidden size instead of a setting of its own, and it
zeroes the distances of future keys (``torch.tril``) before the cosines, where here they keep
their bias (attention masks them anyway).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register
from posbench.errors import PosbenchError


@dataclass
class SandwichConfig(EncodingConfig):
    name: str = "sandwich"
    dim: int = 128  # d': the dimension of the sinusoidal position vectors
    base: float = 10000.0  # their frequencies are base^(-2k/d'), k = 1..d'/2


def sandwich_compression(n_head: int) -> torch.Tensor:
    """Each head's divisor h * 8 / H, h = 1..H -> (H,) float64 (ALiBi's range of h)."""
    return torch.arange(1, n_head + 1, dtype=torch.float64) * 8 / n_head


@register("sandwich")
class SandwichRelativeBias(PositionalEncoding):
    Config = SandwichConfig

    def __init__(self, config: SandwichConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if config.dim <= 0 or config.dim % 2:
            raise PosbenchError(
                f"encoding.dim must be a positive even number: the sinusoids pair a sin with a "
                f"cos (got {config.dim})"
            )
        if config.base <= 1:
            raise PosbenchError(f"encoding.base must be > 1 (got {config.base})")

    def relative_bias(self, distance: torch.Tensor) -> torch.Tensor:
        half = self.config.dim // 2
        # float64 throughout, then float32 (attention casts it to the queries' dtype): the angles
        # reach tens of thousands of radians, and h * 8/H is inexact in float32 for most H.
        k = torch.arange(1, half + 1, dtype=torch.float64, device=distance.device)  # (d'/2,)
        inv_freq = self.config.base ** (-2 * k / self.config.dim)  # (d'/2,)
        angles = distance.to(torch.float64)[:, None] * inv_freq  # (D, d'/2)
        inner = angles.cos().sum(-1) - half  # (D,) p_i.p_j - d'/2
        compression = sandwich_compression(self.n_head).to(distance.device)  # (H,)
        return (inner / compression[:, None]).float()  # (H, D)
