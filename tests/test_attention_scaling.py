"""model.attention_scaling: Scalable-Softmax (Nakanishi 2025) and Llama 4's attention temperature
tuning, for any encoding.

Expected factors are written out here with ``math`` from the formulas (SSMax: s * log n, n the
keys a query sees; llama4: log(floor((m + 1) / floor_scale) + 1) * scale + 1 at position m),
and llama4's against HF transformers' own Llama4TextAttention.
"""

from __future__ import annotations

import math

import pytest
import torch

import posbench.model.attention_scaling
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model import Transformer, build_model
from posbench.model.args import ModelArgs
from posbench.model.attention_scaling import (
    Llama4Temperature,
    ScalableSoftmax,
    build_attention_scaling,
)

F64 = torch.float64
B, H, T, HS = 2, 3, 40, 4


def random_queries(seed: int = 0) -> torch.Tensor:
    return torch.randn(B, H, T, HS, dtype=F64, generator=torch.Generator().manual_seed(seed))


def ssmax(s: list[float]) -> ScalableSoftmax:
    scaling = ScalableSoftmax(len(s)).double()
    with torch.no_grad():
        scaling.s.copy_(torch.tensor(s, dtype=F64))
    return scaling


# --- ssmax -------------------------------------------------------------------------------------


def every_query_sees(monkeypatch: pytest.MonkeyPatch, log_n: float) -> None:
    """SSMax's log n_i replaced by ``log_n`` for every query (a test-only override)."""
    monkeypatch.setattr(
        ScalableSoftmax,
        "log_keys_seen",
        lambda self, indices, window: torch.full(indices.shape, log_n),
    )


def test_ssmax_multiplies_each_query_by_s_times_the_log_of_the_keys_it_sees():
    s = [0.3, 1.0, 2.5]
    q = random_queries()
    scaled = ssmax(s)(q, None)
    expected = q.clone()
    for h in range(H):
        for i in range(T):
            expected[:, h, i] *= s[h] * math.log(i + 1)
    torch.testing.assert_close(scaled, expected, rtol=1e-6, atol=1e-12)


def test_ssmax_counts_at_most_the_encodings_window():
    q = random_queries()
    scaled = ssmax([1.0, 1.0, 1.0])(q, 5)
    factors = torch.tensor([math.log(min(i + 1, 5)) for i in range(T)], dtype=F64)
    torch.testing.assert_close(scaled, q * factors[:, None], rtol=1e-6, atol=1e-12)


def test_ssmax_s_starts_at_one_in_every_head():
    assert torch.equal(ScalableSoftmax(4).s.detach(), torch.ones(4))


def test_ssmax_whose_s_log_n_is_one_for_every_query_equals_no_scaling(monkeypatch):
    # log n replaced by 2 for every query, s by 1/2: a factor of exactly 1 everywhere.
    every_query_sees(monkeypatch, log_n=2.0)
    torch.manual_seed(0)
    plain = build_model({"n_layer": 2}, {"name": "alibi"})
    scaled = build_model({"n_layer": 2, "attention_scaling": "ssmax"}, {"name": "alibi"})
    scaled.load_state_dict(plain.state_dict(), strict=False)
    with torch.no_grad():
        for block in scaled.blocks:
            block.attn.scaling.s.fill_(0.5)
    tokens = torch.randint(0, 256, (2, 50))
    assert torch.equal(scaled(tokens), plain(tokens))


def test_ssmax_s_gets_a_gradient_and_learns():
    torch.manual_seed(0)
    model = build_model({"n_layer": 2, "attention_scaling": "ssmax"}, {"name": "none"})
    s = [block.attn.scaling.s for block in model.blocks]
    start = [p.detach().clone() for p in s]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 256, (4, 33))
    for _ in range(3):
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        assert all(p.grad is not None and p.grad.abs().min() > 0 for p in s)
        optimizer.step()
    assert all(not torch.equal(p.detach(), p0) for p, p0 in zip(s, start, strict=True))


