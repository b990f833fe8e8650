"""Tasks (data=passkey, copy, recall): prompts whose answers the prompt alone determines,
generated deterministically from the seed, trained and scored end to end."""

import json
import re
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from conftest import TINY_RUN, posbench
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posbench.config import compose_config, validate
from posbench.data import WINDOW_TASKS, load_corpus, load_data
from posbench.data.passkey import QUESTION
from posbench.data.recall import pairs_in
from posbench.errors import PosbenchError
from posbench.evaluation.diagnose import diagnose_run
from posbench.training.train import train

LENGTHS = {
    "passkey": [102, 103, 200, 1000],
    "copy": [2, 3, 16, 17, 500],
    "recall": [11, 12, 50, 999],
}
CHANCE = {"passkey": 1 / 10, "copy": 1 / 26, "recall": 1 / 26}  # one digit / letter of all


def split(examples, i):
    """Example i as (prompt, answer): the bytes before its first answer byte, the answer bytes."""
    inputs, targets, answer = examples.input_bytes[i], examples.targets()[i], examples.answer[i]
    first = int(answer.nonzero()[0]) + 1  # the target of input t is byte t + 1
    return bytes(inputs[:first].tolist()), bytes(targets[answer].tolist())


def passkey_oracle(prompt: bytes) -> bytes:
    (key,) = re.findall(rb"The pass key is (\d+)\. Remember it\.", prompt)
    return key


def copy_oracle(prompt: bytes) -> bytes:
    return prompt.strip().removesuffix(b"|")


def recall_oracle(prompt: bytes, sequence: bytes) -> bytes:
    """The value of every queried key, read from the pairs (the queries' keys: after the
    prompt's pairs, in the sequence)."""
    n = len(re.findall(rb"[a-z]{3}=[A-Z] ", prompt))  # the pairs
    value = dict(re.findall(rb"([a-z]{3})=([A-Z]) ", prompt))
    assert len(value) == n, "keys are distinct"
    queried = re.findall(rb"([a-z]{3})=", sequence)[n:]
    return b"".join(value[key] for key in queried)


@pytest.mark.parametrize("source", sorted(WINDOW_TASKS))
def test_every_task_is_registered_with_a_config_file_and_a_schema(source):
    cfg = compose_config([f"data={source}"])
    assert (cfg.data.name, cfg.data.source) == (source, source)
    validate(cfg)


@pytest.mark.parametrize("source", sorted(WINDOW_TASKS))
def test_the_answers_are_recoverable_from_the_prompt_by_an_oracle(source):
    task = load_data({"source": source, "val_examples": 10})
    for length in LENGTHS[source]:
        examples = task.examples(length)
        assert examples.input_bytes.shape == examples.targets().shape == (10, length)
        for i in range(10):
            prompt, answer = split(examples, i)
            if source == "passkey":
                assert passkey_oracle(prompt) == answer
            elif source == "copy":
                assert copy_oracle(prompt) == answer and len(answer) == length // 2
            else:
                inputs = bytes(
                    examples.input_bytes[i].tolist()
                )  # every query, each before its value
                assert recall_oracle(prompt, inputs) == answer
                assert len(answer) == pairs_in(length)


@pytest.mark.parametrize("source", sorted(WINDOW_TASKS))
def test_a_predictor_that_never_looks_back_scores_at_chance(source):
    """The best guess from the current byte alone (the most frequent answer after it, fitted
    on training batches) is right about as often as chance on the evaluation examples."""
    task = load_data({"source": source, "val_examples": 1000})
    length = 128
    counts = defaultdict(Counter)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        inputs, targets = task.train_batch(50, length, generator, 0)
        for x, y in zip(inputs[targets >= 0].tolist(), targets[targets >= 0].tolist(), strict=True):
            counts[x][y] += 1
    guess = {x: c.most_common(1)[0][0] for x, c in counts.items()}
    examples = task.examples(length)
    inputs, targets = examples.inputs()[examples.answer], examples.targets()[examples.answer]
    accuracy = np.mean(
        [guess.get(x) == y for x, y in zip(inputs.tolist(), targets.tolist(), strict=True)]
    )
    assert accuracy == pytest.approx(CHANCE[source], abs=0.03)


@pytest.mark.parametrize("source", sorted(WINDOW_TASKS))
def test_evaluation_examples_depend_on_the_seed_and_length_alone(source):
    task = load_data({"source": source})
    assert torch.equal(task.examples(128).input_bytes, task.examples(128).input_bytes)
    other_seed = load_data({"source": source, "seed": 1})
    assert not torch.equal(task.examples(128).input_bytes, other_seed.examples(128).input_bytes)


@pytest.mark.parametrize("source", sorted(WINDOW_TASKS))
def test_training_batches_follow_the_sampler_state_so_a_resumed_run_continues_them(source):
    task = load_data({"source": source})
    sampler = torch.Generator().manual_seed(0)
    first = task.train_batch(4, 128, sampler, 0)
    state = sampler.get_state()
    second = task.train_batch(4, 128, sampler, 1)
    resumed = torch.Generator()
    resumed.set_state(state)
    assert all(
        torch.equal(a, b) for a, b in zip(second, task.train_batch(4, 128, resumed, 1), strict=True)
    )
    assert not torch.equal(first[0], second[0])
    assert first[0].shape == first[1].shape == (4, 128)


