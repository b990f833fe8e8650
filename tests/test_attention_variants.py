"""The attention variants (model.qk_norm, model.attn_gate, model.attn_sinks, model.attention):
against x-transformers' own Attention with the weights copied across (QK-norm, both gates,
sinks, sigmoid), against stick-breaking's formula in float64 (fla's naive reference needs
triton to import: not on a CPU), on every attention path and encoding, in evaluation blocks,
a cached decode, diagnose's probabilities, both ways, compiled, in bf16, and as one-line
refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from x_transformers.x_transformers import AlibiPositionalBias, Attention, RotaryEmbedding

import posbench.model.attention as attention_paths
import posbench.model.attention_options
from posbench.config import compose_config, validate
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model import build_model
from posbench.model.args import ModelArgs
from posbench.model.attention import (
    AttentionVariant,
    QueryBlockBiases,
    attention_probabilities,
    bidirectional,
    blocks,
    fused,
    of_layer,
    tiles,
)
from posbench.model.attention.variants import sink_attention, written_attention
from posbench.model.model import CausalSelfAttention
from posbench.model.random_positions import PositionSampler

F64 = torch.float64
FP32 = {"rtol": 1e-5, "atol": 1e-5}  # float32 computations against a float32 reference
B, H, T, HS = 2, 4, 21, 8
VARIANTS = {  # model options of each variant
    "qk_norm": {"qk_norm": True},
    "headwise": {"attn_gate": "headwise"},
    "elementwise": {"attn_gate": "elementwise"},
    "sinks": {"attn_sinks": True},
    "sigmoid": {"attention": "sigmoid", "sigmoid_length": 16},
    "stick_breaking": {"attention": "stick_breaking"},
}
WEIGHTING = ["sinks", "sigmoid", "stick_breaking"]  # the variants of the weights themselves


@pytest.fixture(autouse=True)
def seeded():
    """Each test draws the same inputs whichever worker runs it after whichever test."""
    torch.manual_seed(0)


def randomized(module: torch.nn.Module, scale: float = 0.3) -> torch.nn.Module:
    """``module`` with every parameter moved off its initial value (a sink of 0, gains of 1
    and zeros would hide a parameter that is not used)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)
    return module


def outputs_and_gradients(forward, leaves: list[torch.Tensor], out_grad: torch.Tensor):
    out = forward()
    grads = torch.autograd.grad(out, leaves, out_grad, allow_unused=True)
    return [out, *grads]


def assert_all_close(got: list, expected: list, **tolerance) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), **tolerance)


# --- x-transformers' Attention, weights copied ---------------------------------------------


def x_transformers_attention(ours: CausalSelfAttention, options: dict) -> Attention:
    """x-transformers' Attention with ``options``' flags and ``ours``' weights."""
    d_model = ours.qkv.in_features
    heads, hs = ours.n_head, d_model // ours.n_head
    gate = options.get("attn_gate", "none")
    theirs = Attention(
        d_model,
        dim_head=hs,
        heads=heads,
        causal=True,
        qk_norm=options.get("qk_norm", False),
        qk_norm_dim_scale=True,  # learned gains, softmax scale 1/sqrt(hs): ours
        gate_values=gate != "none",
        gate_values_headwise=gate == "headwise",
        head_learned_sink=options.get("attn_sinks", False),
        sigmoid=options.get("attention") == "sigmoid",
    )
    with torch.no_grad():
        for linear, weight in zip(
            (theirs.to_q, theirs.to_k, theirs.to_v), ours.qkv.weight.split(d_model), strict=True
        ):
            linear.weight.copy_(weight)
        theirs.to_out.weight.copy_(ours.proj.weight)
        if ours.gate is not None:
            theirs.to_v_gate.weight.copy_(ours.gate.linear.weight)
        if ours.qk_norm is not None:  # l2-normalised there: gains sqrt(hs) times ours
            theirs.qk_norm_q_scale.copy_(ours.qk_norm.q_gain.view(heads, 1, hs) * hs**0.5)
            theirs.qk_norm_k_scale.copy_(ours.qk_norm.k_gain.view(heads, 1, hs) * hs**0.5)
        if ours.variant.sinks is not None:
            theirs.attend.head_attn_sink.copy_(ours.variant.sinks)
    return theirs


