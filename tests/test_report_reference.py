"""Published results a sweep is read against (posbench/references/) and ``posbench report
--reference``: the paper's numbers as published, a paper column and curve beside each encoding,
one-line warnings where the sweep and the paper do not match."""

import csv
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TINY_RUN, posbench
from test_report import make_run
from test_tokenizer import english_like

from posbench.commands.report import run_report
from posbench.config import compose_config, eval_lengths
from posbench.encodings import encoding_names
from posbench.errors import PosbenchError
from posbench.references import load_reference, reference_names
from posbench.report import build_report, write_report
from posbench.report.figures import ratio_figure
from posbench.report.reference import reference_warnings
from posbench.report.tables import markdown

ALIBI_WT103 = load_reference("alibi-wt103")
PAPER_LENGTHS = [512, 1012, 1512, 2512, 5512, 10512, 15512]


# ------------------------------------------------------------------ the published numbers


def test_the_alibi_paper_tables_hold_the_cells_issue_22_quotes_from_the_paper():
    table = ALIBI_WT103.table(512)
    quoted = {
        ("alibi", 512): 19.73,
        ("alibi", 15512): 18.31,
        ("rope", 512): 20.07,
        ("rope", 15512): 79.25,
        ("sinusoidal", 512): 20.05,
        ("sinusoidal", 15512): 406.01,
        ("t5", 512): 19.65,
        ("t5", 10512): 52.95,
    }
    assert {key: table.values[key[0]][key[1]] for key in quoted} == quoted


def test_the_t5_cells_the_paper_could_not_measure_stay_missing_with_the_reason():
    for table, longest in ((ALIBI_WT103.table(512), 15512), (ALIBI_WT103.table(1024), 16024)):
        assert table.values["t5"][longest] is None
        assert "out of memory" in table.missing["t5"]
        assert table.ratio("t5", longest) is None


def test_the_alibi_paper_has_a_table_for_each_of_its_training_lengths_512_and_1024():
    assert [table.train_seq_len for table in ALIBI_WT103.tables] == [512, 1024]
    assert ALIBI_WT103.table(1024).lengths == [1024, 1524, 2024, 3024, 6024, 11024, 16024]
    assert ALIBI_WT103.metric == "word_ppl"
    assert "arXiv:2108.12409" in ALIBI_WT103.citation


def test_the_experiment_trains_and_evaluates_at_the_lengths_of_the_papers_table():
    cfg = compose_config(["+experiment=alibi_wt103"])
    table = ALIBI_WT103.table(cfg.train.seq_len)
    assert table is not None and eval_lengths(cfg) == table.lengths == PAPER_LENGTHS


@pytest.mark.parametrize("name", reference_names())
def test_every_shipped_reference_names_registered_encodings(name):
    reference = load_reference(name)
    assert set(reference.encodings) <= set(encoding_names())


def test_an_unknown_reference_is_a_one_line_error_listing_the_shipped_ones():
    with pytest.raises(PosbenchError) as error:
        load_reference("alibi-wt2")
    message = str(error.value)
    assert "\n" not in message and "alibi-wt103" in message and "'alibi-wt2'" in message


def reference_file(tmp_path, **changes):
    """A reference file of one table (trained at 16) that ``changes`` alter."""
    table = {
        "source": "Table 1",
        "train_seq_len": 16,
        "missing": {},
        "values": {"rope": {"16": 10.0, "32": 12.0}, "alibi": {"16": 10.0, "32": 9.0}},
    }
    content = {
        "title": "a test's table",
        "citation": "Nobody. A paper. 2030.",
        "url": "https://example.org",
        "provenance": "made up by the test",
        "metric": "ppl",
        "protocol": "non-overlapping windows",
        "model": "a tiny model",
        "encodings": {"rope": "RoPE", "alibi": "ALiBi"},
        "tables": [{**table, **changes.pop("table", {})}],
        **changes,
    }
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(content))
    return path