def test_ssmax_scales_q_dot_k_and_leaves_the_encodings_bias_unscaled(monkeypatch):
    # With log n = 3 and s = 1 the logits are 3 q.k / sqrt(hs) + ALiBi's bias, written out.
    every_query_sees(monkeypatch, log_n=3.0)
    torch.manual_seed(1)
    model = build_model({"n_layer": 1, "attention_scaling": "ssmax"}, {"name": "alibi"}).double()
    attn, encoding = model.blocks[0].attn, model.encoding
    x = torch.randn(1, 20, model.args.d_model, dtype=F64)
    positions = torch.arange(20)
    C, hs = model.args.d_model, model.args.d_model // model.args.n_head
    q, k, v = (
        t.view(1, 20, model.args.n_head, hs).transpose(1, 2) for t in attn.qkv(x).split(C, 2)
    )
    bias = encoding.score_bias(positions, positions).to(F64)
    scores = 3 * q @ k.transpose(-1, -2) / math.sqrt(hs) + bias
    scores = scores.masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
    expected = attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 20, C))
    torch.testing.assert_close(attn(x, positions, encoding), expected, rtol=1e-10, atol=1e-12)


# --- llama4 ------------------------------------------------------------------------------------


def test_llama4_multiplies_the_query_of_token_i_by_its_temperature():
    floor_scale, scale = 4, 0.3
    q = random_queries()
    scaled = Llama4Temperature(floor_scale, scale)(q, None)
    factors = [math.log(math.floor((i + 1) / floor_scale) + 1) * scale + 1 for i in range(T)]
    expected = q * torch.tensor(factors, dtype=F64)[:, None]
    torch.testing.assert_close(scaled, expected, rtol=1e-6, atol=1e-12)


def test_llama4_is_one_below_floor_scale_minus_one():
    q = random_queries()
    assert torch.equal(Llama4Temperature(8192, 0.1)(q, None), q)


def test_llama4_matches_hf_transformers_llama4_text_attention(monkeypatch):
    modeling = pytest.importorskip("transformers.models.llama4.modeling_llama4")
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

    floor_scale, scale, length = 4, 0.25, 37
    config = Llama4TextConfig(
        hidden_size=H * HS,
        num_attention_heads=H,
        num_key_value_heads=H,
        head_dim=HS,
        num_hidden_layers=1,
        no_rope_layers=[0],  # layer 0 without RoPE: HF tunes the temperature there only
        attn_temperature_tuning=True,
        floor_scale=floor_scale,
        attn_scale=scale,
    )
    config._attn_implementation = "eager"
    hf = modeling.Llama4TextAttention(config, layer_idx=0).double()
    with torch.no_grad():
        hf.q_proj.weight.copy_(torch.eye(H * HS))
    seen = {}

    def record(module, query, key, value, attention_mask, **kwargs):
        seen["query"] = query  # (B, H, T, hs), after the temperature
        return torch.zeros(1, length, H, HS, dtype=F64), None

    monkeypatch.setattr(modeling, "eager_attention_forward", record)
    x = torch.randn(1, length, H * HS, dtype=F64, generator=torch.Generator().manual_seed(2))
    hf(x, position_embeddings=None, attention_mask=None)
    q = x.view(1, length, H, HS).transpose(1, 2)  # what the identity q_proj gives, (B, H, T, hs)
    ours = Llama4Temperature(floor_scale, scale)(q, None)
    torch.testing.assert_close(ours, seen["query"], rtol=1e-6, atol=1e-12)


def test_llama4_defaults_are_hf_llama4s():
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

    hf = Llama4TextConfig()
    args = ModelArgs()
    assert (args.attention_floor_scale, args.attention_scale) == (hf.floor_scale, hf.attn_scale)


# --- with the model's encodings -----------------------------------------------------------------