X_CASES = [
    ("qk_norm", "rope"),
    ("qk_norm", "none"),
    ("headwise", "none"),
    ("elementwise", "rope"),
    ("sinks", "none"),
    ("sinks", "rope"),
    ("sinks", "alibi"),
    ("sigmoid", "none"),
    ("sigmoid", "rope"),
    ("sigmoid", "alibi"),
    ("all", "rope"),  # QK-norm, the elementwise gate and sinks at once
]


# x-transformers takes softmax in float32 for float64 inputs (without qk_norm): the layer is
# compared in float64 to float32's precision. Its l2norm has an epsilon of 1e-12 on the norm,
# ours 1e-6 in the mean square (QK_NORM_EPS), set near 0 here to compare the rest.
X_TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}


@pytest.mark.parametrize(("variant", "encoding"), X_CASES)
def test_a_layer_gives_x_transformers_attentions_output_and_gradients(
    variant, encoding, monkeypatch
):
    monkeypatch.setattr(posbench.model.attention_options, "QK_NORM_EPS", 1e-30)
    options = (
        {"qk_norm": True, "attn_gate": "elementwise", "attn_sinks": True}
        if variant == "all"
        else VARIANTS[variant]
    )
    d_model = H * HS
    args = ModelArgs(n_layer=1, n_head=H, d_model=d_model, **options)
    block = randomized(build_model(args.to_dict(), {"name": encoding}).blocks[0].double(), 0.1)
    ours = block.attn
    theirs = x_transformers_attention(ours, options).double()
    enc = build_encoding({"name": encoding}, d_model, H).double()
    positions = torch.arange(T)
    x = torch.randn(B, T, d_model, dtype=F64, requires_grad=True)
    out_grad = torch.randn(B, T, d_model, dtype=F64)
    kwargs = {}
    if encoding == "rope":
        kwargs["rotary_pos_emb"] = RotaryEmbedding(HS).double()(positions)
    bias = torch.zeros(H, T, T, dtype=F64)
    if encoding == "alibi":
        bias = AlibiPositionalBias(heads=H)(T, T).double()  # ours on every key a query sees
    if variant == "sigmoid":
        bias = bias - math.log(16)  # b = -ln L, L = sigmoid_length
    if encoding == "alibi" or variant == "sigmoid":
        kwargs["attn_bias"] = bias
    mine = [x, *ours.parameters()]
    got = outputs_and_gradients(lambda: ours(x, positions, enc), mine, out_grad)
    expected = outputs_and_gradients(lambda: theirs(x, **kwargs), mine[:1], out_grad)
    assert_all_close(got[:2], expected[:2], **X_TOLERANCE)
    # Each parameter's gradient, through the copies: theirs of the same weights.
    grads = dict(zip([id(p) for p in ours.parameters()], got[2:], strict=True))
    q_grad = torch.autograd.grad(theirs(x, **kwargs), theirs.to_q.weight, out_grad)[0]
    torch.testing.assert_close(grads[id(ours.qkv.weight)][:d_model], q_grad, **X_TOLERANCE)
    if ours.variant.sinks is not None:
        sink_grad = torch.autograd.grad(
            theirs(x, **kwargs), theirs.attend.head_attn_sink, out_grad
        )[0]
        torch.testing.assert_close(grads[id(ours.variant.sinks)], sink_grad, **X_TOLERANCE)
    if ours.qk_norm is not None:
        k_scale = torch.autograd.grad(theirs(x, **kwargs), theirs.qk_norm_k_scale, out_grad)[0]
        expected_gain = (k_scale * HS**0.5).flatten()  # d/dg = d/d(scale) * sqrt(hs)
        torch.testing.assert_close(grads[id(ours.qk_norm.k_gain)], expected_gain, **X_TOLERANCE)
    if ours.gate is not None:
        gate_grad = torch.autograd.grad(theirs(x, **kwargs), theirs.to_v_gate.weight, out_grad)[0]
        torch.testing.assert_close(grads[id(ours.gate.linear.weight)], gate_grad, **X_TOLERANCE)


# --- the weights written out, in float64 ---------------------------------------------------


