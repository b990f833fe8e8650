"""Rotary position embedding (Su et al. 2021, RoFormer, https://arxiv.org/abs/2104.09864).

Each pair of dimensions of a query or key at position m is rotated by the angle m * theta_i
with theta_i = base^(-2i/d). The dot product of a rotated query at m and a rotated key at n
then depends on the positions only through n - m, because R(a)^T R(b) = R(b - a).

Options:

* ``layout``: which dimensions form pair i. ``interleaved`` pairs (2i, 2i+1) as RoFormer and
  the seed documents do; ``half`` pairs (i, i + d/2) as GPT-NeoX and Llama do. The two are the
  same rotation after a fixed permutation of the head dimensions.
* ``fraction``: partial rotary (GPT-NeoX, GPT-J): only the first ``fraction * head_dim``
  dimensions rotate (d above is that count); the rest pass through unchanged.
* ``keep_frequencies``: p-RoPE (Barbero et al. 2024, "Round and Round We Go",
  https://arxiv.org/abs/2410.06205): of the d/2 frequencies theta_i = base^(-2i/d), only the
  highest share p (pairs 0 .. p*d/2 - 1) is kept and the rest are set to 0, so those pairs
  carry no position at all. Unlike ``fraction``, the kept frequencies are exactly the ones full
  RoPE would use (partial rotary recomputes a whole frequency range over fewer dims).
* ``scaling``: context extension of a model trained with plain RoPE. Each method is a pure
  function with one signature, found through ``SCALING_METHODS`` (the pattern of HF
  transformers' ``modeling_rope_utils``). Scaling acts in eval mode (``not self.training``),
  and in training too when ``scaling.in_training`` is set (a fine-tune after scaling,
  ``train.init_from``); otherwise training learns plain RoPE and the same weights can then be
  evaluated under every method. Each method also gets the sequence's length (LongRoPE picks
  its rescale factors by it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register
from posbench.errors import PosbenchError

LAYOUTS = ("interleaved", "half")


@dataclass
class RopeScalingConfig:
    # none | linear | ntk | dynamic | yarn | llama3 | longrope (SCALING_METHODS)
    method: str = "none"
    # s, the context extension factor; null: s = max(1, L / original_length) per length L
    factor: float | None = None
    # the length the model was trained at (conf/encoding/rope.yaml: ${train.seq_len})
    original_length: int | None = None
    # yarn: pairs turning more than beta_fast times within original_length keep theta, pairs
    # turning fewer than beta_slow times get theta / s
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    # yarn: reference (HF transformers, the authors' code: linear in the pair index between
    # rounded bounds) | paper (the paper's eqs. 17-20: linear in the rotation count)
    ramp: str = "reference"
    # apply the method while training too (set by train.init_from: a fine-tune after scaling)
    in_training: bool = False
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_length / this: theta / s
    high_freq_factor: float = 4.0  # llama3: wavelengths below original_length / this: theta
    # longrope: theta_i / factor_i, one rescale factor per rotated pair (d/2 of them), searched
    # per model; long_factor for sequences longer than original_length, short_factor up to it
    short_factor: list[float] | None = None
    long_factor: list[float] | None = None
    # yarn, longrope: the factor on the rotated q and k in place of the method's own (null)
    attention_factor: float | None = None


@dataclass
class RopeConfig(EncodingConfig):
    name: str = "rope"
    base: float = 10000.0
    layout: str = "interleaved"  # interleaved | half
    fraction: float = 1.0  # share of each head's dimensions that rotate
    keep_frequencies: float = 1.0  # p-RoPE: share of the frequencies kept, highest first
    scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)


def rope_frequencies(dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/dim) for the dim/2 pairs -> (dim/2,) float64."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return base**-exponents


# --- eval-time scaling: (dim, base, s, config, length L) -> (theta (dim/2,), attention factor) -


def plain_frequencies(
    dim: int, base: float, factor: float, scaling: RopeScalingConfig, length: int
) -> tuple[torch.Tensor, float]:
    """No scaling: the frequencies the model was trained with."""
    return rope_frequencies(dim, base), 1.0


def linear_frequencies(
    dim: int, base: float, factor: float, scaling: RopeScalingConfig, length: int
) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023, https://arxiv.org/abs/2306.15595): position m
    becomes m / s, so s times the training length maps onto the positions seen in training."""
    return rope_frequencies(dim, base) / factor, 1.0


