"""posbench report compares like with like: across tokenizers by bits per byte, a run repeated
counted once, runs that scored other text never averaged, titles naming only what differs."""

import json
import os
from pathlib import Path

import pytest
from conftest import posbench
from test_report import add_records, make_run

from posbench.report import build_report, write_report
from posbench.report.figures import value_figure
from posbench.report.read import Run, drop_duplicates
from posbench.report.settings import TITLE_CHARACTERS
from posbench.report.tables import markdown


def text_run(path, tokenizer="bytes", ppl=5.0, bits_per_byte=2.0, tokens=4096, **config):
    """A run as make_run makes it on ``tokenizer``, its records also holding bits per byte, the
    tokens scored and word_ppl null (the synthetic corpus has no words): ``ppl`` and
    ``bits_per_byte`` at 16, 1.2 times them at 32."""
    if tokenizer == "bpe":
        config["data__vocab_size"] = 8192
    run = make_run(path, ppls={16: ppl, 32: 1.2 * ppl}, data__tokenizer=tokenizer, **config)
    results = json.loads((run / "results.json").read_text())
    for record in results["eval"]:
        scale = record["ppl"] / ppl
        record.update(bits_per_byte=scale * bits_per_byte, tokens=tokens, word_ppl=None)
    (run / "results.json").write_text(json.dumps(results))
    return run


def written_at(run, seconds):
    """Set when the run's results.json was last written (seconds since the epoch)."""
    os.utime(run / "results.json", (seconds, seconds))


def report_json(out):
    return json.loads((out / "report.json").read_text())


# ------------------------------------------------------------------------------ tokenizers


@pytest.mark.slow
def test_runs_on_two_tokenizers_are_compared_by_bits_per_byte_by_default(tmp_path):
    # The user study's pair: BPE 273.43 per token beside bytes 8.05 per byte.
    text_run(tmp_path / "runs" / "bpe", "bpe", ppl=273.43, bits_per_byte=2.19)
    text_run(tmp_path / "runs" / "bytes", "bytes", ppl=8.05, bits_per_byte=3.01)
    result = posbench("report", tmp_path / "runs", cwd=tmp_path)
    assert (
        "Bits per byte, not perplexity: the runs differ in tokenizer (bpe 8192, bytes), whose "
        "tokens are not alike (`--metric ppl` compares perplexity within each tokenizer)."
    ) in result.stdout
    assert "| rope [bpe 8192] | 1 | **2.19** | **2.63** |" in result.stdout
    assert "| rope [bytes] | 1 | 3.01 | 3.61 |" in result.stdout
    assert "did not learn comparably" not in result.stdout
    assert report_json(tmp_path / "runs" / "report")["metric"] == "bits_per_byte"


@pytest.mark.slow
def test_metric_ppl_on_two_tokenizers_groups_the_runs_by_tokenizer(tmp_path):
    text_run(tmp_path / "runs" / "bpe", "bpe", ppl=273.43, bits_per_byte=2.19)
    text_run(tmp_path / "runs" / "bytes", "bytes", ppl=8.05, bits_per_byte=3.01)
    result = posbench("report", tmp_path / "runs", "--metric", "ppl", cwd=tmp_path)
    assert "Perplexity per token, compared within each tokenizer" in result.stdout
    assert "## data.tokenizer=bpe 8192\n" in result.stdout
    assert "## data.tokenizer=bytes\n" in result.stdout
    assert "| rope | 1 | 273.43 | 328.12 |" in result.stdout
    assert "| rope | 1 | 8.05 | 9.66 |" in result.stdout
    groups = report_json(tmp_path / "runs" / "report")["groups"]
    assert [g["setting"] for g in groups] == [
        {"data.tokenizer": "bpe 8192"},
        {"data.tokenizer": "bytes"},
    ]


def test_runs_on_one_tokenizer_keep_perplexity_without_a_note(tmp_path):
    text_run(tmp_path / "a", "bpe", seed=0)
    text_run(tmp_path / "b", "bpe", seed=1)
    report = build_report(tmp_path)
    assert report.metric == "ppl" and report.metric_note is None