def qkv(length: int = T, dtype: torch.dtype = torch.float32, seed: int = 0) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(B, H, length, HS, generator=generator) * 1.5).to(dtype).requires_grad_()
        for _ in range(3)
    ]


def stick_breaking_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | float = 0.0
) -> torch.Tensor:
    """Tan et al.'s stick-breaking attention entry by entry, in float64: for j < i,
    A_ij = sigmoid(z_ij) prod_{j<l<i} (1 - sigmoid(z_il)), and the stick left,
    prod_{l<i} (1 - sigmoid(z_il)), on v_i (their kernel tests' o + rem * v)."""
    q, k, v = q.double(), k.double(), v.double()
    z = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    beta = torch.sigmoid(z)
    length = q.shape[2]
    rows = []
    for i in range(length):
        out = torch.zeros_like(v[:, :, 0])
        stick = torch.ones_like(beta[:, :, 0, 0])
        for j in reversed(range(i)):  # the nearest key breaks the stick first
            out = out + (stick * beta[:, :, i, j])[..., None] * v[:, :, j]
            stick = stick * (1 - beta[:, :, i, j])
        rows.append(out + stick[..., None] * v[:, :, i])
    return torch.stack(rows, dim=2)


def softmax_reference(q, k, v, bias=0.0, sinks=None, sigmoid_bias=None, causal=True):
    """Softmax with sink logits (a column of s_h, dropped after), or sigmoid(z + b), in float64,
    causal or not."""
    q, k, v = q.double(), k.double(), v.double()
    z = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    length = q.shape[2]
    if causal:
        z = z.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    if sigmoid_bias is not None:
        return torch.sigmoid(z + sigmoid_bias) @ v
    column = sinks.double()[:, None, None].expand(*z.shape[:-1], 1)
    return torch.softmax(torch.cat([z, column], dim=-1), dim=-1)[..., :-1] @ v


def variant_of(name: str, sinks: torch.Tensor | None = None) -> AttentionVariant:
    options = VARIANTS[name]
    variant = AttentionVariant(
        H, options.get("attention", "softmax"), name == "sinks", options.get("sigmoid_length")
    )
    if variant.sinks is not None and sinks is not None:
        with torch.no_grad():
            variant.sinks.copy_(sinks)
    return variant


def reference_of(name: str, q, k, v, variant: AttentionVariant, bias=0.0) -> torch.Tensor:
    if name == "stick_breaking":
        return stick_breaking_reference(q, k, v, bias)
    if name == "sigmoid":
        return softmax_reference(q, k, v, bias, sigmoid_bias=variant.sigmoid_bias)
    return softmax_reference(q, k, v, bias, sinks=variant.sinks)


def use_query_blocks(size: int, monkeypatch) -> None:
    monkeypatch.setattr(blocks, "QUERY_BLOCK", size)


@pytest.mark.parametrize("encoding", ["none", "alibi"])
@pytest.mark.parametrize("name", WEIGHTING)
@pytest.mark.parametrize("block", [64, 8], ids=["one-block", "blocks-of-8"])
def test_attention_gives_the_formulas_output_and_gradients(name, encoding, block, monkeypatch):
    use_query_blocks(block, monkeypatch)
    variant = variant_of(name, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))
    enc = build_encoding({"name": encoding}, H * HS, H)
    q, k, v = qkv()
    positions = torch.arange(T)
    bias = enc.score_bias(positions, positions) if encoding == "alibi" else 0.0
    leaves = [q, k, v, *variant.parameters()]
    out_grad = torch.randn(B, H, T, HS)

    def ours():
        return attention_paths.causal_attention(q, k, v, positions, enc, variant=variant)

    got = outputs_and_gradients(ours, leaves, out_grad)
    expected = outputs_and_gradients(
        lambda: reference_of(name, q, k, v, variant, bias), leaves, out_grad.double()
    )
    assert_all_close(got, expected, **FP32)


