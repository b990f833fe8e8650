"""DAPE's network f as matrix products (posbench/encodings/dape.py): ``DapeNetwork`` gives f's
output at a block of queries and keys from the queries, the keys and the bias of positions,
with a hand-written backward (``DapeBias``).

f is two convolutions along the keys, 2H -> width -> H channels with 1 x k kernels. A 1 x k
convolution of C channels is one matrix product with the input's k shifted copies ("taps",
k * C rows, one column per (query, key) pair): width x 2kH for the first layer, kH x width for
the second (its output's taps summed back). Each sequence's logits are computed, masked and
fed through both layers in chunks of sequences small enough (CHUNK_PAIRS pairs) that the hidden
layer stays in the caches, and the backward pass recomputes them per chunk instead of keeping
them: nothing of the width's size is kept for the backward pass or written out at once (the
hidden layer of a block of 32 queries over 128 keys at batch 32 is 17 MB, which autograd's
convolutions wrote out and read back several times, forward and backward, each a fresh
allocation whose pages the system zeroed again).

The bias of positions is the same for every sequence (positions (T,)): its part of the first
layer is computed once per block, not per sequence, and added to each.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

# Pairs (query, key) per chunk of sequences: the hidden layer of one chunk is 32 channels of
# this many pairs (2 MiB in float32).
CHUNK_PAIRS = 2**14
SLOPE = 0.01  # the LeakyReLU's between the layers


def taps(x: torch.Tensor, kernel: int, left: int, right: int) -> torch.Tensor:
    """The ``kernel`` shifted copies of ``x`` (B, C, n, m) zero-padded by ``left`` and ``right``
    keys, as the rows of one matrix per sequence -> (B, kernel * C, n * w), w = m + left + right
    - kernel + 1: row (t, c), column (i, j) is x[c, i, j + t - left] (0 outside)."""
    B, _, n, m = x.shape
    padded = F.pad(x, (left, right))
    w = m + left + right - kernel + 1
    return torch.stack([padded[..., t : t + w] for t in range(kernel)], dim=1).view(B, -1, n * w)


def untaps(rows: torch.Tensor, kernel: int, n: int, w: int) -> torch.Tensor:
    """The adjoint of ``taps`` with ``kernel // 2`` keys of padding on each side: rows
    (B, kernel * C, n * w) -> (B, C, n, w), each tap's rows shifted back and summed."""
    half = kernel // 2
    shifted = rows.view(rows.shape[0], kernel, -1, n, w)
    out = shifted[:, half].clone()
    for t in range(kernel):
        s = t - half  # tap t read key j + s
        if s > 0:
            out[..., s:] += shifted[:, t, ..., : w - s]
        elif s < 0:
            out[..., : w + s] += shifted[:, t, ..., -s:]
    return out


class Piece(NamedTuple):
    """A block of queries and the keys f reads for them."""

    queries: slice  # token indices of the queries
    keys: slice  # of the keys whose logits and bias f reads: the block's, widened
    beyond: int  # zero keys after those (past the sequence's last)
    inside: slice  # the block's own keys among keys + beyond: where f's output is wanted
    hidden: torch.Tensor  # (n, M) bool: features 0 there (keys a query does not see)


