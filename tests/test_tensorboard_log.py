"""TensorBoard tags and the extrapolation figure: one series per way of evaluating; the HParams
columns of every evaluated length."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from posbench.config import compose_config
from posbench.report.run_table import eval_table
from posbench.runs.loggers.tensorboard import TensorBoardLogger
from posbench.runs.tensorboard_log import (
    HPARAM_PREFIX,
    TrainedLengths,
    eval_tag,
    extrapolation_figure,
    headline_metrics,
    hparams,
    log_eval_records,
    loss_by_position_tag,
    problem_length_figure,
    write_eval_events,
)

AT_16 = TrainedLengths.tokens(16)  # a run trained at 16 tokens
TRAINING = {"final_loss": 0.7, "val_ppl": 2.0}  # results.json's "train" summary


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
        (
            {"scaling": "yarn", "scaling_factor": 4.0, "scaling_factor_setting": 4.0},
            "eval/ppl/yarn_s4",
        ),
        (
            {"scaling": "yarn", "scaling_factor": 3.0, "scaling_factor_setting": None},
            "eval/ppl/yarn",
        ),
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


def table_rows(table: str) -> list[list[str]]:
    """An eval table's measured rows, split into cells (not its title, header or footnotes)."""
    _, _, dashes, *lines = table.splitlines()
    assert set(dashes) == {"-"}
    return [line.split() for line in lines if not line.startswith("ratio -:")]


def test_the_table_shows_the_method_and_compares_each_method_with_itself():
    records = [
        record(16, ppl=2.0, scaling="none"),
        record(64, ppl=4.0, scaling="none"),
        record(16, ppl=2.0, scaling="yarn"),
        record(64, ppl=3.0, scaling="yarn"),
        record(64, ppl=5.0),  # no field: plain
    ]
    rows = table_rows(eval_table(records, train_seq_len=16))
    assert rows[1][:5] == ["64", "-", "none", "4.000", "2.00"]
    assert rows[3][:5] == ["64", "-", "yarn", "3.000", "1.50"]
    assert rows[4][:5] == ["64", "-", "none", "5.000", "2.50"]


def test_the_table_divides_each_record_by_its_own_stride_factor_and_positions():
    records = [
        record(16, ppl=2.0),
        record(16, ppl=1.6, stride=8),
        record(64, ppl=2.4, stride=8),
        record(16, ppl=3.0, scaling="yarn", scaling_factor=4.0, scaling_factor_setting=4.0),
        record(64, ppl=3.3, scaling="yarn", scaling_factor=4.0, scaling_factor_setting=4.0),
        record(16, ppl=2.5, positions="random"),
        record(64, ppl=5.0, positions="random"),
    ]
    rows = table_rows(eval_table(records, train_seq_len=16))
    ratios = [row[-3] for row in rows]  # before bits/byte and tokens ("yarn s=4" is two words)
    assert ratios == ["1.00", "1.00", "1.50", "1.00", "1.10", "1.00", "2.00"]


def test_the_table_header_names_the_ratio_s_reference():
    title, header, *_ = eval_table([record(16)], train_seq_len=16).splitlines()
    assert title == "ratio: ppl / ppl at 16 (same protocol: stride, scaling, positions)"
    assert "ratio" in header.split()


def test_a_ratio_without_its_protocol_at_the_training_length_is_a_dash_and_a_footnote():
    records = [record(16, ppl=2.0), record(64, ppl=3.0, stride=8), record(32, ppl=3.0, stride=8)]
    table = eval_table(records, train_seq_len=16)
    assert [row[4] for row in table_rows(table)] == ["1.00", "-", "-"]
    assert table.splitlines()[-1] == (
        "ratio -: no ppl at 16 measured the same way (stride 8, no scaling, consecutive "
        "positions); evaluate length 16 that way too for a ratio"
    )
    assert table.count("ratio -:") == 1


