"""Effective context length: the longest length up to which a run's score stays within a
threshold of its score at the training length, in results.json, TensorBoard and the report."""

import json

import pytest
from conftest import finished_run
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from posbench.errors import PosbenchError
from posbench.report import build_report
from posbench.report.tables import cell_records, json_content, markdown
from posbench.runs.results import (
    append_eval_results,
    effective_context_lengths,
    effective_length,
)
from posbench.runs.tensorboard_log import (
    TrainedLengths,
    headline_metrics,
    log_hparams,
    write_eval_events,
)

S = 16


def ppl_record(length, ppl, **fields):
    status = "ok" if ppl is not None else "unsupported"
    return {"length": length, "stride": None, "ppl": ppl, "status": status, **fields}


def task_record(length, accuracy, chance=None, constant=None):
    scores = {"accuracy": accuracy, "sequence_accuracy": accuracy, "decode": "greedy"}
    baselines = {"chance_accuracy": chance, "constant_answer_accuracy": constant}
    return {**ppl_record(length, 2.0), **scores, **baselines}


def test_a_perplexity_length_is_effective_while_ppl_stays_below_its_training_value_over_t():
    # 5 / 0.9 = 5.56: 32 keeps it, 64 does not, and 128 does again but the run of lengths ended
    scores = {8: 9.0, 16: 5.0, 32: 5.5, 64: 5.6, 128: 5.0}
    assert effective_length(scores, S, 0.9, "ppl") == 32
    assert effective_length(scores, S, 0.5, "ppl") == 128


def test_an_accuracy_length_is_effective_while_accuracy_keeps_t_of_its_training_value():
    scores = {16: 0.8, 32: 0.73, 64: 0.71}  # 0.9 x 0.8 = 0.72
    assert effective_length(scores, S, 0.9, "accuracy") == 32


def test_an_accuracy_no_better_than_its_prompt_blind_baseline_at_the_training_length_has_none():
    """A model at chance keeps its score at every length: that says nothing of its context."""
    scores = {16: 0.1, 32: 0.1, 64: 0.1}
    assert effective_length(scores, S, 0.9, "accuracy", floor=0.1) is None
    assert effective_length(scores, S, 0.9, "accuracy", floor=0.09) == 64
    at_chance = [task_record(16, 0.04, 0.04, 0.09), task_record(32, 0.04, 0.04, 0.09)]
    above = [task_record(16, 0.5, 0.04, 0.09), task_record(32, 0.5, 0.04, 0.09)]
    assert effective_context_lengths(at_chance, S)[0]["length"] is None
    assert effective_context_lengths(above, S)[0]["length"] == 32
    # the baselines at the training length count, not those at the longer lengths
    assert effective_context_lengths([above[0], task_record(32, 0.5, 0.6, 0.6)], S)[0]["length"]


def test_an_unmeasured_length_ends_the_run_and_an_unmeasured_training_length_gives_none():
    assert effective_length({16: 5.0, 32: None, 64: 5.0}, S, 0.9, "ppl") == 16
    assert effective_length({32: 5.0, 64: 5.0}, S, 0.9, "ppl") is None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(1.0, 20.0), min_size=1, max_size=6), st.floats(0.1, 1.0))
def test_every_length_up_to_the_effective_one_is_within_and_the_next_is_not(ppls, t):
    scores = {S * 2**i: ppl for i, ppl in enumerate(ppls)}
    effective = effective_length(scores, S, t, "ppl")
    within = [n for n in scores if scores[n] <= scores[S] / t]
    assert all(n in within for n in scores if n <= effective)
    assert effective == max(scores) or 2 * effective not in within


def test_results_json_holds_one_entry_per_protocol_and_tasks_read_their_accuracy(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"train_seq_len": S, "eval": []}))
    records = [ppl_record(16, 5.0), ppl_record(32, 5.2), ppl_record(32, 9.0, stride=8)]
    results = append_eval_results(tmp_path, records)
    entries = {e["stride"]: e for e in results["effective_context_length"]}
    assert entries[None]["length"] == 32 and entries[None]["metric"] == "ppl"
    assert entries[8]["length"] is None  # no stride-8 record at the training length
    (task,) = effective_context_lengths([task_record(16, 1.0), task_record(32, 0.5)], S)
    assert (task["metric"], task["length"], task["threshold"]) == ("accuracy", 16, 0.9)


