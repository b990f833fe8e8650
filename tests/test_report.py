"""posbench report: numbers equal to the runs' own, partial sweeps, every output written."""

import csv
import json
import shutil

import numpy as np
import pytest
from conftest import TINY, built_once, posbench
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib import image
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posbench.data import load_data
from posbench.errors import PosbenchError
from posbench.report import build_report, write_report
from posbench.report.aggregate import reciprocal_ranks
from posbench.report.cells import Stat
from posbench.report.figures import (
    FIGURE_DPI,
    FIGURE_INCHES,
    accuracy_figure,
    position_figure,
    value_figure,
)
from posbench.report.tables import best_shown, markdown, stat_text


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache_dir):
    """A real tiny sweep: 2 encodings x 2 seeds, a few steps each (built once for every
    worker: tests that change it take sweep_copy)."""
    command = ["train", "-m", "encoding=none,rope", "seed=0,1", *TINY, "train.steps=10"]
    workdir = built_once(
        tmp_path_factory, "report-sweep", lambda workdir: posbench(*command, cwd=workdir)
    )
    (root,) = (workdir / "outputs" / "multirun").glob("*/*")
    return root


@pytest.fixture
def sweep_copy(sweep, tmp_path):
    shutil.copytree(sweep, tmp_path / "sweep")
    return tmp_path / "sweep"


def results_by_encoding(root):
    runs = {}
    for path in sorted(root.glob("*/results.json")):
        results = json.loads(path.read_text())
        runs.setdefault(results["encoding"], []).append(results)
    return runs


def ppl_at(results, length):
    (record,) = [r for r in results["eval"] if r["length"] == length and r["stride"] is None]
    return record["ppl"]


def report_cells(out):
    cells = json.loads((out / "report.json").read_text())["cells"]
    return {(c["encoding"], c["length"]): c for c in cells}


@pytest.mark.slow
def test_table_cells_are_mean_and_sample_std_of_the_runs(sweep, tmp_path):
    result = posbench("report", str(sweep), "--out", str(tmp_path / "out"), cwd=tmp_path)
    table = result.stdout.replace("**", "")  # the best mean per column is bold
    cells = report_cells(tmp_path / "out")
    for encoding, runs in results_by_encoding(sweep).items():
        assert len(runs) == 2
        for length in (16, 32, 64):
            ppls = np.array([ppl_at(r, length) for r in runs])
            ratios = ppls / np.array([ppl_at(r, 16) for r in runs])
            cell = cells[(encoding, length)]
            assert cell["ppl_n"] == 2
            assert cell["ppl_mean"] == pytest.approx(ppls.mean(), rel=1e-12)
            assert cell["ppl_std"] == pytest.approx(ppls.std(ddof=1), rel=1e-9)
            assert cell["ratio_mean"] == pytest.approx(ratios.mean(), rel=1e-12)
            assert cell["ratio_std"] == pytest.approx(ratios.std(ddof=1), rel=1e-9, abs=1e-15)
            assert f"{ppls.mean():.2f} ± {ppls.std(ddof=1):.2f}" in table


@pytest.mark.slow
def test_report_writes_markdown_csv_json_png_and_tensorboard_into_dir_report(sweep_copy):
    posbench("report", str(sweep_copy), cwd=sweep_copy)
    out = sweep_copy / "report"
    assert (out / "report.md").read_text().startswith("# posbench report")
    rows = list(csv.DictReader((out / "report.csv").open()))
    cells = report_cells(out)
    assert len(rows) == len(cells) == 2 * 3
    for row in rows:
        cell = cells[(row["encoding"], int(row["length"]))]
        assert float(row["ppl_mean"]) == pytest.approx(cell["ppl_mean"])
    png = out / "ppl_vs_length.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = image.imread(png).shape
    assert_canvas(width, height)
    for encoding in ("none", "rope"):
        events = EventAccumulator(str(out / "tensorboard" / encoding))
        events.Reload()
        points = {e.step: e.value for e in events.Scalars("report/ppl")}
        assert points == pytest.approx({n: cells[(encoding, n)]["ppl_mean"] for n in (16, 32, 64)})


@pytest.mark.slow
def test_partial_sweeps_list_unfinished_and_diverged_runs_and_average_the_rest(sweep_copy):
    none_runs = sorted(sweep_copy.glob("*_none_seed*"))
    (none_runs[0] / "results.json").unlink()  # failed or still running
    rope_runs = sorted(sweep_copy.glob("*_rope_seed*"))
    diverged = json.loads((rope_runs[1] / "results.json").read_text())
    diverged.update(status="diverged", train={"diverged_at_step": 7}, eval=[])
    (rope_runs[1] / "results.json").write_text(json.dumps(diverged))

    result = posbench("report", str(sweep_copy), cwd=sweep_copy)
    assert f"`{none_runs[0].name}`: no results.json" in result.stdout
    assert f"`{rope_runs[1].name}`: diverged at step 7" in result.stdout
    cells = report_cells(sweep_copy / "report")
    for encoding, kept in (("none", none_runs[1]), ("rope", rope_runs[0])):
        alone = json.loads((kept / "results.json").read_text())
        assert cells[(encoding, 32)]["ppl_n"] == 1
        assert cells[(encoding, 32)]["ppl_mean"] == ppl_at(alone, 32)
        assert cells[(encoding, 32)]["ppl_std"] is None


def test_report_help_and_top_level_help_mention_report(capsys):
    """posbench's main in this process (test_cli.py runs --help as the command)."""
    from posbench.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["report", "--help"])
    assert exited.value.code == 0 and "DIR" in capsys.readouterr().out
    main(["--help"])
    assert "report" in capsys.readouterr().out


# ------------------------------------------------------------ hand-made runs (fast)


def make_run(path, encoding="rope", seed=0, seq_len=16, ppls=None, results=None, **config):
    """A run directory as `posbench train` leaves it: config.yaml and results.json."""
    ppls = ppls or {16: 5.0, 32: 6.0}
    cfg = OmegaConf.create(
        {
            "seed": seed,
            "encoding": {"name": encoding},
            "model": {"n_layer": 1, "d_model": 32},
            "data": {"name": "synthetic"},
            "train": {"seq_len": seq_len, "steps": 10},
        }
    )
    for key, value in config.items():  # encoding__base=500 -> encoding.base: 500
        OmegaConf.update(cfg, key.replace("__", "."), value)
    path.mkdir(parents=True)
    OmegaConf.save(cfg, path / "config.yaml")
    records = [
        {"length": n, "stride": None, "ppl": p, "status": "ok", "reason": None}
        if p is not None
        else {"length": n, "stride": None, "ppl": None, "status": "unsupported", "reason": "why"}
        for n, p in ppls.items()
    ]
    content = {"encoding": encoding, "seed": seed, "eval": records, **(results or {})}
    (path / "results.json").write_text(json.dumps(content))
    return path


def test_runs_of_different_training_lengths_are_grouped_not_averaged(tmp_path):
    make_run(tmp_path / "a", seq_len=16, ppls={16: 5.0, 32: 6.0})
    make_run(tmp_path / "b", seq_len=32, ppls={32: 4.0, 64: 9.0})
    report = build_report(tmp_path)
    assert [(g.train_seq_len, g.setting) for g in report.groups] == [
        (16, {"train.seq_len": 16}),
        (32, {"train.seq_len": 32}),
    ]
    (first,) = report.groups[0].rows
    assert [c.ppl.mean for c in first.cells] == [5.0, 6.0]


def test_only_seed_differences_are_averaged(tmp_path):
    make_run(tmp_path / "s0", seed=0, ppls={16: 4.0, 32: 8.0})
    make_run(tmp_path / "s1", seed=1, ppls={16: 6.0, 32: 12.0}, train__log_every=3)
    (group,) = build_report(tmp_path).groups
    (row,) = group.rows
    assert [c.ppl.mean for c in row.cells] == [5.0, 10.0]
    assert row.cells[1].ppl.std == pytest.approx(np.std([8.0, 12.0], ddof=1))
    assert row.cells[1].ratio.mean == pytest.approx(2.0) and row.cells[1].ratio.std == 0.0


def test_runs_logged_to_different_places_are_averaged(tmp_path):
    make_run(tmp_path / "s0", seed=0, ppls={16: 4.0, 32: 8.0})  # from before the logger group
    make_run(tmp_path / "s1", seed=1, ppls={16: 6.0, 32: 12.0}, logger__name="wandb")
    (group,) = build_report(tmp_path).groups
    (row,) = group.rows
    assert [c.ppl.mean for c in row.cells] == [5.0, 10.0]


