"""Evaluation checks memory before it starts a length: it shrinks the batch to what fits and
reports a length that cannot fit at all, instead of being killed halfway.

The available memory is monkeypatched, never exhausted for real.
"""

from __future__ import annotations

import logging

import pytest
import torch

import posbench.evaluation.memory
import posbench.model.attention.fused
from posbench.encodings import EncodingConfig, PositionalEncoding, build_encoding
from posbench.evaluation.longppl import KeyTokens
from posbench.evaluation.memory import available_memory, fitting_batch_size, inference_memory_bytes
from posbench.evaluation.perplexity import evaluate_length
from posbench.model import Transformer, build_model
from posbench.model.args import ModelArgs
from posbench.model.attention.biases import SHARED_BIAS_ELEMENTS
from posbench.model.attention.blocks import MAX_SCORE_ELEMENTS
from posbench.model.position_remap import configured_remap, remapped_positions

CPU = torch.device("cpu")


class PairBias(PositionalEncoding):
    """A bias given per (query, key) pair only (no relative_bias): the general attention path."""

    def score_bias(self, query_positions, key_positions, out=None):
        pairs = (query_positions[:, None] * key_positions[None, :]).float()  # (Tq, Tk)
        return pairs.expand(self.n_head, -1, -1) / 1e6  # (H, Tq, Tk)


def model_with(encoding: str) -> Transformer:
    torch.manual_seed(0)
    args = ModelArgs(n_layer=1, n_head=2, d_model=16)
    if encoding == "pair-bias":
        return Transformer(args, PairBias(EncodingConfig(), 16, 2))
    return Transformer(args, build_encoding({"name": encoding}, 16, 2))


def scratch(encoding: str, length: int) -> int:
    """What a score bias adds to the estimate of one window of ``length`` tokens."""
    without_bias = inference_memory_bytes(model_with("none"), 1, length)
    return inference_memory_bytes(model_with(encoding), 1, length) - without_bias


def allow(monkeypatch, n_bytes: int) -> None:
    monkeypatch.setattr(posbench.evaluation.memory, "available_memory", lambda device: n_bytes)


# --- what is available --------------------------------------------------------------------------


