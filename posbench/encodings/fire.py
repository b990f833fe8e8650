"""FIRE: functional interpolation for relative positions (Li et al. 2023,
https://arxiv.org/abs/2310.04418).

The attention logit of query i and key j gets a learned bias per head

    b_h(i, j) = f_theta(psi(i - j) / psi(max(L, i))),    psi(x) = log(c * x + 1),

where f_theta is a small MLP (1 -> ``width`` -> heads, ReLU), c > 0 a learned scale of the log
transform and L > 0 a learned threshold. While i <= L the denominator is the constant psi(L),
so the bias depends on i - j only (a relative encoding, like T5's or KERPLE's). Past L the
relative distance is divided by the query's own position: every query sees its keys on the same
[0, 1] scale, whatever the length (the paper's "progressive interpolation"), so a query at 4x
the training length reads the function at inputs it was trained on.

L is learned as a multiple of its initial value: L = L0 * s, with L0 = ``threshold`` (the
training length: conf/encoding/fire.yaml) fixed and s = ``threshold_scale`` learned from 1, as
the public implementation in mcleish7/arithmetic (cramming/architectures/embeddings.py) does
with its ``init_L`` and ``L_multiplier`` (it takes |L0 * s| where posbench clamps). An Adam(W)
step moves a parameter by at most about the learning rate, whatever the scale of its gradient:
L itself as the parameter moved by under 2 in 600 steps at lr 3e-3 and stayed at the training
length; s moves as much, so L moves by L0 times that. Weights and checkpoints written while L
itself was the parameter (key ``threshold``) load as s = L / L0 (``load_threshold_as_scale``).

With a large L and a suitable f_theta the bias can express T5's buckets, ALiBi and KERPLE
(the paper's Theorem 3.1). c and L are kept in their domains by clamping where they are used
(c >= 0.01, L >= 1), so an optimizer step can never make the log undefined.

The paper's FIRE gives every layer its own f_theta, c and L; its FIRE-S shares one set across
the layers, as T5's bias is shared. ``per_layer: false`` (the default: one instance for every
layer, whose layers then share each query block's bias in evaluation) is FIRE-S, and
``per_layer: true`` the paper's FIRE.

Attention takes FIRE's bias as a bias of the distance alone while no query is past L
(``consecutive_bias``: training at T <= L), and builds it per block of queries past L
(``score_bias``), where f_theta is evaluated from its linear segments (``segments``), one
slope and intercept per key wherever no segment boundary crosses the key's column. L is
learned, so a run whose L falls below its training length trains on the second path from then.

``encoding.dape=true`` adds DAPE's network of the logits and this bias (posbench/encodings/dape.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from posbench.encodings.dape import DapeEncoding, DapeOptions
from posbench.encodings.registry import register
from posbench.errors import PosbenchError

SMALLEST_C = 1e-2  # psi(x) = log(c x + 1) flattens to 0 as c -> 0; keep it a transform


@dataclass
class FireConfig(DapeOptions):
    name: str = "fire"
    width: int = 32  # hidden units of f_theta
    c: float = 0.1  # initial scale of psi(x) = log(c x + 1)
    threshold: float = 512.0  # initial L (conf/encoding/fire.yaml: ${train.seq_len})
    per_layer: bool = False  # one FIRE per layer (the paper's FIRE), not one for all (FIRE-S)


@register("fire")
class FireRelativeBias(DapeEncoding):
    Config = FireConfig

    def __init__(self, config: FireConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        for key in ("width", "c", "threshold"):
            if getattr(config, key) <= 0:
                raise PosbenchError(f"encoding.{key} must be positive (got {getattr(config, key)})")
        width = config.width
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_head))
        self.c = nn.Parameter(torch.tensor(float(config.c)))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # s of L = L0 * s
        self.register_load_state_dict_pre_hook(load_threshold_as_scale)

    @property
    def per_layer(self) -> bool:
        return self.config.per_layer or super().per_layer  # DAPE: one per layer

    @property
    def threshold(self) -> torch.Tensor:
        """The threshold L = L0 * s, at least 1 (a 0-d tensor, differentiable in s)."""
        return (self.threshold_scale * self.config.threshold).clamp(min=1.0)

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        """The log transform psi(x) = log(c x + 1) of distances or positions x >= 0."""
        c = self.c.clamp(min=SMALLEST_C)
        return torch.log1p(c * x.to(c.dtype))

    def normalised(self, distance: torch.Tensor, horizon: torch.Tensor) -> torch.Tensor:
        """f_theta's input psi(distance) / psi(horizon), for integer distances >= 0."""
        return self.psi(distance) / self.psi(horizon)

    def relative_inputs(
        self, query_positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor:
        """f_theta's input psi(i - j) / psi(max(L, i)) for every pair of positions (..., Tq)
        and (..., Tk) -> (..., Tq, Tk), in [0, 1] for past keys. Future keys (masked anyway)
        read distance 0, so the log stays finite."""
        horizon = torch.maximum(query_positions.to(self.c.dtype), self.threshold)
        Tk = key_positions.shape[-1]
        shared = query_positions.dim() == key_positions.dim() == 1  # one row for the batch
        if shared and int(key_positions[-1] - key_positions[0]) == Tk - 1:
            # Consecutive keys: row i reads psi at the distances i - j, consecutive too, so each
            # row is a slice of one descending row of psi values; a strided view (unfold) holds
            # them all, and the logs are taken once per distinct distance instead of per pair.
            nearest = query_positions.min() - key_positions[-1]
            farthest = query_positions.max() - key_positions[0]
            descending = torch.arange(farthest, nearest - 1, -1, device=key_positions.device)
            rows = self.psi(descending.clamp(min=0)).unfold(0, Tk, 1)  # row r: farthest - r - j
            inputs = rows.index_select(0, farthest - (query_positions - key_positions[0]))
            return inputs.div_(self.psi(horizon)[..., None])
        distance = (query_positions[..., :, None] - key_positions[..., None, :]).clamp(min=0)
        return self.normalised(distance, horizon[..., None])

    def consecutive_bias(self, positions: torch.Tensor) -> torch.Tensor | None:
        # While no query is past L, every denominator is psi(L): the bias is one of the distance
        # alone, which the model attends with as it does T5's (training at T <= L, at the cost
        # of one scalar read) instead of building the (H, T, T) bias.
        threshold = self.threshold
        if int(positions.max()) > threshold.item():
            return None
        distance = torch.arange(positions.shape[-1], device=positions.device)
        with float32_bias(positions.device):
            return self.mlp(self.normalised(distance, threshold)[:, None]).T  # (H, T)

    def segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """f_theta as the piecewise linear function it is: a ReLU MLP of one input is linear
        between the inputs where one of its hidden units switches on or off. Returns the
        switch points, sorted (width,), and per segment its slope and intercept for every head
        (width + 1, H); segment s holds the inputs above exactly s switch points. Slopes and
        intercepts are differentiable in the MLP's weights, as the MLP is."""
        first, second = self.mlp[0], self.mlp[2]
        w, b = first.weight[:, 0], first.bias  # unit k is relu(w_k x + b_k)
        # Where each unit switches (a unit with w_k = 0 never does: +inf, last in order). The
        # points only pick segments, so they need no gradient.
        switch = torch.where(w != 0, -b / w.where(w != 0, 1.0), torch.inf).detach()
        order = switch.argsort()
        rank = order.argsort()  # unit k's place among the sorted switch points
        segment = torch.arange(len(w) + 1, device=w.device)[:, None]  # (width + 1, 1)
        # In segment s the inputs x are above the first s sorted points: a unit with w_k > 0
        # is on there when its point is among them, one with w_k < 0 when it is not.
        on = torch.where(w > 0, rank < segment, torch.where(w < 0, rank >= segment, b > 0))
        on = on.to(w.dtype)  # (width + 1, width)
        with float32_bias(w.device):
            slopes = (on * w) @ second.weight.T  # (width + 1, H)
            intercepts = (on * b) @ second.weight.T + second.bias
        return switch[order], slopes, intercepts

    def score_bias(
        self,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inputs = self.relative_inputs(query_positions, key_positions)  # ([B,] Tq, Tk)
        switches, slopes, intercepts = self.segments()
        # f_theta exactly, from its segments: slope * input + intercept of each pair's segment.
        # A key's input never falls as the query's position grows (psi(i - j) / psi(max(L, i))
        # rises with i; a future key's is 0) and never rises with the key's, so each key's
        # column starts in the segment of the block's first query, and the keys where a switch
        # point t_s is crossed between the first and last query form one range of columns
        # (a few keys per point far from the diagonal, up to the block's height near it).
        first = torch.bucketize(inputs[..., 0, :].contiguous(), switches)  # ([B,] Tk)
        last = torch.bucketize(inputs[..., -1, :].contiguous(), switches)
        column_slopes = slopes.T[:, first].movedim(0, -2)[..., None, :]  # ([B,] H, 1, Tk)
        column_intercepts = intercepts.T[:, first].movedim(0, -2)[..., None, :]
        bias = torch.addcmul(column_intercepts, column_slopes, inputs[..., None, :, :], out=out)
        # Past t_s the next segment's line is the last one's plus its change of slope and
        # intercept (f_theta is continuous: the change is 0 at t_s), added to the pairs past
        # t_s of the range's columns. One write per pair and head where gathering each pair's
        # slope and intercept wrote three: 10-13x faster for a block of 256 x 16,384 with 4
        # heads, 5.6x with all 32 switch points inside (0, 1) (measured on a 2-core Zen 3).
        crossed = torch.arange(int(first.min()), int(last.max()), device=first.device)  # s
        if len(crossed):
            # Columns [lo, hi) hold every key whose first query is at or before t_s and whose
            # last is past it (for any sequence; the other columns there are masked below).
            lo = (first[..., None] > crossed).sum(-2).reshape(-1, len(crossed)).amin(0)
            hi = (last[..., None] > crossed).sum(-2).reshape(-1, len(crossed)).amax(0)
            slope_steps, intercept_steps = slopes.diff(dim=0), intercepts.diff(dim=0)  # (S, H)
            for s, a, b in zip(crossed.tolist(), lo.tolist(), hi.tolist(), strict=True):
                x = inputs[..., None, :, a:b]  # ([B,] 1, Tq, b - a)
                past = (x > switches[s]) & (first[..., None, None, a:b] <= s)
                past_inputs = x * past
                columns = bias[..., a:b]  # ([B,] H, Tq, b - a), in place
                columns.addcmul_(slope_steps[s][:, None, None], past_inputs)
                columns.addcmul_(intercept_steps[s][:, None, None], past.to(x.dtype))
        return bias  # ([B,] H, Tq, Tk)


def float32_bias(device: torch.device) -> torch.autocast:
    """Autocast off, for f_theta's matrix products: the bias in its parameters' dtype (float32),
    as every other bias of positions is kept (T5's table, KERPLE's, ALiBi's slopes), where bf16
    autocast rounded it to 8 bits, and differently on the two paths (its table and its
    segments). A few thousand multiply-adds: its cost does not show."""
    return torch.autocast(device.type, enabled=False)


def load_threshold_as_scale(
    encoding: FireRelativeBias, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """load_state_dict's pre-hook: weights written before L was learned as L0 * s hold L itself
    (``threshold``); they load as s = L / L0, which gives back the saved L exactly when L0 is a
    power of two (the usual training lengths) and to within its last bit otherwise."""
    saved = state_dict.pop(prefix + "threshold", None)
    if saved is not None and prefix + "threshold_scale" not in state_dict:
        scale = saved.item() / encoding.config.threshold  # rounded once, to the saved dtype
        state_dict[prefix + "threshold_scale"] = torch.tensor(scale, dtype=saved.dtype)
