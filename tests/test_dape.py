"""DAPE (Zheng et al. 2024; DAPE V2): ``encoding.dape=true`` on alibi, kerple and fire against
the authors' formula (github.com/chuanyang-Zheng/DAPE: ``AliBi_DAPE``'s MLP over the heads and
``Alibi_DAPEV2``'s 1 x k convolutions over tril([logits; bias]), ``ParallelKerpleLog_DAPE``'s
kernel), restated over the whole (B, H, T, T) logits with the network's weights copied across:
attention's output and gradients in query blocks, in training and in evaluation; a window;
one network per layer; a cached decode, diagnose, compiled training (tests/test_precision.py)
and training from the config; one-line refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_attention import outputs_and_gradients, plain_attention, use_query_blocks
from test_decode import cached_and_recomputed, random_model

import posbench.model.attention
from posbench.config import compose_config
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model import build_model
from posbench.model.attention.blocks import causal_bias
from posbench.training.train import train

F64 = torch.float64
B, H, T, HS = 2, 2, 37, 4  # 37 = 4 * 8 + 5 queries in blocks of 8


def dape(name: str, kernel: int = 3, seed: int = 0, **options):
    """A float64 encoding with DAPE whose network's weights are spread (std 0.5)."""
    torch.manual_seed(seed)
    values = {"name": name, "dape": True, "dape_kernel": kernel, "dape_width": 6, **options}
    encoding = build_encoding(values, H * HS, H).double()
    with torch.no_grad():
        for p in encoding.dape.parameters():
            p.normal_(0.0, 0.5)
    return encoding


def reference_bias(encoding, length: int) -> torch.Tensor:
    """The repository's bias of positions a (H, T, T), 0 at future keys (its torch.tril)."""
    diff = torch.tril(
        torch.arange(length).view(length, 1).repeat(1, length) + torch.arange(0, -length, -1)
    ).to(F64)
    if encoding.config.name == "alibi":  # AliBi_DAPE: -tril(i - j) * slope
        return -diff * encoding.slopes.to(F64).view(-1, 1, 1)
    if encoding.config.name == "kerple":  # ParallelKerpleLog_DAPE: -p log(1 + a diff)
        return -encoding.r1[:, None, None] * torch.log(1 + encoding.r2[:, None, None] * diff)
    return encoding.score_bias(torch.arange(length), torch.arange(length))  # FIRE: posbench's


def reference_logits(encoding, z: torch.Tensor) -> torch.Tensor:
    """x + a + mlp2([x; a]) for the logits x = z (B, H, T, T), as the repository computes it:
    kernel 1, AliBi_DAPE's Linear layers over the last axis of the permuted features; else
    Alibi_DAPEV2's Conv2d layers over torch.tril of the features."""
    a = reference_bias(encoding, z.shape[-1])
    features = torch.cat((z, torch.tile(a, (z.shape[0], 1, 1, 1))), dim=1)  # (B, 2H, T, T)
    up, down = encoding.dape.up, encoding.dape.down
    kernel = up.kernel_size[1]
    if kernel == 1:  # mlp2: Linear(2H, width), LeakyReLU(), Linear(width, H)
        out = F.linear(features.permute(0, 2, 3, 1), up.weight.flatten(1), up.bias)
        out = F.linear(F.leaky_relu(out, 0.01), down.weight.flatten(1), down.bias)
        out = out.permute(0, 3, 1, 2)
    else:
        pad = (0, kernel // 2)
        out = F.conv2d(torch.tril(features), up.weight, up.bias, padding=pad)
        out = F.leaky_relu(out, 0.01)
        out = F.conv2d(out, down.weight, down.bias, padding=pad)
    return z + a + out


def reference_attention(encoding, q, k, v) -> torch.Tensor:
    """Attention with the reference's logits of a sequence one kernel half longer: its last
    query reads the network's hidden layer past its diagonal, as every other query does (the
    reference's (T, T) map pads the last query's with zeros: its output would change when a
    token is appended, what posbench's causal DAPE does not do; the tokens appended change
    nothing else: the reference's tril hides them from every query before them)."""
    T = q.shape[2]
    half = encoding.dape.up.kernel_size[1] // 2
    z = q @ k.transpose(-1, -2) / HS**0.5
    logits = reference_logits(encoding, F.pad(z, (0, half, 0, half)))[..., :T, :T]
    return plain_attention(q, k, v, causal_bias(logits - z))


@pytest.mark.parametrize(
    ("name", "kernel", "options"),
    [
        ("alibi", 1, {}),
        ("kerple", 3, {}),  # a bias of the distance alone: laid out from its table
        ("fire", 5, {"threshold": 16.0}),  # 37 tokens: past FIRE's L, its score_bias
        ("fire", 3, {"threshold": 64.0}),  # within L: a bias of the distance, from its table
    ],
)
def test_attention_in_training_gives_the_repositorys_output_and_gradients(
    name, kernel, options, monkeypatch
):
    use_query_blocks(8, monkeypatch)
    # Each block's rows at once, the network one sequence at a time (a chunk of each).
    monkeypatch.setattr(posbench.encodings.dape_network, "CHUNK_PAIRS", 8 * 39)
    encoding = dape(name, kernel, **options)
    q, k, v = (torch.randn(B, H, T, HS, dtype=F64, requires_grad=True) for _ in "qkv")
    leaves = [q, k, v, *encoding.parameters()]
    out_grad = torch.randn(B, H, T, HS, dtype=F64)
    positions = torch.arange(T)

    def attend():
        content = encoding.content_state(None, q, k, positions)
        return posbench.model.attention.causal_attention(
            q, k, v, positions, encoding, content=content
        )

    got = outputs_and_gradients(attend, leaves, out_grad)
    expected = outputs_and_gradients(
        lambda: reference_attention(encoding, q, k, v), leaves, out_grad
    )
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_evaluation_in_query_blocks_gives_the_repositorys_output(monkeypatch):
    use_query_blocks(8, monkeypatch)
    monkeypatch.setattr(posbench.encodings.dape_network, "CHUNK_PAIRS", 3 * 39)  # 3 rows
    encoding = dape("alibi")
    q, k, v = (torch.randn(B, H, T, HS, dtype=F64) for _ in "qkv")
    with torch.no_grad():
        content = encoding.content_state(None, q, k, torch.arange(T))
        got = posbench.model.attention.causal_attention(
            q, k, v, torch.arange(T), encoding, content=content
        )
        expected = reference_attention(encoding, q, k, v)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_in_a_window_the_network_sees_the_keys_in_view_whatever_the_blocks(monkeypatch):
    encoding = dape("alibi")
    encoding.window = 5
    q, k, v = (torch.randn(B, H, T, HS, dtype=F64) for _ in "qkv")
    outputs = []
    for block in (4, 64):
        use_query_blocks(block, monkeypatch)
        content = encoding.content_state(None, q, k, torch.arange(T))
        with torch.no_grad():
            outputs.append(
                posbench.model.attention.causal_attention(
                    q, k, v, torch.arange(T), encoding, content=content
                )
            )
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=1e-12)


