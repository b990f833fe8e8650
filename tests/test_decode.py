"""Greedy decoding of task answers (posbench/evaluation/decode.py) and the key-value cache it
decodes with (posbench/model/kv_cache.py): a cached step's logits are the recomputed ones, for every
encoding and option, and the scores are those of the model's own answers."""

import json

import pytest
import torch
from conftest import TINY_TASK_RUN

from posbench.cli import main
from posbench.config import compose_config
from posbench.data import load_data
from posbench.data.task import Examples
from posbench.encodings.registry import encoding_names
from posbench.evaluation import task_accuracy
from posbench.evaluation.decode import NOT_DECODED, greedy_decode
from posbench.evaluation.positions import RandomPositions
from posbench.evaluation.task_accuracy import evaluate_task_length
from posbench.model import Transformer, build_model
from posbench.model.kv_cache import DecodeCache
from posbench.model.random_positions import PositionDraw, PositionSampler
from posbench.training.train import train

B, T, PROMPT = 3, 14, 5  # sequences, tokens, the tokens cached at once before the steps
ATOL = 1e-5  # cached and recomputed logits agree to this in fp32
# Every layer encoding a hybrid can schedule in turn, its positional layers in a window of 3.
HYBRID = {"name": "hybrid", "layers": ["rope", "alibi", "fox", "none"], "window": 3}


def random_model(encoding: dict, n_layer: int = 2, **model) -> Transformer:
    """A small model in fp32 whose every weight is random (CoPE's embedding, FoX's gate bias
    and T5's buckets start at zero or near it: a cache that dropped them would still agree)."""
    torch.manual_seed(0)
    args = {"n_layer": n_layer, "n_head": 2, "d_model": 16, **model}
    model = build_model(args, encoding).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def cached_and_recomputed(
    model: Transformer,
    positions: torch.Tensor,
    cached: PositionDraw | None = None,
    distances: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits (B, T - PROMPT, vocab) of random tokens at ``positions`` (T,), (B, T) or
    (n_layer, B, T) and randomized ``distances`` (None, (B, T) or (n_layer, B, T)) at each step
    after the first PROMPT tokens: with the cache (of the ``cached`` draw, by default the same),
    one token a step, and recomputed from the whole prefix."""
    tokens = torch.randint(256, (B, T), generator=torch.Generator().manual_seed(1))
    cached = cached or PositionDraw(positions, distances)
    cache = DecodeCache(cached.positions, len(model.blocks), cached.distances)
    with torch.inference_mode():
        model(tokens[:, :PROMPT], cache=cache)
        steps = [model(tokens[:, t : t + 1], cache=cache)[:, -1] for t in range(PROMPT, T)]
        recomputed = [
            model(tokens[:, :end], positions[..., :end], distances=prefix(distances, end))[:, -1]
            for end in range(PROMPT + 1, T + 1)
        ]
    return torch.stack(steps, 1), torch.stack(recomputed, 1)


def prefix(draw: torch.Tensor | None, end: int) -> torch.Tensor | None:
    """A draw's first ``end`` tokens (None: no draw)."""
    return None if draw is None else draw[..., :end]


def random_positions(rows: int | None = None) -> torch.Tensor:
    """Sorted distinct positions from [0, 64): (T,), or one row each for ``rows``."""
    generator = torch.Generator().manual_seed(2)
    draws = [torch.randperm(64, generator=generator)[:T].sort().values for _ in range(rows or 1)]
    return torch.stack(draws) if rows else draws[0]


def sampled(mode: str, n_layer: int, per_layer: bool = True) -> PositionDraw:
    """Randomized positions or distances from [0, 64) as training draws them, for B rows of
    T, T - 4 and PROMPT + 2 tokens (the padding after a row repeats its last position): a draw
    per layer, (n_layer, B, T), or (B, T) for all."""
    sampler = PositionSampler(64, n_layer, per_layer, mode)
    lengths = torch.tensor([T, T - 4, PROMPT + 2])
    return sampler.draw(lengths, T, torch.Generator().manual_seed(3))


def encoding_config(name: str) -> dict:
    return HYBRID if name == "hybrid" else {"name": name}


@pytest.mark.parametrize("name", encoding_names())
def test_cached_decode_steps_give_the_recomputed_logits_for_every_encoding(name):
    cached, recomputed = cached_and_recomputed(random_model(encoding_config(name)), torch.arange(T))
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", [n for n in encoding_names() if n != "learned"])
def test_cached_decode_steps_give_the_recomputed_logits_at_randomized_positions(name):
    model = random_model(encoding_config(name))
    cached, recomputed = cached_and_recomputed(model, random_positions(rows=B))
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", [n for n in encoding_names() if n != "learned"])
def test_cached_decode_steps_give_the_recomputed_logits_at_per_layer_random_positions(name):
    # Each layer attends at its own draw, the embedding at the first layer's.
    model = random_model(encoding_config(name), n_layer=3)
    cached, recomputed = cached_and_recomputed(model, sampled("positions", 3).positions)
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=ATOL)