def ntk_frequencies(
    dim: int, base: float, factor: float, scaling: RopeScalingConfig, length: int
) -> tuple[torch.Tensor, float]:
    """NTK-aware scaling (bloc97 2023, as formalised in Peng et al. 2023 section 3.1): base
    becomes base * s^(d/(d-2)), which leaves theta_0 alone and divides the slowest frequency,
    theta_(d/2-1), by exactly s, interpolating in between."""
    # With one pair (dim 2) theta_0 = base^0 = 1 for any base: nothing to rescale.
    stretch = factor ** (dim / (dim - 2)) if dim > 2 else 1.0
    return rope_frequencies(dim, base * stretch), 1.0


def yarn_paper_ramp(dim: int, base: float, scaling: RopeScalingConfig) -> torch.Tensor:
    """gamma_i of the paper's eqs. 17-20 -> (dim/2,): 0 below beta_slow rotations of pair i
    within the original length L, 1 above beta_fast, linear in the rotation count between."""
    rotations = scaling.original_length * rope_frequencies(dim, base) / (2 * math.pi)
    return ((rotations - scaling.beta_slow) / (scaling.beta_fast - scaling.beta_slow)).clamp(0, 1)


def yarn_reference_ramp(dim: int, base: float, scaling: RopeScalingConfig) -> torch.Tensor:
    """gamma_i as the authors' code and HF transformers' ``_compute_yarn_parameters`` compute it
    -> (dim/2,): the (fractional) pair index that turns r times within L is
    d ln(L / (2 pi r)) / (2 ln base); the bounds for beta_fast and beta_slow are rounded outward
    (floor, ceil) and clipped to [0, d - 1], and gamma falls linearly in the pair index from 1
    at the lower bound to 0 at the upper one."""

    def pair_turning(rotations: float) -> float:
        wavelength = scaling.original_length / rotations
        return dim * math.log(wavelength / (2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(scaling.beta_fast)), 0)
    high = min(math.ceil(pair_turning(scaling.beta_slow)), dim - 1)
    width = (high - low) or 0.001  # as the reference: a zero-width ramp is a step
    pair = torch.arange(dim // 2, dtype=torch.float64)
    return 1 - ((pair - low) / width).clamp(0, 1)


# encoding.scaling.ramp -> gamma_i
YARN_RAMP_FUNCTIONS = {"reference": yarn_reference_ramp, "paper": yarn_paper_ramp}


def yarn_frequencies(
    dim: int, base: float, factor: float, scaling: RopeScalingConfig, length: int
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071), "NTK-by-parts" plus the
    attention temperature of section 3.4.

    gamma_i (``scaling.ramp``: the reference implementation's, or the paper's) is 1 for pairs
    that turn often within the ORIGINAL training length and 0 for those that barely turn; the
    new frequency is (1 - gamma) * theta_i / s + gamma * theta_i: fast pairs keep what they
    learned, slow pairs are interpolated. The logits get 1/t with sqrt(1/t) = 0.1 ln(s) + 1,
    returned as the factor applied to both rotated q and k.
    """
    theta = rope_frequencies(dim, base)
    gamma = YARN_RAMP_FUNCTIONS[scaling.ramp](dim, base, scaling)
    theta = (1 - gamma) * theta / factor + gamma * theta
    return theta, chosen_attention_factor(scaling, 0.1 * math.log(factor) + 1)


def llama3_frequencies(
    dim: int, base: float, factor: float, scaling: RopeScalingConfig, length: int
) -> tuple[torch.Tensor, float]:
    """Llama 3.1's scaling (Meta's reference ``apply_scaling``, Dubey et al. 2024): wavelengths
    shorter than L / high_freq_factor keep theta, longer than L / low_freq_factor get theta / s,
    and in between theta is blended by smooth = (L / lambda - low) / (high - low)."""
    theta = rope_frequencies(dim, base)
    rotations = scaling.original_length * theta / (2 * math.pi)  # L / lambda_i
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    smooth = ((rotations - low) / (high - low)).clamp(0, 1)  # 0 on long, 1 on short wavelengths
    return (1 - smooth) * theta / factor + smooth * theta, 1.0


def longrope_frequencies(
    dim: int, base: float, factor: float, scaling: RopeScalingConfig, length: int
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Ding et al. 2024, https://arxiv.org/abs/2402.13753) as Phi-3 and HF
    transformers' ``_compute_longrope_parameters`` apply it: theta_i / lambda_i with one rescale
    factor lambda_i per pair, found by the paper's search for each model and given here as
    lists: ``long_factor`` for a sequence longer than the original length L0, ``short_factor``
    up to it. The rotated q and k get sqrt(1 + ln s / ln L0), so the logits grow by
    1 + ln s / ln L0 (the entropy-keeping scale of attention over s times more tokens)."""
    rescale = scaling.long_factor if length > scaling.original_length else scaling.short_factor
    theta = rope_frequencies(dim, base) / torch.tensor(rescale, dtype=torch.float64)
    # original_length >= 2 (check_scaling), so ln L0 > 0
    temperature = math.sqrt(1 + math.log(factor) / math.log(scaling.original_length))
    return theta, chosen_attention_factor(scaling, temperature)


