"""RULER-style tasks (data=niah_*, variable_tracking, common_words, freq_words) and flip-flop
(data=flip_flop): every answer is what an oracle reads off the prompt, a predictor that never
looks back scores chance, and each trains and is scored from a config."""

import re
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from conftest import TINY_RUN, error_line
from hypothesis import given, settings
from hypothesis import strategies as st
from test_evaluate import Teacher, uniform_model

from posbench.config import compose_config, validate
from posbench.data import RULER_TASKS, load_data
from posbench.data.flip_flop import flip_flop_sequence
from posbench.data.haystack import FILLER, haystack
from posbench.evaluation.task_accuracy import answer_scores, evaluate_task_length, task_predictions
from posbench.runs.results import headline_accuracy
from posbench.training.train import train

NIAH = {
    "niah_single": {"keys": 1, "values": 1, "queries": 1},
    "niah_multikey": {"keys": 4, "values": 1, "queries": 1},
    "niah_multivalue": {"keys": 1, "values": 4, "queries": 1},
    "niah_multiquery": {"keys": 4, "values": 1, "queries": 4},
}
# Each data= option: its config (as conf/data/ has it), chance, and lengths to check.
TASKS = {
    **{name: ({"source": "niah", **counts}, 1 / 10) for name, counts in NIAH.items()},
    "variable_tracking": ({"source": "variable_tracking"}, 1 / 26),
    "variable_tracking_1hop": ({"source": "variable_tracking", "hops": 1}, 1 / 26),
    "common_words": ({"source": "common_words"}, 1 / 26),
    "freq_words": ({"source": "freq_words"}, 1 / 26),
    "flip_flop": ({"source": "flip_flop"}, 1 / 2),
}


def niah_oracle(prompt: str) -> str:
    value = defaultdict(list)
    for key, number in re.findall(r"A number for ([a-z]+) is (\d+)\. ", prompt):
        value[key].append(number)
    (asked,) = re.findall(r"\nWhat are the numbers for (.*)\? $", prompt)
    return "".join("".join(value[key]) for key in asked.split(", "))


def variable_tracking_oracle(prompt: str) -> str:
    (number,) = re.findall(r"\nWhich variables are (\d+)\? $", prompt)
    (first,) = re.findall(rf"VAR ([A-Z]+) = {number}\. ", prompt)
    chain, hops = [first], dict(re.findall(r"VAR ([A-Z]+) = VAR ([A-Z]+)\. ", prompt))
    follows = {b: a for a, b in hops.items()}
    while chain[-1] in follows:
        chain.append(follows[chain[-1]])
    return "".join(chain)


def common_words_oracle(prompt: str) -> str:
    words, question = prompt.rsplit("\n", 1)
    (n,) = re.findall(r"What are the (\d+) most common words\? $", question)
    counts = Counter(words.split())
    common = [w for w, _ in counts.most_common(int(n))]
    assert (
        len({counts[w] for w in common}) == 1
        and counts.most_common()[int(n)][1] < counts[common[0]]
    )
    return "".join(sorted(common, key=words.split().index))


def freq_words_oracle(prompt: str) -> str:
    counts = Counter(prompt.rsplit("\n", 1)[0].split())
    ranked = [w for w, _ in counts.most_common() if not w.startswith(".")]
    assert len(ranked) == 3 or counts[ranked[2]] > counts[ranked[3]], "the answer is unambiguous"
    return "".join(ranked[:3])


def flip_flop_oracle(sequence: str) -> str:
    """Every read's bit: the latest write's."""
    bits, latest = [], None
    for instruction, bit in re.findall(r"([wri])([01])", sequence):
        latest = bit if instruction == "w" else latest
        bits += [latest] if instruction == "r" else []
    return "".join(bits)


def oracle(name: str, prompt: str, sequence: str) -> str:
    if name.startswith("niah"):
        return niah_oracle(prompt)
    if name == "flip_flop":
        return flip_flop_oracle(sequence)
    if name.startswith("variable_tracking"):
        return variable_tracking_oracle(prompt)
    return globals()[f"{name}_oracle"](prompt)


