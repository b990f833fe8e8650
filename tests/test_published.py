"""A published table (posbench/report/published.py): a result whose runs are gone, kept as the
table it was published in, with its provenance, rendered into docs beside the paper's numbers."""

import json
import shutil
from pathlib import Path

import pytest

from posbench.errors import PosbenchError
from posbench.references import load_reference
from posbench.report.docs import load
from posbench.report.docs.published import published_provenance, published_ratio_table
from posbench.report.groups import build_report
from posbench.report.published import PublishedTable, read_published_table

ROOT = Path(__file__).resolve().parents[1]
H200 = "results/alibi_wt103/h200.json"


def test_the_h200_table_reads_as_a_published_table_without_per_run_records():
    table = load(ROOT, H200)
    assert isinstance(table, PublishedTable)
    assert table.train_seq_len == 512 and table.metric == "word_ppl"
    assert all(by_length[512] == 1.0 for by_length in table.ratios.values())
    assert "no per-run records" in published_provenance(table)
    assert table.provenance["posbench_commit"][:7] in published_provenance(table)


def test_the_paper_columns_are_the_references_ratios():
    """Each (paper) cell is the reference file's value at that length over its value at 512."""
    lines = published_ratio_table(load(ROOT, H200)).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    paper = load_reference("alibi-wt103").table(512)
    rows = {line.split("|")[1].strip(): line.strip("|").split("|") for line in lines[2:]}
    for i, name in enumerate(header):
        if name == "(paper)":
            encoding = header[i - 1]
            assert rows["15512"][i].strip() == (
                "OOM" if paper.values[encoding][15512] is None
                else f"{paper.ratio(encoding, 15512):.2f}"
            )  # fmt: skip
            assert rows["word ppl at 512"][i].strip() == f"{paper.values[encoding][512]:.2f}"


def test_report_refuses_a_published_table_in_one_line():
    with pytest.raises(PosbenchError, match="published table, not a summary") as err:
        build_report(ROOT / H200)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(per_run_records=True), "per_run_records must be false"),
        (lambda c: c["provenance"].pop("machine"), "provenance lacks machine"),
        (lambda c: c["ratios"]["alibi"].update({"512": 0.9}), "must be 1.0"),
        (lambda c: c["at_train_seq_len"].pop("fox"), "name different encodings"),
    ],
)
def test_a_malformed_published_table_is_a_one_line_error(tmp_path, edit, message):
    content = json.loads((ROOT / H200).read_text())
    edit(content)
    (tmp_path / "table.json").write_text(json.dumps(content))
    with pytest.raises(PosbenchError, match=message) as err:
        read_published_table(tmp_path, "table.json")
    assert "\n" not in str(err.value)


def test_the_published_figure_draws_each_encoding_in_its_colour(tmp_path):
    from matplotlib.colors import same_color

    from posbench.report.docs.published import published_ratio_figure
    from posbench.report.styles import ENCODING_STYLES

    shutil.copy(ROOT / H200, tmp_path / "h200.json")
    figure = published_ratio_figure(read_published_table(tmp_path, "h200.json"))
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    for encoding, (colour, _) in ENCODING_STYLES.items():
        for label in (encoding, f"{encoding} (paper)"):
            if label in lines:
                assert same_color(lines[label].get_color(), colour)


def test_python_m_posbench_report_docs_runs_the_renderer(monkeypatch, capsys):
    """`python -m posbench.report.docs` is the render command docs name; --help says what it
    does and renders nothing."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", ["python -m posbench.report.docs", "--help"])
    with pytest.raises(SystemExit) as exit:
        runpy.run_module("posbench.report.docs.__main__", run_name="__main__")
    assert exit.value.code == 0
    assert "Render README's and docs/'s result tables" in capsys.readouterr().out