@pytest.mark.parametrize("devices", [None, frozenset()], ids=["lse", "sink-key"])
def test_sink_attention_on_the_fused_kernel_gives_the_formulas_output_and_gradients(
    devices, monkeypatch
):
    if devices is not None:  # a device without the CPU kernel's log-sum-exp: the sink as a key
        monkeypatch.setattr(fused, "LOG_SUM_EXP_DEVICES", devices)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    q, k, v = qkv(seed=4)
    out_grad = torch.randn(B, H, T, HS)
    got = outputs_and_gradients(lambda: sink_attention(q, k, v, sinks), [q, k, v, sinks], out_grad)
    expected = outputs_and_gradients(
        lambda: softmax_reference(q, k, v, sinks=sinks), [q, k, v, sinks], out_grad.double()
    )
    assert_all_close(got, expected, **FP32)


@pytest.mark.parametrize("encoding", ["none", "alibi"])
def test_sinks_give_hf_gpt_oss_eager_attentions_output_and_gradients(encoding):
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    variant = variant_of("sinks", sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))
    enc = build_encoding({"name": encoding}, H * HS, H)
    q, k, v = qkv(seed=8)
    positions = torch.arange(T)
    mask = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf)
    if encoding == "alibi":
        mask = mask + enc.score_bias(positions, positions)
    out_grad = torch.randn(B, H, T, HS)
    leaves = [q, k, v, variant.sinks]

    def ours():
        return attention_paths.causal_attention(q, k, v, positions, enc, variant=variant)

    def theirs():  # in float64; (B, T, H, hs) out, as HF lays it
        module = SimpleNamespace(
            sinks=variant.sinks.double(), num_key_value_groups=1, training=False
        )
        qd, kd, vd = (t.double() for t in (q, k, v))
        out, _ = eager_attention_forward(module, qd, kd, vd, mask.double(), HS**-0.5)
        return out.transpose(1, 2)

    got = outputs_and_gradients(ours, leaves, out_grad)
    expected = outputs_and_gradients(theirs, leaves, out_grad.double())
    assert_all_close(got, expected, **FP32)


@pytest.mark.parametrize("name", WEIGHTING)
def test_stick_breaking_and_every_variant_in_float64_are_exact(name):
    # float64 inputs are computed in float64: the formula to rounding, on the written path.
    variant = variant_of(name, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))
    q, k, v = qkv(dtype=F64, seed=5)
    enc = build_encoding({"name": "none"}, H * HS, H)
    positions = torch.arange(T)
    got = written_attention(q, k, v, positions, enc, 0.0, None, None, variant.double())
    torch.testing.assert_close(got, reference_of(name, q, k, v, variant), rtol=0, atol=1e-12)


def test_evaluation_stops_at_the_tile_where_every_querys_stick_is_spent(monkeypatch):
    # Logits of 8: each key keeps 1 - sigmoid(8) = 3.4e-4 of the stick, so 14 keys spend it
    # past float32's smallest subnormal. Blocks of 8 queries over tiles of 4 keys: 72 tiles in
    # all, of which each block from the third on needs its nearest 6 or so.
    use_query_blocks(8, monkeypatch)
    monkeypatch.setattr(tiles, "STICK_TILE", 4)
    computed = []
    softplus = F.softplus
    monkeypatch.setattr(F, "softplus", lambda x: computed.append(x.shape[-1]) or softplus(x))
    variant = variant_of("stick_breaking")
    q = torch.ones(1, 1, 64, HS) * 8**0.5 * HS**0.25
    k = torch.ones(1, 1, 64, HS) * 8**0.5 / HS**0.25
    v = torch.randn(1, 1, 64, HS)
    enc = build_encoding({"name": "none"}, HS, 1)
    with torch.no_grad():
        y = written_attention(q, k, v, torch.arange(64), enc, 0.0, None, None, variant)
        p = attention_probabilities(q, k, torch.arange(64), enc, None, 0, 64, variant=variant)
    assert 0 < len(computed) < 50
    torch.testing.assert_close(y, p @ v, **FP32)


def test_stick_breaking_weights_of_a_query_sum_to_one_and_the_first_token_keeps_its_value():
    variant = variant_of("stick_breaking")
    q, k, v = qkv(seed=6)
    enc = build_encoding({"name": "none"}, H * HS, H)
    with torch.no_grad():
        p = attention_probabilities(q, k, torch.arange(T), enc, None, 0, T, variant=variant)
        y = attention_paths.causal_attention(q, k, v, torch.arange(T), enc, variant=variant)
    torch.testing.assert_close(p.sum(-1), torch.ones(B, H, T))
    torch.testing.assert_close(y[:, :, 0], v[:, :, 0].detach())