def test_available_cpu_memory_is_meminfos_mem_available(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  24000000 kB\nMemFree:  1000 kB\nMemAvailable:  2048 kB\n")
    monkeypatch.setattr(posbench.evaluation.memory, "MEMINFO", meminfo)
    assert available_memory(CPU) == 2048 * 1024


def test_available_memory_is_unknown_without_meminfo(tmp_path, monkeypatch):
    monkeypatch.setattr(posbench.evaluation.memory, "MEMINFO", tmp_path / "absent")
    assert available_memory(CPU) is None


# --- the estimate -------------------------------------------------------------------------------


def test_estimate_grows_with_batch_and_length():
    model = model_with("alibi")
    assert inference_memory_bytes(model, 2, 512) > inference_memory_bytes(model, 1, 512)
    assert inference_memory_bytes(model, 1, 1024) > inference_memory_bytes(model, 1, 512)


def test_general_bias_attention_scratch_stays_bounded_at_long_lengths():
    # A query block's scratch and the blocks' biases the layers share, besides q, k, v cast up
    # to float32 for bf16 on a CPU (3 per channel of a token, counted twice for a 16-bit model).
    cast_up = 6 * 65536 * model_with("pair-bias").args.d_model
    bound = (6 * MAX_SCORE_ELEMENTS + SHARED_BIAS_ELEMENTS + cast_up) * 4
    assert 0 < scratch("pair-bias", 65536) <= bound


@pytest.mark.parametrize("encoding", ["alibi", "t5", "kerple", "sandwich"])
def test_distance_bias_attention_scratch_grows_with_the_length_not_its_square(encoding):
    assert 0 < scratch(encoding, 65536) <= 2 * scratch(encoding, 32768)
    assert scratch(encoding, 65536) < scratch("pair-bias", 65536)


def test_key_bias_attention_scratch_on_a_cpu_holds_no_scores():
    # q, k, v with the bias's dimension and the blocks' outputs: nothing of (T, T) at any length.
    assert 0 < scratch("fox", 16384) < MAX_SCORE_ELEMENTS
    assert scratch("fox", 65536) <= 4 * scratch("fox", 16384)


def test_key_bias_attention_scratch_without_log_sum_exps_is_the_blocked_paths(monkeypatch):
    # Past KEY_BIAS_LENGTH a device whose kernel returns no log-sum-exps takes the blocked path.
    fused = scratch("fox", 16384)
    monkeypatch.setattr(posbench.model.attention.fused, "LOG_SUM_EXP_DEVICES", frozenset())
    assert scratch("fox", 16384) > MAX_SCORE_ELEMENTS > fused
    assert scratch("fox", 2048) < MAX_SCORE_ELEMENTS  # up to it, one fused call on any device


@pytest.mark.parametrize("encoding", ["alibi", "t5", "kerple", "sandwich", "path"])
def test_default_model_at_16k_tokens_is_estimated_under_2_gb(encoding):
    model = build_model({}, {"name": encoding})  # ModelArgs' defaults are model=tiny
    assert inference_memory_bytes(model, 1, 16384) < 2e9


# --- choosing the batch -------------------------------------------------------------------------


def test_the_requested_batch_is_kept_when_it_fits(monkeypatch):
    model = model_with("alibi")
    allow(monkeypatch, inference_memory_bytes(model, 8, 256))
    assert fitting_batch_size(model, 256, 8, CPU) == (8, None)


def test_a_batch_that_does_not_fit_shrinks_to_the_largest_that_does(monkeypatch, caplog):
    model = model_with("alibi")
    allow(monkeypatch, inference_memory_bytes(model, 3, 256) + 1)
    with caplog.at_level(logging.WARNING):
        assert fitting_batch_size(model, 256, 8, CPU) == (3, None)
    assert "batch size 8 -> 3" in caplog.text


def test_a_length_where_one_window_does_not_fit_gets_a_one_line_reason(monkeypatch):
    model = model_with("alibi")
    allow(monkeypatch, inference_memory_bytes(model, 1, 256) - 1)
    batch, reason = fitting_batch_size(model, 256, 8, CPU)
    assert batch == 0
    assert "one window of 256 tokens needs" in reason and "\n" not in reason


def test_unknown_available_memory_keeps_the_requested_batch(monkeypatch):
    allow(monkeypatch, None)
    assert fitting_batch_size(model_with("none"), 256, 8, CPU) == (8, None)


# --- in evaluation ------------------------------------------------------------------------------


def test_evaluation_records_a_length_that_cannot_fit_as_unsupported_without_running(monkeypatch):
    model = model_with("t5")
    allow(monkeypatch, 1000)
    monkeypatch.setattr(model, "forward", lambda tokens: pytest.fail("the model ran"))
    record = evaluate_length(model, torch.randint(0, 256, (5000,)), 1024)
    assert record["status"] == "unsupported" and record["ppl"] is None
    assert "needs about" in record["reason"]


def test_a_shrunken_batch_gives_the_same_perplexity(monkeypatch):
    model = model_with("kerple")
    tokens = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(1))
    expected = evaluate_length(model, tokens, 64, batch_size=16)
    allow(monkeypatch, inference_memory_bytes(model, 2, 64))
    assert evaluate_length(model, tokens, 64, batch_size=16)["ppl"] == pytest.approx(
        expected["ppl"], rel=1e-6
    )


# --- queries and keys wider than the values, and LongPPL's evaluator ----------------------------


def test_pope_and_a_remap_add_their_doubled_queries_and_keys_to_the_estimate():
    """PoPE's q, k and the values padded to their width and its output: 4*C per token more
    than RoPE; Self-Extend's [near | far] q and k and its two merged calls: more again."""
    length, C = 4096, 16
    rope, pope = model_with("rope"), model_with("pope")
    plain = inference_memory_bytes(rope, 1, length)
    assert inference_memory_bytes(pope, 1, length) - plain == length * 4 * C * 4
    remap = configured_remap("self_extend", {"group": 8, "window": 32}, None, 128)
    with remapped_positions(rope, remap):
        assert inference_memory_bytes(rope, 1, length) - plain >= length * 8 * C * 4


def test_longppl_counts_its_evaluators_passes_in_the_batch_that_fits(monkeypatch):
    model = model_with("alibi")
    evaluator = KeyTokens(model_with("none"), 16)
    allow(monkeypatch, inference_memory_bytes(model, 8, 256))
    batch, _ = fitting_batch_size(model, 256, 8, CPU, then=evaluator.memory_bytes)
    assert evaluator.memory_bytes(8, 256) > inference_memory_bytes(model, 8, 256) and batch < 8
    assert evaluator.memory_bytes(8, 16) == 0  # no window is long: no key token, no pass
