"""FIRE (Li et al. 2023): the bias formula, its shift behaviour, what it can express, and how
it is trained and evaluated.

Expected biases are computed here entry by entry with ``math`` from the paper's definition,
b_h(i, j) = f(psi(i - j) / psi(max(L, i))) with psi(x) = log(c x + 1) and f the MLP written out.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

from posbench.config import compose_config
from posbench.encodings import alibi_slopes, build_encoding
from posbench.encodings.fire import FireRelativeBias
from posbench.errors import PosbenchError
from posbench.evaluation.memory import inference_memory_bytes
from posbench.model import build_model
from posbench.runs.directory import WEIGHTS_FILE, load_weights, save_weights
from posbench.training.checkpoint import TrainProgress, restore_checkpoint
from posbench.training.train import make_optimizer

F64 = torch.float64


def fire(threshold: float = 16.0, c: float = 0.5, n_head: int = 2, seed: int = 0):
    """A float64 FIRE encoding whose MLP weights are random and large enough to matter."""
    torch.manual_seed(seed)
    encoding = build_encoding(
        {"name": "fire", "threshold": threshold, "c": c}, d_model=8 * n_head, n_head=n_head
    ).double()
    with torch.no_grad():
        for parameter in encoding.mlp.parameters():
            parameter.normal_(std=1.0)
    return encoding


def mlp_by_hand(encoding, x: float) -> list[float]:
    """f(x) = W2 relu(W1 x + b1) + b2, one value per head."""
    w1, b1 = encoding.mlp[0].weight[:, 0].tolist(), encoding.mlp[0].bias.tolist()
    w2, b2 = encoding.mlp[2].weight.tolist(), encoding.mlp[2].bias.tolist()
    hidden = [max(0.0, w * x + b) for w, b in zip(w1, b1, strict=True)]
    rows = zip(w2, b2, strict=True)
    return [sum(w * h for w, h in zip(row, hidden, strict=True)) + b for row, b in rows]


def bias_by_hand(encoding, i: int, j: int) -> list[float]:
    c, L = encoding.c.item(), encoding.threshold.item()
    psi = lambda x: math.log(c * x + 1)  # noqa: E731
    return mlp_by_hand(encoding, psi(i - j) / psi(max(L, i)))


def test_bias_is_the_mlp_of_the_log_distance_over_the_log_of_max_threshold_and_query():
    encoding = fire(threshold=16.0, c=0.5)
    queries, keys = [0, 5, 16, 40, 300], [0, 3, 5, 16, 39, 300]
    bias = encoding.score_bias(torch.tensor(queries), torch.tensor(keys))
    for a, i in enumerate(queries):
        for b, j in enumerate(keys):
            if j <= i:  # future keys are masked by the model; their bias is never read
                assert bias[:, a, b].tolist() == pytest.approx(bias_by_hand(encoding, i, j))


def test_below_the_threshold_the_bias_depends_only_on_the_relative_distance():
    encoding = fire(threshold=100.0)
    base = encoding.score_bias(torch.arange(30), torch.arange(30))
    shifted = encoding.score_bias(torch.arange(60, 90), torch.arange(60, 90))  # all i <= L
    torch.testing.assert_close(shifted.tril(), base.tril(), rtol=0, atol=1e-12)


def test_past_the_threshold_distances_are_read_relative_to_the_query_position():
    # Progressive interpolation: the first key is at normalised distance 1 from every query
    # past L, so its bias is f(1) at 2x, 10x or 100x the threshold alike; shifting a pair no
    # longer keeps its bias.
    encoding = fire(threshold=10.0)
    queries = torch.tensor([10, 20, 100, 1000])
    bias = encoding.score_bias(queries, torch.tensor([0]))[:, :, 0]  # (H, 4)
    for column in range(4):
        assert bias[:, column].tolist() == pytest.approx(mlp_by_hand(encoding, 1.0))
    near = encoding.score_bias(torch.tensor([20]), torch.tensor([15]))
    far = encoding.score_bias(torch.tensor([200]), torch.tensor([195]))
    assert not torch.allclose(near, far)


def test_fire_can_express_an_alibi_bias():
    # The paper's Theorem 3.1: with L past every position, FIRE reduces to a learned function
    # of the distance, which an ALiBi slope is. A few hundred Adam steps on f_theta and c fit
    # the ALiBi bias of 4 heads over 64 positions to within 3% of its range.
    torch.manual_seed(0)
    encoding = build_encoding({"name": "fire", "threshold": 64.0}, d_model=32, n_head=4)
    encoding.threshold_scale.requires_grad_(False)
    positions = torch.arange(64)
    distance = (positions[:, None] - positions[None, :]).clamp(min=0).float()
    target = -alibi_slopes(4).float()[:, None, None] * distance  # (H, T, T)
    causal = distance.new_ones(64, 64).tril().bool()
    optimizer = torch.optim.Adam(encoding.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 600)
    for _ in range(600):
        error = (encoding.score_bias(positions, positions) - target)[:, causal]
        loss = error.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        worst = (encoding.score_bias(positions, positions) - target)[:, causal].abs().max()
    assert worst.item() < 0.03 * target.abs().max().item()


def test_the_bias_is_finite_and_bounded_at_lengths_far_past_training():
    encoding = fire(threshold=128.0)
    positions = torch.arange(0, 50_000, 997)
    bias = encoding.score_bias(positions, positions)
    assert torch.isfinite(bias).all()
    # inputs lie in [0, 1] for past keys, so the bias stays within f's range on [0, 1]
    inputs = encoding.relative_inputs(positions, positions)
    assert inputs.min().item() >= 0 and inputs.max().item() <= 1 + 1e-12


class LargestTensor(TorchDispatchMode):
    """Records the most elements any operation produced while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_no_intermediate_of_the_bias_outgrows_the_bias_the_memory_estimate_budgets():
    # posbench.evaluation.memory.inference_memory_bytes budgets a few (H, Tq, Tk) tensors per query
    # block; f_theta's hidden layer (width values per pair) must stay within one of them.
    encoding = fire(threshold=16.0, n_head=2)
    with torch.inference_mode(), LargestTensor() as recorder:
        bias = encoding.score_bias(torch.arange(300, 400), torch.arange(400))
    assert recorder.largest <= bias.numel()


