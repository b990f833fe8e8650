"""Randomized positional encodings (Ruoss et al. 2023, train.random_positions): training
sequences sit at sorted random subsets of [0, N); evaluation uses 0..L-1."""

import pytest
import torch
from test_checkpoint import SHORT, assert_same_run, at_batch, crash

from posbench.config import compose_config, validate
from posbench.data import sample_positions
from posbench.encodings import build_encoding, encoding_names
from posbench.errors import PosbenchError
from posbench.model import ModelArgs, Transformer, build_model
from posbench.train import train

SMALL = ModelArgs(n_layer=1, n_head=2, d_model=16)


@pytest.mark.parametrize(("n", "length"), [(64, 16), (16, 16), (1000, 3)])
def test_each_sequence_gets_a_sorted_subset_of_distinct_positions_below_n(n, length):
    positions = sample_positions(n, 5, length, torch.Generator().manual_seed(0))
    assert positions.shape == (5, length) and positions.dtype == torch.long
    for row in positions.tolist():
        assert row == sorted(set(row))
    assert 0 <= positions.min() and positions.max() < n


def test_sampled_positions_follow_the_generator_differ_per_sequence_and_cover_the_range():
    draws = sample_positions(64, 50, 16, torch.Generator().manual_seed(0))
    assert torch.equal(draws, sample_positions(64, 50, 16, torch.Generator().manual_seed(0)))
    assert len({tuple(row) for row in draws.tolist()}) == 50
    assert draws.min() == 0 and draws.max() == 63
    # Uniform over subsets: every position is in a subset with probability 16/64.
    many = sample_positions(64, 4000, 16, torch.Generator().manual_seed(1))
    share = torch.bincount(many.flatten(), minlength=64) / 4000
    assert share.sub(0.25).abs().max() < 0.05


def test_the_model_gives_its_encoding_the_positions_it_is_given(monkeypatch):
    model = Transformer(SMALL, build_encoding({"name": "none"}, SMALL.d_model, SMALL.n_head))
    seen = []
    for hook in ("embed", "rotate", "score_bias"):
        original = getattr(model.encoding, hook)

        def recording(*args, original=original):
            seen.extend(a for a in args if a.dtype == torch.long)  # the position arguments
            return original(*args)

        monkeypatch.setattr(model.encoding, hook, recording)
    positions = torch.tensor([2, 5, 6, 40])
    model(torch.zeros(1, 4, dtype=torch.long), positions)
    assert len(seen) >= 1 + 2 * SMALL.n_layer
    assert all(torch.equal(p, positions) for p in seen)


@pytest.mark.parametrize("name", encoding_names())
@pytest.mark.parametrize("length", [12, 300])  # 300: several query blocks with a score bias
def test_one_row_of_positions_per_sequence_equals_each_sequence_alone(name, length):
    """Positions (B, T) through every encoding hook (embed, rotate, score_bias) and attention
    path: row b of the batch gives what sequence b alone gives at its own positions (T,)."""
    torch.manual_seed(0)
    config = {"name": name, "max_length": 1024} if name == "learned" else {"name": name}
    model = Transformer(SMALL, build_encoding(config, SMALL.d_model, SMALL.n_head)).double()
    tokens = torch.randint(0, 256, (3, length))
    positions = sample_positions(1024, 3, length, torch.Generator().manual_seed(1))
    for training in (True, False):  # with gradients, and the blocked inference path
        model.train(training)
        with torch.set_grad_enabled(training):
            batched = model(tokens, positions)
            alone = [model(tokens[b : b + 1], positions[b]) for b in range(3)]
        torch.testing.assert_close(batched, torch.cat(alone))
    assert not torch.allclose(alone[0], model(tokens[:1])) or name == "none"


def test_a_learned_table_serves_positions_past_the_input_length_up_to_its_rows():
    model = Transformer(SMALL, build_encoding({"name": "learned", "max_length": 64}, 16, 2))
    tokens = torch.zeros(1, 4, dtype=torch.long)
    assert model(tokens, torch.tensor([0, 9, 30, 63])).shape == (1, 4, 256)
    with pytest.raises(PosbenchError, match="64"):
        model(tokens, torch.tensor([0, 9, 30, 64]))


def test_rope_scores_at_shifted_positions_equal_those_at_zero_to_t():
    torch.manual_seed(0)
    model = Transformer(SMALL, build_encoding({"name": "rope"}, 16, 2)).double()
    tokens = torch.randint(0, 256, (2, 12))
    torch.testing.assert_close(model(tokens, torch.arange(100, 112)), model(tokens))


def test_the_learned_table_has_one_row_per_random_position():
    cfg = compose_config(["encoding=learned", "train.seq_len=32", "train.random_positions=256"])
    assert build_model(cfg.model, cfg.encoding).max_length == 256
    plain = compose_config(["encoding=learned", "train.seq_len=32"])
    assert build_model(plain.model, plain.encoding).max_length == 32


def test_fewer_random_positions_than_the_training_length_is_a_one_line_error():
    cfg = compose_config(["train.seq_len=128", "train.random_positions=100"])
    with pytest.raises(PosbenchError, match=r"train\.random_positions \(100\) must be >= ") as info:
        validate(cfg)
    assert "\n" not in str(info.value)


RANDOM = [*SHORT, "encoding=learned", "train.random_positions=64", "eval.lengths=[16,64]"]


@pytest.fixture(scope="module")
def straight_random(tmp_path_factory, cache_dir):
    run_dir = tmp_path_factory.mktemp("straight_random")
    results = train(compose_config([*RANDOM, f"data.cache_dir={cache_dir}"]), run_dir)
    return run_dir, results


def test_training_draws_positions_from_the_range_and_evaluation_uses_zero_to_l(
    straight_random, monkeypatch, cache_dir, tmp_path
):
    used = []
    forward = Transformer.forward

    def recording(self, tokens, positions=None):
        used.append((self.training, positions))
        return forward(self, tokens, positions)

    monkeypatch.setattr(Transformer, "forward", recording)
    train(compose_config([*RANDOM, "train.steps=3", f"data.cache_dir={cache_dir}"]), tmp_path)
    drawn = [p for training, p in used if training]
    batch_size = compose_config(RANDOM).train.batch_size
    assert len(drawn) == 3 and all(p.shape == (batch_size, 16) and p.max() < 64 for p in drawn)
    assert all(len({tuple(row) for row in p.tolist()}) == batch_size for p in drawn)  # per row
    assert any(p.max() >= 16 for p in drawn)  # not 0..15
    assert all(p is None for training, p in used if not training)  # eval: 0..L-1
    _, results = straight_random
    assert [(r["length"], r["status"]) for r in results["eval"]] == [(16, "ok"), (64, "ok")]


def test_a_resumed_random_positions_run_equals_an_uninterrupted_one(
    straight_random, cache_dir, tmp_path, monkeypatch
):
    overrides = [*RANDOM, f"data.cache_dir={cache_dir}"]
    at_batch(monkeypatch, 13, crash)  # after the step-10 checkpoint
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(overrides), tmp_path)
    monkeypatch.undo()
    train(compose_config([*overrides, "train.resume=true"]), tmp_path)
    assert_same_run(tmp_path, straight_random[0])
