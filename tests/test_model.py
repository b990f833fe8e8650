"""Specification of the decoder: its shape contract, how it uses its encoding's three hooks,
causality and its behaviour at lengths far beyond training, for every registered encoding.

Two encodings are defined here, for tests only, whose expected outputs are easy to write out:
an ALiBi-shaped score bias and a position-dependent scaling of queries and keys.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import pytest
import torch
from conftest import chunked_calls
from hypothesis import given, settings
from hypothesis import strategies as st

import posbench.config
import posbench.model
import posbench.model.loss
from posbench.encodings import EncodingConfig, PositionalEncoding, build_encoding, encoding_names
from posbench.errors import PosbenchError
from posbench.evaluation.memory import inference_memory_bytes
from posbench.model.args import ModelArgs
from posbench.model.model import CausalSelfAttention, Transformer

F64 = torch.float64
SMALL = ModelArgs(n_layer=2, n_head=2, d_model=16)


@dataclass
class ForTestConfig(EncodingConfig):
    name: str = "for-test"


class DistanceBias(PositionalEncoding):
    """ALiBi-shaped (Press et al. 2022): head h adds -slope_h * |i - j| to the logit of (i, j)."""

    Config = ForTestConfig

    def __init__(self, config: EncodingConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        self.register_buffer("slopes", torch.linspace(1.0, 0.25, n_head))

    def score_bias(self, query_positions, key_positions, out=None):
        distance = (query_positions[:, None] - key_positions[None, :]).abs()  # (Tq, Tk)
        return -self.slopes[:, None, None] * distance  # (H, Tq, Tk)


class PairBias(DistanceBias):
    """A bias of both positions, not of their distance alone: slope_h * sin(i / 7) * cos(j / 5)."""

    def score_bias(self, query_positions, key_positions, out=None):
        pairs = torch.sin(query_positions / 7)[:, None] * torch.cos(key_positions / 5)[None, :]
        return self.slopes[:, None, None] * pairs  # (H, Tq, Tk)


class PositionScaledQK(PositionalEncoding):
    """Scales the query or key at position t by 1 + t / 4, as a stand-in for a rotation."""

    Config = ForTestConfig

    def rotate(self, x, positions):
        return x * (1 + positions[:, None] / 4)


def make_encoding(name: str, args: ModelArgs) -> PositionalEncoding:
    if name == "distance-bias":
        return DistanceBias(ForTestConfig(), args.d_model, args.n_head)
    if name == "pair-bias":
        return PairBias(ForTestConfig(), args.d_model, args.n_head)
    return build_encoding({"name": name}, args.d_model, args.n_head)


# Every registered encoding, plus a score bias simple enough to write out in the tests.
ENCODINGS_UNDER_TEST = [*encoding_names(), "distance-bias"]


@functools.cache
def small_model(name: str) -> Transformer:
    """A small model whose weights are large enough that a leak from the future would move the
    logits far above the test tolerance (at GPT-2's std 0.02 a leak can stay below 1e-5)."""
    torch.manual_seed(0)
    model = Transformer(SMALL, make_encoding(name, SMALL)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.3)
    return model


FAR = 4096  # far beyond any training length of these tests
BOUNDED = [name for name in ENCODINGS_UNDER_TEST if small_model(name).max_length is not None]
REACHING_FAR = [n for n in ENCODINGS_UNDER_TEST if (small_model(n).max_length or FAR) >= FAR]


def reference_attention(
    attention: CausalSelfAttention,
    x: torch.Tensor,
    bias: torch.Tensor | float = 0.0,
    qk_scale: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """softmax(QK^T / sqrt(hs) + bias + causal mask) V, then the output projection, written out.

    ``qk_scale`` (T, 1) multiplies queries and keys (not values) before their product."""
    B, T, C = x.shape
    H = attention.n_head
    hs = C // H
    q, k, v = (x @ attention.qkv.weight.T).split(C, dim=-1)
    q, k, v = (t.reshape(B, T, H, hs).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
    scores = (q * qk_scale) @ (k * qk_scale).transpose(-1, -2) / math.sqrt(hs) + bias
    rows, cols = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    scores = scores.masked_fill(cols > rows, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, hs)
    return y.transpose(1, 2).reshape(B, T, C) @ attention.proj.weight.T


def random_attention(seed: int) -> CausalSelfAttention:
    torch.manual_seed(seed)
    attention = CausalSelfAttention(SMALL.d_model, SMALL.n_head, dropout=0.0).double()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(std=0.5)
    return attention


# --- shape contract ---------------------------------------------------------------------------


def test_model_maps_tokens_to_one_logit_per_byte_value():
    model = Transformer(SMALL, make_encoding("none", SMALL))
    logits = model(torch.randint(0, 256, (3, 11)))
    assert logits.shape == (3, 11, 256)


def test_output_layer_shares_its_weight_with_the_token_embedding():
    model = Transformer(SMALL, make_encoding("none", SMALL))
    assert model.lm_head.weight is model.token_embedding.weight


# --- the training loss ---------------------------------------------------------------------------


def loss_and_gradients(
    model: Transformer, tokens: torch.Tensor, targets: torch.Tensor, bf16: bool = False
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's summed loss given ``targets`` and the gradient of every parameter."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(tokens, targets=targets)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def loss_of_logits(
    model: Transformer, tokens: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The same from the logits, by F.cross_entropy: the definition the loss path must meet."""
    model.zero_grad(set_to_none=True)
    logits = model(tokens)  # (B, T, vocab)
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), reduction="sum"
    )
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def scored_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (3, 17) and their targets, a third of them -100 (unscored, as a task's prompt)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (3, 17), generator=generator)
    targets = torch.randint(0, vocab, (3, 17), generator=generator)
    targets[:, :6] = -100
    return tokens, targets


def float64_model_and_batch(
    monkeypatch, chunked: bool, encoding: str
) -> tuple[list[int], Transformer, torch.Tensor, torch.Tensor]:
    """A float64 model (2 layers of 16, vocabulary 300) with ``encoding``, a scored batch, and
    the calls of F.linear_cross_entropy from now on; its NLL by the chunked way (``chunked``)
    or the logits way (CUDA's, and any torch without linear_cross_entropy)."""
    calls = chunked_calls(monkeypatch)
    if not chunked:
        monkeypatch.setattr(posbench.model.loss, "CHUNKED_LOSS_DEVICES", frozenset())
    torch.manual_seed(0)
    args = ModelArgs(n_layer=2, n_head=2, d_model=16, vocab_size=300)
    model = Transformer(args, make_encoding(encoding, args)).double()
    tokens, targets = scored_batch(300)
    return calls, model, tokens, targets


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "reference"])
def test_loss_given_targets_is_the_summed_cross_entropy_of_the_logits(chunked, monkeypatch):
    # Both ways of computing it: F.linear_cross_entropy's chunked path (a CPU's) and logits
    # then cross-entropy.
    calls, model, tokens, targets = float64_model_and_batch(monkeypatch, chunked, "alibi")
    loss, gradients = loss_and_gradients(model, tokens, targets)
    assert calls == ([3 * 17] if chunked else [])
    expected, expected_gradients = loss_of_logits(model, tokens, targets)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expected)
    for gradient, expected_gradient in zip(gradients, expected_gradients, strict=True):
        torch.testing.assert_close(gradient, expected_gradient)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "reference"])