def inputs_by_formula(
    encoding, queries: torch.Tensor, keys: torch.Tensor, threshold: float | None = None
) -> torch.Tensor:
    """psi(i - j) / psi(max(L, i)) over the (..., Tq, Tk) grid of positions, written out, with
    the encoding's L unless ``threshold`` is given."""
    c = encoding.c
    threshold = encoding.threshold if threshold is None else torch.tensor(threshold, dtype=F64)
    distance = (queries[..., :, None] - keys[..., None, :]).clamp(min=0).to(F64)
    horizon = torch.maximum(queries.to(F64), threshold)[..., None]
    return torch.log1p(c * distance) / torch.log1p(c * horizon)


def mlp_bias(encoding, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The bias from f_theta's layers as written ([B,] H, Tq, Tk)."""
    return encoding.mlp(inputs_by_formula(encoding, queries, keys)[..., None]).movedim(-1, -3)


def switching_inside(encoding):
    """Puts every hidden unit's switch point inside (0, 1), where the inputs of past keys lie:
    the most segments a block of queries can cross (units alternately rising and falling)."""
    width = encoding.mlp[0].out_features
    with torch.no_grad():
        w = torch.ones(width, dtype=F64)
        w[1::2] = -1.0
        encoding.mlp[0].weight[:, 0] = w
        encoding.mlp[0].bias.copy_(-w * torch.linspace(0.02, 0.98, width, dtype=F64))
    return encoding


def sorted_subsets(rows: int, size: int, limit: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.stack(
        [torch.randperm(limit, generator=generator)[:size].sort().values for _ in range(rows)]
    )


POSITION_LAYOUTS = {  # (queries, keys): the blocks attention asks for, and other layouts
    "below and past L": (torch.arange(5, 90), torch.arange(90)),
    "a block far past L": (torch.arange(300, 364), torch.arange(364)),
    "sparse queries": (torch.tensor([3, 17, 40, 41, 90, 200]), torch.arange(201)),
    "sparse keys": (torch.arange(50, 60), torch.arange(0, 60, 3)),
    "one row per sequence": (sorted_subsets(2, 40, 500, 1), sorted_subsets(2, 50, 500, 2)),
}


@pytest.mark.parametrize("layout", POSITION_LAYOUTS)
@pytest.mark.parametrize("switches", ["random", "inside"])
@pytest.mark.parametrize("seed", range(3))
def test_the_bias_from_f_thetas_segments_equals_the_mlp_and_so_do_its_gradients(
    layout, switches, seed
):
    encoding = fire(threshold=16.0, seed=seed)
    with torch.no_grad():  # some units that never switch, and some with w = 0
        encoding.mlp[0].weight[:3] = 0.0
        encoding.mlp[0].bias[3] = 40.0
    if switches == "inside":
        switching_inside(encoding)
    queries, keys = POSITION_LAYOUTS[layout]
    by_segments, by_mlp = encoding.score_bias(queries, keys), mlp_bias(encoding, queries, keys)
    torch.testing.assert_close(by_segments, by_mlp, rtol=0, atol=1e-12)
    weights = torch.randn(by_mlp.shape, dtype=F64)
    parameters = list(encoding.parameters())
    got = torch.autograd.grad((by_segments * weights).sum(), parameters)
    expected = torch.autograd.grad((by_mlp * weights).sum(), parameters)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_the_bias_is_written_to_out_when_given_one():
    encoding = switching_inside(fire(threshold=16.0))
    queries, keys = torch.arange(300, 364), torch.arange(364)
    out = torch.full((2, 64, 364), float("nan"), dtype=F64)
    with torch.no_grad():
        bias = encoding.score_bias(queries, keys, out=out)
        assert bias.data_ptr() == out.data_ptr()
        torch.testing.assert_close(bias, mlp_bias(encoding, queries, keys), rtol=0, atol=1e-12)


def test_the_inputs_of_consecutive_keys_equal_the_formula():
    # Consecutive keys read psi from one row of distances; other keys from the grid.
    encoding = fire(threshold=16.0, c=0.3)
    for queries, keys in POSITION_LAYOUTS.values():
        torch.testing.assert_close(
            encoding.relative_inputs(queries, keys),
            inputs_by_formula(encoding, queries, keys),
            rtol=1e-15,
            atol=0,
        )


def test_below_the_threshold_the_consecutive_bias_is_the_bias_at_each_distance():
    encoding = fire(threshold=40.0)
    full = encoding.score_bias(torch.arange(30), torch.arange(30))  # (H, 30, 30)
    by_distance = encoding.consecutive_bias(torch.arange(30))  # (H, 30)
    for i in range(30):
        torch.testing.assert_close(full[:, i, : i + 1], by_distance[:, : i + 1].flip(1))
    assert encoding.consecutive_bias(torch.arange(11, 41)) is not None  # i <= L everywhere
    assert encoding.consecutive_bias(torch.arange(12, 42)) is None  # query 41 is past L


def test_under_bf16_autocast_the_bias_is_computed_in_float32_on_either_path():
    # As every other bias of positions is (T5's table, KERPLE's, ALiBi's): autocast's bf16
    # matmuls rounded f_theta's table (consecutive_bias) and its segments (score_bias) to 8 bits.
    encoding = fire(threshold=16.0).float()
    at, past = torch.arange(16), torch.arange(40)  # within L (a table) and past it
    expected = encoding.consecutive_bias(at), encoding.score_bias(past, past)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = encoding.consecutive_bias(at), encoding.score_bias(past, past)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_below_the_threshold_either_attention_path_gives_the_same_output_and_gradients(
    monkeypatch,
):
    torch.manual_seed(0)
    model = build_model(
        {"n_layer": 1, "d_model": 16, "n_head": 2}, {"name": "fire", "threshold": 30.0}
    ).double()
    tokens = torch.randint(0, 256, (2, 24))
    assert model.encoding.consecutive_bias(torch.arange(24)) is not None

    def output_and_gradients():
        model.zero_grad()
        logits = model(tokens)
        logits.logsumexp(-1).sum().backward()
        return [logits, *(p.grad.clone() for p in model.parameters())]

    chosen = output_and_gradients()
    monkeypatch.setattr(type(model.encoding), "consecutive_bias", lambda self, positions: None)
    general = output_and_gradients()  # every block's (H, Tq, Tk) bias from score_bias
    for a, b in zip(chosen, general, strict=True):
        torch.testing.assert_close(a, b)


def test_the_model_evaluation_memory_estimate_counts_fire_as_a_score_bias():
    fire_model = build_model({}, {"name": "fire", "threshold": 128.0})
    plain = build_model({}, {"name": "none"})
    assert inference_memory_bytes(fire_model, 1, 4096) > inference_memory_bytes(plain, 1, 4096)


@pytest.mark.parametrize("per_layer", [False, True])
def test_every_fire_parameter_learns_and_none_is_weight_decayed(per_layer):
    cfg = compose_config(["encoding=fire", "train.seq_len=32", f"encoding.per_layer={per_layer}"])
    model = build_model(cfg.model, cfg.encoding)
    decayed, _plain = make_optimizer(model, cfg.train).param_groups
    fire = [p for encoding in set(model.layer_encodings) for p in encoding.parameters()]
    assert fire and not {id(p) for p in fire} & {id(p) for p in decayed["params"]}
    model(torch.randint(0, 256, (2, 24))).logsumexp(-1).sum().backward()  # every query below L
    for encoding in model.layer_encodings:
        for name, parameter in encoding.named_parameters():
            assert parameter.grad is not None and (parameter.grad != 0).any(), name


def test_the_threshold_starts_at_the_training_length():
    cfg = compose_config(["encoding=fire", "train.seq_len=96"])
    assert build_model(cfg.model, cfg.encoding).encoding.threshold.item() == 96.0


def rising_fire(threshold: float):
    """A FIRE whose f_theta rises over [0, 1] and switches nowhere there (every unit is
    relu(x + 1)): the closer its L to another's, the closer their biases."""
    encoding = fire(threshold=threshold)
    with torch.no_grad():
        encoding.mlp[0].weight.fill_(1.0)
        encoding.mlp[0].bias.fill_(1.0)
        encoding.mlp[2].weight.abs_()
    return encoding


def threshold_after_fitting(encoding, target: torch.Tensor, steps: int) -> float:
    """L after ``steps`` Adam steps at lr 3e-3 (the default train.lr) on the squared error of
    the bias of queries 0..191 to ``target``, with f_theta and c fixed."""
    positions = torch.arange(192)
    causal = torch.ones(192, 192).tril().bool()
    encoding.mlp.requires_grad_(False)
    encoding.c.requires_grad_(False)
    trained = [p for p in encoding.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=3e-3)
    for _ in range(steps):
        loss = (encoding.score_bias(positions, positions) - target)[:, causal].square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return encoding.threshold.item()


def test_the_threshold_learns_a_value_far_from_its_start_which_l_itself_could_not(monkeypatch):
    # The bias of a FIRE with L = 64 is the target of the same FIRE started at L = 128. 300 Adam
    # steps at lr 3e-3 bring the multiplier from 1 to about 0.5; L itself as the parameter
    # moves by at most about 300 * 3e-3 = 0.9, under 1%.
    with torch.no_grad():
        target = rising_fire(threshold=64.0).score_bias(torch.arange(192), torch.arange(192))
    assert threshold_after_fitting(rising_fire(128.0), target, 300) == pytest.approx(64, rel=0.05)

    raw = torch.nn.Parameter(torch.tensor(128.0, dtype=F64))  # the threshold as it was learned
    monkeypatch.setattr(FireRelativeBias, "threshold", property(lambda self: raw.clamp(min=1.0)))
    assert threshold_after_fitting(rising_fire(128.0), target, 300) > 0.99 * 128.0


def with_threshold_itself(state: dict[str, torch.Tensor], saved: float) -> dict:
    """``state`` in the layout of the weights written before the multiplier: L itself as
    ``encoding.threshold``, no ``encoding.threshold_scale``."""
    state = dict(state)
    del state["encoding.threshold_scale"]
    state["encoding.threshold"] = torch.tensor(saved)
    return state


SAVED_THRESHOLD = 83.7  # a trained L below the training length


@pytest.mark.parametrize("initial", [128.0, 96.0])  # L0 a power of two, and not
def test_a_weights_file_holding_the_threshold_itself_loads_with_that_threshold(tmp_path, initial):
    model = build_model(
        {"n_layer": 1, "d_model": 16, "n_head": 2}, {"name": "fire", "threshold": initial}
    )
    path = save_weights(tmp_path, model)
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    save_file(with_threshold_itself(load_file(path), SAVED_THRESHOLD), path, metadata=metadata)
    encoding = load_weights(tmp_path / WEIGHTS_FILE).encoding
    saved = torch.tensor(SAVED_THRESHOLD)  # float32, as saved
    last_bit = 0.0 if initial == 128.0 else torch.finfo(torch.float32).eps * SAVED_THRESHOLD
    assert abs(encoding.threshold.item() - saved.item()) <= last_bit
    queries, keys = torch.arange(60, 120), torch.arange(120)  # below and past L
    inputs = inputs_by_formula(encoding, queries, keys, saved.item()).float()
    with torch.no_grad():
        expected = encoding.mlp(inputs[..., None]).movedim(-1, -3)  # (H, Tq, Tk)
        torch.testing.assert_close(encoding.score_bias(queries, keys), expected)


def test_a_training_checkpoint_holding_the_threshold_itself_resumes_with_that_threshold():
    cfg = compose_config(["encoding=fire", "train.seq_len=128"])
    model = build_model(cfg.model, cfg.encoding)
    state = {
        "model": with_threshold_itself(model.state_dict(), SAVED_THRESHOLD),
        "optimizer": make_optimizer(model, cfg.train).state_dict(),
        "sampler": torch.Generator().get_state(),
        "progress": {"step": 40},
    }
    resumed = build_model(cfg.model, cfg.encoding)
    progress = restore_checkpoint(
        state, resumed, make_optimizer(resumed, cfg.train), torch.Generator()
    )
    assert progress == TrainProgress(step=40)
    assert resumed.encoding.threshold.item() == torch.tensor(SAVED_THRESHOLD).item()


@pytest.mark.parametrize("key", ["width", "c", "threshold"])
def test_non_positive_options_are_one_line_errors(key):
    with pytest.raises(PosbenchError, match=rf"encoding\.{key} must be positive"):
        build_encoding({"name": "fire", key: 0}, d_model=16, n_head=2)


THREE_LAYERS = {"n_layer": 3, "d_model": 16, "n_head": 2}


def test_one_fire_serves_every_layer_by_default():
    model = build_model(THREE_LAYERS, {"name": "fire"})
    assert all(encoding is model.encoding for encoding in model.layer_encodings)


def test_per_layer_fire_gives_every_layer_an_encoding_of_its_own():
    torch.manual_seed(0)
    model = build_model(THREE_LAYERS, {"name": "fire", "per_layer": True})
    encodings = model.layer_encodings
    assert len(set(encodings)) == 3
    assert not torch.equal(encodings[0].mlp[0].weight, encodings[1].mlp[0].weight)
    received = []
    for block in model.blocks:  # the encoding each layer's attention is called with
        block.attn.register_forward_pre_hook(lambda module, args: received.append(args[2]))
    model(torch.randint(0, 256, (1, 8)))
    assert received == encodings


@pytest.mark.parametrize("gradients", [True, False])
def test_per_layer_fire_past_its_threshold_attends_in_each_layer_with_that_layers_bias(gradients):
    # Past L each query block's bias is built for the block; in evaluation the layers of one
    # shared FIRE reuse them, which layers with FIREs of their own must not.
    torch.manual_seed(0)
    model = build_model(THREE_LAYERS, {"name": "fire", "per_layer": True, "threshold": 8.0})
    model = model.double()
    with torch.no_grad():
        for parameter in model.deeper_encodings.parameters():  # far from the first layer's
            parameter.normal_(std=1.0)
    tokens, positions = torch.randint(0, 256, (2, 40)), torch.arange(40)
    with torch.set_grad_enabled(gradients):
        logits = model(tokens)
        x = model.token_embedding(tokens)
        for block, encoding in zip(model.blocks, model.layer_encodings, strict=True):
            x = block(x, positions, encoding)  # the query blocks' biases of this layer alone
        torch.testing.assert_close(logits, model.lm_head(model.ln_final(x)))


def test_a_per_layer_fire_model_reloads_with_every_layers_encoding(tmp_path):
    torch.manual_seed(0)
    model = build_model(THREE_LAYERS, {"name": "fire", "per_layer": True, "threshold": 8.0})
    save_weights(tmp_path, model)
    loaded = load_weights(tmp_path / WEIGHTS_FILE)
    assert len(set(loaded.layer_encodings)) == 3
    tokens = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