def test_tensorboard_gets_a_scalar_per_series_and_hparams_the_as_trained_one(tmp_path):
    records = [ppl_record(16, 5.0), ppl_record(32, 5.2), ppl_record(64, 9.0)]
    write_eval_events(tmp_path, records, TrainedLengths.tokens(S))
    events = EventAccumulator(str(tmp_path)).Reload()
    assert [e.value for e in events.Scalars("eval/effective_context_length")] == [32]
    results = {
        "train": {"final_loss": 1.0, "val_ppl": 3.0},
        "eval": records,
        "effective_context_length": effective_context_lengths(records, S),
    }
    assert headline_metrics(results)["effective_context_length"] == 32


def make_run(path, seed, ppls):
    records = [ppl_record(n, p) for n, p in ppls.items()]
    finished_run(path, "rope", {"seed": seed, "eval": records}, seed)


def test_the_report_tabulates_each_rows_effective_length_over_seeds_at_its_threshold(tmp_path):
    make_run(tmp_path / "s0", 0, {16: 5.0, 32: 5.2, 64: 5.4})
    make_run(tmp_path / "s1", 1, {16: 5.0, 32: 5.2, 64: 9.0})
    report = build_report(tmp_path)
    assert "| rope | 2 | ppl | 48 ± 23 | 3.00 ± 1.41 |" in markdown(report)
    content = json_content(report, [])["groups"][0]["effective_context_length"]
    assert content == {"threshold": 0.9, "rows": {"rope": {"metric": "ppl", "lengths": [64, 32]}}}
    (first, *_) = cell_records(report)
    assert (first["effective_length_n"], first["effective_length_mean"]) == (2, 48)
    strict = build_report(tmp_path, effective_threshold=0.99)
    assert strict.groups[0].rows[0].effective.values == (16, 16)


@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_a_threshold_outside_0_1_is_a_one_line_error(tmp_path, threshold):
    make_run(tmp_path / "s0", 0, {16: 5.0})
    with pytest.raises(PosbenchError, match="--effective-threshold must be in"):
        build_report(tmp_path, effective_threshold=threshold)


def test_a_re_evaluation_updates_the_hparams_metric_with_the_scalar(tmp_path):
    """The HParams tab shows a metric's last value, read in event-file name order."""
    with SummaryWriter(log_dir=str(tmp_path)) as writer:  # as the run trained: 32
        log_hparams(writer, {"encoding": "rope"}, {"effective_context_length": 32})
    records = [ppl_record(16, 5.0), ppl_record(32, 5.2), ppl_record(64, 5.3)]
    write_eval_events(tmp_path, records, TrainedLengths.tokens(S))  # posbench eval at 64
    events = EventAccumulator(str(tmp_path)).Reload()
    scalar = [e.value for e in events.Scalars("eval/effective_context_length")]
    metric = [e.value for e in events.Scalars("hparam/effective_context_length")]
    assert scalar == [64] and metric[-1] == 64


def test_a_re_evaluation_updates_every_hparams_metric_read_from_the_records(tmp_path):
    """Not only the effective length: `posbench eval --max-tokens` re-measuring 32 replaces
    ppl_at_32 in the HParams tab too; a YaRN record beside it leaves it the plain one's; the
    training's own summary (val_ppl) stays."""
    with SummaryWriter(log_dir=str(tmp_path)) as writer:  # as the run trained
        log_hparams(writer, {"encoding": "rope"}, {"val_ppl": 5.0, "ppl_at_32": 5.2})
    records = [ppl_record(16, 5.0), ppl_record(32, 6.0), ppl_record(32, 4.0, scaling="yarn")]
    write_eval_events(tmp_path, records, TrainedLengths.tokens(S))
    events = EventAccumulator(str(tmp_path)).Reload()
    assert [e.value for e in events.Scalars("hparam/ppl_at_32")][-1] == 6.0
    assert [e.value for e in events.Scalars("hparam/val_ppl")] == [5.0]


def test_the_report_leaves_out_a_task_run_at_chance_at_the_training_length(tmp_path):
    for seed, accuracy in enumerate([0.04, 0.5]):
        records = [task_record(n, accuracy, 0.04, 0.09) for n in (16, 32)]
        finished_run(tmp_path / f"s{seed}", "rope", {"seed": seed, "eval": records}, seed)
    assert "| rope | 2 | accuracy | 32 (n=1) | 2.00 (n=1) |" in markdown(build_report(tmp_path))


def test_the_effective_length_table_says_how_many_runs_a_row_is_over(tmp_path):
    make_run(tmp_path / "s0", 0, {16: 5.0, 32: 5.2})
    make_run(tmp_path / "s1", 1, {32: 5.2})  # not measured at the training length
    assert "| rope | 2 | ppl | 32 (n=1) | 2.00 (n=1) |" in markdown(build_report(tmp_path))