def test_nll_per_target_is_the_cross_entropy_of_the_logits_unreduced(chunked, monkeypatch):
    # reduction="none", evaluation's: one NLL per target (B, T), 0 where a target is -100,
    # by either way, without gradients as evaluation runs it.
    calls, model, tokens, targets = float64_model_and_batch(monkeypatch, chunked, "t5")
    model.eval()
    with torch.inference_mode():
        nll = model(tokens, targets=targets, reduction="none")
        logits = model(tokens)  # (B, T, vocab)
    assert calls == ([3 * 17] if chunked else [])
    expected = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    assert nll.shape == targets.shape and nll.dtype == torch.float64
    torch.testing.assert_close(nll, expected)
    assert (nll[:, :6] == 0).all()


def test_memory_estimate_counts_the_logits_whole_only_where_they_are_formed_whole(monkeypatch):
    # At a vocabulary of 8,192 a 4,096-token window's logits are 2^25 elements: the chunked
    # way holds a chunk of them (at most as many elements as the hidden states), the logits way
    # three (B, T, vocab) tensors; the estimate's difference is those (V - C) * 3 per token.
    args = ModelArgs(n_layer=1, n_head=2, d_model=64, vocab_size=8192)
    model = Transformer(args, make_encoding("none", args))
    chunked = inference_memory_bytes(model, 1, 4096)
    monkeypatch.setattr(posbench.model.loss, "CHUNKED_LOSS_DEVICES", frozenset())
    whole = inference_memory_bytes(model, 1, 4096)
    assert whole - chunked == 4096 * 3 * (8192 - 64) * 4


