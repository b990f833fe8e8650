"""KERPLE: kernelized relative positional embedding (Chi et al. 2022,
https://arxiv.org/abs/2205.09921).

The attention logit of query m and key n gets a learned, shift-invariant bias k(m, n) that is
a conditionally positive definite kernel of the distance |m - n|; its constant offset to a
positive definite kernel cancels in the softmax. The paper's two practical variants, each with
its own (r1, r2) per head:

    power:        k(m, n) = -r1 * |m - n|^r2           r1 > 0, 0 < r2 <= 2
    logarithmic:  k(m, n) = -r1 * log(1 + r2 * |m - n|)  r1, r2 > 0

(the logarithmic one extrapolates best in the paper). With r2 = 1 the power kernel is ALiBi
with a learned slope. As in the authors' code (github.com/chijames/KERPLE), the bias is added
after the 1/sqrt(d) scaling, r1 and r2 start uniform in (0, 2) and (0, 1) (log) or (0, 1)
and (0, 2) (power), and the constraints are kept by projection: before each use, r1 and r2
are clamped to at least 0.01 (positive, away from zero), and the power kernel's r2 also to at
most 2.

``encoding.dape=true`` adds DAPE's network of the logits and this bias (posbench/encodings/dape.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from posbench.encodings.dape import DapeEncoding, DapeOptions
from posbench.encodings.registry import register
from posbench.errors import PosbenchError

KERNELS = ("log", "power")
SMALLEST = 1e-2  # the authors' lower bound for r1 and r2: positive, away from zero


@dataclass
class KerpleConfig(DapeOptions):
    name: str = "kerple"
    kernel: str = "log"  # log | power


@register("kerple")
class KerpleRelativeBias(DapeEncoding):
    Config = KerpleConfig

    def __init__(self, config: KerpleConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if config.kernel not in KERNELS:
            raise PosbenchError(
                f"encoding.kernel must be one of {', '.join(KERNELS)} (got {config.kernel!r})"
            )
        log = config.kernel == "log"
        self.r1 = nn.Parameter(torch.rand(n_head) * (2.0 if log else 1.0))  # (H,)
        self.r2 = nn.Parameter(torch.rand(n_head) * (1.0 if log else 2.0))  # (H,)
        # r2 is an exponent in the power kernel, where the kernel is CPD only up to 2.
        self.r2_max = None if log else 2.0

    def project(self) -> None:
        """Clamp r1 and r2 back into their constraint sets, in place and only when a step has
        left them: several layers use them within one forward, and an in-place write after
        an earlier layer's use would invalidate that layer's backward."""
        with torch.no_grad():
            for param, upper in ((self.r1, None), (self.r2, self.r2_max)):
                outside = (
                    param < SMALLEST if upper is None else (param < SMALLEST) | (param > upper)
                )
                if outside.any():
                    param.clamp_(SMALLEST, upper)

    def relative_bias(self, distance: torch.Tensor) -> torch.Tensor:
        self.project()
        return self.kernel(distance.abs().to(self.r1.dtype))  # (H, D)

    def kernel(self, distance: torch.Tensor) -> torch.Tensor:
        """k(m, n) of each head at distances |m - n| ``distance`` (D,) -> (H, D)."""
        r1, r2 = self.r1[:, None], self.r2[:, None]  # (H, 1)
        if self.config.kernel == "log":
            return -r1 * torch.log1p(r2 * distance)
        return -r1 * distance.pow(r2)