@pytest.mark.parametrize("per_layer", [True, False], ids=["per_layer", "shared"])
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich"])
def test_cached_decode_steps_give_the_recomputed_logits_at_randomized_distances(name, per_layer):
    model = random_model({"name": name}, n_layer=3)
    distances = sampled("distances", 3, per_layer).distances
    cached, recomputed = cached_and_recomputed(model, torch.arange(T), distances=distances)
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=ATOL)


def test_the_comparison_fails_for_a_cache_with_another_layers_positions_or_distances():
    positions = sampled("positions", 3).positions  # (3, B, T)
    model = random_model({"name": "rope"}, n_layer=3)
    swapped = PositionDraw(positions.flip(0))  # layer 0 at layer 2's draw, and back
    cached, recomputed = cached_and_recomputed(model, positions, swapped)
    assert not torch.allclose(cached, recomputed, rtol=0, atol=ATOL)
    distances = sampled("distances", 3).distances
    model = random_model({"name": "alibi"}, n_layer=3)
    swapped = PositionDraw(torch.arange(T), distances.flip(0))
    cached, recomputed = cached_and_recomputed(model, torch.arange(T), swapped, distances)
    assert not torch.allclose(cached, recomputed, rtol=0, atol=ATOL)


@pytest.mark.parametrize("scaling", ["ssmax", "llama4"])
@pytest.mark.parametrize("name", ["none", "rope", "alibi", "hybrid"])
def test_cached_decode_steps_give_the_recomputed_logits_with_attention_scaling(scaling, name):
    # llama4's factor changes every 4 positions here, SSMax's with every token.
    model = random_model(encoding_config(name), attention_scaling=scaling, attention_floor_scale=4)
    cached, recomputed = cached_and_recomputed(model, random_positions())
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=ATOL)


@pytest.mark.parametrize("layers", [["rope"], ["alibi"], ["fire"], ["fox"], ["cope"], ["t5"]])
def test_cached_decode_steps_keep_a_window_as_recomputation_does(layers):
    model = random_model({"name": "hybrid", "layers": layers, "window": 3})
    cached, recomputed = cached_and_recomputed(model, torch.arange(T))
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=ATOL)


def test_cached_decode_steps_give_per_layer_fires_logits():
    model = random_model({"name": "fire", "per_layer": True}, n_layer=3)
    cached, recomputed = cached_and_recomputed(model, random_positions(rows=B))
    torch.testing.assert_close(cached, recomputed, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", ["rope", "alibi", "fire", "learned", "xpos"])
def test_the_comparison_fails_for_a_cache_whose_new_tokens_are_one_position_off(name):
    positions = torch.arange(T)
    off_by_one = positions + (positions >= PROMPT)  # every step's token one position later
    model = random_model(encoding_config(name))
    cached, recomputed = cached_and_recomputed(model, positions, PositionDraw(off_by_one))
    assert not torch.allclose(cached, recomputed, rtol=0, atol=ATOL)


def test_cached_decode_steps_give_the_logits_of_a_forward_pass_over_the_whole_sequence():
    # RoPE's YaRN with its factor from the length (the largest position) and xPos's factors
    # centred between the first and last positions read the whole sequence: a step gives what
    # a forward pass over all of it (teacher forcing) gives at its token.
    for encoding in [
        {"name": "rope", "scaling": {"method": "yarn", "original_length": 4}},
        {"name": "xpos", "scale_base": 4.0},
    ]:
        model = random_model(encoding)
        tokens = torch.randint(256, (B, T), generator=torch.Generator().manual_seed(1))
        cache = DecodeCache(torch.arange(T), len(model.blocks))
        with torch.inference_mode():
            whole = model(tokens)  # (B, T, vocab)
            model(tokens[:, :PROMPT], cache=cache)
            for t in range(PROMPT, T):
                step = model(tokens[:, t : t + 1], cache=cache)[:, -1]
                torch.testing.assert_close(step, whole[:, t], rtol=0, atol=ATOL)


# Greedy decoding of answers ------------------------------------------------------------------


def previous_byte_model() -> Transformer:
    """A model whose argmax is its input byte, whatever came before it (attention and MLP
    outputs zero, its tied embedding matching each byte best with itself): a rule that repeats
    the previous answer byte, which teacher forcing scores well on a sorted answer."""
    torch.manual_seed(0)
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 32}, {"name": "none"}).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.proj.weight.zero_()
            block.mlp.down.weight.zero_()
    bytes_ = torch.arange(256)[None]
    assert torch.equal(model(bytes_).argmax(-1), bytes_)
    return model