def test_unsupported_lengths_are_shown_with_their_reason(tmp_path):
    make_run(tmp_path / "learned", encoding="learned", ppls={16: 5.0, 32: None})
    text = markdown(build_report(tmp_path))
    assert "| learned | 1 | 5.00 | unsupported [1] |" in text
    assert "[1] learned: why" in text


def add_records(run, *records):
    """More eval records in the run's results.json (the fields a record lacks: plain, ok)."""
    results = json.loads((run / "results.json").read_text())
    plain = {"stride": None, "status": "ok", "reason": None}
    results["eval"] += [{**plain, **record} for record in records]
    (run / "results.json").write_text(json.dumps(results))


def test_dape_runs_are_rows_beside_their_bias_without_it(tmp_path):
    """DAPE's settings label a row only where it is on, its width and kernel only away from
    their defaults: "alibi" beside "alibi (dape=True)", not "alibi (dape=False)"."""
    dape = {"encoding__dape_width": 32, "encoding__dape_kernel": 3}
    make_run(tmp_path / "a", encoding="alibi", encoding__dape=False, **dape)
    make_run(tmp_path / "b", encoding="alibi", encoding__dape=True, **dape)
    make_run(
        tmp_path / "c",
        encoding="alibi",
        encoding__dape=True,
        **{**dape, "encoding__dape_width": 16},
    )
    (group,) = build_report(tmp_path).groups
    labels = sorted(row.label for row in group.rows)
    assert labels == ["alibi", "alibi (dape=True)", "alibi (dape=True, dape_width=16)"]


def test_an_encoding_option_at_its_default_is_not_named_beside_one_away_from_it(tmp_path):
    """p-RoPE's rows beside RoPE's: "rope (keep_frequencies=0.75)" and "rope", never
    "rope (keep_frequencies=1.0)" on every RoPE row."""
    make_run(tmp_path / "a", encoding="rope", encoding__keep_frequencies=1.0)
    make_run(tmp_path / "b", encoding="rope", encoding__keep_frequencies=0.75)
    make_run(tmp_path / "c", encoding="rope", encoding__keep_frequencies=1.0, encoding__base=500.0)
    (group,) = build_report(tmp_path).groups
    labels = sorted(row.label for row in group.rows)
    assert labels == ["rope", "rope (base=500.0)", "rope (keep_frequencies=0.75)"]


def test_scaled_evaluations_are_rows_of_their_own(tmp_path):
    run = make_run(tmp_path / "r", ppls={16: 5.0, 32: 7.0})
    add_records(run, {"length": 32, "ppl": 5.5, "scaling": "yarn"})
    (group,) = build_report(tmp_path).groups
    rows = {row.label: [c.ppl.mean for c in row.cells] for row in group.rows}
    assert rows == {"rope": [5.0, 7.0], "rope + yarn": [None, 5.5]}


def test_each_scaling_method_and_factor_is_a_row_of_its_own(tmp_path):
    run = make_run(tmp_path / "r", ppls={16: 5.0, 32: 7.0})
    results = json.loads((run / "results.json").read_text())
    for ppl, setting in ((5.5, None), (5.2, 2.0), (6.0, 4.0)):
        factor = setting or 2.0
        results["eval"].append(
            {
                "length": 32,
                "stride": None,
                "ppl": ppl,
                "status": "ok",
                "scaling": "yarn",
                "scaling_factor": factor,
                "scaling_factor_setting": setting,
            }
        )
    (run / "results.json").write_text(json.dumps(results))
    (group,) = build_report(tmp_path).groups
    rows = {row.label: row.cells[1].ppl.mean for row in group.rows}
    assert rows == {"rope": 7.0, "rope + yarn": 5.5, "rope + yarn s=2": 5.2, "rope + yarn s=4": 6.0}


def test_positions_other_than_the_runs_own_are_rows_of_their_own(tmp_path):
    # A randomized-positions run evaluates at random positions (its own protocol); a
    # re-evaluation at 0..L-1 (posbench eval --positions consecutive) is another row.
    # make_run's records have no positions field: consecutive, as records from before it.
    run = make_run(tmp_path / "r", ppls={16: 8.0, 32: 12.0}, train__random_positions=64)
    at_random = {"positions": "random", "random_positions": 64}
    add_records(
        run, {"length": 16, "ppl": 5.0, **at_random}, {"length": 32, "ppl": 5.5, **at_random}
    )
    (group,) = build_report(tmp_path).groups
    rows = {row.label: [(c.ppl.mean, c.ratio.mean) for c in row.cells] for row in group.rows}
    assert rows == {
        "rope": [(5.0, 1.0), (5.5, pytest.approx(1.1))],
        "rope, consecutive positions": [(8.0, 1.0), (12.0, 1.5)],
    }
    assert "rope, consecutive positions" in markdown(build_report(tmp_path))


def yarn(length, ppl, setting=None):
    """A record of eval-time YaRN: s from each length, or ``setting`` for every length."""
    factor = setting or max(1.0, length / 16)
    return {
        "length": length,
        "ppl": ppl,
        "scaling": "yarn",
        "scaling_factor": factor,
        "scaling_factor_setting": setting,
    }


def test_each_row_divides_by_its_own_protocol_at_the_training_length(tmp_path):
    run = make_run(tmp_path / "r", ppls={16: 5.0, 32: 7.0})
    add_records(
        run,
        {"length": 16, "ppl": 4.0, "stride": 8},
        {"length": 32, "ppl": 4.4, "stride": 8},
        yarn(16, 5.0),
        yarn(32, 5.5),
        yarn(16, 8.0, setting=4.0),
        yarn(32, 6.0, setting=4.0),
    )
    (group,) = build_report(tmp_path).groups
    ratios = {row.label: [c.ratio.mean for c in row.cells] for row in group.rows}
    assert ratios == {
        "rope": pytest.approx([1.0, 1.4]),
        "rope, stride 8": pytest.approx([1.0, 1.1]),
        "rope + yarn": pytest.approx([1.0, 1.1]),
        "rope + yarn s=4": pytest.approx([1.0, 0.75]),
    }


def test_the_ratio_table_names_its_reference_in_its_header(tmp_path):
    make_run(tmp_path / "r", ppls={16: 5.0, 32: 7.0})
    text = markdown(build_report(tmp_path))
    title = "ppl / ppl at 16 (same protocol: stride, scaling, positions), each run against its own:"
    assert f"\n{title}\n\n| encoding | runs | 16 (1×) | 32 (2×) |\n" in text


def test_a_length_that_is_no_multiple_of_the_training_length_shows_two_decimals(tmp_path):
    make_run(tmp_path / "r", seq_len=512, ppls={512: 5.0, 1012: 5.5, 15512: 6.0})
    assert "| 512 (1×) | 1012 (1.98×) | 15512 (30.3×) |" in markdown(build_report(tmp_path))


def test_a_ratio_without_its_protocol_at_the_training_length_is_a_dash_and_a_footnote(tmp_path):
    add_records(make_run(tmp_path / "r", ppls={16: 5.0, 32: 7.0}), yarn(32, 5.5, setting=4.0))
    text = markdown(build_report(tmp_path))
    ratios = text.split("each run against its own:")[1]
    assert "| rope + yarn s=4 | 1 | – | – [1] |" in ratios
    assert (
        "- [1] rope + yarn s=4: no ppl at 16 measured the same way (non-overlapping windows, "
        "yarn s=4, consecutive positions); evaluate length 16 that way too for a ratio"
    ) in text


def test_the_report_says_what_code_its_runs_ran(tmp_path):
    ran = {"posbench": "0.1.0", "git_commit": "a" * 40, "git_dirty": False}
    ran |= {"torch": "2.13.0+cpu", "python": "3.11.7"}
    edited = {**ran, "git_commit": "b" * 40, "git_dirty": True}
    for seed, versions in enumerate([ran, ran, ran, edited, edited, None]):
        make_run(tmp_path / f"seed{seed}", seed=seed, results=versions and {"versions": versions})
    report = build_report(tmp_path)
    assert (
        "Code: the results come from 3 versions (results.json's `versions`, re-evaluations' too; "
        "one config and seed can give other numbers under other code): posbench 0.1.0 at "
        "aaaaaaaaaaaa, torch 2.13.0+cpu, Python 3.11.7 (3 runs); posbench 0.1.0 at bbbbbbbbbbbb "
        "with edits, torch 2.13.0+cpu, Python 3.11.7 (2 runs); not recorded (runs written "
        "before posbench recorded it) (1 run)."
    ) in markdown(report)
    write_report(report, tmp_path / "report")
    content = json.loads((tmp_path / "report" / "report.json").read_text())
    assert content["code"] == [
        {"versions": ran, "runs": 3},
        {"versions": edited, "runs": 2},
        {"versions": None, "runs": 1},
    ]
    one = markdown(build_report([tmp_path / "seed0", tmp_path / "seed1"]))
    assert "\nCode: posbench 0.1.0 at aaaaaaaaaaaa, torch 2.13.0+cpu, Python 3.11.7.\n" in one
    # A record `posbench eval` re-evaluated under other code counts that code too.
    add_records(tmp_path / "seed1", {"length": 64, "ppl": 8.0, "versions": edited})
    both = build_report([tmp_path / "seed0", tmp_path / "seed1"])
    assert both.code == [(ran, 2), (edited, 1)]


