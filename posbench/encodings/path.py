"""PaTH: position encoding by accumulated Householder transformations (Yang et al., NeurIPS 2025,
https://arxiv.org/abs/2505.16381).

Every token t of every head reads from its input x_t (the layer's input after its layer norm) a
unit direction w_t and a strength beta_t in (0, 2), and the logit of query i and key j <= i is
q_i and k_j with the product of the Householder-like transitions between them,

    logit_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(hs),    H_t = I - beta_t w_t w_t^T,

(q_i . k_j / sqrt(hs) at j = i): no position is read, the content decides how a key turns on
its way to a query (beta near 2 reflects, beta near 0 leaves it as it is). w and beta are made as
the paper's layer makes them (fla-org/flash-linear-attention, ``fla/layers/path_attn.py``): w a
rank-32 projection of x, a causal depthwise convolution over 3 tokens with SiLU, L2-normalised
per head; beta = 2 sigmoid(a linear map of x). ``forget_gate=true`` (PaTH-FoX) adds FoX's
forget gate (posbench/encodings/fox.py, the same gate) as fla's reference adds it: its log-sums
inside the scaled logit, (c_i - c_j) / sqrt(hs).

The transitions are not invertible in general (beta = 1 projects), so no per-token transform of
q and k gives these logits: attention takes them chunk by chunk (CHUNK tokens,
posbench/model/attention/transitions.py), with the paper's UT representation of a chunk's
product, I - W^T T (beta W), T = (I + strictly_lower(beta W W^T))^-1 (``chunk_logits``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.fox import ForgetGateBias, FoxConfig
from posbench.encodings.registry import register

# Tokens per chunk: a chunk's product is a (hs, hs) matrix, carried over the keys before it
# (T^2 hs^2 / (2 CHUNK) multiply-adds in all), and its own logits are (CHUNK, CHUNK). 64 is
# fla's chunk, and between the best for evaluation and for training (one layer of the tiny
# model, one thread: at 16,384 tokens 7.8 s, against 10.2 s with 32 and 7.0 s with 128;
# forward and backward at 32 x 128 tokens 0.28 s, against 0.21 s and 0.59 s).
CHUNK = 64
W_RANK = 32  # the rank of w's projection (fla's use_low_rank_w)
CONV_SIZE = 3  # tokens w's causal convolution reads (fla's conv_size)


@dataclass
class PathConfig(EncodingConfig):
    name: str = "path"
    forget_gate: bool = False  # PaTH-FoX: FoX's forget gate besides the transitions


@dataclass
class PathState:
    """One layer's PaTH quantities, (B, H, T, ...) each: the q, k it attends with (before the
    queries' scaling), the unit directions ``w`` (B, H, T, hs) and strengths ``beta`` (B, H, T) in
    float32 (float64 for a float64 model), and the forget gate's bias of each key (B, H, T) float64
    (None without the gate)."""

    q: torch.Tensor
    k: torch.Tensor
    w: torch.Tensor
    beta: torch.Tensor
    key_bias: torch.Tensor | None


@register("path")
class HouseholderPath(PositionalEncoding):
    Config = PathConfig

    def __init__(self, config: PathConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        self.w_down = nn.Linear(d_model, W_RANK, bias=False)
        self.w_up = nn.Linear(W_RANK, d_model, bias=False)
        # Depthwise: each channel of w over its own last CONV_SIZE tokens.
        self.w_conv = nn.Conv1d(d_model, d_model, CONV_SIZE, groups=d_model, bias=False)
        self.beta = nn.Linear(d_model, n_head)
        self.gate = ForgetGateBias(FoxConfig(), d_model, n_head) if config.forget_gate else None

    @property
    def per_layer(self) -> bool:
        return True  # the paper's w and beta are projections of each layer's own input

    def directions(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The unit directions w (B, H, T, hs) and strengths beta (B, H, T) in (0, 2) of the
        layer input ``x`` (B, T, C), in float32 (float64 for a float64 ``x``)."""
        B, T, _ = x.shape
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):  # unit vectors in float32
            x = x.to(dtype)
            w = self.w_up(self.w_down(x)).transpose(1, 2)  # (B, C, T)
            w = self.w_conv(F.pad(w, (CONV_SIZE - 1, 0)))  # (B, C, T): causal, token t's last 3
            w = F.silu(w).view(B, self.n_head, self.head_dim, T).transpose(2, 3)  # (B, H, T, hs)
            beta = 2 * torch.sigmoid(self.beta(x)).transpose(1, 2)  # (B, H, T)
        return F.normalize(w, dim=-1), beta

    def content_state(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> PathState:
        w, beta = self.directions(x)
        key_bias = None
        if self.gate is not None:  # fla's reference: the gate's sums scaled with q.k
            key_bias = -self.gate.log_gate_sums(x) / math.sqrt(self.head_dim)  # (B, H, T)
        return PathState(q, k, w, beta, key_bias)

    def transitions(
        self, state: PathState
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return state.w, state.beta, state.key_bias

    def content_bias(self, state: PathState, queries: slice, keys: slice) -> torch.Tensor:
        # PaTH's logit less the q.k / sqrt(hs) attention adds anyway, and the gate's bias.
        q, k = state.q, state.k
        dtype = state.w.dtype
        with torch.autocast(q.device.type, enabled=False):  # autocast would round them to bf16
            logits = path_logits(q, k, state.w, state.beta, queries, keys)  # (B, H, n, m)
        plain = q[:, :, queries].to(dtype) @ k[:, :, keys].to(dtype).transpose(-1, -2)
        bias = (logits - plain) / math.sqrt(self.head_dim)
        if state.key_bias is not None:
            reference = state.key_bias[..., queries.start, None]  # (B, H, 1)
            query_bias = (state.key_bias[..., queries] - reference).to(dtype)  # (B, H, n)
            key_bias = (state.key_bias[..., keys] - reference).to(dtype)  # (B, H, m)
            bias = bias + key_bias[..., None, :] - query_bias[..., :, None]
        return bias


@dataclass
class PathChunk:
    """One chunk of queries [start, end) of ``chunk_logits``: its queries taken back to its
    start (B, H, n, hs), the keys [first, start) carried forward to it (B, H, start - first,
    hs), whose dot products are the logits over the chunks before it, and its own logits
    (B, H, n, n), valid on and below the diagonal (the rest is not masked). Logits without
    1/sqrt(hs)."""

    start: int
    end: int
    queries: torch.Tensor
    keys: torch.Tensor
    local: torch.Tensor


def chunk_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    first: int = 0,
    last: int | None = None,
    store: torch.Tensor | None = None,
) -> Iterator[PathChunk]:
    """The PaTH logits q_i^T H_i ... H_{j+1} k_j of q, k (B, H, T, hs), unit directions ``w``
    (B, H, T, hs) and strengths ``beta`` (B, H, T), one chunk of queries at a time, from the
    chunk holding token ``first`` (its keys from that chunk's first token) to the one holding
    token ``last`` - 1 (default: all), in the dtype of ``w``; the caller turns autocast off
    (it would round them to bf16). Without gradients a ``store`` (B, H, >= T, >= hs) may take
    the carried keys, in place, in its first hs columns (each chunk's ``keys`` then a view of
    it, every column): keys that grow by a chunk each step in fresh tensors leave the heap
    fragmented (1.7 GB for one layer at 16,384 tokens, against 0.1 GB in place).

    Within a chunk of n tokens, W (n, hs) its directions and Wb = diag(beta) W, the product of
    its transitions is P = I - W^T U, U = T Wb, T = (I + strictly_lower(Wb W^T))^-1 (the UT
    transform: the same T serves every stretch of the chunk). Its queries are taken back to the
    chunk's start, q^ = q - tril(q W^T) U; its keys forward to its end, k^ = k - Tk^T W with
    Tk = T strictly_lower(Wb k^T); its own logits are tril(q k^T) - tril(q W^T) Tk. The keys of
    earlier chunks are carried forward through each chunk's P as the queries advance."""
    B, H, T, hs = q.shape
    dtype = w.dtype
    last = T if last is None else last
    size = min(CHUNK, T)
    origin = first - first % size
    carried = q.new_zeros(B, H, 0, hs, dtype=dtype)  # the keys before the chunk, at its start
    for start in range(origin, last, size):
        end = min(start + size, T)
        n = end - start
        qc, kc = (t[:, :, start:end].to(dtype) for t in (q, k))  # (B, H, n, hs)
        wc = w[:, :, start:end]  # (B, H, n, hs)
        wb = wc * beta[:, :, start:end, None]  # (B, H, n, hs)
        eye = torch.eye(n, dtype=dtype, device=q.device)
        lower = (wb @ wc.transpose(-1, -2)).tril(-1)  # (B, H, n, n)
        t = torch.linalg.solve_triangular(eye + lower, eye, upper=False, unitriangular=True)
        u = t @ wb  # (B, H, n, hs)
        qw = (qc @ wc.transpose(-1, -2)).tril()  # (B, H, n, n)
        tk = t @ (wb @ kc.transpose(-1, -2)).tril(-1)  # (B, H, n, n)
        local = (qc @ kc.transpose(-1, -2)).tril() - qw @ tk  # (B, H, n, n)
        keys = carried if store is None else store[:, :, : start - origin]
        yield PathChunk(start, end, qc - qw @ u, keys, local)
        product = torch.eye(hs, dtype=dtype, device=q.device) - wc.transpose(-1, -2) @ u
        forward = kc - tk.transpose(-1, -2) @ wc  # (B, H, n, hs): k^ at the chunk's end
        if store is None:
            carried = torch.cat([carried @ product.transpose(-1, -2), forward], dim=2)
        else:
            carried = store[:, :, : start - origin, :hs]
            carried.copy_(carried @ product.transpose(-1, -2))
            store[:, :, start - origin : end - origin, :hs] = forward


def path_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    queries: slice,
    keys: slice,
) -> torch.Tensor:
    """The PaTH logits (without 1/sqrt(hs)) of the queries at indices ``queries`` over the keys
    at ``keys`` (B, H, n, m), the keys from at most the first query on and up to at most the
    last (as attention asks a block's), in the dtype of ``w``: those on and below the diagonal;
    those above it are not meaningful (the caller masks them)."""
    assert keys.start <= queries.start and keys.stop <= queries.stop, (queries, keys)
    first = keys.start - keys.start % min(CHUNK, q.shape[2])  # the first chunk's first key
    width = queries.stop - first
    rows = []
    for chunk in chunk_logits(q, k, w, beta, keys.start, queries.stop):
        if chunk.end <= queries.start:  # no query here: the chunk only carries the keys on
            continue
        past = chunk.queries @ chunk.keys.transpose(-1, -2)  # (B, H, n, start - first)
        row = torch.cat([past, chunk.local], dim=-1)  # keys [first, end)
        row = F.pad(row, (0, max(width - row.shape[-1], 0)))  # keys [first, queries.stop)
        rows.append(row[:, :, max(queries.start - chunk.start, 0) :, :width])
    logits = torch.cat(rows, dim=2)[:, :, : queries.stop - queries.start]  # (B, H, n, width)
    return logits[..., keys.start - first : keys.stop - first]