def chosen_attention_factor(scaling: RopeScalingConfig, own: float) -> float:
    """The attention factor of yarn or longrope: ``scaling.attention_factor`` where it is set
    (as HF transformers' ``attention_factor``), else the method's ``own``."""
    return own if scaling.attention_factor is None else scaling.attention_factor


ScalingMethod = Callable[[int, float, float, RopeScalingConfig, int], tuple[torch.Tensor, float]]
SCALING_METHODS: dict[str, ScalingMethod] = {
    "none": plain_frequencies,
    "linear": linear_frequencies,
    "ntk": ntk_frequencies,
    "dynamic": ntk_frequencies,  # NTK whose s follows each length (see scaling_factor)
    "yarn": yarn_frequencies,
    "llama3": llama3_frequencies,
    "longrope": longrope_frequencies,
}


def check_scaling(scaling: RopeScalingConfig) -> None:
    """One-line errors for a scaling config that cannot work."""
    if scaling.method not in SCALING_METHODS:
        raise PosbenchError(
            f"unknown encoding.scaling.method {scaling.method!r}; "
            f"choose one of: {', '.join(SCALING_METHODS)}"
        )
    if scaling.factor is not None and scaling.factor < 1:
        raise PosbenchError(f"encoding.scaling.factor must be >= 1 (got {scaling.factor})")
    if scaling.ramp not in YARN_RAMP_FUNCTIONS:
        raise PosbenchError(
            f"unknown encoding.scaling.ramp {scaling.ramp!r}; "
            f"choose one of: {', '.join(YARN_RAMP_FUNCTIONS)}"
        )
    shortest = 2 if scaling.method == "longrope" else 1  # longrope divides by ln of it
    if scaling.method != "none" and (scaling.original_length or 0) < shortest:
        raise PosbenchError(
            f"encoding.scaling.original_length must be the training length, >= {shortest} "
            f"(got {scaling.original_length})"
        )
    if scaling.attention_factor is not None and scaling.attention_factor <= 0:
        raise PosbenchError(
            f"encoding.scaling.attention_factor must be positive, or null for the method's own "
            f"(got {scaling.attention_factor})"
        )
    if scaling.beta_fast <= scaling.beta_slow:
        raise PosbenchError(
            f"encoding.scaling.beta_fast ({scaling.beta_fast}) must exceed beta_slow "
            f"({scaling.beta_slow})"
        )
    if scaling.high_freq_factor <= scaling.low_freq_factor:
        raise PosbenchError(
            f"encoding.scaling.high_freq_factor ({scaling.high_freq_factor}) must exceed "
            f"low_freq_factor ({scaling.low_freq_factor})"
        )