def test_bold_marks_every_mean_that_prints_as_the_best_and_none_where_all_print_alike():
    assert best_shown([0.004, 0.001]) is None  # both print 0.00: no win to mark
    assert best_shown([0.004, 0.001, 0.2]) == "0.20"
    assert best_shown([0.996, 1.0, 0.5]) == "1.00"  # the 0.996 is bold too
    assert best_shown([5.0, 7.4, None], min) == "5.00"
    assert best_shown([None, 0.3]) is None
    assert stat_text(Stat.of([0.991, 0.993]), "0.99") == "**0.99** ± 0.00"
    assert stat_text(Stat.of([0.5]), "1.00") == "0.50"


def test_an_encoding_far_worse_at_the_training_length_is_marked_not_comparable(tmp_path):
    make_run(tmp_path / "rope", ppls={16: 5.0, 32: 9.0})
    make_run(tmp_path / "alibi", encoding="alibi", ppls={16: 7.4, 32: 8.0})  # 1.48x: comparable
    make_run(tmp_path / "none", encoding="none", ppls={16: 7.6, 32: 7.6})  # 1.52x: not
    out = tmp_path / "report"
    report = build_report(tmp_path, out)
    write_report(report, out)
    text = markdown(report)
    ratios = text.split("each run against its own:")[1]
    assert "| none [1] | 1 | 1.00 | **1.00** |" in ratios  # at 16 every run is 1.00: no bold
    assert "| alibi | 1 |" in ratios and "| rope | 1 |" in ratios
    assert (
        "- [1] none: did not learn comparably at the training length (ppl 7.60 at 16, more "
        "than 1.5× the best encoding's, rope: 5.00): its ratios say little about extrapolation"
    ) in text
    comparable = {(c["encoding"], c["comparable"]) for c in report_cells(out).values()}
    assert comparable == {("alibi", True), ("none", False), ("rope", True)}


def test_every_row_of_an_encoding_that_is_not_comparable_shares_its_mark(tmp_path):
    make_run(tmp_path / "rope", ppls={16: 5.0, 32: 9.0})
    none = make_run(tmp_path / "none", encoding="none", ppls={16: 8.0, 32: 8.0})
    add_records(
        none, {"length": 16, "ppl": 6.0, "stride": 8}, {"length": 32, "ppl": 6.0, "stride": 8}
    )
    ratios = markdown(build_report(tmp_path)).split("each run against its own:")[1]
    assert "| none [1] | 1 |" in ratios and "| none, stride 8 [1] | 1 |" in ratios
    assert "| rope | 1 |" in ratios


def test_a_row_trained_at_another_precision_than_the_tables_others_is_footnoted(tmp_path):
    """precision=auto resolves per machine: a sweep added from a CPU without bf16 trains in
    fp32 under the same config, and its row says so."""
    for seed in (0, 1):
        make_run(tmp_path / f"rope{seed}", seed=seed, results={"precision": "bf16"})
    make_run(tmp_path / "alibi0", encoding="alibi", results={"precision": "bf16"})
    make_run(tmp_path / "alibi1", encoding="alibi", seed=1, results={"precision": "fp32"})
    make_run(tmp_path / "old", encoding="t5")  # before results.json recorded it: neither
    text = markdown(build_report(tmp_path))
    ratios = text.split("each run against its own:")[1]
    assert "| alibi [1] | 2 |" in ratios
    assert "| rope | 2 |" in ratios and "| t5 | 1 |" in ratios
    assert (
        "- [1] alibi: 1 of its 2 runs trained in fp32, the table's others in bf16 "
        "(train.precision=auto resolves per machine: results.json's precision)"
    ) in text
    for run in ("rope0", "rope1", "alibi0"):
        shutil.rmtree(tmp_path / run)
    (group,) = build_report(tmp_path).groups  # one precision recorded: nothing to mark
    assert [row.other_precision for row in group.rows] == [None, None]


def test_comparability_is_judged_on_the_records_measured_as_trained(tmp_path):
    """Sliding windows score each token with more context: a stride row's lower perplexity at
    the training length is no better learning."""
    rope = make_run(tmp_path / "rope", ppls={16: 5.0, 32: 9.0})
    add_records(rope, {"length": 16, "ppl": 3.0, "stride": 8})
    make_run(tmp_path / "alibi", encoding="alibi", ppls={16: 7.0, 32: 7.0})  # 1.4x rope's 5.0
    (group,) = build_report(tmp_path).groups
    assert [row.not_comparable for row in group.rows] == [None, None, None]


def test_the_figure_legend_marks_a_row_that_is_not_comparable(tmp_path):
    make_run(tmp_path / "rope", ppls={16: 5.0, 32: 9.0})
    make_run(tmp_path / "none", encoding="none", ppls={16: 8.0, 32: 8.0})
    (group,) = build_report(tmp_path).groups
    (legend,) = value_figure(group).legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["none (not comparable)", "rope", "train length"]


def assert_canvas(width, height):
    """An image of one axes: FIGURE_INCHES high, as wide or wider (its legend beside it)."""
    assert height == FIGURE_INCHES[1] * FIGURE_DPI
    assert width >= FIGURE_INCHES[0] * FIGURE_DPI


def labelled_range(axes):
    """The lowest and the highest y value that a tick label names, as drawn."""
    axes.figure.draw_without_rendering()
    low, high = sorted(axes.get_ylim())
    ticks = [*axes.yaxis.get_major_ticks(), *axes.yaxis.get_minor_ticks()]
    locations = [*axes.yaxis.get_majorticklocs(), *axes.yaxis.get_minorticklocs()]
    named = [
        at
        for at, tick in zip(locations, ticks, strict=True)
        if tick.label1.get_visible() and tick.label1.get_text() and low <= at <= high
    ]
    return min(named), max(named)


def plotted_range(axes):
    """The lowest and the highest value of the figure's curves (the rows' means)."""
    values = [
        y
        for line in axes.get_lines()
        if line.get_label() != "train length"
        for y in line.get_ydata()
    ]
    return min(values), max(values)


@pytest.mark.parametrize(
    "ppls",
    [
        {16: 8.1, 32: 9.0, 64: 11.7},  # narrow: once labelled at 8, 9 and 10 only
        {16: 3.2, 32: 40.0, 64: 310.0},  # wide: an encoding that blows up past its length
        {16: 5.0, 32: 5.0, 64: 5.0},  # flat
    ],
    ids=["narrow", "wide", "flat"],
)
def test_the_perplexity_axis_labels_a_range_holding_every_curve(tmp_path, ppls):
    make_run(tmp_path / "rope", ppls=ppls)
    make_run(tmp_path / "alibi", encoding="alibi", ppls={16: 8.0, 32: 8.3, 64: 8.6})
    (group,) = build_report(tmp_path).groups
    (axes,) = value_figure(group).axes
    labelled_low, labelled_high = labelled_range(axes)
    low, high = plotted_range(axes)
    assert labelled_low <= low and high <= labelled_high


@pytest.mark.parametrize(
    ("highest", "scale"), [(8.0 * 3, "linear"), (8.0 * 3.01, "log")], ids=["3x", "over 3x"]
)
def test_the_perplexity_axis_is_log_scaled_only_where_its_range_is_wide(tmp_path, highest, scale):
    make_run(tmp_path / "rope", ppls={16: 8.0, 32: highest})
    (group,) = build_report(tmp_path).groups
    (axes,) = value_figure(group).axes
    assert axes.get_yscale() == scale


def test_encodings_with_different_options_are_separate_rows(tmp_path):
    make_run(tmp_path / "a", ppls={16: 5.0}, encoding__base=10000)
    make_run(tmp_path / "b", ppls={16: 7.0}, encoding__base=500)
    (group,) = build_report(tmp_path).groups
    assert sorted(row.label for row in group.rows) == ["rope", "rope (base=500)"]  # 10000: default