# --- every encoding, every path: what attention attends with is what diagnose writes out -----

ENCODINGS = [
    {"name": "none"},
    {"name": "rope"},
    {"name": "pope", "phase_init": "uniform"},  # q and k twice as wide as v
    {"name": "alibi"},
    {"name": "t5"},
    {"name": "fire"},
    {"name": "fox"},
    {"name": "cope", "npos": 9},
    {"name": "hybrid", "layers": ["rope", "none"], "window": 5},
]


def encoding_id(options: dict) -> str:
    return options["name"] + ("-window" if "window" in options else "")


@pytest.mark.parametrize("positions_kind", ["consecutive", "random"])
@pytest.mark.parametrize("encoding", ENCODINGS, ids=encoding_id)
@pytest.mark.parametrize("name", WEIGHTING)
def test_attention_in_blocks_equals_the_probabilities_written_out(
    name, encoding, positions_kind, monkeypatch
):
    """In evaluation (blocks of 8 queries, tiles of 5 keys, 3 for stick-breaking) and in
    training (gradients): the output is diagnose's probabilities (attention_probabilities,
    which a cached decode's steps use too) times v."""
    use_query_blocks(8, monkeypatch)
    monkeypatch.setattr(tiles, "KEY_TILE", 5)
    monkeypatch.setattr(tiles, "STICK_TILE", 3)
    model = randomized(
        build_model({"n_layer": 1, "n_head": H, "d_model": H * HS, **VARIANTS[name]}, encoding), 0.5
    )
    attn, enc = model.blocks[0].attn, model.layer_encodings[0]
    x = torch.randn(B, T, H * HS)
    positions, distances = torch.arange(T), None
    if positions_kind == "random":
        mode = "distances" if encoding["name"] == "alibi" else "positions"
        draw = PositionSampler(64, n_layer=1, mode=mode).draw(
            torch.tensor([T, T]), T, torch.Generator().manual_seed(2)
        )
        distances = of_layer(draw.distances, 0)
        if draw.positions is not None:  # else the distances alone are randomized
            positions = of_layer(draw.positions, 0)
    q, k, v, content = attn.queries_keys_values(x, positions, enc)
    biases = QueryBlockBiases(enc, keep_elements=0, distances=distances)
    p = attention_probabilities(q, k, positions, enc, content, 0, T, distances, attn.variant)
    expected = p @ v
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            y = attention_paths.causal_attention(
                q, k, v, positions, enc, 0.0, biases, content, attn.variant
            )
        torch.testing.assert_close(y, expected, **FP32)


@pytest.mark.parametrize("name", WEIGHTING)
def test_a_cached_decode_gives_the_recomputed_logits(name):
    model = randomized(
        build_model(
            {"n_layer": 2, "n_head": 2, "d_model": 16, **VARIANTS[name]}, {"name": "rope"}
        ).eval(),
        0.1,
    )
    from posbench.model.kv_cache import DecodeCache

    tokens = torch.randint(256, (2, 12), generator=torch.Generator().manual_seed(1))
    cache = DecodeCache(torch.arange(12), 2)
    with torch.inference_mode():
        model(tokens[:, :5], cache=cache)
        steps = torch.stack(
            [model(tokens[:, t : t + 1], cache=cache)[:, -1] for t in range(5, 12)], 1
        )
        recomputed = torch.stack([model(tokens[:, : t + 1])[:, -1] for t in range(5, 12)], 1)
    torch.testing.assert_close(steps, recomputed, rtol=0, atol=1e-5)


# --- the model: defaults, compile, bf16, both ways ------------------------------------------


def test_the_defaults_add_no_weights_and_attend_as_before():
    torch.manual_seed(0)
    model = build_model({"n_layer": 2}, {"name": "rope"})
    assert not any("variant" in n or "gate" in n or "qk_norm" in n for n in model.state_dict())
    q, k, v = qkv()
    enc = build_encoding({"name": "alibi"}, H * HS, H)
    plain = AttentionVariant(H)
    with torch.no_grad():
        for positions in (torch.arange(T),):
            y = attention_paths.causal_attention(q, k, v, positions, enc)
            same = attention_paths.causal_attention(q, k, v, positions, enc, variant=plain)
    assert torch.equal(y, same)