def task(name: str, **options):
    config, _ = TASKS[name]
    return load_data({**config, "name": name, **options})


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_composes_from_its_config_file(name):
    cfg = compose_config([f"data={name}", "train.seq_len=256"])
    config, _ = TASKS[name]
    assert cfg.data.name == name and all(cfg.data[k] == v for k, v in config.items())
    validate(cfg)


def test_the_ruler_registry_holds_the_needle_tasks_and_extraction():
    assert sorted(RULER_TASKS) == ["common_words", "freq_words", "niah", "variable_tracking"]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_answers_are_what_an_oracle_reads_off_the_prompt(name):
    t = task(name, val_examples=4)
    for length in (t.min_length(), t.min_length() + 1, 300, 777):
        examples = t.examples(length)
        assert examples.input_bytes.shape == (len(examples.answer), length)
        for inputs, targets, scored in zip(
            examples.input_bytes, examples.targets(), examples.answer, strict=True
        ):
            first = int(scored.nonzero()[0]) + 1  # the target of input t is byte t + 1
            prompt = bytes(inputs[:first].tolist()).decode()
            sequence = bytes([*inputs.tolist(), int(targets[-1])]).decode()
            assert oracle(name, prompt, sequence) == bytes(targets[scored].tolist()).decode()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_predictor_that_never_looks_back_scores_at_chance(name):
    """The best guess from the current byte alone (the most frequent target after it, fitted
    on training batches) is right about as often as chance on the evaluation examples."""
    t, chance = task(name, val_examples=300), TASKS[name][1]
    counts = defaultdict(Counter)
    generator = torch.Generator().manual_seed(0)
    for step in range(8):
        inputs, targets = t.train_batch(32, 200, generator, step)
        for x, y in zip(inputs[targets >= 0].tolist(), targets[targets >= 0].tolist(), strict=True):
            counts[x][y] += 1
    guess = {x: c.most_common(1)[0][0] for x, c in counts.items()}
    examples = t.examples(200)
    inputs, targets = examples.inputs()[examples.answer], examples.targets()[examples.answer]
    right = [guess.get(x) == y for x, y in zip(inputs.tolist(), targets.tolist(), strict=True)]
    assert np.mean(right) == pytest.approx(chance, abs=0.04)
    assert t.chance_accuracy() == chance


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_model_that_predicts_every_scored_byte_scores_one(name):
    examples = task(name, val_examples=3).examples(256)
    _, correct, _ = task_predictions(Teacher(examples), examples, 3, torch.device("cpu"))
    scores = answer_scores(None, correct, examples.answer.sum(1))
    assert scores["teacher_forced_accuracy"] == scores["sequence_accuracy"] == 1.0


@pytest.mark.parametrize("name", sorted(NIAH))
def test_evaluation_puts_the_first_needle_asked_for_at_each_depth(name):
    examples = task(name, val_examples=5).examples(600)
    assert examples.depth_percent.tolist() == [0, 25, 50, 75, 100]
    for i, depth in enumerate(examples.depth_percent.tolist()):
        text = bytes(examples.input_bytes[i].tolist()).decode().lstrip()
        (asked,) = re.findall(r"numbers for ([a-z]+)", text)
        needles = re.findall(r"A number for [a-z]+ is \d+\. ", text)
        filler = len(text) - len("".join(needles)) - len(text[text.index("\nWhat") :])
        before = text[: text.index(f"A number for {asked}")]
        at = len(before) - len("".join(n for n in needles if n in before))
        assert at == round(depth / 100 * filler)