def test_attention_variants_are_rows_beside_their_encoding_in_one_group(tmp_path):
    """A variant away from its default is a row of its own, named by the variant; sigmoid
    attention's length only where it is not the training length (its default)."""
    make_run(tmp_path / "plain")  # a run from before the variants: their defaults
    make_run(tmp_path / "softmax", seed=1, model__qk_norm=False, model__attention="softmax")
    make_run(tmp_path / "qk", model__qk_norm=True)
    make_run(tmp_path / "gate", model__attn_gate="headwise", model__attn_sinks=True)
    make_run(tmp_path / "sig", model__attention="sigmoid", model__sigmoid_length=16)
    make_run(tmp_path / "sig64", model__attention="sigmoid", model__sigmoid_length=64)
    make_run(tmp_path / "sb", encoding="none", model__attention="stick_breaking")
    (group,) = build_report(tmp_path).groups
    assert sorted((row.label, len(row.runs)) for row in group.rows) == [
        ("none", 1),  # the only none: nothing to tell it from
        ("rope", 2),
        ("rope (attention=sigmoid)", 1),
        ("rope (attention=sigmoid, sigmoid_length=64)", 1),
        ("rope (attn_gate=headwise, attn_sinks=True)", 1),
        ("rope (qk_norm=True)", 1),
    ]


def test_rerunning_the_report_ignores_its_own_output(tmp_path):
    make_run(tmp_path / "a")
    write_report(build_report(tmp_path, tmp_path / "report"), tmp_path / "report")
    write_report(build_report(tmp_path, tmp_path / "report"), tmp_path / "report")
    assert sorted(p.name for p in (tmp_path / "report" / "tensorboard").iterdir()) == ["rope"]
    assert not [p for p in (tmp_path / "report").iterdir() if p.name.startswith(".")]


def test_several_directories_are_read_as_one_sweep(tmp_path):
    """The second sweep of +experiment=algorithmic (randomized positions) lands in a directory
    of its own: both DIRs together give one table, each run once even where DIRs overlap."""
    make_run(tmp_path / "sweeps" / "a" / "s0", seed=0, ppls={16: 4.0})
    make_run(tmp_path / "sweeps" / "b" / "s1", seed=1, ppls={16: 6.0})
    out = tmp_path / "out"
    result = posbench(
        "report", "sweeps/a", "sweeps/b", "sweeps/b/s1", "--out", str(out), cwd=tmp_path
    )
    assert result.stdout.startswith("# posbench report: sweeps/a, sweeps/b, sweeps/b/s1\n")
    content = json.loads((out / "report.json").read_text())
    assert content["dirs"] == ["sweeps/a", "sweeps/b", "sweeps/b/s1"]
    assert content["root"] == str(tmp_path / "sweeps")
    (group,) = content["groups"]
    assert group["rows"] == {"rope": ["a/s0", "b/s1"]}
    assert report_cells(out)[("rope", 16)]["ppl_mean"] == 5.0


def test_a_directory_without_finished_runs_is_a_one_line_error(tmp_path):
    (tmp_path / "job" / ".hydra").mkdir(parents=True)
    with pytest.raises(PosbenchError, match="no finished run") as err:
        build_report(tmp_path)
    assert "\n" not in str(err.value)


def add_documents(run, documents):
    """Give the run's records the documents they scored: ``documents`` maps length -> count."""
    results = json.loads((run / "results.json").read_text())
    for record in results["eval"]:
        record["documents"] = documents[record["length"]]
    (run / "results.json").write_text(json.dumps(results))


def test_documents_scored_are_shown_per_length_when_they_differ(tmp_path):
    add_documents(make_run(tmp_path / "s0", seed=0), {16: 3, 32: 2})
    add_documents(make_run(tmp_path / "s1", seed=1), {16: 3, 32: 2})
    out = tmp_path / "report"
    report = build_report(tmp_path, out)
    write_report(report, out)
    assert "| documents | 3 | 2 |" in markdown(report)
    cells = report_cells(out)
    assert (cells[("rope", 32)]["documents_min"], cells[("rope", 32)]["documents_max"]) == (2, 2)
    assert cells[("rope", 16)]["documents_max"] == 3


def test_the_same_documents_at_every_length_are_one_line(tmp_path):
    add_documents(make_run(tmp_path / "r"), {16: 3, 32: 3})
    text = markdown(build_report(tmp_path))
    assert "Documents scored: 3 at every length." in text and "| documents |" not in text


def test_runs_whose_documents_differ_show_each_count(tmp_path):
    add_documents(make_run(tmp_path / "s0", seed=0), {16: 3, 32: 2})
    add_documents(make_run(tmp_path / "s1", seed=1), {16: 3, 32: 1})  # e.g. another max_tokens
    assert "| documents | 3 | 1, 2 |" in markdown(build_report(tmp_path))


def test_a_stream_corpus_gets_no_documents_note(tmp_path):
    add_documents(make_run(tmp_path / "r"), {16: None, 32: None})
    assert "ocuments" not in markdown(build_report(tmp_path))


# ------------------------------------------------------------ loss by position (fast)


def add_loss_by_position(run, length, nlls, tokens_per_position=1):
    """Give the run's record at ``length`` a loss_by_position: {(start, end): nll}."""
    results = json.loads((run / "results.json").read_text())
    (record,) = [r for r in results["eval"] if r["length"] == length]
    record["loss_by_position"] = [
        {"start": s, "end": e, "nll": nll, "tokens": (e - s) * tokens_per_position}
        for (s, e), nll in nlls.items()
    ]
    (run / "results.json").write_text(json.dumps(results))


# train.seq_len 16: buckets before it, and after it of unequal size (8 and 16 positions)
BUCKETS = [(0, 8), (8, 16), (16, 24), (24, 40)]


def test_loss_by_position_is_averaged_over_seeds_at_the_longest_length(tmp_path):
    for seed, nlls in enumerate(([2.0, 1.0, 3.0, 4.0], [4.0, 1.0, 5.0, 6.0])):
        run = make_run(tmp_path / f"s{seed}", seed=seed, ppls={16: 5.0, 40: 6.0})
        add_loss_by_position(run, 16, {(0, 8): 9.0, (8, 16): 9.0})  # shorter: not plotted
        add_loss_by_position(run, 40, dict(zip(BUCKETS, nlls, strict=True)))
    (group,) = build_report(tmp_path).groups
    (row,) = group.rows
    assert group.position_length == 40
    assert row.by_position.buckets == BUCKETS
    assert [stat.mean for stat in row.by_position.nll] == [3.0, 1.0, 4.0, 5.0]
    assert row.by_position.nll[0].std == pytest.approx(np.std([2.0, 4.0], ddof=1))


def test_nll_after_over_before_the_training_length_is_token_weighted_per_run(tmp_path):
    run = make_run(tmp_path / "r", ppls={16: 5.0, 40: 6.0})
    add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0], strict=True)), 2)
    (group,) = build_report(tmp_path).groups
    curve = group.rows[0].by_position
    before, after = (2.0 * 8 + 1.0 * 8) / 16, (3.0 * 8 + 4.0 * 16) / 24
    assert (curve.before.mean, curve.after.mean) == pytest.approx((before, after))
    assert curve.ratio.mean == pytest.approx(after / before)
    assert f"| rope | 1 | 1.50 | {after:.2f} | {after / before:.2f} |" in markdown(
        build_report(tmp_path)
    )


def test_report_writes_the_loss_by_position_figure_and_curves(tmp_path):
    run = make_run(tmp_path / "r", ppls={16: 5.0, 40: 6.0})
    add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0], strict=True)))
    out = tmp_path / "report"
    write_report(build_report(tmp_path, out), out)
    height, width, _ = image.imread(out / "loss_by_position.png").shape
    assert_canvas(width, height)
    (group,) = json.loads((out / "report.json").read_text())["groups"]
    curve = group["loss_by_position"]["rows"]["rope"]
    assert group["loss_by_position"]["length"] == 40
    assert (curve["end"], curve["nll_mean"]) == ([8, 16, 24, 40], [2.0, 1.0, 3.0, 4.0])
    events = EventAccumulator(str(out / "tensorboard" / "rope"))
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("report/loss_by_position")]
    assert points == [(8, 2.0), (16, 1.0), (24, 3.0), (40, 4.0)]


def test_every_row_has_its_own_line_style_the_same_in_both_figures(tmp_path):
    """More rows than matplotlib has default colours (a sweep with scaled re-evaluations has
    12) must not draw two rows alike."""
    for index in range(13):
        run = make_run(tmp_path / f"r{index}", encoding=f"enc{index:02d}", ppls={16: 5.0, 40: 6.0})
        add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0], strict=True)))
    (group,) = build_report(tmp_path).groups

    def styles(figure):
        (axes,) = figure.axes
        return {
            line.get_label(): (line.get_color(), line.get_linestyle())
            for line in axes.get_lines()
            if line.get_label() != "train length"
        }

    by_length, by_position = styles(value_figure(group)), styles(position_figure(group))
    assert len(by_length) == 13 and len(set(by_length.values())) == 13
    assert by_position == by_length