def test_the_ratio_uses_the_training_length_record_of_the_references():
    """`posbench eval --length 64` alone still shows the ratio to the 1x record in results.json."""
    references = [record(16, ppl=2.0, scaling="none"), record(64, ppl=3.0, scaling="none")]
    (row,) = table_rows(eval_table([record(64, ppl=3.0, scaling="none")], 16, references))
    assert row[:5] == ["64", "-", "none", "3.000", "1.50"]


def test_the_table_counts_the_documents_of_a_corpus_with_documents():
    records = [{**record(16), "documents": 3}, {**record(64), "documents": 1}]
    _, header, _, *rows = eval_table(records, train_seq_len=16).splitlines()
    assert header.split()[-2:] == ["tokens", "documents"]
    assert [row.split()[-1] for row in rows] == ["3", "1"]
    assert "documents" not in eval_table([{**record(16), "documents": None}], 16)


def eval_events(run_dir):
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


def test_rewriting_the_eval_events_replaces_a_reevaluated_point(tmp_path):
    write_eval_events(tmp_path, [record(16, ppl=2.0), record(32, ppl=3.0)], AT_16)
    write_eval_events(tmp_path, [record(16, ppl=2.0), record(32, ppl=2.5)], AT_16)
    events = eval_events(tmp_path)
    assert [(e.step, e.value) for e in events.Scalars("eval/ppl")] == [(16, 2.0), (32, 2.5)]
    assert len(events.Images("eval/ppl_vs_length")) == 1


def test_text_records_log_the_metrics_that_compare_across_tokenizers(tmp_path):
    text = {**record(16), "word_ppl": 40.0}
    write_eval_events(tmp_path, [text], AT_16)
    scalars = set(eval_events(tmp_path).Tags()["scalars"])
    assert {"eval/ppl", "eval/bits_per_byte", "eval/word_ppl"} <= scalars


def test_the_figure_is_drawn_from_all_records_given(tmp_path):
    everything = [record(16, ppl=2.0), record(32, ppl=3.0), record(2048, ppl=9.0)]
    write_eval_events(tmp_path / "at_once", everything, AT_16)
    write_eval_events(tmp_path / "in_two_steps", everything[:2], AT_16)
    write_eval_events(tmp_path / "in_two_steps", everything, AT_16)
    (expected,) = eval_events(tmp_path / "at_once").Images("eval/ppl_vs_length")
    (image,) = eval_events(tmp_path / "in_two_steps").Images("eval/ppl_vs_length")
    assert image.encoded_image_string == expected.encoded_image_string


class Recorder:
    """A SummaryWriter stand-in that keeps the scalars it is given."""

    def __init__(self):
        self.scalars = []
        self.figures = {}

    def add_scalar(self, tag, value, global_step):
        self.scalars.append((tag, global_step, value))

    def add_figure(self, tag, figure):
        self.figures[tag] = figure

    def flush(self):
        pass


def test_task_records_plot_accuracy_against_length():
    writer = Recorder()
    greedy = {"decode": "greedy", "teacher_forced_accuracy": 0.9}
    records = [record(16, accuracy=0.75, **greedy), record(32, accuracy=0.25, **greedy)]
    log_eval_records(writer, [*records, record(64)], AT_16)
    accuracy = [(step, value) for tag, step, value in writer.scalars if tag == "eval/accuracy"]
    assert accuracy == [(16, 0.75), (32, 0.25)]
    tags = {tag for tag, _, _ in writer.scalars}
    assert "eval/teacher_forced_accuracy" in tags


def test_a_task_record_from_before_decoding_plots_no_greedy_accuracy():
    # Its accuracy was scored under teacher forcing.
    writer = Recorder()
    log_eval_records(writer, [record(16, accuracy=0.75, sequence_accuracy=0.5)], AT_16)
    assert [tag for tag, _, _ in writer.scalars if "accuracy" in tag] == ["eval/sequence_accuracy"]