def test_the_needles_distractors_and_chains_scale_with_the_config():
    assert task("niah_multikey", keys=6).min_length() > task("niah_multikey").min_length()
    chains = task("variable_tracking", chains=2, hops=2).examples(400)
    text = bytes(chains.input_bytes[0].tolist()).decode()
    assert len(re.findall(r"VAR [A-Z]+ = \d+\. ", text)) == 2
    assert len(re.findall(r"VAR [A-Z]+ = VAR", text)) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["data=niah_multikey", "data.queries=5"], "data.queries (5) asks for more keys"),
        (["data=common_words", "data.uncommon_repeats=4"], "data.common_repeats (4) must exceed"),
        (["data=freq_words", "data.alpha=1"], "data.alpha must exceed 1"),
        (["data=flip_flop", "data.p_ignore_sparse=1"], "data.p_ignore_sparse must be in [0, 1)"),
        (["data=variable_tracking", "train.seq_len=64"], "needs windows of at least 137"),
    ],
)
def test_misconfigured_tasks_fail_with_one_line(capsys, args, message):
    assert message in error_line(capsys, "train", *args)


@pytest.mark.parametrize("p_ignore", [0.1, 0.8, 0.98])
def test_flip_flop_draws_ignores_at_p_ignore_and_writes_and_reads_evenly(p_ignore):
    pairs = flip_flop_sequence(20000, p_ignore, np.random.default_rng(0))
    counts = Counter(bytes(pairs[0::2].tolist()).decode())
    assert counts["i"] / 20000 == pytest.approx(p_ignore, abs=0.01)
    assert counts["w"] / 20000 == pytest.approx((1 - p_ignore) / 2, abs=0.01)
    assert pairs[0] == ord("w") and pairs[-2] == ord("r")


def test_flip_flop_trains_every_byte_and_scores_the_reads_under_teacher_forcing():
    t = task("flip_flop", val_examples=4)
    _, targets = t.train_batch(2, 16, torch.Generator().manual_seed(0), 0)
    assert (targets >= 0).all()  # a language: every byte after the padding
    record = evaluate_task_length(uniform_model(), t, 16, decode="greedy")
    assert record["decode"] == record["protocol_decode"] == "teacher_forced"
    assert record["accuracy"] == record["teacher_forced_accuracy"] == headline_accuracy(record)
    by = record["accuracy_by_p_ignore"]
    assert [(d["p_ignore"], d["examples"]) for d in by] == [(0.1, 4), (0.8, 4), (0.98, 4)]


@pytest.mark.parametrize(
    ("name", "breakdown"), [("niah_multiquery", "accuracy_by_depth"), ("flip_flop", None)]
)
def test_a_tiny_run_records_accuracy_at_every_length(name, breakdown, tmp_path):
    lengths = [170, 340]
    overrides = [*TINY_RUN, f"data={name}", "train.steps=4", "data.val_examples=5"]
    overrides += [f"train.seq_len={lengths[0]}", f"eval.lengths=[{','.join(map(str, lengths))}]"]
    results = train(compose_config(overrides), tmp_path / "run")
    assert [r["length"] for r in results["eval"]] == lengths
    for record in results["eval"]:
        assert record["status"] == "ok" and 0 <= record["teacher_forced_accuracy"] <= 1
        assert (breakdown in record) if breakdown else "accuracy_by_p_ignore" in record


@settings(max_examples=25, deadline=None)
@given(
    filler=st.integers(0, 300),
    needles=st.lists(st.text("abc. ", min_size=1, max_size=9), max_size=4),
    data=st.data(),
)
def test_the_haystack_is_the_filler_with_each_needle_at_its_depth(filler, needles, data):
    depths = data.draw(st.lists(st.floats(0, 1), min_size=len(needles), max_size=len(needles)))
    text = haystack(filler, needles, depths)
    assert len(text) == filler + sum(map(len, needles))
    order = sorted(range(len(needles)), key=lambda i: (round(depths[i] * filler), i))
    rest = text
    for i in order:  # cut each needle out, in order, where its depth puts it in the filler
        at = round(depths[i] * filler)
        assert rest[at : at + len(needles[i])] == needles[i]
        rest = rest[:at] + rest[at + len(needles[i]) :]
    assert rest == (FILLER * (filler // len(FILLER) + 1))[:filler]