def test_runs_without_loss_by_position_get_no_position_table_or_figure(tmp_path):
    make_run(tmp_path / "r")  # results.json from before loss by position, or sliding windows
    out = tmp_path / "report"
    report = build_report(tmp_path, out)
    write_report(report, out)
    assert report.groups[0].position_length is None
    assert "Loss by position" not in markdown(report)
    assert not (out / "loss_by_position.png").exists()


def add_accuracy(run, accuracies, decode="greedy"):
    """Task records: ``accuracies`` maps length -> (accuracy, sequence_accuracy), scored as
    ``decode`` says (None: a record from before the field existed)."""
    results = json.loads((run / "results.json").read_text())
    for record in results["eval"]:
        record["accuracy"], record["sequence_accuracy"] = accuracies[record["length"]]
        if decode is not None:
            record["decode"] = decode
    (run / "results.json").write_text(json.dumps(results))


def test_task_runs_get_accuracy_tables_averaged_over_seeds_and_a_figure(tmp_path):
    add_accuracy(make_run(tmp_path / "a", seed=0), {16: (1.0, 1.0), 32: (0.5, 0.25)})
    add_accuracy(make_run(tmp_path / "b", seed=1), {16: (0.8, 0.5), 32: (0.3, 0.0)})
    out = tmp_path / "report"
    report = build_report(tmp_path, out)
    write_report(report, out)
    text = markdown(report)
    assert "| rope | 2 | 0.90 ± 0.14 | 0.40 ± 0.14 |" in text.split("Accuracy (")[1]
    assert "| rope | 2 | 0.75 ± 0.35 | 0.12 ± 0.18 |" in text.split("Sequence accuracy")[1]
    cells = report_cells(out)
    assert cells[("rope", 32)]["accuracy_mean"] == pytest.approx(0.4)
    assert cells[("rope", 32)]["sequence_accuracy_n"] == 2
    height, width, _ = image.imread(out / "accuracy_vs_length.png").shape
    assert_canvas(width, height)
    events = EventAccumulator(str(out / "tensorboard" / "rope"))
    events.Reload()
    points = [(e.step, round(e.value, 6)) for e in events.Scalars("report/accuracy")]
    assert points == [(16, 0.9), (32, 0.4)]


def test_runs_from_before_greedy_decoding_report_sequence_accuracy_but_no_accuracy(tmp_path):
    # Their accuracy was scored under teacher forcing: no greedy decode's to average.
    add_accuracy(make_run(tmp_path / "a", seed=0), {16: (1.0, 1.0), 32: (0.9, 0.25)}, None)
    (group,) = build_report(tmp_path).groups
    cells = group.rows[0].cells
    assert [c.accuracy.n for c in cells] == [0, 0]
    assert [c.sequence_accuracy.mean for c in cells] == [1.0, 0.25]
    assert "| rope | 1 | 1.00 | 0.25 |" in markdown(build_report(tmp_path)).split("Sequence")[1]


def test_corpus_runs_get_no_accuracy_table_or_figure(tmp_path):
    make_run(tmp_path / "r")
    out = tmp_path / "report"
    report = build_report(tmp_path, out)
    write_report(report, out)
    assert "Accuracy" not in markdown(report)
    assert not (out / "accuracy_vs_length.png").exists()


@pytest.mark.parametrize(("seeds", "says_std"), [(1, False), (2, True)], ids=["1 seed", "2 seeds"])
def test_the_figures_name_a_std_over_seeds_only_where_a_row_has_several_runs(
    tmp_path, seeds, says_std
):
    for seed in range(seeds):
        run = make_run(tmp_path / f"s{seed}", seed=seed, ppls={16: 5.0 + seed, 40: 6.0})
        add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0 + seed], strict=True)))
        add_accuracy(run, {16: (1.0, 1.0), 40: (0.5 + 0.1 * seed, 0.25)})
    (group,) = build_report(tmp_path).groups
    for figure in (value_figure(group), position_figure(group), accuracy_figure(group)):
        (axes,) = figure.axes
        assert ("± std over seeds" in axes.get_ylabel()) == says_std, axes.get_ylabel()


def test_passkey_accuracy_by_depth_is_averaged_over_seeds_at_the_longest_length(tmp_path):
    for seed, accuracies in enumerate([(1.0, 0.5), (0.6, 0.3)]):
        run = make_run(tmp_path / str(seed), seed=seed)
        add_accuracy(run, {16: (1.0, 1.0), 32: (0.7, 0.5)})
        results = json.loads((run / "results.json").read_text())
        results["eval"][1]["accuracy_by_depth"] = [
            {"depth_percent": d, "accuracy": a, "sequence_accuracy": a, "examples": 10}
            for d, a in zip((0, 100), accuracies, strict=True)
        ]
        (run / "results.json").write_text(json.dumps(results))
    out = tmp_path / "report"
    report = build_report(tmp_path, out)
    write_report(report, out)
    assert "| rope | 2 | 0.80 ± 0.28 | 0.40 ± 0.14 |" in markdown(report).split("by depth")[1]
    (group,) = json.loads((out / "report.json").read_text())["groups"]
    by_depth = group["accuracy_by_depth"]
    assert by_depth["length"] == 32
    assert by_depth["rows"]["rope"]["depth_percent"] == [0, 100]
    assert by_depth["rows"]["rope"]["accuracy_mean"] == pytest.approx([0.8, 0.4])


@pytest.mark.slow
def test_a_run_from_before_a_model_option_existed_groups_with_runs_at_its_default(sweep_copy):
    old = sorted(sweep_copy.glob("*_none_seed*"))[0] / "config.yaml"
    config = OmegaConf.load(old)
    for key in ("attention_scaling", "attention_floor_scale", "attention_scale"):
        del config.model[key]  # as a config.yaml written before model.attention_scaling
    OmegaConf.save(config, old)
    (group,) = build_report(sweep_copy).groups
    assert {len(row.runs) for row in group.rows} == {2}


def task_run(path, task, encoding, seed, accuracies, decode="greedy", **config):
    """A run on an algorithmic task trained at problem lengths 1-40: ``accuracies`` maps each
    problem length to its (accuracy, sequence_accuracy), its autoregressive answers scored as
    ``decode`` says (None: a record from before the field existed, teacher-forced;
    "placeholders": answers at placeholders); results.json holds the summary over the lengths
    past 40, as runs.with_length_generalization writes it."""
    positions = config.get("train__random_positions")
    at = {} if positions is None else {"positions": "random", "random_positions": positions}
    scored = {"answer_mode": "placeholders", "decode": None} if decode == "placeholders" else {}
    scored = scored or ({} if decode is None else {"decode": decode})
    records = [
        {"length": n, "stride": None, "ppl": 1.5, "status": "ok", "reason": None,
         "accuracy": acc, "sequence_accuracy": seq, **scored, **at}
        for n, (acc, seq) in accuracies.items()
    ]  # fmt: skip
    beyond = [(acc, seq) for n, (acc, seq) in accuracies.items() if n > 40]
    summary = {
        "length_generalization": float(np.mean([seq for _, seq in beyond])),
        "length_generalization_accuracy": float(np.mean([acc for acc, _ in beyond])),
    }
    run = make_run(
        path, encoding, seed, seq_len=128, data__name=task, data__train_lengths=[1, 40], **config
    )
    content = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**content, "eval": records, **summary}))
    return run


def test_accuracy_per_byte_is_read_against_chance_and_the_constant_answer(tmp_path):
    run = task_run(
        tmp_path / "parity",
        "parity_check",
        "rope",
        0,
        {40: (1.0, 1.0), 50: (0.6, 0.6), 100: (0.5, 0.5)},
        data__source="parity_check",
    )
    results = json.loads((run / "results.json").read_text())
    results["data"] = {"name": "parity_check", "chance_accuracy": 0.5}
    (run / "results.json").write_text(json.dumps(results))
    # A run whose config does not name its task's source (an older posbench's): no baselines.
    task_run(tmp_path / "reverse", "reverse_string", "rope", 0, {40: (1.0, 1.0), 50: (0.5, 0.0)})
    task = load_data({"source": "parity_check", "train_lengths": [1, 40]})
    # Its records hold no baselines (written before they did): the constant answer of each
    # length, averaged.
    constant = np.mean([task.constant_answer_accuracy([n]) for n in (50, 100)])
    text = markdown(build_report(tmp_path))
    per_byte = text[text.index("mean accuracy per answer byte") :]
    table = per_byte[per_byte.index("| task |") :].splitlines()
    assert table[0] == "| task | rope | chance | constant answer |"
    assert table[2] == f"| parity_check | 0.55 | 0.50 | {constant:.2f} |"
    assert table[3] == "| reverse_string | 0.50 | – | – |"
    out = tmp_path / "report"
    write_report(build_report(tmp_path, out), out)
    groups = json.loads((out / "report.json").read_text())["groups"]
    assert groups[0]["chance_accuracy"] == 0.5
    assert groups[0]["constant_answer_accuracy"] == pytest.approx(constant)
    assert groups[1]["constant_answer_accuracy"] is None