def test_each_option_adds_its_weights():
    def names(**options) -> set[str]:
        return set(build_model({"n_layer": 1, **options}, {"name": "none"}).state_dict())

    base = names()
    assert names(qk_norm=True) - base == {
        "blocks.0.attn.qk_norm.q_gain",
        "blocks.0.attn.qk_norm.k_gain",
    }
    assert names(attn_gate="headwise") - base == {"blocks.0.attn.gate.linear.weight"}
    assert names(attn_sinks=True) - base == {"blocks.0.attn.variant.sinks"}
    assert names(attention="stick_breaking") == base


COMPILED = {  # every variant in three compilations
    "qk_norm-elementwise-sinks": {
        **VARIANTS["qk_norm"],
        **VARIANTS["elementwise"],
        **VARIANTS["sinks"],
    },
    "headwise-sigmoid": {**VARIANTS["headwise"], **VARIANTS["sigmoid"]},
    "stick_breaking": VARIANTS["stick_breaking"],
}


@pytest.mark.parametrize("options", list(COMPILED.values()), ids=list(COMPILED))
def test_a_compiled_training_forward_and_its_gradients_equal_eagers(options):
    torch.manual_seed(0)
    model = randomized(
        build_model(
            {"n_layer": 2, "n_head": 2, "d_model": 16, **options}, {"name": "alibi"}
        ).train(),
        0.1,
    )
    tokens = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(1))

    def logits_and_gradients(forward) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits = forward(tokens)
        logits.square().mean().backward()
        return [logits, *(p.grad for p in model.parameters() if p.grad is not None)]

    eager = logits_and_gradients(model)
    compiled = logits_and_gradients(torch.compile(model, backend="aot_eager"))
    assert_all_close(compiled, eager, rtol=1e-5, atol=1e-6)


BF16_CASES = [  # every variant, on the fused sink path (none) and the written one (alibi)
    ("qk_norm-elementwise-sinks", "none"),
    ("headwise-sigmoid", "alibi"),
    ("stick_breaking", "alibi"),
    ("qk_norm-elementwise-sinks", "alibi"),
]


@pytest.mark.parametrize(("name", "encoding"), BF16_CASES)
def test_bf16_autocast_follows_float32(name, encoding):
    model = randomized(
        build_model(
            {"n_layer": 2, "n_head": 2, "d_model": 32, **COMPILED[name]}, {"name": encoding}
        ),
        0.1,
    )
    tokens = torch.randint(256, (2, 24), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(256, (2, 24), generator=torch.Generator().manual_seed(2))

    def loss_and_gradients() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss = model(tokens, targets=targets) / targets.numel()
        loss.backward()
        return [loss, *(p.grad for p in model.parameters())]

    full = loss_and_gradients()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = loss_and_gradients()
    torch.testing.assert_close(half[0], full[0], rtol=1e-2, atol=0)
    for a, b in zip(half[1:], full[1:], strict=True):  # each gradient within bf16's rounding
        assert (a - b).norm() <= 0.05 * b.norm() + 1e-6


@pytest.mark.parametrize("encoding", ["none", "alibi"])
@pytest.mark.parametrize("name", ["sinks", "sigmoid"])
def test_attention_both_ways_gives_the_formulas_output_and_gradients(name, encoding, monkeypatch):
    use_query_blocks(8, monkeypatch)
    variant = variant_of(name, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0]))
    enc = build_encoding({"name": encoding}, H * HS, H)
    q, k, v = qkv(seed=7)
    positions = torch.arange(T)
    bias = 0.0
    if encoding == "alibi":
        distance = positions[:, None] - positions[None, :]
        table = enc.two_sided_bias(torch.arange(-T + 1, T))
        bias = table[:, distance + T - 1]
    leaves = [q, k, v, *variant.parameters()]
    out_grad = torch.randn(B, H, T, HS)

    def ours():
        return bidirectional.bidirectional_attention(q, k, v, positions, enc, variant=variant)

    def reference():
        if name == "sigmoid":
            return softmax_reference(q, k, v, bias, sigmoid_bias=variant.sigmoid_bias, causal=False)
        return softmax_reference(q, k, v, bias, sinks=variant.sinks, causal=False)

    got = outputs_and_gradients(ours, leaves, out_grad)
    expected = outputs_and_gradients(reference, leaves, out_grad.double())
    assert_all_close(got, expected, **FP32)