def test_training_targets_are_the_answer_bytes_only():
    task = load_data({"source": "copy"})
    inputs, targets = task.train_batch(2, 16, torch.Generator().manual_seed(0), 0)
    scored = targets >= 0
    assert scored.sum(1).tolist() == [8, 8] and scored[:, -8:].all()
    assert torch.equal(targets[:, -8:], inputs[:, :8])  # the string again, after "|"


@pytest.mark.parametrize("depth", [0, 25, 50, 75, 100])
def test_passkey_evaluation_puts_the_needle_at_each_depth_of_the_filler(depth):
    task = load_data({"source": "passkey", "val_examples": 5})
    examples = task.examples(1000)
    (i,) = (examples.depth_percent == depth).nonzero()[0].tolist()
    prompt, _ = split(examples, i)
    text = prompt.decode()
    needle = re.search(r"The pass key.*?is the pass key\. ", text)[0]
    filler = len(text) - len(QUESTION) - len(needle)
    start = text.index("The pass key is")
    assert start == round(depth / 100 * filler)


def test_recall_pairs_scale_with_the_window():
    assert [pairs_in(n) for n in (11, 128, 1024)] == [1, 10, 85]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=passkey", "train.seq_len=64"], "data=passkey needs windows of at least 102"),
        (["data=copy", "eval.stride=8"], "eval.stride applies to corpora only"),
        (["data=passkey", "data.digits=0"], "data.digits must be positive"),
        (["data=recall", "data.val_examples=0"], "data.val_examples must be positive"),
    ],
)
def test_misconfigured_tasks_fail_with_one_line(overrides, message, tmp_path):
    with pytest.raises(PosbenchError, match=re.escape(message)):
        train(compose_config([*TINY_RUN, *overrides]), tmp_path / "run")


def test_a_task_is_not_a_corpus():
    with pytest.raises(PosbenchError, match="data=copy is a task"):
        load_corpus({"source": "copy"})


def accuracy_scalars(run_dir):
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events.Scalars("eval/accuracy")


# A tiny run per task: trained on the answers, evaluated at 1x and 2x.
TASK_RUNS = {
    "passkey": ["train.seq_len=104", "eval.lengths=[104,208]"],
    "copy": ["train.seq_len=16", "eval.lengths=[16,32]"],
    "recall": ["train.seq_len=24", "eval.lengths=[24,48]"],
}


@pytest.mark.parametrize("source", sorted(TASK_RUNS))
def test_a_tiny_task_run_records_accuracy_at_every_length(source, tmp_path):
    overrides = [*TINY_RUN, f"data={source}", *TASK_RUNS[source], "data.val_examples=20"]
    results = train(compose_config(overrides), tmp_path / "run")
    assert results["data"] == {
        "name": source,
        "tokenizer": "bytes",
        "vocab_size": 256,
        "chance_accuracy": CHANCE[source],
        "answer_mode": "autoregressive",
    }
    # Trained on the answers: their perplexity falls from ~256 to about the answer alphabet's
    # (seeds 0 to 4, 2026-12-06: passkey 10.0 to 10.3, copy 26.0 to 26.7, recall 21.7 to 25.8,
    # half the bound).
    assert results["train"]["val_ppl"] < 2 / CHANCE[source]
    for record in results["eval"]:
        assert record["status"] == "ok" and record["examples"] == 20
        assert 0 <= record["sequence_accuracy"] <= record["accuracy"] <= 1
        assert ("accuracy_by_depth" in record) == (source == "passkey")
        assert "loss_by_position" not in record
    lengths = [record["length"] for record in results["eval"]]
    assert [(e.step, e.value) for e in accuracy_scalars(tmp_path / "run")] == [
        (length, pytest.approx(record["accuracy"]))
        for length, record in zip(lengths, results["eval"], strict=True)
    ]


def test_diagnosing_a_task_run_asks_for_a_corpus_run(tmp_path):
    overrides = [*TINY_RUN, "data=copy", *TASK_RUNS["copy"], "data.val_examples=4"]
    train(compose_config([*overrides, "train.steps=2"]), tmp_path)
    with pytest.raises(PosbenchError, match="needs a run trained on a corpus"):
        diagnose_run(tmp_path, 32, n_windows=1)


@pytest.mark.slow
def test_posbench_trains_and_evaluates_a_task_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    overrides = [*TINY_RUN, "data=recall", *TASK_RUNS["recall"], "data.val_examples=8"]
    posbench("train", *overrides, f"hydra.run.dir={run}", cwd=tmp_path)
    result = posbench("eval", "--run", run, "--length", "24", "--length", "96", cwd=tmp_path)
    _, header, _, *rows = result.stdout.splitlines()[1:]  # after "<run> trained at ..."
    assert "accuracy" in header and [row.split()[0] for row in rows] == ["24", "96"]
    records = json.loads((run / "results.json").read_text())["eval"]
    assert sorted(r["length"] for r in records if r["accuracy"] is not None) == [24, 48, 96]