def test_loss_without_torchs_linear_cross_entropy_takes_the_reference_path(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(SMALL, make_encoding("rope", SMALL))
    tokens, targets = scored_batch(256)
    calls = chunked_calls(monkeypatch)
    chunked = model(tokens, targets=targets)
    assert calls == [3 * 17]
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy")  # torch before 2.13
    torch.testing.assert_close(model(tokens, targets=targets), chunked)


@pytest.mark.parametrize(
    "d_model, vocab, min_elements",
    [(64, 256, 0), (16, 16, 0), (16, 256, 51 * 256 + 1)],
    ids=["fewer-rows", "fewer-classes", "small-logits"],
)
def test_loss_takes_the_logits_way_where_chunks_do_not_pay(
    d_model, vocab, min_elements, monkeypatch
):
    # 51 rows against a width of 64, a vocabulary no larger than the width, or logits with
    # fewer elements than CHUNKED_LOSS_MIN_ELEMENTS.
    args = ModelArgs(n_layer=1, n_head=2, d_model=d_model, vocab_size=vocab)
    model = Transformer(args, make_encoding("none", args))
    tokens, targets = scored_batch(vocab)
    calls = chunked_calls(monkeypatch, min_elements)
    loss = model(tokens, targets=targets)
    assert calls == []
    torch.testing.assert_close(loss, loss_of_logits(model, tokens, targets)[0])


@pytest.mark.skipif(
    not torch.backends.cpu.get_cpu_capability().startswith("AVX512"),
    reason="bf16 matmuls are emulated (and slow) without AVX-512",
)
def test_loss_under_bf16_autocast_is_as_close_to_float32_as_the_logits_way(monkeypatch):
    # The chunked loss runs in float32 under autocast, where the logits way rounds them to
    # bf16: its gradients are as close to float32's as that way's (each within bf16's 1 %,
    # and over all parameters together no farther).
    torch.manual_seed(0)
    args = ModelArgs(n_layer=2, n_head=4, d_model=32, vocab_size=1000)
    model = Transformer(args, make_encoding("rope", args))
    tokens, targets = scored_batch(1000)
    calls = chunked_calls(monkeypatch)
    exact, exact_gradients = loss_and_gradients(model, tokens, targets)
    loss, gradients = loss_and_gradients(model, tokens, targets, bf16=True)
    assert calls == [3 * 17, 3 * 17]
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens).float()
        reference = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), reduction="sum"
        )
    reference.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, exact, rtol=1e-3, atol=0)
    errors = [(mine - truth).norm() for mine, truth in zip(gradients, exact_gradients, strict=True)]
    for error, truth in zip(errors, exact_gradients, strict=True):
        assert error <= 0.01 * truth.norm()
    pairs = zip(model.parameters(), exact_gradients, strict=True)
    theirs = [(p.grad - truth).norm() for p, truth in pairs]
    assert torch.stack(errors).norm() <= torch.stack(theirs).norm()


def test_num_parameters_counts_the_tied_embedding_once():
    model = Transformer(SMALL, make_encoding("none", SMALL))
    d, layers = SMALL.d_model, SMALL.n_layer
    embedding = 256 * d
    per_layer = 2 * (2 * d) + 3 * d * d + d * d + 2 * (4 * d * d)  # 2 LayerNorms, qkv, proj, MLP
    assert model.num_parameters() == embedding + layers * per_layer + 2 * d


def test_n_head_that_does_not_divide_d_model_is_refused_naming_both():
    with pytest.raises(PosbenchError, match=r"model\.n_head") as info:
        args = ModelArgs(n_layer=1, n_head=3, d_model=16)
        Transformer(args, make_encoding("none", args))
    assert "model.d_model" in str(info.value)