# --- the options from the CLI: one-line errors ------------------------------------------------


def error_of(overrides: list[str]) -> str:
    with pytest.raises(PosbenchError) as err:
        cfg = compose_config(overrides)
        validate(cfg)
        ModelArgs(**cfg.model)
    return str(err.value)


def test_sigmoid_length_is_the_training_length_from_the_cli():
    cfg = compose_config(["model.attention=sigmoid", "train.seq_len=64"])
    assert ModelArgs(**cfg.model).sigmoid_length == 64


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model.attention=bogus"],
            "model.attention must be one of softmax, sigmoid, stick_breaking (got 'bogus')",
        ),
        (
            ["model.attn_gate=both"],
            "model.attn_gate must be one of none, headwise, elementwise (got 'both')",
        ),
        (
            ["model.attention=sigmoid", "model.attn_sinks=true"],
            "model.attn_sinks adds a logit to the softmax's denominator; model.attention=sigmoid "
            "has none: use model.attention=softmax or model.attn_sinks=false",
        ),
        (
            ["model.attention=sigmoid", "model.sigmoid_length=0"],
            "model.attention=sigmoid adds b = -ln(model.sigmoid_length) to every logit: "
            "model.sigmoid_length must be a positive length (got 0)",
        ),
        (
            [
                "model.attention=stick_breaking",
                "model.causal=false",
                "data=reverse_string",
                "data.answer_mode=placeholders",
                "encoding=none",
            ],
            "model.attention=stick_breaking breaks the stick from the query back over the keys "
            "before it; model.causal=false needs model.attention=softmax or sigmoid",
        ),
    ],
)
def test_a_mistaken_option_is_one_line(overrides, message):
    assert error_of(overrides) == message


# --- end to end: train, crash and resume, posbench eval, posbench diagnose ------------------

RUNS = {
    "qk_norm-gate-sinks": [
        "encoding=rope",
        "model.qk_norm=true",
        "model.attn_gate=headwise",
        "model.attn_sinks=true",
    ],
    "sigmoid": ["encoding=alibi", "model.attention=sigmoid"],
    "stick_breaking": ["encoding=none", "model.attention=stick_breaking"],
}


@pytest.mark.slow
@pytest.mark.parametrize("options", list(RUNS.values()), ids=list(RUNS))
def test_a_run_resumes_bit_for_bit_and_eval_and_diagnose_read_it(
    options, cache_dir, tmp_path, monkeypatch
):
    from test_checkpoint import SHORT, assert_same_run, at_batch, crash, resume_later

    from posbench.commands.eval import run_eval
    from posbench.evaluation.diagnose import diagnose_run
    from posbench.training.train import train

    overrides = [*SHORT, f"data.cache_dir={cache_dir}", *options]
    results = train(compose_config(overrides), tmp_path / "straight")
    at_batch(monkeypatch, 13, crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(overrides), tmp_path / "run")
    monkeypatch.undo()
    resume_later(overrides, tmp_path / "run")
    assert_same_run(tmp_path / "run", tmp_path / "straight")
    trained = [r["ppl"] for r in results["eval"] if r["length"] == 16]
    run_eval(["--run", str(tmp_path / "run"), "--length", "16", "--threads", "1"])
    run_eval(["--run", str(tmp_path / "run"), "--length", "32", "--threads", "1"])
    records = json.loads((tmp_path / "run" / "results.json").read_text())["eval"]
    assert [r["ppl"] for r in records if r["length"] == 16] == pytest.approx(trained, rel=1e-6)
    assert any(r["length"] == 32 and math.isfinite(r["ppl"]) for r in records)
    result, _ = diagnose_run(tmp_path / "run", 32, n_windows=1)
    entropy = torch.tensor(result["entropy"])
    assert torch.isfinite(entropy).all() and (entropy > 0).any()