def test_every_layer_has_its_own_network_and_each_gets_a_gradient():
    model = build_model(
        {"n_layer": 3, "n_head": 2, "d_model": 16}, {"name": "kerple", "dape": True}
    )
    networks = {id(e.dape) for e in model.layer_encodings}
    assert len(networks) == 3
    model(torch.randint(256, (2, 12))).square().mean().backward()
    for encoding in model.layer_encodings:
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoding.parameters())


@pytest.mark.parametrize("name", ["kerple", "fire"])
def test_a_training_forward_computes_each_layers_table_of_distances_once(name, monkeypatch):
    # The network's pieces and attention's blocks read one table per layer: the content state's
    # (its MLP's forward and backward, for FIRE, once, not once for each).
    model = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, {"name": name, "dape": True})
    encoding_type = type(model.encoding)
    calls = []
    consecutive_bias = encoding_type.consecutive_bias

    def counted(self, positions):
        calls.append(id(self))
        return consecutive_bias(self, positions)

    monkeypatch.setattr(encoding_type, "consecutive_bias", counted)
    model.train()(torch.randint(256, (2, 12))).square().mean().backward()
    assert sorted(calls) == sorted(id(e) for e in model.layer_encodings)


def test_without_dape_the_encodings_weights_and_paths_are_as_before():
    for name in ("alibi", "kerple", "fire"):
        encoding = build_encoding({"name": name}, 16, 2)
        assert not encoding.has_content_bias and not encoding.per_layer
        assert not any(key.startswith("dape") for key in encoding.state_dict())


def test_a_cached_decode_gives_the_recomputed_logits():
    cached, recomputed = cached_and_recomputed(
        random_model({"name": "alibi", "dape": True}), torch.arange(14)
    )
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=1e-5)


def test_a_run_trains_and_evaluates_from_the_config(tiny, tmp_path):
    overrides = ["encoding=fire", "encoding.dape=true", *tiny, "train.steps=4", "train.val_every=4"]
    results = train(compose_config(overrides), tmp_path)
    assert math.isfinite(results["train"]["final_loss"])
    assert [math.isfinite(record["ppl"]) for record in results["eval"]] == [True] * 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dape_kernel": 2}, "dape_kernel must be a positive odd number"),
        ({"dape_width": 0}, "dape_width must be positive"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(PosbenchError, match=message):
        build_encoding({"name": "alibi", "dape": True, **options}, 16, 2)


def test_attending_both_ways_is_refused():
    # The network reads the causal logits of past keys: alibi's two-sided form is not DAPE's.
    with pytest.raises(PosbenchError, match=r"model\.causal=false needs an encoding"):
        build_model({"n_head": 2, "d_model": 16, "causal": False}, {"name": "alibi", "dape": True})
