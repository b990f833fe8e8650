"""Rotary position embedding (Su et al. 2021, RoFormer, https://arxiv.org/abs/2104.09864).

Each pair of dimensions (2i, 2i+1) of a query or key at position m is rotated by the angle
m * theta_i with theta_i = base^(-2i/d). The dot product of a rotated query at m and a rotated
key at n then depends on the positions only through n - m, because R(a)^T R(b) = R(b - a).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register
from posbench.errors import PosbenchError


@dataclass
class RopeConfig(EncodingConfig):
    name: str = "rope"
    base: float = 10000.0


def rope_angles(positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation angles m * theta_i for ``positions`` (T,) -> (T, head_dim / 2), in float64."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device)
    inv_freq = base ** -(exponents / head_dim)  # theta_i, (hs/2,)
    return positions.to(torch.float64)[:, None] * inv_freq


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (x[2i], x[2i+1]) of ``x`` (..., T, hs) by angles whose
    cosines and sines are ``cos``, ``sin`` (T, hs/2)."""
    pairs = x.unflatten(-1, (-1, 2))  # (..., T, hs/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate ``x`` (..., T, head_dim) as RoPE does at integer ``positions`` (T,)."""
    if x.shape[-1] % 2:
        raise PosbenchError(f"RoPE needs an even head dimension (got {x.shape[-1]})")
    angles = rope_angles(positions, x.shape[-1], base)
    return rotate_pairs(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype))


@register("rope")
class RotaryPositionalEncoding(PositionalEncoding):
    Config = RopeConfig

    def __init__(self, config: RopeConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if self.head_dim % 2:
            raise PosbenchError(
                f"rope rotates pairs of dimensions, so the head dim d_model/n_head must be even "
                f"(got {d_model}/{n_head} = {self.head_dim}); change model.d_model or model.n_head"
            )
        # cos/sin of every position seen so far; recomputable, so not saved in checkpoints.
        self.register_buffer(
            "cos_cached", torch.empty(0, self.head_dim // 2, dtype=torch.float64), persistent=False
        )
        self.register_buffer(
            "sin_cached", torch.empty(0, self.head_dim // 2, dtype=torch.float64), persistent=False
        )

    def _extend_cache(self, length: int, device: torch.device) -> None:
        """Grow the cos/sin tables to cover ``length`` positions (doubling, to amortise)."""
        size = max(length, 2 * self.cos_cached.shape[0])
        angles = rope_angles(torch.arange(size, device=device), self.head_dim, self.config.base)
        # float64, cast per call: exact for a float64 model, and free to cast down.
        self.cos_cached = angles.cos()
        self.sin_cached = angles.sin()

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        needed = int(positions.max()) + 1
        if needed > self.cos_cached.shape[0] or self.cos_cached.device != x.device:
            self._extend_cache(needed, x.device)
        cos = self.cos_cached[positions].to(x.dtype)  # (T, hs/2)
        sin = self.sin_cached[positions].to(x.dtype)
        return rotate_pairs(x, cos, sin)
