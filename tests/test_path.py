"""PaTH (Yang et al. 2025): attention against fla's naive PaTH reference
(``fla.ops.path_attn.naive.naive_path_attn``, outputs and gradients, with and without FoX's gate,
in training and evaluation), the chunked logits of any block against the product of transitions
written out in float64, a window's attention through content_bias, transitions of strength 0 giving
NoPE, the layer's directions and strengths as the paper's layer makes them, and attention scaling
refused.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posbench.encodings.path
from posbench.encodings import build_encoding
from posbench.encodings.path import path_logits
from posbench.errors import PosbenchError
from posbench.model import build_model
from posbench.model.attention import causal_attention
from posbench.model.attention.transitions import transition_attention


def fla_naive_module(name: str) -> ModuleType:
    """fla's plain-PyTorch reference ``fla/ops/<name>.py``, loaded as that one file: importing
    it through fla's packages imports every Triton kernel of fla (10 s, and triton, which has
    wheels for Linux alone), and the reference needs only torch and einops."""
    path = Path(importlib.util.find_spec("fla").origin).parent / "ops" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"fla_reference_{name.replace('/', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


naive_path_attn = fla_naive_module("path_attn/naive").naive_path_attn

F64 = torch.float64
SMALL = {"n_layer": 2, "n_head": 2, "d_model": 16}


def transitions_inputs(length: int, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v (B, H, T, hs), unit w (B, H, T, hs), beta in (0, 2) (B, H, T) and log forget gates
    (B, H, T), float64, for B = 2, H = 3, hs = 8."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v, w = (torch.randn(2, 3, length, 8, dtype=F64, generator=generator) for _ in range(4))
    beta = 2 * torch.rand(2, 3, length, dtype=F64, generator=generator)
    log_gates = F.logsigmoid(torch.randn(2, 3, length, dtype=F64, generator=generator))
    return [q, k, v, F.normalize(w, dim=-1), beta, log_gates]


@pytest.mark.parametrize("gate", [False, True], ids=["path", "path-fox"])
def test_attention_equals_flas_naive_path_attention_with_its_gradients(gate, monkeypatch):
    # Chunks of 16 over 40 tokens: two whole chunks and a partial one, as at any length.
    monkeypatch.setattr(posbench.encodings.path, "CHUNK", 16)
    inputs = [t.requires_grad_() for t in transitions_inputs(40)]
    q, k, v, w, beta, log_gates = inputs
    scale = 1 / math.sqrt(q.shape[-1])
    # posbench's key bias b_j = -c_j / sqrt(hs), c the gates' running log-sum: fla's reference
    # adds c_i - c_j to q.k before scaling both.
    key_bias = -log_gates.cumsum(-1) * scale if gate else None
    got = transition_attention(q, k, v, (w, beta, key_bias))
    fla_inputs = [t.transpose(1, 2) for t in (q, k, v, w, beta, log_gates if gate else 0 * beta)]
    expected = naive_path_attn(*fla_inputs, scale=scale, chunk_size=16).transpose(1, 2)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)  # fla's in float32
    with torch.no_grad():  # evaluation's path: SDPA's kernel, merged by log-sum-exps
        evaluated = transition_attention(q, k, v, (w, beta, key_bias))
    torch.testing.assert_close(evaluated, expected, rtol=0, atol=2e-6)
    out_grad = torch.randn_like(got)
    leaves = inputs if gate else inputs[:-1]
    for ours, theirs in zip(
        torch.autograd.grad(got, leaves, out_grad),
        torch.autograd.grad(expected, leaves, out_grad),
        strict=True,
    ):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-5)


def householder(w: torch.Tensor, beta: torch.Tensor, t: int) -> torch.Tensor:
    """H_t = I - beta_t w_t w_t^T (B, H, hs, hs), written out."""
    outer = w[:, :, t, :, None] * w[:, :, t, None, :]
    return torch.eye(w.shape[-1], dtype=F64) - beta[:, :, t, None, None] * outer


@functools.cache
def written_out_logits(length: int) -> torch.Tensor:
    """q_i^T H_i ... H_{j+1} k_j of transitions_inputs(length) at every j <= i (B, H, T, T), the
    transitions multiplied out one by one in float64 (0 above the diagonal)."""
    q, k, _, w, beta, _ = transitions_inputs(length)
    logits = torch.zeros(2, 3, length, length, dtype=F64)
    for i in range(length):
        product = torch.eye(8, dtype=F64)  # H_i ... H_{j+1}, from j = i down
        for j in range(i, -1, -1):
            logits[:, :, i, j] = (q[:, :, i, None, :] @ product @ k[:, :, j, :, None])[..., 0, 0]
            product = product @ householder(w, beta, j)
    return logits


@settings(max_examples=8, deadline=None)
@given(st.data())
def test_logits_of_any_block_are_queries_and_keys_through_every_transition_between(data):
    # Chunks of 4 over 23 tokens; blocks that start and end anywhere, the keys from at most the
    # first query on and up to at most the last, as attention asks (a window's start first).
    query_stop = data.draw(st.integers(1, 23))
    query_start = data.draw(st.integers(0, query_stop - 1))
    key_start = data.draw(st.integers(0, query_start))
    key_stop = data.draw(st.integers(key_start + 1, query_stop))
    q, k, _, w, beta, _ = transitions_inputs(23)
    with mock.patch.object(posbench.encodings.path, "CHUNK", 4):
        logits = path_logits(
            q, k, w, beta, slice(query_start, query_stop), slice(key_start, key_stop)
        )
    expected = written_out_logits(23)[:, :, query_start:query_stop, key_start:key_stop]
    on_or_below = torch.arange(query_start, query_stop)[:, None] >= torch.arange(
        key_start, key_stop
    )
    torch.testing.assert_close(logits * on_or_below, expected, rtol=0, atol=1e-12)


def test_transitions_of_strength_zero_leave_a_nope_model():
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, 70))
    path = build_model(SMALL, {"name": "path", "forget_gate": False}).double().eval()
    nope = build_model(SMALL, {"name": "none"}).double().eval()
    nope.load_state_dict(path.state_dict(), strict=False)  # every weight but PaTH's own
    with torch.no_grad():
        for encoding in path.layer_encodings:
            encoding.beta.bias.fill_(-80.0)  # beta = 2 sigmoid(-80): H_t = I to rounding
        torch.testing.assert_close(path(tokens), nope(tokens), rtol=0, atol=1e-12)


def test_directions_are_unit_vectors_of_their_tokens_and_those_before_and_strengths_in_0_2():
    encoding = build_encoding({"name": "path"}, 16, 2)
    x = torch.randn(1, 9, 16)
    w, beta = encoding.directions(x)  # (1, 2, 9, 8), (1, 2, 9)
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(1, 2, 9))
    assert ((beta > 0) & (beta < 2)).all()
    later = x.clone()
    later[:, 5] += 1.0
    w_later, _ = encoding.directions(later)
    assert torch.equal(w_later[:, :, :5], w[:, :, :5]) and not torch.equal(w_later, w)
    further = x.clone()
    further[:, 2] += 1.0  # the convolution reads tokens t - 2, t - 1 and t
    w_further, _ = encoding.directions(further)
    assert torch.equal(w_further[:, :, 5:], w[:, :, 5:]) and not torch.equal(w_further, w)


def test_path_fox_reuses_foxs_gate_and_its_initialisation():
    encoding = build_encoding({"name": "path", "forget_gate": True}, 16, 2)
    assert type(encoding.gate).__name__ == "ForgetGateBias"
    assert torch.equal(encoding.gate.gate_bias, torch.zeros(2))
    assert build_encoding({"name": "path"}, 16, 2).gate is None


def test_an_attention_scaling_is_refused_in_one_line():
    with pytest.raises(PosbenchError, match=r"model\.attention_scaling=none"):
        build_model({**SMALL, "attention_scaling": "ssmax"}, {"name": "path"})


def test_a_windowed_layer_attends_with_the_same_logits_to_its_recent_keys_alone():
    # A hybrid's window takes the blocked path, which asks content_bias per block of queries.
    encoding = build_encoding({"name": "path"}, 16, 2).double()
    encoding.window = 5
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 30, 16, dtype=F64, generator=generator)
    q, k, v = (torch.randn(1, 2, 30, 8, dtype=F64, generator=generator) for _ in range(3))
    state = encoding.content_state(x, q, k, torch.arange(30))
    got = causal_attention(q, k, v, torch.arange(30), encoding, content=state)
    logits = path_logits(q, k, state.w, state.beta, slice(0, 30), slice(0, 30)) / math.sqrt(8)
    apart = torch.arange(30)[:, None] - torch.arange(30)[None, :]  # i - j
    visible = (apart >= 0) & (apart < 5)
    expected = torch.softmax(logits.masked_fill(~visible, -math.inf), dim=-1) @ v
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
