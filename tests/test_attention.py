"""Specification of the attention paths (posbench/model/attention/): each gives the output and the
gradients of the written-out masked computation at any length and block size; which path a
bias takes, and the tensors a path never writes.

The small model, its test encodings and the reference computation of one attention layer are
test_model's.
"""

from __future__ import annotations

import gc
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model import (
    F64,
    SMALL,
    ForTestConfig,
    make_encoding,
    random_attention,
    reference_attention,
    small_model,
)
from torch.nn.attention.flex_attention import flex_attention

import posbench.model.attention
import posbench.model.attention.biases
import posbench.model.attention.blocks
import posbench.model.attention.explicit
import posbench.model.attention.flex
from posbench.encodings import PositionalEncoding
from posbench.model import Transformer
from posbench.model.args import ModelArgs
from posbench.model.attention.blocks import causal_bias


def test_causal_bias_puts_minus_infinity_strictly_above_the_diagonal_and_keeps_the_rest():
    bias = torch.randn(2, 5, 5, dtype=F64)
    out = causal_bias(bias)
    for h in range(2):
        for i in range(5):
            for j in range(5):
                expected = float("-inf") if j > i else float(bias[h, i, j])
                assert float(out[h, i, j]) == expected


def test_causal_bias_compares_token_indices_from_the_block_starts():
    # Queries 2 and 3 over keys 1..4: key 3 is after query 2, key 4 after both. Positions play
    # no part: a padded row's padding repeats its last position, and stays in the future.
    bias = torch.zeros(1, 2, 4, dtype=F64)
    out = causal_bias(bias, query_start=2, key_start=1)
    expected = torch.tensor([[[0, 0, -math.inf, -math.inf], [0, 0, 0, -math.inf]]], dtype=F64)
    assert torch.equal(out, expected)


# --- score biases at long lengths: attention per block of queries ------------------------------

BIASED = ["alibi", "t5", "kerple", "sandwich", "fire", "distance-bias"]


def random_bias_encoding(name: str, n_head: int = SMALL.n_head) -> PositionalEncoding:
    """A float64 bias encoding whose learned parts are random, so every bucket/head differs."""
    torch.manual_seed(3)
    args = ModelArgs(n_layer=1, n_head=n_head, d_model=8 * n_head)
    encoding = make_encoding(name, args).double()
    with torch.no_grad():
        for parameter in encoding.parameters():
            parameter.uniform_(0.1, 1.5)
    return encoding


@pytest.mark.parametrize("name", BIASED)
@pytest.mark.parametrize("limit", [1, 100, 2000])
def test_blocked_attention_equals_the_full_computation(name, limit, monkeypatch):
    attention = random_attention(seed=4)
    encoding = random_bias_encoding(name)
    x = torch.randn(2, 37, SMALL.d_model, dtype=F64, generator=torch.Generator().manual_seed(5))
    positions = torch.arange(37)
    monkeypatch.setattr(posbench.model.attention.blocks, "MAX_SCORE_ELEMENTS", limit)
    assert (
        posbench.model.attention.blocks.query_block_size(2, SMALL.n_head, 37) < 37
    )  # really blocked
    full_bias = encoding.score_bias(positions, positions).detach()
    expected = reference_attention(attention, x, bias=full_bias)
    torch.testing.assert_close(attention(x, positions, encoding), expected, rtol=0, atol=1e-10)


def test_blocked_model_equals_the_single_call_model_in_float32(monkeypatch):
    model = small_model("t5")
    tokens = torch.randint(0, 256, (2, 300), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        single = model(tokens)
        monkeypatch.setattr(posbench.model.attention.blocks, "MAX_SCORE_ELEMENTS", 5000)
        blocked = model(tokens)
    torch.testing.assert_close(blocked, single, rtol=0, atol=1e-5)


def test_each_block_of_a_general_bias_sees_keys_only_up_to_its_own_end_and_stays_under_the_limit(
    monkeypatch,
):
    encoding = random_bias_encoding("distance-bias")
    calls = []
    score_bias = encoding.score_bias

    def recording(query_positions, key_positions, out=None):
        bias = score_bias(query_positions, key_positions, out=out)
        calls.append((query_positions, key_positions, bias.numel()))
        return bias

    monkeypatch.setattr(encoding, "score_bias", recording)
    monkeypatch.setattr(posbench.model.attention.blocks, "MAX_SCORE_ELEMENTS", 400)
    q = k = v = torch.zeros(1, SMALL.n_head, 50, 8, dtype=F64)
    posbench.model.attention.causal_attention(q, k, v, torch.arange(50), encoding)
    assert sorted(int(qp[0]) for qp, _, _ in calls) == list(range(0, 50, 4))  # 400 // (2 * 50)
    for query_positions, key_positions, elements in calls:
        assert torch.equal(key_positions, torch.arange(int(query_positions[-1]) + 1))
        assert elements <= 400


# --- a bias of the distance alone (relative_bias): no (H, Tq, Tk) tensor --------------------------

RELATIVE = ["alibi", "t5", "kerple", "sandwich"]


def plain_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(hs) + mask) v, written out: (B, H, T, T) scores."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
    return torch.softmax(scores, dim=-1) @ v


def masked_attention(q, k, v, encoding, positions):
    """The plain computation: softmax(q k^T / sqrt(hs) + score_bias + causal mask) v, written out
    with the whole (H, T, T) bias of the encoding's reference score_bias."""
    bias = causal_bias(encoding.score_bias(positions, positions))
    return plain_attention(q, k, v, bias)


def random_qkv(batch, n_head, length, head_dim, dtype=F64):
    generator = torch.Generator().manual_seed(8)
    shape = (batch, n_head, length, head_dim)
    return [torch.randn(shape, dtype=dtype, generator=generator) for _ in range(3)]