class DapeNetwork(nn.Module):
    """f: 2H -> width -> H channels, two 1 x kernel convolutions along the keys (their weights
    as nn.Conv2d's), a LeakyReLU between; its forward is DapeBias's."""

    def __init__(self, n_head: int, width: int, kernel: int) -> None:
        super().__init__()
        padding = (0, kernel // 2)  # the same number of keys out as in
        self.up = nn.Conv2d(2 * n_head, width, (1, kernel), padding=padding)
        self.down = nn.Conv2d(width, n_head, (1, kernel), padding=padding)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, pieces: list[Piece], biases: list[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """f([z; b]) of each piece: z = q k^T / sqrt(d) of the queries q (B, H, T, d) and keys
        k (B, H, T, d) at its indices, b its bias of positions ([B|1], H, n, M) in ``biases``,
        both 0 where it hides them and over its ``beyond`` keys -> f's output at its
        ``inside`` keys, (B, H, n, m) each, in float32 at least. One autograd node for all."""
        up, down = self.up, self.down
        return DapeBias.apply(q, k, pieces, up.weight, up.bias, down.weight, down.bias, *biases)


def matrices(
    w_up: torch.Tensor, w_down: torch.Tensor, n_head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The convolutions' weights as matrices over taps: the first layer's of the logits and of
    the bias (width, kH) each, its rows' order (t, h) that of ``taps``; the second layer's
    (kH, width) with its taps reversed, so that ``untaps`` of its product is the convolution."""
    width, _, _, kernel = w_up.shape
    up = w_up[:, :, 0].permute(0, 2, 1)  # (width, k, 2H)
    w_z = up[..., :n_head].reshape(width, kernel * n_head)
    w_b = up[..., n_head:].reshape(width, kernel * n_head)
    w_d = w_down[:, :, 0].flip(-1).permute(2, 0, 1).reshape(kernel * n_head, width)
    return w_z, w_b, w_d


class DapeBias(torch.autograd.Function):
    """DapeNetwork's forward and backward, in float32 (float64 for float64 inputs) whatever the
    autocast, the gradients returned in their inputs' dtypes. The pieces' gradients of q and k
    are summed in place into one each."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        pieces: list[Piece],
        w_up: torch.Tensor,
        b_up: torch.Tensor,
        w_down: torch.Tensor,
        b_down: torch.Tensor,
        *biases: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.dtypes = [t.dtype for t in (q, k, *biases)]
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k, w_up, b_up, w_down, b_down = (t.to(dtype) for t in (q, k, w_up, b_up, w_down, b_down))
        biases = tuple(b.to(dtype) for b in biases)
        ctx.save_for_backward(q, k, w_up, b_up, w_down, *biases)
        ctx.pieces = pieces
        outputs = []
        with torch.autocast(q.device.type, enabled=False):
            for piece, bias in zip(pieces, biases, strict=True):
                net = Network(w_up, b_up, w_down, piece, q.shape[-1])
                outputs.append(net.forward(q, k, bias).add_(b_down[:, None, None]))
        return tuple(outputs)

    @staticmethod
    @once_differentiable  # its gradients are not recorded for a second derivative
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, w_up, b_up, w_down, *biases = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            dq, dk = torch.zeros_like(q), torch.zeros_like(k)
            sums = [torch.zeros_like(t) for t in (w_up, b_up, w_down)]
            bias_grads = []
            for piece, bias, grad, needs_grad in zip(
                ctx.pieces, biases, grads, ctx.needs_input_grad[7:], strict=True
            ):
                net = Network(w_up, b_up, w_down, piece, q.shape[-1])
                parts = net.backward(q, k, bias, grad.to(q.dtype), dq, dk, needs_grad)
                for total, part in zip(sums, parts[:3], strict=True):
                    total += part
                bias_grads.append(parts[3])
            d_bdown = sum(grad.sum((0, 2, 3)) for grad in grads)
        q_dtype, k_dtype, *bias_dtypes = ctx.dtypes
        bias_grads = [
            None if grad is None else grad.to(dtype)
            for grad, dtype in zip(bias_grads, bias_dtypes, strict=True)
        ]
        return (dq.to(q_dtype), dk.to(k_dtype), None, *sums, d_bdown, *bias_grads)


class Network:
    """DapeBias's computation for one piece, a chunk of sequences at a time: the convolutions
    as matrices (``matrices``), the logits of a chunk's queries and keys, its hidden layer."""

    def __init__(
        self,
        w_up: torch.Tensor,
        b_up: torch.Tensor,
        w_down: torch.Tensor,
        piece: Piece,
        head_dim: int,
    ) -> None:
        self.kernel = w_up.shape[-1]
        self.half = self.kernel // 2
        self.w_z, self.w_b, self.w_d = matrices(w_up, w_down, w_down.shape[0])
        # The logits' 1 / sqrt(d) in their matrix: its taps are those of q k^T.
        self.scale = 1 / math.sqrt(head_dim)
        self.w_z = self.w_z * self.scale
        self.b_up = b_up[:, None]  # (width, 1)
        self.piece = piece
        self.n, self.m = piece.hidden.shape  # queries, keys read
        self.w = self.m + piece.beyond  # keys of the hidden layer and the output

    def forward(self, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """f's output without the second layer's bias at the piece's inside keys,
        (B, H, n, inside), from all queries and keys (B, H, T, d) and its bias."""
        B, H = q.shape[:2]
        inside = self.piece.inside
        out = q.new_empty(B, H, self.n, inside.stop - inside.start)
        shared = self.bias_hidden(bias) if bias.shape[0] == 1 else None
        for s in self.chunks(B):
            hb = shared if shared is not None else self.bias_hidden(bias[s])
            _, a = self.hidden_layer(q, k, s, hb)
            second = untaps(torch.matmul(self.w_d, a), self.kernel, self.n, self.w)
            out[s] = second[..., inside]
        return out

    def backward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        bias: torch.Tensor,
        grad: torch.Tensor,
        dq: torch.Tensor,
        dk: torch.Tensor,
        needs_bias_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The gradients of the convolutions' weights (w_up, b_up, w_down) and of the piece's
        ``bias`` (if ``needs_bias_grad``) from its output's ``grad`` (B, H, n, inside), its
        queries' and keys' added to ``dq`` and ``dk`` (B, H, T, d)."""
        B = q.shape[0]
        piece, n, w = self.piece, self.n, self.w
        shared = bias.shape[0] == 1
        hb_shared = self.bias_hidden(bias) if shared else None
        d_wz, d_wb, d_wd = (torch.zeros_like(t) for t in (self.w_z, self.w_b, self.w_d))
        d_bup = torch.zeros_like(self.b_up[:, 0])
        dh_sum = q.new_zeros(1, self.w_z.shape[0], n * w) if shared else None
        dbias = torch.empty_like(bias) if needs_bias_grad and not shared else None
        # The output's gradient at every key of the hidden layer (0 outside ``inside``) as taps.
        left, right = piece.inside.start + self.half, w - piece.inside.stop + self.half
        for s in self.chunks(B):
            hb = hb_shared if shared else self.bias_hidden(bias[s])
            z_taps, a = self.hidden_layer(q, k, s, hb)
            dy = taps(grad[s], self.kernel, left, right)  # (c, kH, n * w)
            d_wd += torch.bmm(dy, a.transpose(1, 2)).sum(0)
            dh = torch.ops.aten.leaky_relu_backward(
                torch.matmul(self.w_d.t(), dy), a, SLOPE, True
            )  # (c, width, n * w)
            # (c, kH, n * w) by (c, n * w, width): 2.5x as fast as the product the other way
            d_wz += torch.bmm(z_taps, dh.transpose(1, 2)).sum(0).t()
            dz = self.features_grad(self.w_z, dh)  # (c, H, n, M), of q k^T
            dq[s, :, piece.queries] += torch.matmul(dz, k[s, :, piece.keys])
            dk[s, :, piece.keys] += torch.matmul(dz.transpose(-1, -2), q[s, :, piece.queries])
            if shared:
                dh_sum += dh.sum(0, keepdim=True)
                continue
            d_wb += torch.bmm(self.bias_taps(bias[s]), dh.transpose(1, 2)).sum(0).t()
            d_bup += dh.sum((0, 2))
            if dbias is not None:
                dbias[s] = self.features_grad(self.w_b, dh)
        if shared:
            d_wb += torch.bmm(self.bias_taps(bias), dh_sum.transpose(1, 2)).sum(0).t()
            d_bup += dh_sum.sum((0, 2))
            if needs_bias_grad:
                dbias = self.features_grad(self.w_b, dh_sum)
        return (*self.weight_grads(d_wz, d_wb, d_wd, d_bup), dbias)

    def chunks(self, batch: int) -> list[slice]:
        """Slices of the sequences, each at most CHUNK_PAIRS pairs (at least one sequence)."""
        size = max(1, CHUNK_PAIRS // (self.n * self.w))
        return [slice(s, min(s + size, batch)) for s in range(0, batch, size)]

    def bias_taps(self, bias: torch.Tensor) -> torch.Tensor:
        """The masked bias's taps, ([B|1], kH, n * w)."""
        masked = bias.masked_fill(self.piece.hidden, 0)
        return taps(masked, self.kernel, self.half, self.half + self.piece.beyond)

    def bias_hidden(self, bias: torch.Tensor) -> torch.Tensor:
        """The bias's part of the first layer, with its bias: ([B|1], width, n * w)."""
        return torch.matmul(self.w_b, self.bias_taps(bias)).add_(self.b_up)

    def hidden_layer(
        self, q: torch.Tensor, k: torch.Tensor, chunk: slice, bias_hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The masked logits' taps (c, kH, n * w) and the hidden layer after the LeakyReLU
        (c, width, n * w) of the piece's queries and keys in the ``chunk`` of sequences."""
        piece = self.piece
        # q k^T: its 1 / sqrt(d) is in w_z
        z = torch.matmul(q[chunk, :, piece.queries], k[chunk, :, piece.keys].transpose(-1, -2))
        right = self.half + piece.beyond
        z_taps = taps(z.masked_fill_(piece.hidden, 0), self.kernel, self.half, right)
        c = z.shape[0]
        a = torch.baddbmm(
            bias_hidden.expand(c, -1, -1), self.w_z.expand(c, -1, -1), z_taps
        )  # (c, width, n * w)
        return z_taps, F.leaky_relu_(a, SLOPE)

    def features_grad(self, w: torch.Tensor, dh: torch.Tensor) -> torch.Tensor:
        """The gradient of the masked features (logits or bias) whose first-layer matrix is
        ``w`` from the hidden layer's ``dh`` (c, width, n * w): (c, H, n, M), 0 where masked."""
        full = untaps(torch.matmul(w.t(), dh), self.kernel, self.n, self.w)
        return full[..., : self.m].masked_fill_(self.piece.hidden, 0)

    def weight_grads(
        self, d_wz: torch.Tensor, d_wb: torch.Tensor, d_wd: torch.Tensor, d_bup: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gradients of w_up, b_up and w_down in their shapes from those of ``matrices``."""
        width = d_wz.shape[0]
        d_wz = d_wz * self.scale  # of the weights before the logits' scale
        up = torch.cat((d_wz.view(width, self.kernel, -1), d_wb.view(width, self.kernel, -1)), 2)
        down = d_wd.view(self.kernel, -1, width).flip(0).permute(1, 2, 0)
        return up.permute(0, 2, 1).unsqueeze(2), d_bup, down.unsqueeze(2)