def test_an_algorithmic_sweep_opens_with_ruoss_et_als_table_of_length_generalization(tmp_path):
    for seed, spread in ((0, 0.0), (1, 0.2)):
        for task in ("parity_check", "reverse_string"):
            task_run(
                tmp_path / f"{task}-rope-{seed}",
                task,
                "rope",
                seed,
                {40: (1.0, 1.0), 50: (0.6, 0.1 + spread), 100: (0.5, 0.1 + spread)},
            )
            task_run(
                tmp_path / f"{task}-alibi-{seed}",
                task,
                "alibi",
                seed,
                {40: (1.0, 1.0), 50: (0.9, 0.6), 100: (0.7, 0.4)},
            )
            task_run(tmp_path / f"{task}-random-{seed}", task, "rope", seed,
                     {40: (1.0, 1.0), 50: (0.8, 0.5), 100: (0.8, 0.5)},
                     train__random_positions=2048)  # fmt: skip
    report = build_report(tmp_path)
    assert [(g.task, g.problem_lengths) for g in report.groups] == [
        ("parity_check", (1, 40)),
        ("reverse_string", (1, 40)),
    ]
    text = markdown(report)
    table = text[text.index("| task |") :].splitlines()
    assert table[0] == "| task | alibi | rope | rope (random_positions=2048) |"
    assert table[2] == "| parity_check | **0.50** ± 0.00 | 0.20 ± 0.14 | **0.50** ± 0.00 |"
    # Problem lengths are no multiples of a window, and an algorithmic task's ppl says little.
    assert "| 50 | 100 |" in text and "(0.39×)" not in text and "Perplexity:" not in text
    out = tmp_path / "report"
    written = {path.name for path in write_report(report, out)}
    assert {"accuracy_vs_length_group1.png", "accuracy_vs_length_group2.png"} <= written
    assert not any(name.startswith("ppl_vs_length") for name in written)
    content = json.loads((out / "report.json").read_text())
    summary = content["groups"][0]["length_generalization"]["rope"]
    assert summary["length_generalization_n"] == 2
    assert summary["length_generalization_mean"] == pytest.approx(0.2)


def generalization_run(path, task, encoding, seed, score, decode="greedy"):
    """A run on ``task`` whose length_generalization (whole answers) and
    length_generalization_accuracy (per byte) are both ``score``, at lengths 50 and 100, its
    answers scored as ``decode`` says (task_run)."""
    return task_run(path, task, encoding, seed, {40: (1.0, 1.0), 50: (score, score),
                                                100: (score, score)}, decode)  # fmt: skip


def table_lines(text, title):
    """The Markdown table under the first paragraph that starts with ``title``."""
    start = text.index(title)
    table = text[text.index("| task |", start) :]
    return table[: table.index("\n\n")].splitlines()


def test_table_1_gives_the_max_over_seeds_and_the_share_of_seeds_above_the_threshold(tmp_path):
    for seed, score in enumerate([0.95, 0.5, 0.92]):
        generalization_run(tmp_path / f"rope{seed}", "reverse_string", "rope", seed, score)
    for seed, score in enumerate([0.3, 0.4]):
        generalization_run(tmp_path / f"alibi{seed}", "reverse_string", "alibi", seed, score)
    title = "Length generalization (Ruoss et al. 2023): mean sequence accuracy"
    text = markdown(build_report(tmp_path))
    maxima = table_lines(text, f"{title} (whole answer right), max over seeds")
    assert maxima[2] == "| reverse_string | 0.40 | **0.95** |"
    shares = table_lines(text, f"{title} (whole answer right), success rate")
    assert "the seeds scoring above 0.9, of all seeds" in text
    assert shares[2] == "| reverse_string | 0/2 | **2/3** |"
    stricter = markdown(build_report(tmp_path, success_threshold=0.93))
    assert table_lines(stricter, f"{title} (whole answer right), success rate")[2] == (
        "| reverse_string | 0/2 | **1/3** |"
    )
    out = tmp_path / "report"
    write_report(build_report(tmp_path, out), out)
    content = json.loads((out / "report.json").read_text())
    rope = content["groups"][0]["length_generalization"]["rope"]
    assert rope["length_generalization_max"] == 0.95
    assert rope["length_generalization_success_rate"] == pytest.approx(2 / 3)
    assert rope["length_generalization_accuracy_success_rate"] == pytest.approx(2 / 3)
    assert content["success_threshold"] == 0.9


def test_a_success_threshold_outside_0_to_1_is_a_one_line_error(tmp_path):
    generalization_run(tmp_path / "r", "reverse_string", "rope", 0, 0.5)
    with pytest.raises(
        PosbenchError, match=r"^--success-threshold must be in \[0, 1\) \(got 1\.0\)"
    ):
        build_report(tmp_path, success_threshold=1.0)


def test_mean_reciprocal_rank_ranks_per_task_ties_sharing_the_best_rank(tmp_path):
    scores = {
        "parity_check": {"a": 0.9, "b": 0.9, "c": 0.5},  # a and b tie for rank 1: c is 3rd
        "even_pairs": {"a": 0.2, "b": 0.6, "c": 0.4},
        "odds_first": {"a": 0.7, "b": 0.1},  # c not run: 0 there
    }
    for task, by_encoding in scores.items():
        for encoding, score in by_encoding.items():
            generalization_run(tmp_path / f"{task}-{encoding}", task, encoding, 0, score)
    report = build_report(tmp_path)
    text = markdown(report)
    table = text[text.index("Mean reciprocal rank across the 3 tasks") :].splitlines()
    assert table[2] == (
        "| encoding | tasks scored | MRR, length_generalization | "
        "MRR, length_generalization_accuracy |"
    )
    assert table[4:7] == [
        "| b | 3 | 0.83 | 0.83 |",  # (1 + 1 + 1/2) / 3
        "| a | 3 | 0.78 | 0.78 |",  # (1 + 1/3 + 1) / 3
        "| c | 2 | 0.28 | 0.28 |",  # (1/3 + 1/2 + 0) / 3
    ]
    out = tmp_path / "report"
    write_report(build_report(tmp_path, out), out)
    mrr = json.loads((out / "report.json").read_text())["mean_reciprocal_rank"]
    assert mrr["length_generalization"] == pytest.approx({"a": 7 / 9, "b": 5 / 6, "c": 5 / 18})


def test_reciprocal_ranks_give_tied_scores_the_best_rank_of_the_tie():
    ranks = reciprocal_ranks({"a": 0.5, "b": 1.0, "c": 1.0, "d": None})
    assert ranks == {"a": 1 / 3, "b": 1.0, "c": 1.0}


def add_baselines(run, baselines):
    """Per-length baseline fields in the run's eval records: {length: {field: value}}."""
    results = json.loads((run / "results.json").read_text())
    for record in results["eval"]:
        record.update(baselines.get(record["length"], {}))
    (run / "results.json").write_text(json.dumps(results))


BASELINES_AT = {
    40: {"chance_accuracy": 0.5, "constant_answer_accuracy": 0.9, "prefix_rule_accuracy": 0.9},
    50: {"chance_accuracy": 0.5, "constant_answer_accuracy": 0.6, "prefix_rule_accuracy": 0.8},
    100: {"chance_accuracy": 0.5, "constant_answer_accuracy": 0.5, "prefix_rule_accuracy": 0.7},
}


def test_baselines_from_the_records_are_averaged_over_the_lengths_past_the_training_range(
    tmp_path,
):
    # Runs from before greedy decoding: their accuracy is teacher-forced, beside the prefix rule.
    for seed in (0, 1):
        run = generalization_run(tmp_path / f"r{seed}", "reverse_string", "rope", seed, 0.6, None)
        add_baselines(run, BASELINES_AT)  # length 40 is inside the range: not averaged
    text = markdown(build_report(tmp_path))
    title = "Length generalization (Ruoss et al. 2023): mean accuracy per answer byte"
    mean = table_lines(text, title)
    assert mean[0] == "| task | rope | chance | constant answer | prefix rule |"
    assert mean[2] == "| reverse_string | 0.60 ± 0.00 | 0.50 | 0.55 | 0.75 |"
    maxima = table_lines(text, f"{title}, max over seeds")
    assert maxima[2] == "| reverse_string | 0.60 | 0.50 | 0.55 | 0.75 |"
    success = table_lines(text, f"{title}, success rate")
    assert success[0] == "| task | rope |"  # a share of seeds is no accuracy to compare
    out = tmp_path / "report"
    write_report(build_report(tmp_path, out), out)
    (group,) = json.loads((out / "report.json").read_text())["groups"]
    assert (group["constant_answer_accuracy"], group["prefix_rule_accuracy"]) == (
        pytest.approx(0.55),
        pytest.approx(0.75),
    )