def test_a_reference_file_given_by_its_path_is_read_like_a_shipped_one(tmp_path):
    reference = load_reference(str(reference_file(tmp_path)))
    assert reference.name == "mine"
    assert reference.table(16).ratio("alibi", 32) == pytest.approx(0.9)
    assert reference.table(32) is None


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"metric": 3}, "must be strings"),
        (
            {"table": {"values": {"rope": {"16": None, "32": 12.0}}}},
            "no value at its train_seq_len",
        ),
        ({"table": {"values": {"rope": {"16": 10.0, "32": -1.0}}}}, "neither > 0 nor null"),
        ({"table": {"values": {"rope": {"16": 10.0, "32": None}}}}, "missing does not explain"),
        ({"table": {"values": {"nope": {"16": 10.0}}}}, "not in its encodings"),
        ({"table": {"train_seq_len": "16"}}, "not a positive integer"),
        ({"tables": []}, "no tables"),
    ],
    ids=[
        "text",
        "no reference value",
        "negative",
        "unexplained null",
        "encoding",
        "length",
        "empty",
    ],
)
def test_a_malformed_reference_file_is_a_one_line_error_saying_what_is_wrong(
    tmp_path, changes, says
):
    path = reference_file(tmp_path, **changes)
    with pytest.raises(PosbenchError) as error:
        load_reference(str(path))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_reference_file_that_is_not_json_is_a_one_line_error(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(PosbenchError, match="is not a reference file") as error:
        load_reference(str(path))
    assert "\n" not in str(error.value)


# ------------------------------------------------------------------ a sweep beside the paper


def paper_run(path, encoding, word_ppls):
    """A run trained at 512 whose records hold ``word_ppls`` (length -> value; ppl the same)."""
    run = make_run(path, encoding=encoding, seq_len=512, ppls=word_ppls)
    results = json.loads((run / "results.json").read_text())
    for record in results["eval"]:
        record["word_ppl"] = record["ppl"]
    (run / "results.json").write_text(json.dumps(results))
    return run


@pytest.fixture
def sweep(tmp_path):
    """alibi flat, rope rising, t5 rising, none (not in the paper): trained at 512, evaluated at
    the paper's lengths."""
    root = tmp_path / "sweep"
    paper_run(root / "alibi", "alibi", {n: 30.0 - n / 2000 for n in PAPER_LENGTHS})
    paper_run(root / "rope", "rope", {n: 30.0 + n / 100 for n in PAPER_LENGTHS})
    paper_run(root / "t5", "t5", {n: 30.0 + n / 1000 for n in PAPER_LENGTHS})
    paper_run(root / "none", "none", {n: 31.0 for n in PAPER_LENGTHS})
    return root


def comparison(text):
    """The report's text from its comparison with the paper on."""
    return text[text.index("### Beside ") :]


def test_each_encoding_the_paper_has_gets_a_paper_column_beside_it(sweep):
    report = build_report(sweep, metric="word_ppl", reference=ALIBI_WT103)
    text = comparison(markdown(report))
    # none has no numbers in the paper: no column
    assert "| length | alibi | alibi (paper) | rope | rope (paper) | t5 | t5 (paper) |\n" in text


def test_the_paper_columns_hold_its_ratios_to_the_training_length_and_its_values(sweep):
    text = comparison(markdown(build_report(sweep, metric="word_ppl", reference=ALIBI_WT103)))
    ratios, values = text.split(", this sweep's and the paper's:")[1:3]
    ours_alibi, ours_rope = (30.0 - 1012 / 2000) / (30.0 - 512 / 2000), (30 + 10.12) / (30 + 5.12)
    assert (
        f"| 1012 (1.98×) | {ours_alibi:.2f} | {18.73 / 19.73:.2f} | {ours_rope:.2f} | "
        f"{21.37 / 20.07:.2f} |"
    ) in ratios
    assert "| 512 (1×) | 29.74 | 19.73 | 35.12 | 20.07 |" in values


def test_a_cell_the_paper_could_not_measure_is_a_dash_whose_footnote_says_why(sweep):
    text = markdown(build_report(sweep, metric="word_ppl", reference=ALIBI_WT103))
    row = next(line for line in comparison(text).splitlines() if line.startswith("| 15512"))
    footnote = row.rsplit("[", 1)[1].split("]")[0]
    assert row.endswith(f"| – [{footnote}] |")
    assert f"- [{footnote}] t5 (paper): out of memory on the paper's 32 GB GPU" in text


def test_report_csv_gives_the_papers_value_and_ratio_beside_each_cell(sweep):
    out = sweep / "report"
    write_report(build_report(sweep, out, "word_ppl", ALIBI_WT103), out)
    records = csv.DictReader((out / "report.csv").read_text().splitlines())
    rows = {(r["encoding"], int(r["length"])): r for r in records}
    assert float(rows[("rope", 15512)]["paper_value"]) == 79.25
    assert float(rows[("rope", 15512)]["paper_ratio"]) == pytest.approx(79.25 / 20.07)
    assert rows[("t5", 15512)]["paper_value"] == rows[("none", 512)]["paper_value"] == ""
    (group,) = json.loads((out / "report.json").read_text())["groups"]
    assert (group["reference"]["source"], group["reference"]["train_seq_len"]) == ("Table 2", 512)


def test_rows_not_measured_as_trained_get_no_paper_column(sweep):
    results = json.loads((sweep / "rope" / "results.json").read_text())
    results["eval"] += [{**r, "stride": 256} for r in results["eval"]]
    (sweep / "rope" / "results.json").write_text(json.dumps(results))
    text = comparison(markdown(build_report(sweep, metric="word_ppl", reference=ALIBI_WT103)))
    assert "rope, stride 256" not in text


def test_the_ratio_figure_draws_the_papers_curves_beside_the_rows_of_their_encodings(sweep):
    (group,) = build_report(sweep, metric="word_ppl", reference=ALIBI_WT103).groups
    (axes,) = ratio_figure(group, "word_ppl", ALIBI_WT103).axes
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert {"alibi (paper)", "rope (paper)", "t5 (paper)"} <= set(lines)
    assert "none (paper)" not in lines
    table = ALIBI_WT103.table(512)
    assert list(lines["alibi (paper)"].get_ydata()) == pytest.approx(
        [table.ratio("alibi", n) for n in PAPER_LENGTHS]
    )
    assert list(lines["t5 (paper)"].get_xdata()) == PAPER_LENGTHS[:-1]  # no number at 15512
    assert lines["rope (paper)"].get_color() == lines["rope"].get_color()
    assert lines["rope (paper)"].get_linestyle() == ":"


def test_report_writes_the_ratio_figure_only_with_a_reference(sweep):
    out = sweep / "report"
    write_report(build_report(sweep, out, "word_ppl", ALIBI_WT103), out)
    assert (out / "word_ppl_ratio_vs_length.png").is_file()
    plain = sweep / "plain"
    write_report(build_report(sweep, plain, "word_ppl"), plain)
    assert not (plain / "word_ppl_ratio_vs_length.png").exists()


def test_a_matching_sweep_gets_no_warning(sweep):
    assert reference_warnings(build_report(sweep, metric="word_ppl", reference=ALIBI_WT103)) == []


def test_a_sweep_trained_at_a_length_the_paper_has_no_table_for_is_one_warning(tmp_path):
    make_run(tmp_path / "r", ppls={256: 5.0, 512: 6.0}, seq_len=256)
    report = build_report(tmp_path, metric="ppl", reference=load_reference("alibi-wt103"))
    (metric, length) = reference_warnings(report)
    assert "word_ppl" in metric
    assert length == (
        "the sweep is trained at 256 tokens and alibi-wt103 has tables trained at 512, 1024 "
        "only: the sweep gets none of its numbers"
    )
    assert "### Beside " not in markdown(report)


def test_a_sweep_evaluated_at_other_lengths_is_one_warning_naming_both(tmp_path):
    paper_run(tmp_path / "r", "rope", {512: 5.0, 1024: 6.0})
    report = build_report(tmp_path, metric="word_ppl", reference=ALIBI_WT103)
    (warning,) = reference_warnings(report)
    assert warning.startswith("the sweep is evaluated at 512, 1024, alibi-wt103's Table 2 at 512,")
    assert "| 1024 (2×) | 1.20 | – |" in markdown(report)


def test_the_metric_defaults_to_the_references_and_warnings_are_one_line_each(sweep, capsys):
    out = sweep / "report"
    run_report([str(sweep), "--reference", "alibi-wt103", "--out", str(out)])
    assert json.loads((out / "report.json").read_text())["metric"] == "word_ppl"
    assert capsys.readouterr().err == ""
    run_report([str(sweep), "--reference", "alibi-wt103", "--metric", "ppl", "--out", str(out)])
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: alibi-wt103's numbers are word_ppl, this report's ppl")


# ------------------------------------------------------------------ end to end


def wikitext_like(root, seed, words):
    """A dataset directory laid out as WikiText-103's hub repository: one parquet file per split,
    one row per line."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    for split, offset in (("train", 0), ("validation", 1)):
        lines = english_like(seed + offset, words // (1 + 4 * offset)).splitlines(keepends=True)
        pq.write_table(pa.table({"text": lines}), root / "data" / f"{split}-00000.parquet")
    return root


@pytest.mark.slow
def test_the_experiment_runs_from_its_command_to_a_report_beside_the_paper(tmp_path, cache_dir):
    """README's commands with a local stand-in for WikiText-103 (the tests are offline) and a
    tiny model, at the experiment's lengths, for the paper's two extremes."""
    data = wikitext_like(tmp_path / "wikitext-103", seed=0, words=60_000)
    model = [o for o in TINY_RUN if o.startswith("model.")]
    posbench(
        "train",
        "-m",
        "+experiment=alibi_wt103",
        "model=small",
        *model,
        "encoding=alibi,sinusoidal",
        f"data.hub_path={data}",
        "data.hub_name=null",
        "data.vocab_size=512",
        "train.steps=4",
        "train.batch_size=2",
        "train.val_every=4",
        "train.val_batches=1",
        "eval.max_tokens=15512",
        "threads=1",
        cwd=tmp_path,
    )
    (sweep,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    result = posbench("report", sweep, "--reference", "alibi-wt103", cwd=tmp_path)
    assert result.stderr == ""  # trained at 512, evaluated at the paper's lengths: no warning
    cells = json.loads((sweep / "report" / "report.json").read_text())["cells"]
    assert {c["encoding"] for c in cells} == {"alibi", "sinusoidal"}
    assert {c["length"] for c in cells} == set(PAPER_LENGTHS)
    for cell in cells:
        assert cell["metric"] == "word_ppl" and math.isfinite(cell["value_mean"])
        assert (
            cell["paper_value"] == ALIBI_WT103.table(512).values[cell["encoding"]][cell["length"]]
        )
    assert "| length | alibi | alibi (paper) | sinusoidal | sinusoidal (paper) |" in result.stdout
    assert (sweep / "report" / "word_ppl_ratio_vs_length.png").is_file()