def test_an_encoding_is_judged_comparable_against_the_best_on_its_own_tokenizer(tmp_path):
    text_run(tmp_path / "bpe", "bpe", ppl=273.43, bits_per_byte=2.19)
    text_run(tmp_path / "bytes", "bytes", ppl=8.05, bits_per_byte=3.01)
    text_run(tmp_path / "bytes_none", "bytes", ppl=20.0, bits_per_byte=4.3, encoding="none")
    (group,) = build_report(tmp_path).groups
    marked = {row.label: row.not_comparable is not None for row in group.rows}
    assert marked == {"none [bytes]": True, "rope [bpe 8192]": False, "rope [bytes]": False}
    (none,) = [row for row in group.rows if row.label == "none [bytes]"]
    assert "the best encoding's, rope [bytes]: 8.05" in none.not_comparable


def test_the_figure_counts_lengths_in_tokens_of_each_rows_tokenizer(tmp_path):
    text_run(tmp_path / "bpe", "bpe")
    text_run(tmp_path / "bytes", "bytes")
    (group,) = build_report(tmp_path).groups
    (axes,) = value_figure(group, "bits_per_byte").axes
    label = "evaluation length (tokens of each row's tokenizer: bpe 8192, bytes)"
    assert axes.get_xlabel() == label


# ------------------------------------------------------------------------------ duplicates


@pytest.mark.slow
def test_runs_with_the_same_config_and_seed_are_one_run_the_newest_kept(tmp_path):
    runs = tmp_path / "runs"
    readme = make_run(runs / "readme", seed=0, ppls={16: 7.0, 32: 8.0})
    sweep_job = make_run(runs / "sweep" / "0", seed=0, ppls={16: 7.2, 32: 8.2})
    make_run(runs / "sweep" / "1", seed=1, ppls={16: 7.4, 32: 8.4})
    written_at(readme, 1_000_000)
    written_at(sweep_job, 2_000_000)
    result = posbench("report", runs, cwd=tmp_path)
    assert "| rope | 2 | 7.30 ± 0.14 | 8.30 ± 0.14 |" in result.stdout
    assert "- `readme`: duplicate of `sweep/0`" in result.stdout
    content = report_json(runs / "report")
    assert content["duplicates"] == [{"path": "readme", "duplicate_of": "sweep/0"}]
    assert content["groups"][0]["rows"] == {"rope": ["sweep/0", "sweep/1"]}


def test_a_run_trained_again_keeps_the_records_only_the_older_one_measured(tmp_path):
    """RoPE trained again (the same config and seed: the same weights) to be measured with a
    remap: the older run's eval-time extension stays a row beside the remap's; where both
    measured one length one way, the newest's record counts."""
    older = make_run(tmp_path / "older", ppls={16: 5.0, 32: 7.0})
    add_records(older, {"length": 32, "ppl": 5.5, "scaling": "yarn"})
    newer = make_run(tmp_path / "newer", ppls={16: 5.1, 32: 7.1})
    add_records(newer, {"length": 32, "ppl": 5.2, "scaling": "string"})
    written_at(older, 1_000_000)
    written_at(newer, 2_000_000)
    report = build_report(tmp_path)
    (group,) = report.groups
    rows = {row.label: [c.ppl.mean for c in row.cells] for row in group.rows}
    assert rows == {"rope": [5.1, 7.1], "rope + string": [None, 5.2], "rope + yarn": [None, 5.5]}
    assert [(d.path.name, d.of.name) for d in report.duplicates] == [("older", "newer")]


def test_runs_that_differ_only_in_where_and_how_they_ran_are_duplicates(tmp_path):
    first = make_run(
        tmp_path / "a", threads=4, device="cpu", eval__batch_size=8, eval__compile=True
    )
    second = make_run(tmp_path / "b", threads=1, device="cuda", train__log_every=1)
    written_at(first, 2_000_000)
    written_at(second, 1_000_000)
    report = build_report(tmp_path)
    assert [(d.path.name, d.of.name) for d in report.duplicates] == [("b", "a")]
    assert [Path(p).name for p in report.groups[0].rows[0].runs] == ["a"]