def test_greedy_accuracy_scores_the_models_own_answers_not_the_true_prefix():
    task = load_data({"source": "bucket_sort", "val_examples": 16, "answer_mode": "autoregressive"})
    model = previous_byte_model()
    record = evaluate_task_length(model, task, 30)
    # Given the true prefix, repeating the previous byte is right wherever a sorted answer
    # repeats; decoded, it repeats the separator "|" from the first answer byte on.
    assert record["teacher_forced_accuracy"] > 0.8
    assert record["accuracy"] == 0.0 and record["decode"] == "greedy"


def test_greedy_decode_feeds_each_row_its_own_prediction_and_the_prompt_elsewhere():
    # Rows of different prompt and answer lengths, the previous-byte model: each input after
    # an answer target is its own prediction (the last prompt byte, again and again, never
    # the true 7s and 9s), every other input the true one (row 2's 0 after its answer).
    inputs = torch.tensor([[1, 2, 3, 7, 7, 7, 0], [4, 5, 9, 9, 9, 9, 9], [6, 8, 8, 8, 0, 0, 0]])
    answer = torch.zeros(3, 7, dtype=torch.bool)  # answer targets: the inputs after them
    answer[0, 2:5] = answer[1, 1:6] = answer[2, 1:3] = True
    predictions = greedy_decode(previous_byte_model(), inputs, answer)
    expected = torch.tensor([[2, 3, 3, 3, 3], [5, 5, 5, 5, 5], [8, 8, 8, 0, 0]])  # targets 1..5
    assert torch.equal(predictions[:, 1:6], expected)
    assert (predictions[:, 0] == NOT_DECODED).all()  # before the first input fed back
    assert (predictions[:, 6] == NOT_DECODED).all()  # after the last answer target


def test_greedy_exact_match_equals_teacher_forced_sequence_accuracy():
    # Prompts of duplicate_string, half of whose answers are the random model's own greedy
    # decode (right in full both ways) and half that decode with one byte changed (wrong in
    # full both ways, at the byte changed or before): the two ways agree example by example.
    task = load_data(
        {"source": "duplicate_string", "val_examples": 8, "answer_mode": "autoregressive"}
    )
    examples = task.examples(8)
    model = random_model({"name": "rope"})
    predictions = greedy_decode(model, examples.inputs(), examples.answer)
    targets = torch.where(examples.answer, predictions, examples.targets())  # its own answers
    changed = 1 + torch.arange(len(targets)) % 5  # the answer byte of each example to change
    for row in range(1, len(targets), 2):
        targets[row, examples.answer[row].nonzero()[changed[row]]] ^= 1  # another byte
    # Autoregressive: the input after each answer target is that target.
    inputs = examples.inputs().clone()
    inputs[:, 1:] = torch.where(examples.answer[:, :-1], targets[:, :-1], inputs[:, 1:])
    mixed = Examples(inputs.to(torch.uint8), targets, examples.answer)
    task.examples = lambda length: mixed
    greedy = evaluate_task_length(model, task, 8)
    teacher_forced = evaluate_task_length(model, task, 8, decode="teacher_forced")
    assert greedy["sequence_accuracy"] == teacher_forced["sequence_accuracy"] == 0.5
    assert greedy["accuracy"] < 1.0


def test_teacher_forced_decode_scores_no_accuracy_and_the_teacher_forced_share_as_before():
    task = load_data(
        {"source": "reverse_string", "val_examples": 8, "answer_mode": "autoregressive"}
    )
    model = random_model({"name": "alibi"})
    record = evaluate_task_length(model, task, 9, decode="teacher_forced")
    examples = task.examples(9)
    with torch.inference_mode():
        right = (model(examples.inputs()).argmax(-1) == examples.targets()) & examples.answer
    assert record["decode"] == "teacher_forced" and record["accuracy"] is None
    assert record["teacher_forced_accuracy"] == right.sum().item() / examples.answer.sum().item()
    greedy = evaluate_task_length(model, task, 9)
    assert greedy["teacher_forced_accuracy"] == record["teacher_forced_accuracy"]