@pytest.mark.parametrize("decode", ["greedy", "placeholders"])
def test_the_model_s_own_answers_are_read_against_chance_and_the_constant_answer_only(
    tmp_path, decode
):
    # A greedy decode's accuracy, or the one forward pass's at placeholders: no prefix rule.
    run = generalization_run(tmp_path / "r", "reverse_string", "rope", 0, 0.6, decode)
    add_baselines(run, BASELINES_AT)
    (group,) = build_report(tmp_path).groups
    assert not group.teacher_forced
    mean = table_lines(
        markdown(build_report(tmp_path)),
        "Length generalization (Ruoss et al. 2023): mean accuracy per answer byte",
    )
    assert mean[0] == "| task | rope | chance | constant answer |"
    assert mean[2] == "| reverse_string | 0.60 | 0.50 | 0.55 |"


def test_a_teacher_forced_accuracy_is_not_averaged_with_the_model_s_own_answers(tmp_path):
    generalization_run(tmp_path / "old", "reverse_string", "rope", 0, 0.9, None)
    generalization_run(tmp_path / "new", "reverse_string", "rope", 1, 0.5)
    (group,) = build_report(tmp_path).groups
    assert not group.teacher_forced
    assert group.rows[0].generalization_accuracy.values == (0.5,)


def test_the_prefix_rule_is_not_set_beside_a_decodes_accuracy(tmp_path):
    """Records with teacher_forced_accuracy hold a greedy decode's accuracy, which no answer
    byte it did not write itself can help."""
    run = generalization_run(tmp_path / "r", "reverse_string", "rope", 0, 0.6)
    decoded = {n: {**fields, "teacher_forced_accuracy": 0.9} for n, fields in BASELINES_AT.items()}
    add_baselines(run, decoded)
    text = markdown(build_report(tmp_path))
    mean = table_lines(text, "Length generalization (Ruoss et al. 2023): mean accuracy per")
    assert mean[0] == "| task | rope | chance | constant answer |"
    assert "prefix rule" not in text


def test_a_summary_reports_as_the_sweep_it_summarizes(sweep_copy, tmp_path, monkeypatch):
    """`posbench report DIR --summary FILE` keeps the runs' records as data; reading FILE gives
    the same tables, without weights, checkpoints or TensorBoard files, in a few KB a run."""
    from posbench.cli import main

    monkeypatch.chdir(tmp_path)  # posbench's main in this process (test_cli.py: the command)
    summary = tmp_path / "results" / "tiny" / "sweep.json"
    main(["report", str(sweep_copy), "--out", "a", "--summary", str(summary)])
    assert summary.stat().st_size < 6_000 * 4  # 4 runs
    # each job recorded its sweep's command as it started (results.json's ran)
    ran = json.loads(next(sweep_copy.glob("*/results.json")).read_text())["ran"]
    assert ran["command"].startswith("posbench train -m encoding=none,rope seed=0,1")
    shutil.rmtree(sweep_copy)  # the runs are gone; their summary stays
    main(["report", str(summary), "--out", "b"])
    first, *tables = (tmp_path / "a" / "report.md").read_text().splitlines()
    assert first.endswith(str(sweep_copy))
    assert (tmp_path / "b" / "report.md").read_text().splitlines()[1:] == tables
    rows = json.loads((tmp_path / "b" / "report.json").read_text())["groups"][0]["rows"]
    assert rows == {
        "none": ["0_none_seed0", "1_none_seed1"],
        "rope": ["2_rope_seed0", "3_rope_seed1"],
    }
    content = json.loads(summary.read_text())
    (command,) = content["provenance"]["commands"]
    assert command.startswith("posbench train -m encoding=none,rope seed=0,1")
    assert content["provenance"]["runs"] == 4 and content["provenance"]["wall_s"] >= 0


def test_a_summary_gives_back_each_runs_config_and_records(tmp_path):
    from posbench.report.read import find_runs
    from posbench.report.summary import read_summary, write_summary

    task_run(tmp_path / "s" / "a", "parity_check", "rope", 0, {10: (1.0, 1.0), 50: (0.75, 0.5)})
    task_run(
        tmp_path / "s" / "b", "parity_check", "alibi", 1, {10: (0.5, 0.25), 50: (0.5, 0.0)},
        train__random_positions=2048,
    )  # fmt: skip
    runs, _ = find_runs([tmp_path / "s"])
    write_summary(tmp_path / "sweep.json", runs, [tmp_path / "s"])
    back = {
        run.path.name: (run.config, run.results) for run in read_summary(tmp_path / "sweep.json")
    }
    assert back == {run.path.name: (run.config, run.results) for run in runs}


def test_a_summary_keeps_a_key_absent_where_a_record_lacked_it_and_curves_exact(tmp_path):
    """loss_by_position stands in the longest length's record only: read back, the others still
    lack it (a None there would be a curve the report cannot read), and its buckets come back
    as they were (the summary stores them as columns)."""
    from posbench.report.read import find_runs
    from posbench.report.summary import read_summary, write_summary

    for seed in (0, 1):
        run = make_run(tmp_path / "s" / f"r{seed}", seed=seed, ppls={16: 5.0, 40: 6.0})
        add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0 + seed], strict=True)))
    runs, _ = find_runs([tmp_path / "s"])
    write_summary(tmp_path / "sweep.json", runs, [tmp_path / "s"])
    back = {run.path.name: run.results for run in read_summary(tmp_path / "sweep.json")}
    assert back == {run.path.name: run.results for run in runs}
    assert "loss_by_position" not in back["r0"]["eval"][0]
    (group,) = build_report(tmp_path / "sweep.json").groups
    assert group.position_length == 40


def test_a_summary_stores_results_equal_in_every_run_once_and_curves_at_the_longest_length(
    tmp_path,
):
    """Issue 54: a summary in tens of KB. What every run's results.json holds alike (its data,
    code versions, ...) is stored once; a curve below the longest length, which no report
    reads, is left out; the report of the summary is the report of the runs."""
    from posbench.report.read import find_runs
    from posbench.report.summary import read_summary, write_summary

    data = {"name": "synthetic", "tokenizer": "bytes", "vocab_size": 256}
    for seed in (0, 1):
        train = {"steps": 10, "wall_s": 1.0 + seed}
        run = make_run(tmp_path / "s" / f"r{seed}", seed=seed, ppls={16: 5.0, 40: 6.0},
                       results={"data": data, "train": train})  # fmt: skip
        add_loss_by_position(run, 16, {(0, 8): 9.0, (8, 16): 9.0})
        add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0 + seed], strict=True)))
    runs, _ = find_runs([tmp_path / "s"])
    write_summary(tmp_path / "sweep.json", runs, [tmp_path / "s"])
    content = json.loads((tmp_path / "sweep.json").read_text())
    assert content["results"]["data"] == data and content["results"]["train"] == {"steps": 10}
    assert all("data" not in run["results"] for run in content["runs"])
    back = {run.path.name: run.results for run in read_summary(tmp_path / "sweep.json")}
    assert back["r1"]["train"] == {"steps": 10, "wall_s": 2.0}
    assert [("loss_by_position" in r) for r in back["r0"]["eval"]] == [False, True]
    of_runs, of_summary = build_report(tmp_path / "s"), build_report(tmp_path / "sweep.json")
    assert markdown(of_summary).splitlines()[1:] == markdown(of_runs).splitlines()[1:]


def test_a_summary_of_the_first_format_is_still_read(tmp_path):
    """posbench-summary/1 (before results shared by every run were stored once) reads as it
    did: its runs' results whole, curves as columns."""
    from posbench.report.summary import read_summary

    curve = {"table": {"start": [0], "end": [16], "nll": [2.0], "tokens": [16]}}
    records = {"records": 1, "constant": {"length": 16, "ppl": 5.0, "loss_by_position": curve},
               "columns": {}}  # fmt: skip
    run = {"name": "r0", "config": {"seed": 0}, "results": {"seed": 0, "eval": records}}
    (tmp_path / "old.json").write_text(json.dumps({
        "format": "posbench-summary/1", "provenance": {}, "config": {"train.seq_len": 16},
        "runs": [run]}))  # fmt: skip
    (back,) = read_summary(tmp_path / "old.json")
    assert back.config == {"train.seq_len": 16, "seed": 0}
    assert back.results == {"seed": 0, "eval": [{"length": 16, "ppl": 5.0, "loss_by_position": [
        {"start": 0, "end": 16, "nll": 2.0, "tokens": 16}]}]}  # fmt: skip