def test_a_key_written_before_posbench_had_it_equals_its_default_for_duplicates(tmp_path):
    make_run(tmp_path / "old")
    make_run(tmp_path / "new", model__attention_scaling="none", eval__max_tokens=262144)
    assert len(build_report(tmp_path).duplicates) == 1


def test_a_key_whose_default_is_another_keys_value_equals_it_for_duplicates(tmp_path):
    """model.sigmoid_length defaults to ${train.seq_len} in conf/model/: a run from before it
    existed lacks it, one after holds the training length; they are one run, one that sets
    another length is not."""
    make_run(tmp_path / "old")
    make_run(tmp_path / "new", model__sigmoid_length=16)  # train.seq_len 16
    make_run(tmp_path / "other", model__sigmoid_length=64)
    assert [(d.path.name, d.of.name) for d in build_report(tmp_path).duplicates] == [("old", "new")]


def test_runs_of_a_summary_file_keep_the_last_found_of_a_config_and_seed():
    summary = Path("/nonexistent/summary.json")  # a reader of summaries gives no run directory
    config = {"seed": 0, "encoding.name": "rope", "train.seq_len": 16}
    runs = [Run(summary / name, dict(config), {"eval": []}) for name in ("first", "second")]
    kept, duplicates = drop_duplicates(runs)
    assert [run.path.name for run in kept] == ["second"]
    assert [(d.path.name, d.of.name) for d in duplicates] == [("first", "second")]


# ------------------------------------------------------------------------ evaluations


@pytest.mark.slow
def test_runs_that_scored_other_numbers_of_tokens_are_groups_of_their_own(tmp_path):
    runs = tmp_path / "runs"
    text_run(runs / "full", seed=0, ppl=7.3, tokens=262144)
    text_run(runs / "short", seed=0, ppl=7.2, tokens=32768, eval__max_tokens=32768)
    result = posbench("report", runs, cwd=tmp_path)
    assert "## eval.max_tokens=262144\n" in result.stdout
    assert "## eval.max_tokens=32768\n" in result.stdout
    assert "| rope | 1 | 7.30 | 8.76 |" in result.stdout
    assert "| rope | 1 | 7.20 | 8.64 |" in result.stdout
    assert "duplicate" not in result.stdout.lower()


def test_records_that_scored_other_numbers_of_tokens_are_not_averaged(tmp_path):
    text_run(tmp_path / "s0", seed=0, tokens=262144)
    rescored = text_run(tmp_path / "s1", seed=1, tokens=262144)
    results = json.loads((rescored / "results.json").read_text())
    results["eval"][1]["tokens"] = 32768  # posbench eval --max-tokens 32768 --length 32
    (rescored / "results.json").write_text(json.dumps(results))
    text = markdown(build_report(tmp_path))
    assert "| rope | 2 | 5.00 ± 0.00 | – [1] |" in text
    assert (
        "[1] rope: its runs scored different numbers of tokens here (32,768, 262,144): not "
        "averaged; evaluate them alike (eval.max_tokens, posbench eval --max-tokens)"
    ) in text


def test_one_seed_evaluated_two_ways_is_not_averaged_as_two_seeds(tmp_path):
    make_run(tmp_path / "fp32", seed=0, ppls={16: 5.0, 32: 6.0})
    make_run(tmp_path / "bf16", seed=0, ppls={16: 5.1, 32: 6.1}, eval__precision="bf16")
    out = tmp_path / "report"
    write_report(report := build_report(tmp_path, out), out)
    assert report.duplicates == []
    text = markdown(report)
    assert "| rope | 2 | – [1] | – [1] |" in text
    assert (
        "[1] rope: 2 of its runs are seed 0, differing in eval.precision: one model evaluated "
        "in other ways, not averaged as seeds; report one of them"
    ) in text
    cells = report_json(out)["cells"]
    assert [(c["value_n"], c["status"]) for c in cells] == [(0, "missing"), (0, "missing")]
    assert all(c["reason"].startswith("2 of its runs are seed 0") for c in cells)