@pytest.mark.parametrize("name", RELATIVE)
@pytest.mark.parametrize("length", [1, 16, 37, 300])
@pytest.mark.parametrize("block", [16, None])  # None: the shipped block sizes
@pytest.mark.parametrize("gradients", [True, False])
def test_relative_bias_attention_equals_the_masked_computation(
    name, length, block, gradients, monkeypatch
):
    # With gradients, a learned bias (t5, kerple) is written out for the explicit computation.
    if block:
        use_query_blocks(block, monkeypatch)  # 16: 300 = 18 * 16 + 12
    assert_attention_matches_masked(name, length, gradients)


def use_query_blocks(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of at most ``block`` queries on every attention path with a bias (the explicit
    computation's too)."""
    monkeypatch.setattr(posbench.model.attention.blocks, "QUERY_BLOCK", block)
    monkeypatch.setattr(posbench.model.attention.blocks, "EXPLICIT_QUERY_BLOCK", block)


def assert_attention_matches_masked(name: str, length: int, gradients: bool) -> None:
    """causal_attention with ``name``'s random bias at positions 0..length-1 equals the written
    out masked computation, with or without gradients enabled."""
    encoding = random_bias_encoding(name)
    q, k, v = random_qkv(2, SMALL.n_head, length, 8)
    positions = torch.arange(length)
    with torch.set_grad_enabled(gradients):
        out = posbench.model.attention.causal_attention(q, k, v, positions, encoding)
    expected = masked_attention(q, k, v, encoding, positions)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", [*RELATIVE, "pair-bias"])  # pair-bias: the general path
def test_bias_attention_equals_the_masked_computation_at_4096_tokens_in_float32(name):
    encoding = random_bias_encoding(name).float()
    q, k, v = random_qkv(1, SMALL.n_head, 4096, 4, dtype=torch.float32)
    positions = torch.arange(4096)
    with torch.no_grad():
        out = posbench.model.attention.causal_attention(q, k, v, positions, encoding)
        expected = masked_attention(q, k, v, encoding, positions)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", RELATIVE)
def test_relative_bias_attention_gives_the_gradients_of_the_masked_computation(name, monkeypatch):
    use_query_blocks(16, monkeypatch)
    encoding = random_bias_encoding(name)
    inputs = [t.requires_grad_() for t in random_qkv(2, SMALL.n_head, 45, 8)]
    leaves = [*inputs, *encoding.parameters()]
    out_grad = torch.randn(2, SMALL.n_head, 45, 8, dtype=F64)

    def gradients(attend) -> list[torch.Tensor]:
        return torch.autograd.grad(attend(*inputs, encoding, torch.arange(45)), leaves, out_grad)

    fast = gradients(lambda q, k, v, e, p: posbench.model.attention.causal_attention(q, k, v, p, e))
    for got, expected in zip(fast, gradients(masked_attention), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", RELATIVE)
@pytest.mark.parametrize(
    "positions", [torch.arange(1000, 1037), torch.arange(0, 74, 2), torch.arange(37) ** 2]
)
def test_bias_attention_at_positions_other_than_zero_to_length_equals_the_masked_computation(
    name, positions, monkeypatch
):
    # Consecutive positions from 1000 take the relative path; the others (increasing, with gaps)
    # the general one.
    monkeypatch.setattr(posbench.model.attention.blocks, "QUERY_BLOCK", 16)
    encoding = random_bias_encoding(name)
    q, k, v = random_qkv(2, SMALL.n_head, 37, 8)
    with torch.no_grad():
        out = posbench.model.attention.causal_attention(q, k, v, positions, encoding)
    expected = masked_attention(q, k, v, encoding, positions)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", RELATIVE)
def test_relative_bias_attention_in_evaluation_never_writes_a_bias_of_queries_by_keys(
    name, monkeypatch
):
    encoding = random_bias_encoding(name)
    masks = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        masks.append(kwargs["attn_mask"])
        return sdpa(*args, **kwargs)

    def refuse(*args):
        raise AssertionError("score_bias builds an (H, Tq, Tk) bias")

    monkeypatch.setattr(encoding, "score_bias", refuse)
    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    q, k, v = random_qkv(1, SMALL.n_head, 1000, 8)
    with torch.no_grad():
        posbench.model.attention.causal_attention(q, k, v, torch.arange(1000), encoding)
    block = posbench.model.attention.blocks.QUERY_BLOCK
    assert len(masks) == math.ceil(1000 / block)
    for mask in masks:
        stored = mask.untyped_storage().nbytes() // mask.element_size()
        assert stored <= SMALL.n_head * (block - 1 + 1000) < mask.numel()


# --- flex_attention: a bias of the distance alone on CUDA ----------------------------------------

FLEX = [*RELATIVE, "distance-table"]


class DistanceTable(PositionalEncoding):
    """A learned bias table indexed by distance, the table flex_attention_bias reads, as a
    parameter: gradients of the table itself can then be compared entry by entry."""

    Config = ForTestConfig

    def __init__(self, n_head: int, distances: int) -> None:
        super().__init__(ForTestConfig(), 8 * n_head, n_head)
        self.table = torch.nn.Parameter(torch.randn(n_head, distances, dtype=F64))

    def relative_bias(self, distance):
        return self.table[:, distance.abs()]  # (H, D)


def flex_encoding(name: str, dtype: torch.dtype, device: str = "cpu") -> PositionalEncoding:
    if name == "distance-table":
        torch.manual_seed(3)
        return DistanceTable(SMALL.n_head, 400).to(device, dtype)
    return random_bias_encoding(name).to(device, dtype)


def flex_and_masked(
    name: str,
    length: int,
    gradients: bool,
    device: str = "cpu",
    compiled: bool = False,
    head_size: int = 16,
    dtype: torch.dtype = torch.float32,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """flex_attention_bias's output (then its gradients of q, k, v and the encoding's learned
    parameters, a bias table among them) with q, k, v in ``dtype``, and the same of the masked
    computation in float32 from the same (rounded) q, k, v."""
    encoding = flex_encoding(name, torch.float32, device)
    rounded = random_qkv(2, SMALL.n_head, length, head_size, torch.float32)
    inputs = [t.to(device, dtype).float() for t in rounded]
    leaves = [t.requires_grad_(gradients) for t in inputs] + list(encoding.parameters())
    positions = torch.arange(length, device=device)
    with torch.set_grad_enabled(gradients):
        bias = encoding.relative_bias(positions)
        flex_inputs = [t.to(dtype) for t in inputs]
        flex = posbench.model.attention.flex_attention_bias(*flex_inputs, bias, compiled=compiled)
        flex = flex.float()
        masked = masked_attention(*inputs, encoding, positions)
    if not gradients:
        return [flex], [masked]
    out_grad = torch.randn_like(flex)
    return (
        [flex, *torch.autograd.grad(flex, leaves, out_grad)],
        [masked, *torch.autograd.grad(masked, leaves, out_grad)],
    )


@pytest.mark.parametrize("name", FLEX)
@pytest.mark.parametrize("length", [37, 300])  # 300: a partial last block of 128
def test_flex_attention_bias_equals_the_masked_computation(name, length):
    # flex_attention's unfused implementation: the score_mod and block mask the kernel runs.
    [flex], [masked] = flex_and_masked(name, length, gradients=False)
    torch.testing.assert_close(flex, masked, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", FLEX)
def test_flex_attention_bias_gives_the_gradients_of_the_masked_computation(name, monkeypatch):
    # torch 2.13 refuses flex_attention's backward on a CPU before it starts (_validate_device);
    # its unfused implementation computes it, from the same score_mod as CUDA's kernel.
    monkeypatch.setattr(torch.nn.attention.flex_attention, "_validate_device", lambda *a: None)
    flex, masked = flex_and_masked(name, 300, gradients=True)
    for got, expected in zip(flex, masked, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_compiled_flex_attention_bias_on_a_cpu_equals_the_masked_computation_at_every_length(
    name,
):
    """About 20 s for some encodings: flex_attention compiled for each of two lengths."""
    # The kernels torch.compile generates for a CPU (forward only there), one per length: the
    # dynamic-shape kernel it built at a second length failed to compile (torch 2.13). With
    # dynamo's limit at one kernel a function, the lengths after the first pass only because
    # compiled_flex_attention raises it.
    posbench.model.attention.flex.compiled_flex_attention.cache_clear()
    torch._dynamo.reset()
    # torch's own patch: pytest's monkeypatch deletes a dynamo setting when it undoes one.
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        for length in (300, 520):
            [flex], [masked] = flex_and_masked(name, length, gradients=False, compiled=True)
            torch.testing.assert_close(flex, masked, rtol=0, atol=1e-5)
    posbench.model.attention.flex.compiled_flex_attention.cache_clear()


@pytest.mark.cuda
@pytest.mark.parametrize("name", FLEX)
@pytest.mark.parametrize("head_size", [16, 64, 128])
def test_compiled_flex_attention_bias_on_cuda_gives_the_masked_computation_and_its_gradients(
    name, head_size
):
    flex, masked = flex_and_masked(
        name, 300, gradients=True, device="cuda", compiled=True, head_size=head_size
    )
    torch.testing.assert_close(flex[0], masked[0], rtol=0, atol=1e-5)
    for got, expected in zip(flex[1:], masked[1:], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("name", FLEX)
@pytest.mark.parametrize("head_size", [32, 64, 128])  # tiny, small and large models' heads
def test_compiled_flex_attention_bias_in_bf16_on_cuda_follows_float32(name, head_size):
    # torch's default blocks for bf16 heads of 64 did not fit an H200's shared memory
    # (HALF_PRECISION_KERNEL_OPTIONS); the kernel rounds its output and gradients to bf16.
    flex, masked = flex_and_masked(
        name, 300, True, "cuda", compiled=True, head_size=head_size, dtype=torch.bfloat16
    )
    for got, expected in zip(flex, masked, strict=True):
        scale = expected.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-2 * scale)


ATTENTION_PATHS = {
    path: getattr(posbench.model.attention, path)
    for path in ("flex_attention_bias", "relative_bias_attention", "blocked_bias_attention")
}


def choose_flex_attention_on(devices: set[str], monkeypatch) -> None:
    """flex_attention on the device types ``devices``, its unfused implementation in place of
    the compiled kernel (no compiler needed)."""
    monkeypatch.setattr(posbench.model.attention, "FLEX_ATTENTION_DEVICES", frozenset(devices))
    monkeypatch.setattr(
        posbench.model.attention.flex, "compiled_flex_attention", lambda: flex_attention
    )


def attention_paths(name: str, flex_devices: set[str], monkeypatch, length: int = 50) -> list[str]:
    """The attention functions one forward pass of the small model over ``length`` tokens
    calls, with flex_attention chosen on ``flex_devices``."""
    choose_flex_attention_on(flex_devices, monkeypatch)
    called = []
    for path, original in ATTENTION_PATHS.items():

        def recording(*args, _path=path, _original=original, **kwargs):
            called.append(_path)
            return _original(*args, **kwargs)

        monkeypatch.setattr(posbench.model.attention, path, recording)
    with torch.no_grad():
        small_model(name)(torch.zeros(1, length, dtype=torch.long))
    return called


def test_flex_attention_is_chosen_on_cuda_only():
    assert posbench.model.attention.FLEX_ATTENTION_DEVICES == {"cuda"}


@pytest.mark.parametrize("name", RELATIVE)
def test_a_bias_of_the_distance_alone_takes_flex_attention_exactly_on_the_flex_devices(
    name, monkeypatch
):
    flex = attention_paths(name, {"cpu"}, monkeypatch)
    assert flex == ["flex_attention_bias"] * SMALL.n_layer
    sdpa = attention_paths(name, set(), monkeypatch)
    assert sdpa == ["relative_bias_attention"] * SMALL.n_layer


def test_a_bias_of_both_positions_keeps_the_blocked_path_on_the_flex_devices(monkeypatch):
    paths = attention_paths("pair-bias", {"cpu"}, monkeypatch)
    assert paths == ["blocked_bias_attention"] * SMALL.n_layer


def test_fire_takes_flex_attention_up_to_its_threshold_and_the_blocked_path_past_it(monkeypatch):
    # FIRE's bias past its threshold L (512 by default) depends on the query's position, not on
    # i - j alone; below it, it is a bias of the distance alone.
    within = attention_paths("fire", {"cpu"}, monkeypatch, length=512)
    assert within == ["flex_attention_bias"] * SMALL.n_layer
    past = attention_paths("fire", {"cpu"}, monkeypatch, length=514)
    assert past == ["blocked_bias_attention"] * SMALL.n_layer


@pytest.mark.parametrize("name", RELATIVE)
def test_the_model_with_flex_attention_chosen_computes_the_same_logits(name, monkeypatch):
    model, tokens = small_model(name), torch.randint(0, 256, (2, 200))
    with torch.no_grad():
        expected = model(tokens)
        choose_flex_attention_on({"cpu"}, monkeypatch)
        torch.testing.assert_close(model(tokens), expected, rtol=0, atol=1e-5)


# --- any other bias (score_bias only) ------------------------------------------------------------

GENERAL = ["distance-bias", "pair-bias"]


@pytest.mark.parametrize("name", GENERAL)
@pytest.mark.parametrize("length", [1, 16, 37, 300])
@pytest.mark.parametrize("gradients", [True, False])
def test_general_bias_attention_equals_the_masked_computation(name, length, gradients, monkeypatch):
    # Without gradients, blocks after the first attend to their past and diagonal keys apart.
    use_query_blocks(16, monkeypatch)
    assert_attention_matches_masked(name, length, gradients)


@pytest.mark.parametrize("positions", [torch.arange(1000, 1037), torch.arange(37) ** 2])
def test_general_bias_attention_at_other_increasing_positions_equals_the_masked_computation(
    positions, monkeypatch
):
    monkeypatch.setattr(posbench.model.attention.blocks, "QUERY_BLOCK", 16)
    encoding = random_bias_encoding("pair-bias")
    q, k, v = random_qkv(2, SMALL.n_head, 37, 8)
    with torch.no_grad():
        out = posbench.model.attention.causal_attention(q, k, v, positions, encoding)
    expected = masked_attention(q, k, v, encoding, positions)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["fire", "kerple"])  # kerple: PositionalEncoding.score_bias
def test_in_evaluation_the_blocks_after_the_first_write_their_bias_to_one_buffer(name, monkeypatch):
    monkeypatch.setattr(posbench.model.attention.blocks, "QUERY_BLOCK", 16)
    encoding = random_bias_encoding(name)
    monkeypatch.setattr(type(encoding), "consecutive_bias", lambda self, positions: None)
    buffers, score_bias = [], encoding.score_bias

    def recording(query_positions, key_positions, out=None):
        bias = score_bias(query_positions, key_positions, out=out)
        buffers.append(None if out is None else (out.untyped_storage().data_ptr(), bias))
        return bias

    monkeypatch.setattr(encoding, "score_bias", recording)
    q, k, v = random_qkv(2, SMALL.n_head, 100, 8)
    with torch.no_grad():
        out = posbench.model.attention.causal_attention(q, k, v, torch.arange(100), encoding)
    monkeypatch.setattr(encoding, "score_bias", score_bias)
    torch.testing.assert_close(out, masked_attention(q, k, v, encoding, torch.arange(100)))
    assert buffers[0] is None and len(buffers) == 7  # 100 = 6 * 16 + 4 queries, last first
    assert len({pointer for pointer, _ in buffers[1:]}) == 1  # one buffer
    for pointer, bias in buffers[1:]:
        assert bias.untyped_storage().data_ptr() == pointer  # the bias was written there


@pytest.mark.parametrize("kept_blocks", [0, 3, 7])  # none, some, all 7 blocks of 100 queries
def test_the_layers_of_a_forward_pass_share_the_biases_of_its_query_blocks(
    kept_blocks, monkeypatch
):
    monkeypatch.setattr(posbench.model.attention.blocks, "QUERY_BLOCK", 16)
    model, tokens = small_model("kerple"), torch.randint(0, 256, (2, 100))
    monkeypatch.setattr(type(model.encoding), "consecutive_bias", lambda self, positions: None)
    ends = [min(start + 16, 100) for start in reversed(range(0, 100, 16))]  # the order computed
    sizes = [SMALL.n_head * (end - (end - 1) // 16 * 16) * end for end in ends]  # H * n * e
    monkeypatch.setattr(posbench.model.attention.biases, "SHARED_BIAS_ELEMENTS", 0)
    with torch.no_grad():
        expected = model(tokens)
    monkeypatch.setattr(
        posbench.model.attention.biases, "SHARED_BIAS_ELEMENTS", sum(sizes[:kept_blocks])
    )
    calls, score_bias = [], model.encoding.score_bias

    def counting(query_positions, key_positions, out=None):
        calls.append(query_positions[0].item())
        return score_bias(query_positions, key_positions, out=out)

    monkeypatch.setattr(model.encoding, "score_bias", counting)
    with torch.no_grad():
        shared = model(tokens)
    assert torch.equal(shared, expected)
    # The first layer computes every block's bias; the second the blocks not kept.
    assert len(calls) == 7 + (7 - kept_blocks) and SMALL.n_layer == 2


def test_the_kept_biases_are_written_into_storage_that_the_next_forward_pass_reuses(
    monkeypatch,
):
    # Fresh storage each pass had its pages zeroed by the operating system again.
    monkeypatch.setattr(posbench.model.attention.blocks, "QUERY_BLOCK", 16)
    model, tokens = small_model("kerple"), torch.randint(0, 256, (2, 100))
    monkeypatch.setattr(type(model.encoding), "consecutive_bias", lambda self, positions: None)
    pointers, score_bias = [], model.encoding.score_bias

    def recording(query_positions, key_positions, out=None):
        pointers.append(None if out is None else out.untyped_storage().data_ptr())
        return score_bias(query_positions, key_positions, out=out)

    monkeypatch.setattr(model.encoding, "score_bias", recording)
    with torch.no_grad():
        first, second = model(tokens), model(tokens)
    assert torch.equal(first, second)
    assert len(pointers) == 14 and None not in pointers  # 7 blocks each pass, all kept
    assert len(set(pointers)) == 1 and pointers[:7] == pointers[7:]  # one storage, reused


def test_storage_kept_under_inference_mode_is_not_written_outside_it(monkeypatch):
    """Evaluation runs under torch.inference_mode, diagnose under no_grad: storage one leased
    (an inference tensor) cannot be written in place by the other, in either order."""
    monkeypatch.setattr(posbench.model.attention.blocks, "QUERY_BLOCK", 16)
    model, tokens = small_model("fire"), torch.randint(0, 256, (1, 40))
    monkeypatch.setattr(type(model.encoding), "consecutive_bias", lambda self, positions: None)
    with torch.no_grad():
        expected = model(tokens)
    for first, then in [
        (torch.inference_mode, torch.no_grad),
        (torch.no_grad, torch.inference_mode),
    ]:
        monkeypatch.setattr(posbench.model.attention.biases, "SPARE_STORAGE", [])
        with first():
            model(tokens)
        gc.collect()  # the pass's storage back in the pool
        with then():
            assert torch.equal(model(tokens), expected)


def test_two_threads_leasing_at_once_never_take_one_spare_storage(monkeypatch):
    """SPARE_STORAGE is shared by models in threads (DataParallel's replicas): one spare, two
    passes leasing at once, each taking its time at the pop, get two storages, not one twice
    (nor an error popping a spare the other took)."""
    import threading
    import time

    class SlowPop(list):
        def pop(self, index):
            time.sleep(0.05)  # the other thread runs meanwhile
            return super().pop(index)

    class Pass:  # a forward pass's QueryBlockBiases: the storage's owner
        pass

    biases = posbench.model.attention.biases
    spare = torch.empty(8)
    monkeypatch.setattr(biases, "SPARE_STORAGE", SlowPop([spare]))
    owners, leased, errors = [Pass() for _ in range(2)], [], []
    start = threading.Barrier(2)

    def lease(owner):
        start.wait()
        try:
            leased.append(biases.leased_storage(owner, 8, torch.float32, torch.device("cpu")))
        except Exception as err:  # the failure this test guards against
            errors.append(err)

    threads = [threading.Thread(target=lease, args=(owner,)) for owner in owners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(leased) == 2
    assert leased[0].data_ptr() != leased[1].data_ptr()
    assert spare.data_ptr() in {t.data_ptr() for t in leased}


def block_masks(mask: torch.Tensor, starts: list[int]) -> list[torch.Tensor]:
    """The masks of the blocks of queries from each of ``starts`` (the first 0) of a whole
    (.., T, T) ``mask``: queries [s, e), keys [0, e)."""
    ends = [*starts[1:], mask.shape[-1]]
    return [mask[..., s:e, :e] for s, e in zip(starts, ends, strict=True)]


@pytest.mark.parametrize("mask_batch", [1, 2])  # one bias for the batch, or one per sequence
@pytest.mark.parametrize("starts", [[0], [0, 4, 8], [0, 10]])
def test_explicit_attention_gives_the_output_and_gradients_of_the_plain_computation(
    mask_batch, starts
):
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 3, 11, 8))
    bias = torch.randn(mask_batch, 3, 11, 11, dtype=F64, requires_grad=True)
    mask = causal_bias(bias)  # (mask_batch, H, T, T)
    out = posbench.model.attention.explicit.explicit_attention(q, k, v, block_masks(mask, starts))
    expected = plain_attention(q, k, v, mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    out_grad = torch.randn(2, 3, 11, 8, dtype=F64)
    got = torch.autograd.grad(out, [q, k, v, bias], out_grad, retain_graph=True)
    plain_grads = torch.autograd.grad(expected, [q, k, v, bias], out_grad)
    for fast, plain in zip(got, plain_grads, strict=True):
        torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("length", [5, 37])  # one block of 8 queries, or 5 blocks
def test_values_narrower_than_q_and_k_give_the_plain_causal_output_and_gradients(
    length, monkeypatch
):
    # PoPE's q and k are twice v's width: in training written out (narrow_values_attention),
    # in evaluation SDPA on v padded with zeros.
    use_query_blocks(8, monkeypatch)
    q, k, _ = random_qkv(2, 3, length, 8)
    v = random_qkv(2, 3, length, 4)[2]
    leaves = [t.requires_grad_() for t in (q, k, v)]
    mask = causal_bias(torch.zeros(length, length, dtype=F64))
    out_grad = torch.randn(2, 3, length, 4, dtype=F64)
    got = outputs_and_gradients(
        lambda: posbench.model.attention.unbiased_causal_attention(q, k, v), leaves, out_grad
    )
    expected = outputs_and_gradients(lambda: plain_attention(q, k, v, mask), leaves, out_grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    with torch.no_grad():
        evaluated = posbench.model.attention.unbiased_causal_attention(q, k, v)
    torch.testing.assert_close(evaluated, expected[0], rtol=0, atol=1e-12)


def test_compiled_explicit_attention_gives_the_eager_output_and_gradients():
    # train.compile traces ExplicitAttention's forward and backward (an out= argument once made
    # the traced graph view a copy that it had not made).
    mask = causal_bias(torch.randn(1, 2, 24, 24, requires_grad=True))
    masks = block_masks(mask, [0, 16])

    def outputs_and_gradients(attention) -> list[torch.Tensor]:
        # As the model makes them: views of (B, T, H, hs) tensors.
        leaves = [t.requires_grad_() for t in random_qkv(3, 24, 2, 8, dtype=torch.float32)]
        q, k, v = (t.transpose(1, 2) for t in leaves)
        out = attention(q, k, v, masks)
        return [out, *torch.autograd.grad(out.square().sum(), [*leaves, *masks])]

    compiled = outputs_and_gradients(
        torch.compile(posbench.model.attention.explicit.explicit_attention)
    )
    eager = outputs_and_gradients(posbench.model.attention.explicit.explicit_attention)
    for got, expected in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_explicit_attention_computes_bf16_inputs_in_float32_even_under_autocast():
    bias = torch.randn(1, 3, 11, 11).bfloat16()  # the callers' bias is in q's dtype
    mask = causal_bias(bias).requires_grad_()
    half = [t.bfloat16().requires_grad_() for t in random_qkv(2, 3, 11, 8, torch.float32)]
    out_grad = torch.randn(2, 3, 11, 8).bfloat16()
    with torch.autocast("cpu", torch.bfloat16):  # as in training with train.precision=bf16
        out = posbench.model.attention.explicit.explicit_attention(*half, block_masks(mask, [0, 6]))
        got = torch.autograd.grad(out, [*half, mask], out_grad)
    # The float32 computation of the rounded inputs, rounded once: within one bf16 ulp.
    rounded = [t.detach().float().requires_grad_() for t in [*half, mask]]
    expected = plain_attention(*rounded)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=1e-6)
    plain_grads = torch.autograd.grad(expected, rounded, out_grad.float())
    for fast, plain in zip(got, plain_grads, strict=True):
        assert fast.dtype == torch.bfloat16
        torch.testing.assert_close(fast.float(), plain, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize(
    ("name", "positions", "gradients"),
    [
        ("alibi", torch.arange(40), True),  # relative_bias_attention on SDPA
        ("alibi", torch.arange(40), False),  # the same, blocks of 16 queries
        ("alibi", torch.arange(0, 80, 2), True),  # with gaps: blocked_bias_attention on SDPA
        ("alibi", torch.arange(0, 80, 2), False),  # past_and_diagonal_attention
        ("t5", torch.arange(40), True),  # a learned bias: explicit_attention
    ],
)
def test_bf16_bias_attention_on_a_cpu_is_the_float32_attention_of_the_same_inputs_rounded(
    name, positions, gradients, monkeypatch
):
    # What eager fp32 computes, exactly: SDPA's bf16 kernels (and a mask rounded to bf16) are
    # what a bf16 step must not take on a CPU.
    use_query_blocks(16, monkeypatch)
    encoding = random_bias_encoding(name).float()
    rounded = [t.bfloat16() for t in random_qkv(2, SMALL.n_head, 40, 8, torch.float32)]
    out_grad = torch.randn(2, SMALL.n_head, 40, 8).bfloat16()

    def outputs_and_gradients(dtype: torch.dtype) -> list[torch.Tensor]:
        leaves = [t.to(dtype).requires_grad_() for t in rounded]
        autocast = torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16)
        with autocast, torch.set_grad_enabled(gradients):
            out = posbench.model.attention.causal_attention(*leaves, positions, encoding)
        if not gradients:
            return [out]
        bias_parameters = list(encoding.parameters())
        return [out, *torch.autograd.grad(out, [*leaves, *bias_parameters], out_grad.to(dtype))]

    fp32 = outputs_and_gradients(torch.float32)
    bf16 = outputs_and_gradients(torch.bfloat16)
    assert len(bf16) == len(fp32) and bf16[0].dtype == torch.bfloat16
    for got, expected in zip(bf16, fp32, strict=True):
        assert torch.equal(got, expected.to(got.dtype))


def test_explicit_attention_applies_dropout_to_the_weights():
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 64, 8))
    mask = torch.zeros(1, 2, 64, 64, dtype=F64)
    torch.manual_seed(9)
    dropped = posbench.model.attention.explicit.explicit_attention(q, k, v, [mask], dropout=0.5)
    torch.manual_seed(9)
    expected = F.dropout(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1), 0.5) @ v
    torch.testing.assert_close(dropped, expected, rtol=0, atol=1e-12)
    out_grad = torch.randn(1, 2, 64, 8, dtype=F64)
    got = torch.autograd.grad(dropped, [q, k, v], out_grad)
    for fast, plain in zip(got, torch.autograd.grad(expected, [q, k, v], out_grad), strict=True):
        torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)


def test_training_shapes_are_blocked_only_where_attention_is_explicit():
    assert posbench.model.attention.blocks.query_block_size(batch=32, n_head=4, length=128) == 128
    assert posbench.model.attention.blocks.query_block_size(batch=32, n_head=8, length=256) == 256
    assert posbench.model.attention.blocks.query_block_size(32, 4, 128, explicit=True) == 32


@pytest.mark.parametrize("general", [False, True])  # the relative or the general path
def test_training_attention_takes_blocks_of_32_queries_and_gives_the_masked_gradients(
    general, monkeypatch
):
    encoding = random_bias_encoding("kerple")
    if general:  # KERPLE's learned bias looked up per (query, key) by score_bias
        monkeypatch.setattr(type(encoding), "consecutive_bias", lambda self, positions: None)
    inputs = [t.requires_grad_() for t in random_qkv(2, SMALL.n_head, 150, 8)]
    leaves = [*inputs, *encoding.parameters()]
    out_grad = torch.randn(2, SMALL.n_head, 150, 8, dtype=F64)
    softmax_rows = []

    def recording(scores: torch.Tensor, dim: int) -> torch.Tensor:
        softmax_rows.append(scores.shape[-2])
        return softmax(scores, dim=dim)

    softmax = torch.softmax
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "softmax", recording)
        out = posbench.model.attention.causal_attention(*inputs, torch.arange(150), encoding)
    assert sorted(softmax_rows) == [22, 32, 32, 32, 32]  # 150 = 4 * 32 + 22 queries
    expected = masked_attention(*inputs, encoding, torch.arange(150))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    got = torch.autograd.grad(out, leaves, out_grad)
    for fast, masked in zip(got, torch.autograd.grad(expected, leaves, out_grad), strict=True):
        torch.testing.assert_close(fast, masked, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["none", "rope"])
def test_encodings_without_a_bias_use_the_fused_causal_kernel_even_at_long_lengths(
    name, monkeypatch
):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        small_model(name)(torch.zeros(1, 3000, dtype=torch.long))
    assert len(calls) == SMALL.n_layer
    assert all(call["is_causal"] and call.get("attn_mask") is None for call in calls)


@pytest.mark.parametrize("name", RELATIVE)
@settings(max_examples=40, deadline=None)
@given(
    qk=st.lists(st.floats(-3, 3, allow_nan=False), min_size=16, max_size=16),
    m=st.integers(0, 3000),
    n=st.integers(0, 3000),
    shift=st.integers(0, 20000),
)
def test_bias_encodings_score_a_pair_by_its_relative_position_only(name, qk, m, n, shift):
    encoding = random_bias_encoding(name, n_head=2)  # head dim 8
    q = torch.tensor(qk[:8], dtype=F64).expand(1, 2, 1, 8)
    k = torch.tensor(qk[8:], dtype=F64).expand(1, 2, 1, 8)

    def scores(query_position: int, key_position: int) -> torch.Tensor:
        qp, kp = torch.tensor([query_position]), torch.tensor([key_position])
        content = encoding.rotate(q, qp) @ encoding.rotate(k, kp).transpose(-1, -2) / math.sqrt(8)
        return content[0] + encoding.score_bias(qp, kp)  # (H, 1, 1)

    torch.testing.assert_close(scores(m + shift, n + shift), scores(m, n), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("name", ["t5", "kerple", "fire"])
def test_blocked_attention_gives_the_same_gradients(name, monkeypatch):
    # Training at long lengths (or large batches) takes the blocked path too.
    torch.manual_seed(7)
    model = Transformer(SMALL, make_encoding(name, SMALL)).double()
    tokens = torch.randint(0, 256, (2, 40))

    def gradients() -> list[torch.Tensor]:
        model.zero_grad()
        model(tokens).logsumexp(-1).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    single = gradients()
    monkeypatch.setattr(posbench.model.attention.blocks, "MAX_SCORE_ELEMENTS", 500)
    for blocked, expected in zip(gradients(), single, strict=True):
        torch.testing.assert_close(blocked, expected, rtol=1e-9, atol=1e-12)


# --- a sliding window, and biases from the content ------------------------------------------


def windowed_masked_attention(q, k, v, encoding, positions, window, content_bias=None):
    """The plain computation with the encoding's bias (if any), a bias from the content (if
    any), the causal mask and -inf at keys ``window`` or more tokens before their query."""
    T = q.shape[2]
    bias = encoding.score_bias(positions, positions)
    bias = torch.zeros(T, T, dtype=q.dtype) if bias is None else bias
    if content_bias is not None:
        bias = bias + content_bias
    index = torch.arange(T)
    too_far = index[:, None] - index[None, :] >= window
    return plain_attention(q, k, v, causal_bias(bias).masked_fill(too_far, -math.inf))


def outputs_and_gradients(attend, leaves, out_grad):
    out = attend()
    return [out, *torch.autograd.grad(out, leaves, out_grad)]


def assert_same_attention(attend, masked, gradients: bool, leaves, out_grad) -> None:
    """``attend()`` gives ``masked()``'s output and, with ``gradients``, its gradients."""
    with torch.set_grad_enabled(gradients):
        if not gradients:
            torch.testing.assert_close(attend(), masked(), rtol=0, atol=1e-10)
            return
        got = outputs_and_gradients(attend, leaves, out_grad)
        expected = outputs_and_gradients(masked, leaves, out_grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["none", "alibi", "t5", "pair-bias"])
@pytest.mark.parametrize("window", [1, 5, 16, 40])
@pytest.mark.parametrize("gradients", [True, False])
def test_windowed_attention_equals_the_masked_computation_with_its_gradients(
    name, window, gradients, monkeypatch
):
    use_query_blocks(8, monkeypatch)  # 37 = 4 * 8 + 5 queries: blocks start past the window
    encoding = random_bias_encoding(name) if name != "none" else make_encoding(name, SMALL)
    encoding.window = window
    inputs = [t.requires_grad_(gradients) for t in random_qkv(2, SMALL.n_head, 37, 8)]
    positions = torch.arange(37)
    leaves = [*inputs, *encoding.parameters()] if gradients else []
    out_grad = torch.randn(2, SMALL.n_head, 37, 8, dtype=F64)

    def windowed():
        return posbench.model.attention.causal_attention(*inputs, positions, encoding)

    def masked():
        return windowed_masked_attention(*inputs, encoding, positions, window)

    assert_same_attention(windowed, masked, gradients, leaves, out_grad)


def test_a_window_of_the_whole_length_is_full_attention_on_the_fused_path(monkeypatch):
    encoding = make_encoding("none", SMALL)
    encoding.window = 37
    q, k, v = random_qkv(2, SMALL.n_head, 37, 8)
    called = []
    monkeypatch.setattr(
        posbench.model.attention, "blocked_bias_attention", lambda *a, **kw: called.append(1)
    )
    out = posbench.model.attention.causal_attention(q, k, v, torch.arange(37), encoding)
    assert not called
    torch.testing.assert_close(
        out,
        plain_attention(q, k, v, causal_bias(torch.zeros(37, 37, dtype=F64))),
    )


class QueryKeyBias(PositionalEncoding):
    """A bias from the content: weight_h * tanh(q_i . k_j), with a learned weight per head."""

    Config = ForTestConfig

    def __init__(self, config, d_model, n_head):
        super().__init__(config, d_model, n_head)
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 2.0, n_head, dtype=F64))

    def content_state(self, x, q, k, positions):
        return q, k

    def content_bias(self, state, queries, keys):
        q, k = state
        products = q[:, :, queries] @ k[:, :, keys].transpose(-1, -2)  # (B, H, n, m)
        return self.weight[:, None, None] * torch.tanh(products)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("gradients", [True, False])
def test_a_bias_from_the_content_equals_the_masked_computation_with_its_gradients(
    window, gradients, monkeypatch
):
    use_query_blocks(8, monkeypatch)
    encoding = QueryKeyBias(ForTestConfig(), SMALL.d_model, SMALL.n_head)
    encoding.window = window
    inputs = [t.requires_grad_(gradients) for t in random_qkv(2, SMALL.n_head, 37, 8)]
    q, k, _ = inputs
    positions = torch.arange(37)
    leaves = [*inputs, encoding.weight] if gradients else []
    out_grad = torch.randn(2, SMALL.n_head, 37, 8, dtype=F64)

    def attend():
        content = encoding.content_state(None, q, k, positions)
        return posbench.model.attention.causal_attention(
            *inputs, positions, encoding, content=content
        )

    def masked():
        bias = encoding.weight[:, None, None] * torch.tanh(q @ k.transpose(-1, -2))
        return windowed_masked_attention(*inputs, encoding, positions, window or 37, bias)

    assert_same_attention(attend, masked, gradients, leaves, out_grad)


class RecordedQueryKeyBias(QueryKeyBias):
    """QueryKeyBias that records which hook attention asks for the bias of which blocks."""

    def __init__(self, config, d_model, n_head):
        super().__init__(config, d_model, n_head)
        self.asked = []

    def content_bias(self, state, queries, keys):
        self.asked.append(("content_bias", (queries, keys)))
        return super().content_bias(state, queries, keys)

    def content_biases(self, state, blocks):
        self.asked.append(("content_biases", list(blocks)))
        return [QueryKeyBias.content_bias(self, state, *block) for block in blocks]


@pytest.mark.parametrize("window", [None, 6])
def test_with_gradients_attention_asks_for_every_blocks_content_bias_at_once(window, monkeypatch):
    use_query_blocks(8, monkeypatch)  # 20 = 8 + 8 + 4 queries
    encoding = RecordedQueryKeyBias(ForTestConfig(), SMALL.d_model, SMALL.n_head)
    encoding.window = window
    q, k, v = random_qkv(2, SMALL.n_head, 20, 8)
    positions = torch.arange(20)
    content = encoding.content_state(None, q, k, positions)
    posbench.model.attention.causal_attention(q, k, v, positions, encoding, content=content)
    # The blocks from 16, 8 and 0, the last first; a window of 6 shows each query 5 keys back.
    keys = [(0, 0, 0), (11, 3, 0)][window is not None]
    blocks = [
        (slice(start, min(start + 8, 20)), slice(first, min(start + 8, 20)))
        for start, first in zip((16, 8, 0), keys, strict=True)
    ]
    assert encoding.asked == [("content_biases", blocks)]


def test_without_gradients_attention_asks_for_each_blocks_content_bias_as_it_attends(
    monkeypatch,
):
    use_query_blocks(8, monkeypatch)
    encoding = RecordedQueryKeyBias(ForTestConfig(), SMALL.d_model, SMALL.n_head)
    q, k, v = random_qkv(2, SMALL.n_head, 20, 8)
    positions = torch.arange(20)
    with torch.no_grad():
        content = encoding.content_state(None, q, k, positions)
        posbench.model.attention.causal_attention(q, k, v, positions, encoding, content=content)
    assert encoding.asked == [
        ("content_bias", (slice(start, min(start + 8, 20)), slice(0, min(start + 8, 20))))
        for start in (16, 8, 0)
    ]


def test_content_biases_by_default_is_content_bias_of_each_block():
    encoding = QueryKeyBias(ForTestConfig(), SMALL.d_model, SMALL.n_head)
    q, k, _ = random_qkv(2, SMALL.n_head, 12, 8)
    state = encoding.content_state(None, q, k, torch.arange(12))
    blocks = [(slice(8, 12), slice(2, 12)), (slice(0, 8), slice(0, 8))]
    got = encoding.content_biases(state, blocks)
    expected = [encoding.content_bias(state, queries, keys) for queries, keys in blocks]
    assert len(got) == 2
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("length", [37, 300])
def test_a_bias_table_per_sequence_takes_the_same_values_on_flex_and_sdpa(length):
    """Randomized distances give each sequence its own table (B, H, T): flex_attention's
    score_mod reads row b, as the strided mask of relative_bias_attention does."""
    q, k, v = random_qkv(2, SMALL.n_head, length, 16, torch.float32)
    table = torch.randn(2, SMALL.n_head, length, generator=torch.Generator().manual_seed(4))
    flex = posbench.model.attention.flex_attention_bias(q, k, v, table, compiled=False)
    sdpa = posbench.model.attention.relative_bias_attention(q, k, v, table)
    plain = []
    for b in range(2):  # each sequence alone with its own table
        plain.append(
            posbench.model.attention.relative_bias_attention(
                q[b : b + 1], k[b : b + 1], v[b : b + 1], table[b]
            )
        )
    torch.testing.assert_close(sdpa, torch.cat(plain), rtol=0, atol=1e-6)
    torch.testing.assert_close(flex, sdpa, rtol=0, atol=1e-5)