def test_a_summary_of_the_second_format_is_still_read(tmp_path):
    """posbench-summary/2 (before the pool, effective_context_length as its list) reads as it
    did."""
    from posbench.report.summary import read_summary

    records = {"records": 1, "constant": {"length": 16, "ppl": 5.0}, "columns": {}}
    entry = {"metric": "ppl", "length": 16}
    run = {"name": "r0", "config": {"seed": 0},
           "results": {"eval": records, "effective_context_length": [entry]}}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps({
        "format": "posbench-summary/2", "provenance": {}, "config": {"train.seq_len": 16},
        "results": {"seed": 0}, "runs": [run]}))  # fmt: skip
    (back,) = read_summary(tmp_path / "old.json")
    assert back.results == {"seed": 0, "eval": [{"length": 16, "ppl": 5.0}],
                            "effective_context_length": [entry]}  # fmt: skip


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["a", "b"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abcde"), json_values, max_size=5), min_size=1,
                max_size=5))  # fmt: skip
def test_what_runs_share_stored_once_and_their_differences_give_each_back(values):
    """Whatever the runs' dicts hold (keys some lack, values a few share, dicts beside
    scalars), the shared part and each run's difference, its parts pooled, give the run back."""
    from posbench.report.summary import (
        NOTHING,
        common_part,
        difference,
        merged,
        pooled,
        unpooled,
    )  # fmt: skip

    shared = common_part(values)
    shared = {} if shared is NOTHING else shared
    pool, own = pooled([difference(value, shared) for value in values])
    assert [merged(shared, unpooled(o, pool)) for o in own] == values


def test_a_summary_stores_what_most_runs_hold_once_and_a_part_two_share_in_its_pool(tmp_path):
    """Issue 54's tens of KB: a value most runs hold is stored once and a run without it says
    it lacks it; the curves' bucket bounds, equal in the runs at one length, are in the file
    once per length: the most common in the shared results, the others in the pool."""
    from posbench.report.read import find_runs
    from posbench.report.summary import read_summary, write_summary

    for seed, length in enumerate([40, 40, 72, 72]):
        buckets = [*BUCKETS, (40, 48), (48, 56), (56, 64), (64, 72)] if length == 72 else BUCKETS
        run = make_run(tmp_path / "s" / f"r{seed}", seed=seed, ppls={16: 5.0, length: 6.0 + seed},
                       encoding__base=20.0 if seed == 3 else 10.0)  # fmt: skip
        add_loss_by_position(run, length, {b: 1.0 + seed + i for i, b in enumerate(buckets)})
    results = json.loads((tmp_path / "s" / "r3" / "results.json").read_text())
    del results["eval"][0]["status"]  # the others have it: shared, and r3 lacks it
    (tmp_path / "s" / "r3" / "results.json").write_text(json.dumps(results))
    runs, _ = find_runs([tmp_path / "s"])
    write_summary(tmp_path / "sweep.json", runs, [tmp_path / "s"])
    text = (tmp_path / "sweep.json").read_text()
    content = json.loads(text)
    assert content["config"]["encoding.base"] == 10.0
    assert [run["config"].get("encoding.base") for run in content["runs"]] == [None] * 3 + [20.0]
    assert content["results"]["eval"]["constant"]["loss_by_position"]["table"]["start"] == [
        0, 8, 16, 24]  # fmt: skip
    assert text.count("[0,8,16,24,40,48,56,64]") == 1  # a line of the pool
    back = {
        run.path.name: (run.config, run.results) for run in read_summary(tmp_path / "sweep.json")
    }
    assert back == {run.path.name: (run.config, run.results) for run in runs}
    assert "status" not in back["r3"][1]["eval"][0]


def test_a_summarys_provenance_is_its_runs_commands_machines_days_and_commits(tmp_path):
    """Not the summary writer's machine and day, nor one sweep's command for a directory that
    held two: each run's results.json ``ran``, and that of each ``posbench eval`` record."""
    from posbench.report.read import find_runs
    from posbench.report.summary import summary_content

    def ran(command, machine, day):
        return {"command": command, "machine": machine, "date": f"2026-01-0{day}"}

    for seed, sweep in ((0, "a"), (1, "b")):
        results = {"ran": ran(f"posbench train -m {sweep}", "M1", 2 + seed),
                   "versions": {"git_commit": sweep * 40}}  # fmt: skip
        make_run(tmp_path / "s" / f"r{seed}", seed=seed, results=results)
    results = json.loads((tmp_path / "s" / "r1" / "results.json").read_text())
    evaluated = ran("posbench eval --run r1", "M2", 6)
    results["eval"][1].update({"versions": {"git_commit": "c" * 40}, "ran": evaluated})
    (tmp_path / "s" / "r1" / "results.json").write_text(json.dumps(results))
    runs, _ = find_runs([tmp_path / "s"])
    provenance = summary_content(runs, [tmp_path / "s"])["provenance"]
    assert provenance["commands"] == [
        "posbench train -m a", "posbench train -m b", "posbench eval --run r1"]  # fmt: skip
    assert (provenance["machine"], provenance["date"]) == ("M1; M2", "2026-01-02 to 2026-01-06")
    assert provenance["posbench_commits"] == ["a" * 40, "b" * 40, "c" * 40]


def test_fine_tunes_of_each_seeds_parent_are_one_row_over_seeds_and_parent_settings_apart(
    tmp_path,
):
    """DroPE's recalibrations: each seed's fine-tune names its own parent's path, yet the
    parents differ in seed alone, so the fine-tunes are seeds of one row; a fine-tune of a
    parent of another setting (alibi) is a group apart, and so is one whose parent is gone."""
    for encoding, seeds in (("rope", (0, 1)), ("alibi", (0,))):
        for seed in seeds:
            parent = make_run(tmp_path / f"{encoding}_seed{seed}", encoding, seed)
            make_run(tmp_path / f"{encoding}_tune_seed{seed}", "none", seed, train__steps=3,
                     train__init_from=str(parent), results={"init_from": str(parent)})  # fmt: skip
    make_run(tmp_path / "orphan_seed0", "none", 0, train__steps=3, train__init_from="gone")
    rows = {
        g.title: [(row.label, [p.name for p in row.runs]) for row in g.rows]
        for g in build_report(tmp_path).groups
    }
    assert rows == {
        "train.steps=10": [("alibi", ["alibi_seed0"]), ("rope", ["rope_seed0", "rope_seed1"])],
        "train.steps=3, train.init_from=alibi runs": [("none", ["alibi_tune_seed0"])],
        "train.steps=3, train.init_from=rope runs": [
            ("none", ["rope_tune_seed0", "rope_tune_seed1"])],
        "train.steps=3, train.init_from=gone": [("none", ["orphan_seed0"])],
    }  # fmt: skip


def test_a_summary_whose_provenance_predates_sweep_names_is_written_back(tmp_path):
    """results/ruoss2023_cpu/sweep.json's provenance names no sweeps (written before it did):
    writing it back into itself (a format's migration) keeps its runs' names."""
    from posbench.report.read import find_runs
    from posbench.report.summary import read_summary, write_summary

    make_run(tmp_path / "s" / "r0")
    runs, _ = find_runs([tmp_path / "s"])
    write_summary(tmp_path / "old.json", runs, [tmp_path / "s"])
    content = json.loads((tmp_path / "old.json").read_text())
    del content["provenance"]["sweeps"]
    (tmp_path / "old.json").write_text(json.dumps(content))
    runs, _ = find_runs([tmp_path / "old.json"])
    write_summary(tmp_path / "old.json", runs, [tmp_path / "old.json"])
    assert [run.path.name for run in read_summary(tmp_path / "old.json")] == ["r0"]


def test_a_file_that_is_no_summary_is_a_one_line_error(tmp_path):
    (tmp_path / "other.json").write_text('{"eval": []}')
    with pytest.raises(PosbenchError, match="not a posbench summary") as err:
        build_report(tmp_path / "other.json")
    assert "\n" not in str(err.value)


def test_every_registered_encoding_has_a_colour_and_marker_of_its_own_in_one_family():
    from posbench.encodings import encoding_names
    from posbench.report.styles import ENCODING_FAMILIES, ENCODING_STYLES

    members = [name for family in ENCODING_FAMILIES.values() for name in family]
    assert sorted(members) == sorted(ENCODING_STYLES) == sorted(encoding_names())
    assert len(set(ENCODING_STYLES.values())) == len(ENCODING_STYLES)
    colours = [colour for colour, _ in ENCODING_STYLES.values()]
    assert len(set(colours)) == len(colours)
