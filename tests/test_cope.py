"""CoPE (Golovneva et al. 2024): the bias against x-transformers' ``CoPE`` and RAM's formula
written out, the counts when every gate is 1, the gradients through attention, and its config.

x-transformers (a test-only reference) takes the scaled logits with the future masked and the
queries; RAM's ``ContextPosSelfAttn`` (facebookresearch/RAM, projects/cope) is written out here
entry by entry with ``math``.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_attention import outputs_and_gradients, use_query_blocks, windowed_masked_attention
from x_transformers.x_transformers import CoPE

import posbench.model.attention
from posbench.config import compose_config
from posbench.encodings import build_encoding
from posbench.encodings.cope import block, reversed_gates
from posbench.errors import PosbenchError
from posbench.model import build_model

F64 = torch.float64
HEAD_DIM = 4


def cope(npos: int, n_head: int = 2, seed: int = 0):
    """A float64 CoPE encoding whose position embedding is random (zeros at init)."""
    torch.manual_seed(seed)
    encoding = build_encoding({"name": "cope", "npos": npos}, HEAD_DIM * n_head, n_head).double()
    with torch.no_grad():
        encoding.position_embedding.normal_()
    return encoding


def random_qk(length: int, batch: int = 2, n_head: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    shape = (batch, n_head, length, HEAD_DIM)
    return [torch.randn(shape, dtype=F64, generator=generator) for _ in range(2)]


def state(encoding, q: torch.Tensor, k: torch.Tensor):
    """The encoding's content_state of queries and keys (B, H, T, hs) at positions 0..T-1."""
    return encoding.content_state(None, q, k, torch.arange(q.shape[2]))