def test_model_args_round_trip_through_a_dict():
    assert ModelArgs(**SMALL.to_dict()) == SMALL


def test_post_ln_blocks_normalise_after_each_residual_sum_and_skip_the_final_norm():
    """Ruoss et al.'s encoder block (models/transformer.py): h = ln(h + attn(h)), then
    h = ln(h + mlp(h)), and no layer norm after the last block."""
    args = ModelArgs(n_layer=1, n_head=2, d_model=16, norm_position="post")
    model = Transformer(args, make_encoding("none", args)).double().eval()
    tokens = torch.randint(0, 256, (2, 5))
    block = model.blocks[0]
    x = model.token_embedding(tokens)  # (B, T, C)
    positions = torch.arange(5)
    x = block.ln_attn(x + block.attn(x, positions, model.encoding))
    x = block.ln_mlp(x + block.mlp(x))
    torch.testing.assert_close(model(tokens), model.lm_head(x))
    assert isinstance(model.ln_final, torch.nn.Identity)


def test_relu_replaces_gelu_in_the_mlp():
    args = ModelArgs(n_layer=1, n_head=2, d_model=16, activation="relu")
    mlp = Transformer(args, make_encoding("none", args)).blocks[0].mlp
    x = torch.randn(3, 16)
    torch.testing.assert_close(mlp(x), mlp.down(torch.relu(mlp.up(x))))


def test_runs_saved_before_the_norm_and_activation_options_load_as_pre_ln_gelu():
    old = {"n_layer": 2, "n_head": 4, "d_model": 128, "mlp_ratio": 4, "dropout": 0.0}
    args = ModelArgs(**old)
    assert (args.norm_position, args.activation) == ("pre", "gelu")


@pytest.mark.parametrize(
    ("key", "choices"), [("norm_position", "pre, post"), ("activation", "gelu, relu")]
)
def test_an_unknown_norm_position_or_activation_is_a_one_line_error_listing_the_choices(
    key, choices
):
    with pytest.raises(PosbenchError) as error:
        ModelArgs(**{key: "bogus"})
    assert str(error.value) == f"model.{key} must be one of {choices} (got 'bogus')"


# --- how the model uses its encoding ----------------------------------------------------------


def test_model_gives_its_encoding_positions_zero_to_length_minus_one():
    seen = []

    class Recording(PositionalEncoding):
        Config = ForTestConfig

        def embed(self, x, positions):
            seen.append(positions)
            return x

        def rotate(self, x, positions):
            seen.append(positions)
            return x

        def score_bias(self, query_positions, key_positions, out=None):
            seen.extend((query_positions, key_positions))
            return None

    Transformer(SMALL, Recording(ForTestConfig(), SMALL.d_model, SMALL.n_head))(
        torch.zeros(2, 7, dtype=torch.long)
    )
    # embed once, then per layer: rotate queries, rotate keys, score_bias (queries, keys).
    assert len(seen) == 1 + SMALL.n_layer * 4
    for positions in seen:
        assert torch.equal(positions, torch.arange(7))


def test_attention_adds_the_encodings_score_bias_to_the_logits():
    attention = random_attention(seed=1)
    encoding = DistanceBias(ForTestConfig(), SMALL.d_model, SMALL.n_head).double()
    x = torch.randn(2, 9, SMALL.d_model, dtype=F64)
    T = x.shape[1]
    slopes = torch.tensor([1.0, 0.25], dtype=F64)[:, None, None]  # linspace(1, 0.25, 2)
    distance = torch.tensor([[abs(i - j) for j in range(T)] for i in range(T)], dtype=F64)
    out = attention(x, torch.arange(T), encoding)
    expected = reference_attention(attention, x, bias=-slopes * distance)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_attention_rotates_queries_and_keys_but_not_values():
    attention = random_attention(seed=2)
    encoding = PositionScaledQK(ForTestConfig(), SMALL.d_model, SMALL.n_head)
    x = torch.randn(2, 9, SMALL.d_model, dtype=F64)
    positions = torch.arange(9)
    out = attention(x, positions, encoding)
    expected = reference_attention(attention, x, qk_scale=(1 + positions[:, None] / 4).double())
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