def test_a_stride_makes_a_row_of_its_own_beside_the_same_seed(tmp_path):
    make_run(tmp_path / "plain", seed=0, ppls={16: 5.0, 32: 6.0})
    strided = make_run(tmp_path / "strided", seed=0, results={"eval": []}, eval__stride=8)
    add_records(strided, *({"length": n, "ppl": p, "stride": 8} for n, p in ((16, 4.0), (32, 4.4))))
    (group,) = build_report(tmp_path).groups
    rows = {row.label: [c.ppl.mean for c in row.cells] for row in group.rows}
    assert rows == {"rope": [5.0, 6.0], "rope, stride 8": [4.0, 4.4]}


# ------------------------------------------------------------------------------ titles


def test_headings_and_figure_titles_name_only_the_settings_that_differ(tmp_path):
    data_keys = {f"data__option{i}": f"value{i}" for i in range(20)}  # the user study's 6 lines
    make_run(tmp_path / "a", seq_len=16, data__name="synthetic", **data_keys)
    make_run(tmp_path / "b", seq_len=16, data__name="wikitext2", ppls={16: 4.0, 32: 5.0})
    make_run(tmp_path / "c", seq_len=32, data__name="wikitext2", ppls={32: 4.0, 64: 5.0})
    out = tmp_path / "report"
    report = build_report(tmp_path, out)
    titles = [group.title for group in report.groups]
    assert titles == [
        "data=synthetic, train.seq_len=16",
        "data=wikitext2, train.seq_len=16",
        "data=wikitext2, train.seq_len=32",
    ]
    text = markdown(report)
    assert all(f"\n## {title}\n" in text for title in titles)
    for group in report.groups:
        (axes,) = value_figure(group).axes
        assert axes.get_title() == group.title
    assert "data.option0" in report.groups[0].setting  # report.json keeps the whole setting


def test_a_title_longer_than_80_characters_is_cut(tmp_path):
    long = "x" * 100
    make_run(tmp_path / "a", data__name=f"a{long}")
    make_run(tmp_path / "b", data__name=f"b{long}")
    titles = [group.title for group in build_report(tmp_path).groups]
    assert [len(t) for t in titles] == [TITLE_CHARACTERS, TITLE_CHARACTERS]
    assert titles[0] == f"data=a{long}"[: TITLE_CHARACTERS - 1] + "…"


def test_a_report_of_one_group_is_titled_by_its_data_and_training(tmp_path):
    make_run(tmp_path / "a")
    (group,) = build_report(tmp_path).groups
    assert group.title == "synthetic data, model 1×32, trained at 16 tokens for 10 steps"


# ------------------------------------------------------------------------------ word_ppl


@pytest.mark.slow
def test_an_empty_word_ppl_cell_says_its_data_has_no_words(tmp_path):
    text_run(tmp_path / "runs" / "r")  # word_ppl null: the synthetic corpus has no words
    result = posbench("report", tmp_path / "runs", "--metric", "word_ppl", cwd=tmp_path)
    assert "| rope | 1 | – [1] | – [1] |" in result.stdout
    why = "word_ppl is null in its records: its data delimits no words (synthetic, a task)"
    assert f"[1] rope: {why}" in result.stdout
    cells = report_json(tmp_path / "runs" / "report")["cells"]
    assert [c["reason"] for c in cells] == [why, why]


def test_records_from_before_a_metric_existed_say_so(tmp_path):
    make_run(tmp_path / "r")  # records without word_ppl
    text = markdown(build_report(tmp_path, metric="word_ppl"))
    assert "[1] rope: its records have no word_ppl (written before posbench measured it)" in text