def check_rescale_factors(scaling: RopeScalingConfig, pairs: int) -> None:
    """One-line errors for longrope's factor lists, which need one positive factor for each of
    the ``pairs`` rotated pairs (nothing to check for the other methods, which ignore them)."""
    if scaling.method != "longrope":
        return
    for key in ("short_factor", "long_factor"):
        factors = getattr(scaling, key)
        if factors is None or len(factors) != pairs:
            given = "none" if factors is None else len(factors)
            raise PosbenchError(
                f"encoding.scaling.{key} needs {pairs} rescale factors, one per rotated pair of "
                f"head dims (fraction * head_dim / 2); got {given}"
            )
        if min(factors) <= 0:
            raise PosbenchError(f"encoding.scaling.{key} must be positive (got {min(factors)})")


# --- rotation ---------------------------------------------------------------------------------


def kept_frequencies(pairs: int, keep: float) -> int:
    """How many of ``pairs`` frequencies p-RoPE keeps: a whole number, or a one-line error."""
    count = pairs * keep
    if not 0 <= keep <= 1 or count != round(count):
        raise PosbenchError(
            f"encoding.keep_frequencies={keep} keeps {count:g} of the {pairs} RoPE frequencies; "
            "choose a share in [0, 1] that makes a whole number"
        )
    return round(count)


def drop_low_frequencies(theta: torch.Tensor, keep: float) -> torch.Tensor:
    """p-RoPE: theta (d/2,) with all but the highest ``keep`` share of frequencies set to 0
    (theta_i falls with i, so the kept ones are the leading pairs)."""
    kept = kept_frequencies(theta.shape[-1], keep)
    return torch.cat((theta[:kept], theta.new_zeros(theta.shape[-1] - kept)))


def rotated_dims(head_dim: int, fraction: float) -> int:
    """How many of ``head_dim`` dimensions rotate: an even count, or a one-line error."""
    count = head_dim * fraction
    if not 0 < fraction <= 1 or count != round(count) or round(count) % 2:
        raise PosbenchError(
            f"encoding.fraction={fraction} rotates {count:g} of the {head_dim} head dims; "
            "choose a fraction in (0, 1] that makes an even whole number"
        )
    return round(count)


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise PosbenchError(
            f"unknown RoPE layout (encoding.layout) {layout!r}; choose one of: {', '.join(LAYOUTS)}"
        )


def to_pairs(x: torch.Tensor, layout: str) -> torch.Tensor:
    """(..., d) -> (..., d/2, 2): pair i of the layout in row i."""
    if layout == "interleaved":
        return x.unflatten(-1, (-1, 2))  # (x0, x1), (x2, x3), ...
    return x.unflatten(-1, (2, -1)).transpose(-1, -2)  # (x0, x_d/2), (x1, x_d/2+1), ...


def from_pairs(pairs: torch.Tensor, layout: str) -> torch.Tensor:
    """The inverse of ``to_pairs``: (..., d/2, 2) -> (..., d)."""
    if layout == "interleaved":
        return pairs.flatten(-2)
    return pairs.transpose(-1, -2).flatten(-2)