# --- causality and length ---------------------------------------------------------------------


@st.composite
def sequence_and_future_edit(draw) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Tokens (1, T), the same tokens with every position from ``cut`` on changed, and cut."""
    length = draw(st.integers(2, 48))
    cut = draw(st.integers(1, length - 1))
    tokens = draw(st.lists(st.integers(0, 255), min_size=length, max_size=length))
    shifts = draw(st.lists(st.integers(1, 255), min_size=length - cut, max_size=length - cut))
    edited = tokens[:cut] + [(t + s) % 256 for t, s in zip(tokens[cut:], shifts, strict=True)]
    return torch.tensor([tokens]), torch.tensor([edited]), cut


@pytest.mark.parametrize("name", ENCODINGS_UNDER_TEST)
@settings(max_examples=25, deadline=None)
@given(case=sequence_and_future_edit())
def test_changing_future_tokens_leaves_earlier_logits_unchanged(name, case):
    tokens, edited, cut = case
    model = small_model(name)
    with torch.no_grad():
        before, after = model(tokens)[:, :cut], model(edited)[:, :cut]
    # Exactly: a later token may not reach an earlier logit, not even through rounding.
    torch.testing.assert_close(after, before, rtol=0, atol=0)


@pytest.mark.parametrize("name", REACHING_FAR)
def test_models_run_far_beyond_any_training_length(name):
    # 2 heads x 4096^2 scores exceed MAX_SCORE_ELEMENTS: bias encodings take the blocked path.
    with torch.no_grad():
        logits = small_model(name)(torch.randint(0, 256, (1, FAR)))
    assert logits.shape == (1, FAR, 256)
    assert torch.isfinite(logits).all()


def test_only_learned_positions_and_xpos_bound_the_input_length():
    # learned: its table's rows; xpos: the span its decay keeps within float32 (69,478).
    assert BOUNDED == ["learned", "xpos"]
    assert "xpos" in REACHING_FAR


def test_learned_model_max_length_is_the_tables_rows():
    model = Transformer(SMALL, build_encoding({"name": "learned", "max_length": 32}, 16, 2))
    assert model.max_length == 32


def test_learned_model_refuses_inputs_longer_than_its_table():
    model = Transformer(SMALL, build_encoding({"name": "learned", "max_length": 32}, 16, 2))
    with pytest.raises(PosbenchError, match="33"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_learned_model_accepts_inputs_exactly_as_long_as_its_table():
    model = Transformer(SMALL, build_encoding({"name": "learned", "max_length": 32}, 16, 2))
    assert model(torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, 256)


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ({"n_layer": 1, "n_head": 4, "d_model": 30}, {"name": "none"}),  # heads do not divide
        ({"n_layer": 1, "n_head": 4, "d_model": 36}, {"name": "rope"}),  # odd head dim
        ({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": "t5", "num_buckets": 0}),
    ],
)
def test_checking_a_model_config_raises_what_building_the_model_raises(model, encoding):
    with pytest.raises(PosbenchError) as built:
        posbench.model.build_model(model, encoding)
    with pytest.raises(PosbenchError, match=re.escape(str(built.value))):
        posbench.config.check_model_config(model, encoding)


def test_checking_a_valid_model_config_passes():
    posbench.config.check_model_config({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": "rope"})


@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_a_shared_encodings_bias_of_the_distance_is_computed_once_per_forward_pass(
    name, monkeypatch
):
    # Every layer would otherwise check the positions (a device sync on a GPU) and recompute it.
    model = posbench.model.build_model({"n_layer": 3, "n_head": 2, "d_model": 16}, {"name": name})
    calls = []
    computed = type(model.encoding).consecutive_bias

    def counted(self, positions):
        calls.append(positions.shape[-1])
        return computed(self, positions)

    monkeypatch.setattr(type(model.encoding), "consecutive_bias", counted)
    model(torch.zeros(2, 16, dtype=torch.long))  # three layers, one bias for all
    assert calls == [16]
    model(torch.zeros(2, 16, dtype=torch.long)).sum().backward()  # and the same with gradients
    assert calls == [16, 16]
