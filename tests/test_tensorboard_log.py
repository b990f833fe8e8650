"""TensorBoard tags and the extrapolation figure: one series per way of evaluating."""

import pytest

from posbench.tables import eval_table
from posbench.tensorboard_log import (
    eval_tag,
    extrapolation_figure,
    log_eval_records,
    loss_by_position_tag,
)


def record(length, ppl=2.0, stride=None, **scaling):
    return {
        "length": length,
        "stride": stride,
        "ppl": ppl,
        "bits_per_byte": 1.0,
        "tokens": 10,
        "status": "ok",
        "reason": None,
        **scaling,
    }


@pytest.mark.parametrize(
    ("fields", "tag"),
    [
        ({}, "eval/ppl"),  # written before the scaling field existed
        ({"scaling": "none"}, "eval/ppl"),
        ({"stride": 8, "scaling": "none"}, "eval/ppl/stride_8"),
        ({"scaling": "yarn"}, "eval/ppl/yarn"),
        ({"stride": 8, "scaling": "yarn"}, "eval/ppl/yarn/stride_8"),
    ],
)
def test_eval_tags_name_the_scaling_method_then_the_stride(fields, tag):
    assert eval_tag("ppl", record(64, **fields)) == tag


def test_bits_per_byte_tags_follow_the_same_scheme():
    assert eval_tag("bits_per_byte", record(64, scaling="ntk")) == "eval/bits_per_byte/ntk"


@pytest.mark.parametrize(
    ("fields", "tag"),
    [
        ({}, "eval/loss_by_position/L64"),
        ({"scaling": "none"}, "eval/loss_by_position/L64"),
        ({"scaling": "yarn"}, "eval/loss_by_position/L64/yarn"),
    ],
)
def test_loss_by_position_has_one_series_per_length_and_scaling_method(fields, tag):
    assert loss_by_position_tag(record(64, **fields)) == tag


def test_the_figure_draws_one_line_per_series():
    records = [
        record(16, scaling="none"),
        record(32, scaling="none"),
        record(32, scaling="yarn"),
        record(32, stride=8, scaling="yarn"),
    ]
    axes = extrapolation_figure(records, train_seq_len=16).axes[0]
    labels = [line.get_label() for line in axes.get_lines()]
    assert labels == ["plain", "yarn", "yarn/stride_8", "train length"]


def test_the_table_shows_the_method_and_compares_each_method_with_itself():
    records = [
        record(16, ppl=2.0, scaling="none"),
        record(64, ppl=4.0, scaling="none"),
        record(16, ppl=2.0, scaling="yarn"),
        record(64, ppl=3.0, scaling="yarn"),
        record(64, ppl=5.0),  # no field: plain
    ]
    rows = eval_table(records, train_seq_len=16).splitlines()[2:]
    assert rows[1].split()[:5] == ["64", "-", "none", "4.000", "2.00"]
    assert rows[3].split()[:5] == ["64", "-", "yarn", "3.000", "1.50"]
    assert rows[4].split()[:5] == ["64", "-", "none", "5.000", "2.50"]


class Recorder:
    """A SummaryWriter stand-in that keeps the scalars it is given."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, global_step):
        self.scalars.append((tag, global_step, value))

    def add_figure(self, tag, figure):
        pass

    def flush(self):
        pass


def test_task_records_plot_accuracy_against_length():
    writer = Recorder()
    records = [record(16, accuracy=0.75), record(32, accuracy=0.25), record(64)]
    log_eval_records(writer, records, train_seq_len=16)
    accuracy = [(step, value) for tag, step, value in writer.scalars if tag == "eval/accuracy"]
    assert accuracy == [(16, 0.75), (32, 0.25)]