def x_transformers_bias(encoding, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x-transformers' CoPE with the encoding's embedding (the same parameter, so its gradient
    reaches it): its bias (B, H, T, T), given the scaled logits with the future masked as its
    Attend masks them."""
    reference = CoPE(dim=HEAD_DIM, heads=q.shape[1], max_pos=encoding.config.npos)
    reference.pos_emb = encoding.position_embedding
    T = q.shape[2]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    return reference(q, logits.masked_fill(future, -torch.finfo(F64).max))


def past(bias: torch.Tensor, first_query: int = 0) -> torch.Tensor:
    """``bias`` (..., n, m) of queries from ``first_query`` over keys from 0, 0 at future keys."""
    n, m = bias.shape[-2:]
    future = torch.arange(m)[None, :] > torch.arange(first_query, first_query + n)[:, None]
    return bias.masked_fill(future, 0.0)


@pytest.mark.parametrize("gradients", [True, False])  # without: the far keys are not interpolated
@pytest.mark.parametrize("first_query", [0, 13, 32])
def test_the_bias_equals_x_transformers_cope_with_the_same_embedding(gradients, first_query):
    encoding = cope(npos=6)
    q, k = random_qk(40)
    expected = x_transformers_bias(encoding, q, k)[:, :, first_query:]
    with torch.set_grad_enabled(gradients):
        got = encoding.content_bias(state(encoding, q, k), slice(first_query, 40), slice(0, 40))
    torch.testing.assert_close(
        past(got, first_query), past(expected, first_query), rtol=0, atol=1e-12
    )


def test_the_far_keys_of_a_late_block_count_past_the_last_position():
    """The data of the test above reaches npos - 1 before the first key for every query of the
    block from 32: evaluation gives those keys q . e[npos - 1] without interpolating them."""
    encoding = cope(npos=6)
    q, k = random_qk(40)
    q_block, reversed_keys = block(state(encoding, q, k), slice(32, 40), slice(0, 40))
    counts = reversed_gates(q_block, reversed_keys, 32, 0).cumsum(-1)  # keys reversed
    assert bool((counts[..., -1] > 5).all()) and bool((counts[..., 0] < 5).all())


def test_in_evaluation_a_count_that_takes_many_keys_to_reach_the_last_position_is_exact():
    """Evaluation sums the gates of the nearest 2 * npos keys first, then twice as many until
    every query's count reaches npos - 1: query 39's gates of 0.12 take 25 keys to count to 3."""
    encoding = cope(npos=4)
    u = torch.zeros(HEAD_DIM, dtype=F64)
    u[0] = 2.0
    k = u.expand(1, 2, 40, HEAD_DIM)  # q . k / sqrt(hs) = +-2: gates 0.88 and 0.12
    q = torch.cat([u.expand(1, 2, 39, HEAD_DIM), -u.expand(1, 2, 1, HEAD_DIM)], dim=2)
    counts = reversed_gates(*block(state(encoding, q, k), slice(39, 40), slice(0, 40)), 39, 0)
    assert bool((counts.cumsum(-1)[..., 15] < 3).all())  # past the nearest 8 and 16 keys
    expected = x_transformers_bias(encoding, q, k)[:, :, 32:]
    with torch.no_grad():
        got = encoding.content_bias(state(encoding, q, k), slice(32, 40), slice(0, 40))
    torch.testing.assert_close(past(got, 32), past(expected, 32), rtol=0, atol=1e-12)


def ram_logit(q, k, pos_emb, i: int, j: int, npos: int) -> float:
    """RAM's attention logit of query i and key j <= i (one sequence and head; pos_emb
    (hs, npos)): gates sigmoid(q.k / sqrt(hs)), the position summed from j to i and clamped,
    its logit q . pos_emb interpolated from floor and ceil, then (q.k + that) / sqrt(hs)."""
    hs = len(q[i])
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    gates = [1 / (1 + math.exp(-dot(q[i], k[t]) / math.sqrt(hs))) for t in range(j, i + 1)]
    p = min(sum(gates), npos - 1)
    floor, ceil = math.floor(p), math.ceil(p)
    column = lambda n: [pos_emb[d][n] for d in range(hs)]  # noqa: E731
    position_logit = (1 - (p - floor)) * dot(q[i], column(floor)) + (p - floor) * dot(
        q[i], column(ceil)
    )
    return (dot(q[i], k[j]) + position_logit) / math.sqrt(hs)


def test_the_logits_equal_rams_written_out_with_its_embedding_over_sqrt_hs():
    # RAM divides the position logit by sqrt(hs) with the rest; posbench adds q . e after the
    # scaling (x-transformers' and RAM's --cope-nodiv): the same logits with e = e_RAM / sqrt(hs).
    npos, T = 5, 12
    encoding = cope(npos=npos)
    q, k = random_qk(T)
    pos_emb = encoding.position_embedding.T * math.sqrt(HEAD_DIM)  # RAM's (hs, npos)
    bias = encoding.content_bias(state(encoding, q, k), slice(0, T), slice(0, T))
    logits = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + bias
    for b in range(2):
        for h in range(2):
            qs, ks, emb = q[b, h].tolist(), k[b, h].tolist(), pos_emb.tolist()
            for i in range(T):
                for j in range(i + 1):
                    expected = ram_logit(qs, ks, emb, i, j, npos)
                    assert logits[b, h, i, j].item() == pytest.approx(
                        expected, rel=1e-12, abs=1e-12
                    )


@pytest.mark.parametrize("npos", [20, 4])  # 4: counts from 3 on are clamped at it
def test_with_every_gate_1_a_key_is_i_minus_j_plus_1_positions_back(npos):
    T = 12
    encoding = cope(npos=npos)
    # q . k / sqrt(hs) = 200 for every pair: sigmoid is 1 in float64. e[n] = n u, q . u = 10,
    # so the bias is 10 p.
    q = k = torch.full((1, 2, T, HEAD_DIM), 10.0, dtype=F64)
    with torch.no_grad():
        encoding.position_embedding.zero_()
        encoding.position_embedding[:, 0] = torch.arange(npos, dtype=F64)
    positions = encoding.content_bias(state(encoding, q, k), slice(0, T), slice(0, T)) / 10
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    expected = (i - j + 1).clamp(max=npos - 1).to(F64).expand(1, 2, T, T)
    torch.testing.assert_close(past(positions), past(expected), rtol=0, atol=1e-12)


# npos 8: most counts clamped; 64: none, and each block's table stops at its largest count.
@pytest.mark.parametrize("npos", [8, 64])
@pytest.mark.parametrize("window", [None, 6])
def test_attention_with_cope_gives_x_transformers_output_and_gradients_of_q_k_v_and_e(
    window, npos, monkeypatch
):
    use_query_blocks(8, monkeypatch)  # 37 = 4 * 8 + 5 queries
    encoding = cope(npos=npos)
    encoding.window = window
    q, k = (t.requires_grad_() for t in random_qk(37))
    v = torch.randn_like(q).requires_grad_()
    positions = torch.arange(37)
    leaves = [q, k, v, encoding.position_embedding]
    out_grad = torch.randn_like(q)

    def attend():
        content = encoding.content_state(None, q, k, positions)
        return posbench.model.attention.causal_attention(
            q, k, v, positions, encoding, content=content
        )

    def masked():
        bias = x_transformers_bias(encoding, q, k)
        return windowed_masked_attention(q, k, v, encoding, positions, window or 37, bias)

    got = outputs_and_gradients(attend, leaves, out_grad)
    expected = outputs_and_gradients(masked, leaves, out_grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert all(bool(g.abs().sum() > 0) for g in got[1:])


@pytest.mark.parametrize("content_block", [None, 8])
def test_in_evaluation_the_far_keys_are_attended_unmasked_as_x_transformers_attends(
    monkeypatch, content_block
):
    """Without gradients a block's far keys, which all count to npos - 1, get no bias written:
    content_bias_parts gives q . e[npos - 1] per query, added to their log-sum-exp
    (past_and_diagonal_attention). The output equals attention with x-transformers' bias.
    ``content_block``: CoPE's blocks there are at most CONTENT_QUERY_BLOCK queries, whatever
    QUERY_BLOCK allows."""
    # the block from query 32 has far keys (the test above)
    if content_block is None:
        use_query_blocks(8, monkeypatch)
    else:
        use_query_blocks(32, monkeypatch)
        monkeypatch.setattr(posbench.model.attention.blocks, "CONTENT_QUERY_BLOCK", content_block)
    encoding = cope(npos=6)
    q, k = random_qk(40)
    v = torch.randn_like(q)
    positions = torch.arange(40)
    fars = []
    parts = encoding.content_bias_parts

    def recorded(*args):
        far, near = parts(*args)
        fars.append(far)
        return far, near

    monkeypatch.setattr(encoding, "content_bias_parts", recorded)
    with torch.no_grad():
        content = encoding.content_state(None, q, k, positions)
        got = posbench.model.attention.causal_attention(
            q, k, v, positions, encoding, content=content
        )
        bias = x_transformers_bias(encoding, q, k)
        expected = windowed_masked_attention(q, k, v, encoding, positions, 40, bias)
    assert len(fars) == 5 and fars[0] is not None  # the last block, asked first
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_every_blocks_bias_at_once_equals_each_blocks_alone_with_their_gradients():
    # One autograd node for all the blocks of a layer (training), against one per block.
    encoding = cope(npos=8)
    q, k = (t.requires_grad_() for t in random_qk(20))
    blocks = [
        (slice(16, 20), slice(9, 20)),
        (slice(8, 16), slice(0, 16)),
        (slice(0, 8), slice(0, 8)),
    ]
    leaves = [q, k, encoding.position_embedding]
    out_grads = [torch.randn(2, 2, 4, 11), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 8)]

    def biases_and_gradients(biases):
        outputs = biases()
        return [*outputs, *torch.autograd.grad(outputs, leaves, [g.double() for g in out_grads])]

    together = biases_and_gradients(lambda: encoding.content_biases(state(encoding, q, k), blocks))
    alone = biases_and_gradients(
        lambda: [encoding.content_bias(state(encoding, q, k), *block) for block in blocks]
    )
    for a, b in zip(together, alone, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_at_initialisation_cope_attends_as_nope_does():
    # e starts at zeros (as RAM's), so every bias is q . 0.
    torch.manual_seed(0)
    model = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, {"name": "cope"}).eval()
    nope = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, {"name": "none"}).eval()
    shared = {key: value for key, value in model.state_dict().items() if "encoding" not in key}
    nope.load_state_dict(shared)
    tokens = torch.randint(0, 256, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), nope(tokens))


def test_every_layer_has_its_own_position_embedding_shared_by_its_heads():
    model = build_model({"n_layer": 3, "n_head": 4, "d_model": 32}, {"name": "cope", "npos": 9})
    tables = [encoding.position_embedding for encoding in model.layer_encodings]
    assert len({id(table) for table in tables}) == 3
    assert all(table.shape == (9, 8) for table in tables)  # (npos, hs)
    assert sum("position_embedding" in key for key in model.state_dict()) == 3


def test_npos_covers_the_largest_count_in_training_by_default():
    # The last of 64 tokens counting every key with gates of 1 reaches p = 64: positions 0..64,
    # as RAM's block_size + 1.
    cfg = compose_config(["encoding=cope", "train.seq_len=64"])
    assert cfg.encoding.npos == 65


def test_a_non_positive_npos_is_one_error_line():
    with pytest.raises(PosbenchError, match=r"encoding.npos must be positive \(got 0\)") as err:
        build_encoding({"name": "cope", "npos": 0}, 16, 2)
    assert "\n" not in str(err.value)