def test_answers_at_placeholders_are_not_decoded_their_one_forward_pass_is_the_accuracy():
    task = load_data({"source": "reverse_string", "val_examples": 8})  # placeholders: default
    model = random_model({"name": "alibi"})
    record = evaluate_task_length(model, task, 9)
    examples = task.examples(9)
    with torch.inference_mode():
        right = (model(examples.inputs()).argmax(-1) == examples.targets()) & examples.answer
    assert record["answer_mode"] == "placeholders" and record["decode"] is None
    assert record["accuracy"] == right.sum().item() / examples.answer.sum().item()
    assert record["teacher_forced_accuracy"] is None
    # Nothing to decode: eval.decode does not apply.
    assert evaluate_task_length(model, task, 9, decode="teacher_forced") == record


@pytest.mark.parametrize(("name", "mode"), [("rope", "positions"), ("alibi", "distances")])
def test_a_greedy_decode_at_randomized_positions_takes_the_teacher_forced_passs_draws(
    name, mode, monkeypatch
):
    task = load_data(
        {"source": "reverse_string", "val_examples": 6, "answer_mode": "autoregressive"}
    )
    model = random_model({"name": name}, n_layer=3)
    forced, decoded = [], []  # the draws of each batch's teacher-forced pass and its decode
    forward, decode = model.forward, task_accuracy.greedy_decode

    def forced_forward(tokens, positions=None, *args, cache=None, distances=None, **kwargs):
        if cache is None:
            forced.append((positions, distances))
        return forward(tokens, positions, *args, cache=cache, distances=distances, **kwargs)

    def spied_decode(model, inputs, answer, positions=None, distances=None):
        decoded.append((positions, distances))
        return decode(model, inputs, answer, positions, distances)

    monkeypatch.setattr(model, "forward", forced_forward)
    monkeypatch.setattr(task_accuracy, "greedy_decode", spied_decode)
    positions = RandomPositions(PositionSampler(64, 3, True, mode), seed=0)
    record = evaluate_task_length(model, task, 6, batch_size=4, positions=positions)
    assert record["decode"] == "greedy" and record["position_draws"] == 6
    assert len(forced) == len(decoded) == 2  # batches of 4 and 2
    for (forced_positions, forced_distances), draw in zip(forced, decoded, strict=True):
        assert forced_positions is draw[0] and forced_distances is draw[1]
        assert (forced_distances if mode == "distances" else forced_positions).dim() == 3


def test_passkey_accuracy_by_depth_follows_the_decode():
    task = load_data({"source": "passkey", "val_examples": 5})
    record = evaluate_task_length(previous_byte_model(), task, 128)
    depths = record["accuracy_by_depth"]
    assert sum(d["accuracy"] * d["examples"] for d in depths) / 5 == pytest.approx(
        record["accuracy"]
    )
    teacher_forced = evaluate_task_length(previous_byte_model(), task, 128, decode="teacher_forced")
    assert all(d["accuracy"] is None for d in teacher_forced["accuracy_by_depth"])


def test_a_length_not_scored_has_no_decode_and_no_accuracies():
    task = load_data({"source": "passkey"})
    record = evaluate_task_length(previous_byte_model(), task, 64)
    assert record["status"] == "unsupported"
    assert record["decode"] is record["accuracy"] is record["teacher_forced_accuracy"] is None


def test_a_run_decodes_greedily_and_posbench_eval_decode_teacher_forced_rescores_it(tmp_path):
    overrides = [*TINY_TASK_RUN, "data=reverse_string", "data.answer_mode=autoregressive"]
    overrides += ["data.train_lengths=[1,4]"]
    overrides += ["data.val_examples=4", "train.steps=3", "eval.task_lengths=[4,8]"]
    results = train(compose_config(overrides), tmp_path / "run")
    assert [r["decode"] for r in results["eval"]] == ["greedy", "greedy"]
    main(["eval", "--run", str(tmp_path / "run"), "--length", "8", "--decode", "teacher_forced"])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    at_8 = next(r for r in results["eval"] if r["length"] == 8)  # replaced: the same protocol
    assert at_8["decode"] == "teacher_forced" and at_8["accuracy"] is None
    assert results["length_generalization"] == at_8["sequence_accuracy"]
    assert results["length_generalization_accuracy"] is None
