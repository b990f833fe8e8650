"""PoPE, polar positional embeddings (Gopalakrishnan et al. 2025): a layer against
x-transformers' ``Attention`` with its ``PolarEmbedding`` (weights and phases copied across),
outputs and gradients; the logits against the paper's formula; float32 angles at 16k positions;
one-line refusals. Every registered encoding's tests (compiled, bf16, a cached decode, diagnose,
randomized positions, the attention variants) run PoPE too."""

from __future__ import annotations

import math

import pytest
import torch
from x_transformers.x_transformers import Attention, PolarEmbedding

from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model import build_model

F64 = torch.float64
B, H, HS, T = 2, 2, 4, 11


def pope(d_model: int = H * HS, dtype: torch.dtype = F64):
    """A PoPE encoding whose phases are spread over [-2 pi, 0], one of them outside (clamped)."""
    torch.manual_seed(0)
    encoding = build_encoding({"name": "pope", "phase_init": "uniform"}, d_model, H).to(dtype)
    with torch.no_grad():
        encoding.phase[0, 0] = 1.0  # acts as 0, with no gradient, in both implementations
    return encoding


def test_a_layer_gives_x_transformers_polar_attentions_output_and_gradients():
    torch.manual_seed(0)
    model = build_model({"n_layer": 1, "n_head": H, "d_model": H * HS}, {"name": "pope"}).double()
    ours, encoding = model.blocks[0].attn, pope()
    theirs = Attention(H * HS, dim_head=HS, heads=H, causal=True).double()
    with torch.no_grad():
        weights = ours.qkv.weight.split(H * HS)
        for linear, weight in zip((theirs.to_q, theirs.to_k, theirs.to_v), weights, strict=True):
            linear.weight.copy_(weight)
        theirs.to_out.weight.copy_(ours.proj.weight)
    polar = PolarEmbedding(HS, H).double()
    del polar.learned_bias  # its forward reads our phases (their gradients reach them)
    polar.learned_bias = encoding.phase.view(H, 1, HS)
    x = torch.randn(B, T, H * HS, dtype=F64, requires_grad=True)
    positions = torch.arange(T)
    out_grad = torch.randn(B, T, H * HS, dtype=F64)
    out = ours(x, positions, encoding)
    got = [out, *torch.autograd.grad(out, [x, ours.qkv.weight, encoding.phase], out_grad)]
    theirs_weights = [theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight]
    out = theirs(x, polar_pos_emb=polar(positions))
    *grads, phase_grad = torch.autograd.grad(out, [x, *theirs_weights, encoding.phase], out_grad)
    expected = [out, grads[0], torch.cat(grads[1:]), phase_grad]
    # x-transformers applies the embedding in float32 (apply_polar_pos_emb's t.float()).
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert got[3][0, 0] == 0  # the clamped phase


@pytest.mark.parametrize("positions", [torch.arange(7), torch.tensor([[0, 3, 4, 9, 20, 21, 40]])])
def test_the_logits_are_the_papers_sum_of_magnitudes_times_cosines_of_the_distance(positions):
    encoding = pope()
    q, k = (torch.randn(1, H, 7, HS, dtype=F64) for _ in "qk")
    polar_q, polar_k = encoding.queries_and_keys(q, k, positions)
    assert polar_q.shape == (1, H, 7, 2 * HS)
    # Attention divides q.k by the square root of q's width, 2d: the paper's logits over sqrt(d).
    got = polar_q @ polar_k.transpose(-1, -2) / math.sqrt(2 * HS)
    theta = 10000.0 ** -(torch.arange(HS, dtype=F64) / HS)  # (d,)
    delta = encoding.phase.detach().clamp(-2 * math.pi, 0)  # (H, d)
    mu_q, mu_k = torch.nn.functional.softplus(q), torch.nn.functional.softplus(k)
    i, j = positions.view(-1)[:, None], positions.view(-1)[None, :]
    angle = (i - j)[None, :, :, None] * theta - delta[:, None, None, :]  # (H, T, T, d)
    expected = (mu_q[0, :, :, None] * mu_k[0, :, None] * angle.cos()).sum(-1) / math.sqrt(HS)
    torch.testing.assert_close(got[0], expected, rtol=1e-12, atol=1e-12)


def test_float32_logits_at_16k_positions_keep_float32s_precision():
    q, k = (torch.randn(1, H, 4, HS, dtype=F64) for _ in "qk")
    positions = torch.arange(16380, 16384)
    logits = []
    for dtype in (F64, torch.float32):
        polar_q, polar_k = pope(dtype=dtype).queries_and_keys(q.to(dtype), k.to(dtype), positions)
        logits.append((polar_q @ polar_k.transpose(-1, -2)).double())
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"phase_init": "random"}, "phase_init must be one of zero, uniform"),
        ({"base": 1.0}, "base must be > 1"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(PosbenchError, match=message):
        build_encoding({"name": "pope", **options}, H * HS, H)