def rotate_by(x: torch.Tensor, rotation: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """Rotate the pairs of ``x`` (..., T, d) by the unit complex numbers ``rotation`` (T, d/2):
    pair (a, b) is the complex a + ib, and a rotation by angle phi is a product with e^(i phi).
    One complex product is several times faster (forward and backward) than the four real
    products and the re-interleaving it replaces."""
    precise = x.double() if x.dtype == torch.float64 else x.float()  # no complex bf16/fp16
    # The head slices of the fused q/k/v projection, (B, nh, T, hs), are (B, T, nh, hs) in
    # memory: rotated as (B, T, nh, hs), in their memory's order, the product's loops run over
    # a position's heads together, and its gradient (which SDPA returns in that order) reaches
    # view_as_real's backward contiguous. Rotated as (B, nh, T, hs), that backward copied the
    # gradient into (B, nh, T, hs) order and the projection's view backward copied it back:
    # two copies per q and per k, about as long as the product itself.
    rotation = rotation.to(complex_dtype(x))
    heads_inner = precise.dim() >= 3 and precise.stride(-3) < precise.stride(-2)
    if heads_inner:
        precise = precise.transpose(-3, -2)  # (..., T, nh, d)
        if rotation.dim() == 2:
            # Copied across the heads (T * nh * d/2 numbers), a position's heads and pairs run
            # as one loop with the rotation's, not one head's d/2 pairs at a time.
            heads = precise.shape[-2]
            rotation = rotation.unsqueeze(-2).expand(-1, heads, -1).contiguous()  # (T, nh, d/2)
        else:
            rotation = rotation.transpose(-3, -2)  # (B, T, 1, d/2)
    pairs = to_pairs(precise, layout)  # (..., d/2, 2)
    # A head's slice of the fused q/k/v projection views as complex as it is (interleaved
    # pairs are adjacent); copying it first cost a copy forward and one backward per call.
    if not viewable_as_complex(pairs):
        pairs = pairs.contiguous()
    rotated = torch.view_as_real(torch.view_as_complex(pairs) * rotation)
    rotated = from_pairs(rotated, layout).type_as(x)
    return rotated.transpose(-3, -2) if heads_inner else rotated  # (..., T, d)


def viewable_as_complex(pairs: torch.Tensor) -> bool:
    """Whether torch.view_as_complex takes ``pairs`` (..., 2) without a copy: the pair's two
    numbers adjacent, every other stride even."""
    *strides, last = pairs.stride()
    return last == 1 and all(stride % 2 == 0 for stride in strides)


def complex_dtype(x: torch.Tensor) -> torch.dtype:
    """The complex dtype rotations of ``x`` are computed in (complex64 for bf16/fp16/fp32)."""
    return torch.complex128 if x.dtype == torch.float64 else torch.complex64


def rotate_leading(
    x: torch.Tensor, rotation: torch.Tensor, layout: str, attention_factor: float = 1.0
) -> torch.Tensor:
    """Rotate the first 2 * rotation.shape[-1] dims of ``x`` (..., T, hs) and multiply them by
    ``attention_factor`` (YaRN's temperature: both q and k carry it, so their rotated part of
    the logits scales by its square); pass the rest through unchanged. As in the reference
    implementations, which fold the factor into cos and sin, dims that do not rotate under
    partial rotary are not scaled."""
    dim = 2 * rotation.shape[-1]
    if attention_factor != 1.0:
        rotation = rotation * attention_factor
    if dim == x.shape[-1]:
        return rotate_by(x, rotation, layout)
    return torch.cat((rotate_by(x[..., :dim], rotation, layout), x[..., dim:]), dim=-1)


def shared_by_heads(rotation: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotations (..., T, d/2) at ``positions`` laid out for queries or keys (B, H, T, hs): as
    they are for positions (T,); (B, T, d/2) -> (B, 1, T, d/2) for one row per sequence."""
    return rotation if positions.dim() == 1 else rotation.unsqueeze(-3)


def rotation_at(positions: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """e^(i m theta) at integer ``positions`` m ((T,) or (B, T)) for frequencies ``theta``
    (d/2,) -> ([B,] T, d/2) complex128: float64 angles, so that a float64 model is exact."""
    angles = positions.to(torch.float64)[..., None] * theta.to(positions.device)  # ([B,] T, d/2)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    base: float = 10000.0,
    layout: str = "interleaved",
    fraction: float = 1.0,
    keep_frequencies: float = 1.0,
) -> torch.Tensor:
    """Rotate ``x`` (..., T, head_dim) as RoPE does at integer ``positions`` (T,), or ``x``
    (B, H, T, head_dim) at ``positions`` (B, T)."""
    check_layout(layout)
    theta = rope_frequencies(rotated_dims(x.shape[-1], fraction), base)
    rotation = rotation_at(positions, drop_low_frequencies(theta, keep_frequencies))
    return rotate_leading(x, shared_by_heads(rotation, positions), layout)


@register("rope")
class RotaryPositionalEncoding(PositionalEncoding):
    Config = RopeConfig
    # q.k of rotated queries and keys depends on i - j of either sign: two-sided by nature.
    bidirectional = True

    def __init__(self, config: RopeConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if self.head_dim % 2:
            raise PosbenchError(
                f"rope rotates pairs of dimensions, so the head dim d_model/n_head must be even "
                f"(got {d_model}/{n_head} = {self.head_dim}); change model.d_model or model.n_head"
            )
        check_layout(config.layout)
        check_scaling(config.scaling)
        self.dim = rotated_dims(self.head_dim, config.fraction)
        kept_frequencies(self.dim // 2, config.keep_frequencies)
        check_rescale_factors(config.scaling, self.dim // 2)

    def scales(self) -> bool:
        """Whether a scaling method applies now: in eval mode, and in training too with
        ``scaling.in_training`` (a fine-tune after scaling)."""
        scaling = self.config.scaling
        return scaling.method != "none" and (not self.training or scaling.in_training)

    def scaling_factor(self, length: int) -> float | None:
        """The factor s for a sequence of ``length`` positions (0 .. length-1: the window being
        evaluated), or None for plain RoPE (no scaling method, or training mode without
        ``scaling.in_training``)."""
        if not self.scales():
            return None
        scaling = self.config.scaling
        ratio = length / scaling.original_length  # from the TRAINING length, not L
        if scaling.method == "dynamic":
            # HF's dynamic NTK: s' = s L / L0 - (s - 1) past L0 (s = 1 for a null factor), so the
            # stretch grows from 1 at the original length with slope s
            s = scaling.factor or 1.0
            return max(1.0, s * ratio - (s - 1))
        if scaling.factor is not None:
            return scaling.factor
        return max(1.0, ratio)

    def scaling_record(self, length: int) -> dict[str, Any]:
        factor = self.scaling_factor(length)
        if factor is None:
            return super().scaling_record(length)
        return {
            "scaling": self.config.scaling.method,
            "scaling_factor": factor,
            "scaling_factor_setting": self.config.scaling.factor,
        }

    def frequencies(self, factor: float | None, length: int) -> tuple[torch.Tensor, float]:
        """theta (d/2,) float64 under scaling ``factor`` (None: plain RoPE) for a sequence of
        ``length`` positions, with p-RoPE's dropped frequencies, and the attention factor that
        goes with it."""
        method = SCALING_METHODS[self.config.scaling.method if factor is not None else "none"]
        theta, attention_factor = method(
            self.dim, self.config.base, factor or 1.0, self.config.scaling, length
        )
        return drop_low_frequencies(theta, self.config.keep_frequencies), attention_factor

    def rotations(self, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The rotations e^(i m theta) at ``positions`` laid out for queries and keys
        ([B, 1,] T, d/2) complex128, and the attention factor on the rotated dims."""
        # One path, eager or compiled, training or not: the rotations are computed for these
        # positions, with no table to look up. A table sized by the data (int(positions.max()))
        # broke torch.compile's graph, and a second path for compiled training once trained
        # plain RoPE where p-RoPE or a fine-tune's scaling was configured. The largest position
        # is read (a device sync; a graph break when compiled) only while a scaling method
        # applies, whose factor may follow the length.
        length = int(positions.max()) + 1 if self.scales() else 0
        theta, attention_factor = self.frequencies(self.scaling_factor(length), length)
        return shared_by_heads(rotation_at(positions, theta), positions), attention_factor

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rotation, attention_factor = self.rotations(positions)  # ([B, 1,] T, d/2)
        return rotate_leading(x, rotation, self.config.layout, attention_factor)

    def queries_and_keys(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # rotate()'s work for both, with the rotations computed (and cast) once, not twice.
        rotation, attention_factor = self.rotations(positions)  # ([B, 1,] T, d/2)
        rotation = rotation.to(complex_dtype(q))
        layout = self.config.layout
        return (
            rotate_leading(q, rotation, layout, attention_factor),
            rotate_leading(k, rotation, layout, attention_factor),
        )
