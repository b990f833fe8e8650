"""Prompt-blind baselines (posbench/data/baselines.py): the constant answer per length bounds
every rule that never reads the prompt's content, under the headline measure, on every task."""

import pytest
import torch

from posbench.data import TASKS, AnswerMode, WindowTask, load_data
from posbench.data.baselines import (
    PREFIX_RULES,
    accuracy,
    answer_table,
    constant_answer,
    constant_answer_accuracy,
    copy_back,
    prefix_rule_accuracy,
    repeat_previous,
)


def lengths_of(source: str) -> list[int]:
    """A length in the task's training range (its longest) and one past it (twice that)."""
    task = load_data({"source": source})
    if isinstance(task, WindowTask):  # 128 tokens, or the shortest window that holds an example
        shortest = max(128, task.min_length())
        return [shortest, 2 * shortest]
    return [task.train_lengths[1], 2 * task.train_lengths[1]]


def own_decode(rule, constant: torch.Tensor, length: int) -> torch.Tensor:
    """What ``rule`` writes from its own outputs, none of the true answer's an input: greedy
    decoding, or under placeholders a model that sees only the blanks. Each pass fixes one more
    token (a prefix rule reads only the tokens before it), so len(constant) passes decode it
    all: (K,), one fixed answer per length."""
    decoded = constant[None].clone()  # (1, K)
    for _ in range(len(constant)):
        decoded = rule(decoded, constant, length)
    return decoded[0]


@pytest.mark.parametrize("source", sorted(TASKS))
def test_no_prompt_blind_rule_beats_the_constant_answer_under_the_headline_measure(source):
    task = load_data({"source": source, "val_examples": 32})
    for length in lengths_of(source):
        examples = task.examples(length)
        table, present = answer_table(examples.targets(), examples.answer)
        constant = constant_answer([(table, present)])
        best = task.constant_answer_accuracy([length])
        assert best == pytest.approx(accuracy(constant, table, present))
        assert task.chance_accuracy() <= best + 1e-12
        for rule in PREFIX_RULES.values():
            decoded = own_decode(rule, constant, length)
            assert accuracy(decoded, table, present) <= best + 1e-12, (rule.__name__, length)


@pytest.mark.parametrize(
    ("source", "rule"), [("bucket_sort", repeat_previous), ("duplicate_string", copy_back)]
)
def test_under_teacher_forcing_a_prefix_rule_scores_far_above_the_constant_answer(source, rule):
    """Why autoregressive records report prefix_rule_accuracy: given the true answer bytes
    before it, "repeat the previous byte" nearly sorts, "copy the byte n back" duplicates, and
    neither reads the prompt. Each makes about half the constant answer's errors at 40 (0.90
    against 0.80 on bucket_sort, 0.77 against 0.54 on duplicate_string), fewer beyond."""
    task = load_data({"source": source, "answer_mode": "autoregressive"})
    for length in (40, 100):
        examples = task.examples(length)
        table, present = answer_table(examples.targets(), examples.answer)
        teacher_forced = accuracy(
            rule(table, constant_answer([(table, present)]), length), table, present
        )
        constant = task.constant_answer_accuracy([length])
        assert 1 - teacher_forced < 0.6 * (1 - constant), (length, teacher_forced, constant)
        assert prefix_rule_accuracy(examples.targets(), examples.answer, length) == teacher_forced


def test_the_prefix_rules_read_the_previous_token_and_the_one_n_back():
    answers = torch.tensor([[1, 2, 3, 4, 5, 6]])
    constant = torch.tensor([7, 8, 9, 7, 8, 9])
    assert repeat_previous(answers, constant, 2).tolist() == [[7, 1, 2, 3, 4, 5]]
    assert copy_back(answers, constant, 2).tolist() == [[7, 8, 1, 2, 3, 4]]
    assert copy_back(answers, constant, 6).tolist() == [constant.tolist()]


def test_the_constant_answer_is_the_most_common_token_at_each_index_the_lowest_of_a_tie():
    targets = torch.tensor([[-100, 5, 6, 7], [-100, 5, 4, -100], [-100, 3, 4, -100]])
    scored = targets >= 0
    table, present = answer_table(targets, scored)
    assert table.tolist() == [[5, 6, 7], [5, 4, 0], [3, 4, 0]]
    assert constant_answer([(table, present)]).tolist() == [5, 4, 7]
    assert constant_answer_accuracy([(targets, scored)]) == pytest.approx(5 / 7)


def test_a_padding_target_after_the_terminator_is_no_answer_token():
    """Under placeholders the zeros after a sum's terminator are trained, not scored: the
    baselines count the scored targets only."""
    task = load_data({"source": "binary_addition", "val_examples": 8})
    assert task.answer_mode is AnswerMode.placeholders
    examples = task.examples(10)
    _, present = answer_table(examples.targets(), examples.answer)
    assert torch.equal(present.sum(1), examples.answer.sum(1))
    assert (examples.answer.sum(1) < 11).any()  # some answers end before their last blank