def test_an_algorithmic_tasks_figure_is_sequence_accuracy_over_the_shaded_trained_lengths():
    writer = Recorder()
    records = [
        record(length, accuracy=a, sequence_accuracy=a)
        for length, a in [(5, 1.0), (40, 0.9), (80, 0.1)]
    ]
    log_eval_records(writer, records, TrainedLengths(1, 40, problem_lengths=True))
    (tag,) = writer.figures
    assert tag == "eval/sequence_accuracy_vs_problem_length"
    (axes,) = writer.figures[tag].axes
    (line,) = axes.get_lines()
    assert list(line.get_xdata()) == [5, 40, 80] and list(line.get_ydata()) == [1.0, 0.9, 0.1]
    (span,) = axes.patches
    assert span.get_label() == "trained lengths"
    assert (span.get_x(), span.get_x() + span.get_width()) == pytest.approx((1, 40))
    assert axes.get_xlabel() == "problem length" and axes.get_ylabel() == "sequence accuracy"


def test_a_language_models_figure_is_perplexity_with_the_train_length_marked():
    writer = Recorder()
    log_eval_records(writer, [record(16, ppl=2.0), record(64, ppl=3.0)], AT_16)
    (axes,) = writer.figures["eval/ppl_vs_length"].axes
    assert axes.get_xlabel() == "evaluation length (tokens)"
    assert [line.get_label() for line in axes.get_lines()] == ["plain", "train length"]


def test_no_measured_record_draws_no_figure():
    records = [{**record(80, sequence_accuracy=0.5), "status": "unsupported"}]
    assert problem_length_figure(records, TrainedLengths(1, 40, problem_lengths=True)) is None


def test_hparams_write_an_encodings_list_options_as_text_that_tensorboard_takes():
    params = hparams(compose_config(["encoding=hybrid", "encoding.layers=[rope,rope,none]"]))
    assert params["encoding.layers"] == "[rope, rope, none]"
    assert params["encoding.window"] == "null"
    assert all(isinstance(value, int | float | str | bool) for value in params.values())


def test_hparams_name_a_file_corpus_by_its_folder_as_report_titles_do():
    assert hparams(compose_config(["data=text", "data.path=wikitext-2/test.txt"]))["data"] == (
        "wikitext-2"
    )
    assert hparams(compose_config([]))["data"] == "synthetic"


def test_after_posbench_eval_adds_a_length_the_hparams_tab_declares_a_column_for_it(tmp_path):
    # TensorBoard's HParams tab shows the metrics its experiment summary declares (the first one
    # it reads in the run's directory), whatever other hparam/ scalars the run has.
    cfg = compose_config(["train.seq_len=16"])
    trained = [record(16, 2.0), record(32, 2.5)]
    training = TensorBoardLogger(cfg, tmp_path, "train", None)
    training.log_evaluation(trained, AT_16)
    training.log_summary(headline_metrics({"train": TRAINING, "eval": trained}))
    training.close()
    evaluation = TensorBoardLogger(cfg, tmp_path, "eval", None)  # posbench eval --length 64
    evaluation.log_evaluation([*trained, record(64, 3.0)], AT_16)
    evaluation.close()
    events = EventAccumulator(str(tmp_path)).Reload()
    content = events.SummaryMetadata("_hparams_/experiment").plugin_data.content
    experiment = HParamsPluginData.FromString(content).experiment
    declared = {info.name.tag for info in experiment.metric_infos}
    expected = {"final_loss", "val_ppl", "ppl_at_16", "ppl_at_32", "ppl_at_64"}
    expected.add("effective_context_length")  # read from the records, as the others are
    assert declared == {HPARAM_PREFIX + name for name in expected}
    assert {info.name for info in experiment.hparam_infos} >= {"encoding", "seq_len"}
    assert events.Scalars(HPARAM_PREFIX + "ppl_at_64")[-1].value == 3.0