@pytest.mark.parametrize("scaling", ["ssmax", "llama4"])
def test_scalings_count_tokens_of_the_sequence_not_their_positions(scaling):
    # NoPE reads no position: only a scaling that read them could tell these positions apart.
    # HF's Llama 4 counts arange(T) + past_seen_tokens, never position_ids; SSMax the keys seen.
    torch.manual_seed(0)
    args = {"n_layer": 2, "attention_scaling": scaling, "attention_floor_scale": 4}
    model = build_model(args, {"name": "none"})
    tokens = torch.randint(0, 256, (2, 6))
    # The review's example: tokens 0..5 at these positions, where a factor of positions would be
    # 1.069 to 1.593 and one of token indices is 1, 1, 1, 1.069, 1.069, 1.069.
    random_positions = torch.tensor([[3, 90, 400, 511, 700, 1500], [0, 1, 2, 3, 4, 5000]])
    torch.testing.assert_close(model(tokens, random_positions), model(tokens), rtol=0, atol=0)


def test_copes_gates_and_counts_read_the_query_before_ssmax_scales_it(monkeypatch):
    # The documented semantics: SSMax multiplies q.k alone (here by 3); CoPE's bias, its gates
    # sigmoid(q.k / sqrt(hs)) and q . e[p] included, is computed from the unscaled query and
    # added unscaled. Scaling q before CoPE read it changed the output by up to 3.07 (review,
    # finding 4).
    every_query_sees(monkeypatch, log_n=3.0)
    torch.manual_seed(2)
    args = {"n_layer": 1, "attention_scaling": "ssmax"}
    model = build_model(args, {"name": "cope", "npos": 24}).double()
    attn, encoding = model.blocks[0].attn, model.encoding
    with torch.no_grad():  # e starts at zeros, which would give no bias at all
        encoding.position_embedding.normal_()
    n, C = 20, model.args.d_model
    hs = C // model.args.n_head
    x = torch.randn(1, n, C, dtype=F64)
    positions = torch.arange(n)
    q, k, v = (t.view(1, n, model.args.n_head, hs).transpose(1, 2) for t in attn.qkv(x).split(C, 2))
    state = encoding.content_state(x, q, k, positions)  # of the unscaled query
    bias = encoding.content_bias(state, slice(0, n), slice(0, n))  # (1, H, n, n)
    scores = 3 * q @ k.transpose(-1, -2) / math.sqrt(hs) + bias
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    expected = attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, n, C))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, positions, encoding), expected, rtol=1e-9, atol=1e-11)


# --- the model option ---------------------------------------------------------------------------


def test_no_scaling_is_the_default_and_adds_no_weights():
    old = {"n_layer": 2, "n_head": 4, "d_model": 128, "mlp_ratio": 4, "dropout": 0.0}
    args = ModelArgs(**old)  # as a run saved before the option existed describes its model
    assert args.attention_scaling == "none"
    model = Transformer(args, build_encoding({"name": "rope"}, 128, 4))
    assert not any("scaling" in key for key in model.state_dict())


def test_ssmax_adds_one_s_per_head_and_layer():
    model = build_model({"n_layer": 3, "n_head": 4, "attention_scaling": "ssmax"}, {"name": "none"})
    shapes = {k: v.shape for k, v in model.state_dict().items() if "scaling" in k}
    assert shapes == {f"blocks.{i}.attn.scaling.s": (4,) for i in range(3)}


def test_an_unknown_scaling_is_a_one_line_error_listing_the_choices():
    with pytest.raises(PosbenchError) as error:
        ModelArgs(attention_scaling="bogus")
    assert str(error.value) == (
        "model.attention_scaling must be one of none, ssmax, llama4 (got 'bogus')"
    )


def test_a_non_positive_floor_scale_is_a_one_line_error():
    with pytest.raises(PosbenchError, match=r"model\.attention_floor_scale must be positive"):
        ModelArgs(attention_scaling="llama4", attention_floor_scale=0)


def test_every_scaling_is_built_by_its_name():
    kinds = {
        name: type(build_attention_scaling(name, 4, 8192, 0.1)) for name in ("ssmax", "llama4")
    }
    assert kinds == {"ssmax": ScalableSoftmax, "llama4": Llama4Temperature}
    assert posbench.model.attention_scaling.SCALINGS == ("none", "ssmax", "llama4")
