"""posbench report's figures read well: each row in the colour and marker of its encoding, the
same in every figure, the rows of one encoding told apart by line style; one panel per family
past PANEL_CURVES curves, NoPE in each; the legend outside the data, on a canvas widened to hold
it; titles that name no null setting, and a file corpus by its path."""

import pytest
from matplotlib.colors import to_rgba
from test_report import BUCKETS, add_accuracy, add_loss_by_position, add_records, make_run
from test_report_reference import ALIBI_WT103, PAPER_LENGTHS, paper_run

from posbench.report import build_report
from posbench.report.figures import (
    FIGURE_DPI,
    FIGURE_INCHES,
    LEGEND_STEP,
    accuracy_figure,
    position_figure,
    ratio_figure,
    value_figure,
)
from posbench.report.groups import Row
from posbench.report.settings import data_name, group_titles
from posbench.report.styles import (
    ENCODING_FAMILIES,
    ENCODING_STYLES,
    FALLBACK_COLOURS,
    PANEL_CURVES,
    row_styles,
)

KINDS = ("value", "position", "accuracy", "ratio")
FEW = ["none", "rope", "alibi", "t5"]
# nine rows: one axes is too crowded for them
MANY = ["none", "learned", "sinusoidal", "rope", "xpos", "alibi", "t5", "kerple", "fox"]


def figure_of(root, kind, encodings):
    """The group of one run per encoding and its figure of ``kind``: the ratio figure's runs
    trained at 512 beside ALIBI_WT103, the others' at 16 with loss by position and accuracies."""
    if kind == "ratio":
        for i, encoding in enumerate(encodings):
            paper_run(root / encoding, encoding, {n: 30.0 + i * n / 1000 for n in PAPER_LENGTHS})
        (group,) = build_report(root, metric="word_ppl", reference=ALIBI_WT103).groups
        return group, ratio_figure(group, "word_ppl", ALIBI_WT103)
    for i, encoding in enumerate(encodings):
        ppls = {16: 5.0 + 0.1 * i, 40: 6.0 + 0.5 * i}  # all comparable: labels are names
        run = make_run(root / encoding, encoding=encoding, ppls=ppls)
        add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0 + i], strict=True)))
        add_accuracy(run, {16: (1.0, 1.0), 40: (0.9 - 0.05 * i, 0.25)})
    (group,) = build_report(root).groups
    draw = {"value": value_figure, "position": position_figure, "accuracy": accuracy_figure}
    return group, draw[kind](group)


def curves(figure):
    """label -> Line2D of every axes's curves (each label once: NoPE is in every panel)."""
    return {line.get_label(): line for axes in figure.axes for line in axes.get_lines()}


@pytest.mark.parametrize("kind", KINDS)
def test_each_row_is_drawn_in_the_colour_and_marker_of_its_encoding(tmp_path, kind):
    group, figure = figure_of(tmp_path, kind, FEW)
    lines = curves(figure)
    for row in group.rows:
        colour, marker = ENCODING_STYLES[row.name]
        line = lines[row.label]
        assert to_rgba(line.get_color()) == to_rgba(colour), row.label
        assert line.get_marker() == marker and line.get_linestyle() == "-", row.label
    if kind == "ratio":  # the paper's curves: dotted, 'x' marked, in their encoding's colour
        for name in ("rope", "alibi", "t5"):
            paper = lines[f"{name} (paper)"]
            assert to_rgba(paper.get_color()) == to_rgba(ENCODING_STYLES[name][0])
            assert (paper.get_linestyle(), paper.get_marker()) == (":", "x")


def test_an_encoding_has_its_colour_in_every_figure_whatever_the_rows_beside_it(tmp_path):
    _, alone = figure_of(tmp_path / "a", "value", ["alibi"])
    _, among = figure_of(tmp_path / "b", "value", ["none", "learned", "alibi"])
    assert curves(alone)["alibi"].get_color() == curves(among)["alibi"].get_color()


def test_rows_of_one_encoding_keep_its_colour_and_differ_by_line_style_as_trained_first(
    tmp_path,
):
    for keep in (0.75, 1.0):
        make_run(tmp_path / f"rope{keep}", ppls={16: 5.0, 32: 6.0}, encoding__keep_frequencies=keep)
    add_records(
        tmp_path / "rope1.0",
        {"length": 32, "ppl": 5.5, "scaling": "linear"},
        {"length": 32, "ppl": 5.2, "scaling": "yarn"},
    )
    make_run(tmp_path / "alibi", encoding="alibi", ppls={16: 5.0, 32: 5.0})
    (group,) = build_report(tmp_path).groups
    lines = curves(value_figure(group))
    styles = {label: lines[label].get_linestyle() for label in lines if "rope" in label}
    assert styles == {  # 1.0 is keep_frequencies' default: its rows are plain RoPE's
        "rope": "-",
        "rope (keep_frequencies=0.75)": "--",
        "rope + linear": "-.",
        "rope + yarn": ":",
    }
    rope = to_rgba(ENCODING_STYLES["rope"][0])
    assert {to_rgba(lines[label].get_color()) for label in styles} == {rope}
    assert lines["alibi"].get_linestyle() == "-"


def test_past_eight_rows_of_one_encoding_styles_stay_distinct():
    rows = [Row(f"rope {i}", "rope", "none", None, name="rope") for i in range(12)]
    styles = [tuple(sorted(map(str, style.items()))) for style in row_styles(rows)]
    assert len(set(styles)) == 12


def test_an_encoding_without_a_style_of_its_own_gets_a_distinct_one_every_time():
    names = ["newpe", "rope", "otherpe", "newpe"]
    rows = [Row(name, name, "none", None, name=name) for name in names]
    styles = row_styles(rows)
    assert styles == row_styles(rows)  # deterministic
    first, second = FALLBACK_COLOURS[:2]
    assert [style["color"] for style in styles] == [first, "tab:blue", second, first]
    assert styles[0]["linestyle"] != styles[3]["linestyle"]  # newpe's two rows
    assert not {first, second} & {colour for colour, _ in ENCODING_STYLES.values()}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("encodings", [FEW, MANY], ids=["one axes", "panels"])
def test_the_legend_lies_outside_every_axes_on_a_canvas_of_its_own_height(
    tmp_path, kind, encodings
):
    _, figure = figure_of(tmp_path, kind, encodings)
    figure.draw_without_rendering()
    (legend,) = figure.legends
    box = legend.get_window_extent()
    assert not any(box.overlaps(axes.get_window_extent()) for axes in figure.axes)
    assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1
    if encodings is FEW:
        width, height = figure.get_size_inches()
        assert height == FIGURE_INCHES[1] and width > FIGURE_INCHES[0]
        # the canvas widened by whole LEGEND_STEPs: its size follows from its content alone
        assert ((width - FIGURE_INCHES[0]) / LEGEND_STEP).is_integer()


def test_a_long_legend_widens_the_canvas_and_leaves_the_plot_its_size(tmp_path):
    _, short = figure_of(tmp_path / "short", "value", ["rope"])
    long_names = tmp_path / "long"
    for base in (500, 10000, 123456789):
        make_run(long_names / str(base), ppls={16: 5.0, 40: 6.0}, encoding__base=base)
    (group,) = build_report(long_names).groups
    long = value_figure(group)
    for figure in (short, long):
        figure.draw_without_rendering()
    (short_axes,), (long_axes,) = short.axes, long.axes
    assert long.get_size_inches()[0] > short.get_size_inches()[0]
    difference = abs(long_axes.get_window_extent().width - short_axes.get_window_extent().width)
    assert difference <= LEGEND_STEP * FIGURE_DPI
    again = value_figure(group)
    assert list(again.get_size_inches()) == list(long.get_size_inches())


@pytest.mark.parametrize("kind", KINDS)
def test_past_panel_curves_a_figure_draws_a_panel_per_family_with_nope_in_each(tmp_path, kind):
    group, figure = figure_of(tmp_path, kind, MANY)
    assert len(group.rows) > PANEL_CURVES
    panels = [axes for axes in figure.axes if axes.get_visible()]
    assert [axes.get_title() for axes in panels] == list(ENCODING_FAMILIES)
    for axes, members in zip(panels, ENCODING_FAMILIES.values(), strict=True):
        labels = {line.get_label() for line in axes.get_lines()}
        rows = {row.label for row in group.rows if row.name in members or row.name == "none"}
        assert rows <= labels
        assert not {row.label for row in group.rows} - rows & labels
        assert axes.get_shared_y_axes().joined(axes, panels[0])
        assert axes.get_shared_x_axes().joined(axes, panels[0])
    assert figure.get_suptitle() == group.title
    if kind == "ratio":  # each paper curve beside its encoding's rows
        (additive,) = [axes for axes in panels if axes.get_title() == "additive biases"]
        assert {"alibi (paper)", "t5 (paper)"} <= {line.get_label() for line in additive.lines}
        # the paper's lengths, 10512 and 15512, are too close to label level in a panel
        assert {label.get_rotation() for label in panels[-1].get_xticklabels()} == {45}


def test_up_to_panel_curves_rows_share_one_axes(tmp_path):
    _, figure = figure_of(tmp_path, "value", MANY[:PANEL_CURVES])
    (axes,) = figure.axes
    assert len([line for line in axes.get_lines() if line.get_label() in MANY]) == PANEL_CURVES


def test_an_encoding_without_a_family_gets_a_panel_of_its_own(tmp_path):
    _, figure = figure_of(tmp_path, "value", [*MANY, "newpe"])
    panels = [axes for axes in figure.axes if axes.get_visible()]
    assert [axes.get_title() for axes in panels] == [*ENCODING_FAMILIES, "other encodings"]
    assert {line.get_label() for line in panels[-1].get_lines()} >= {"none", "newpe"}


# ------------------------------------------------------------------------------ titles


def test_a_setting_null_in_a_group_is_left_out_of_its_title():
    settings = [
        {"train.seq_len": 16, "train.init_from": None},
        {"train.seq_len": 16, "train.init_from": "base.pt"},
        {"train.seq_len": 32, "train.init_from": None},
    ]
    assert group_titles(settings) == [
        "train.seq_len=16",
        "train.seq_len=16, train.init_from=base.pt",
        "train.seq_len=32",
    ]
    only = [{"train.init_from": None}, {"train.init_from": "base.pt"}]
    assert group_titles(only) == ["no train.init_from", "train.init_from=base.pt"]


def test_figure_titles_never_name_a_null_setting_nor_randomized_positions(tmp_path):
    make_run(tmp_path / "a", ppls={16: 5.0, 40: 6.0})
    make_run(tmp_path / "b", ppls={16: 5.0, 40: 6.0}, train__random_positions=64)
    make_run(tmp_path / "c", ppls={16: 5.0, 40: 6.0}, train__init_from="base.pt")
    report = build_report(tmp_path)
    # randomized positions make a row, not a group
    assert sorted(len(group.rows) for group in report.groups) == [1, 2]
    for group in report.groups:
        (axes,) = value_figure(group).axes
        assert axes.get_title() == group.title
        assert not any(word in group.title for word in ("None", "null", "random_positions"))
    titles = {len(group.rows): group.title for group in report.groups}
    assert titles == {2: "no train.init_from", 1: "train.init_from=base.pt"}


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("wikitext-2/test.txt", "wikitext-2"),  # the folder, not the split's file name
        ("/data/books/pg19/train.txt", "pg19"),
        ("corpus.txt", "corpus"),  # no folder: the file's stem
        ("corpora/enwik8", "enwik8"),  # a directory
        ("shards/*.txt", "shards"),  # a glob: the folder it reads
    ],
)
def test_a_file_corpus_is_named_by_its_path_not_as_text(path, name):
    assert data_name({"data.name": "text", "data.path": path}) == name
    assert data_name({"data.name": "wikitext2"}) == "wikitext2"


def test_every_figure_of_a_file_corpus_names_the_corpus(tmp_path):
    for i, encoding in enumerate(FEW):
        run = make_run(
            tmp_path / encoding,
            encoding=encoding,
            ppls={16: 5.0 + i, 40: 6.0 + i},
            data__name="text",
            data__path="wikitext-2/test.txt",
        )
        add_loss_by_position(run, 40, dict(zip(BUCKETS, [2.0, 1.0, 3.0, 4.0], strict=True)))
        add_accuracy(run, {16: (1.0, 1.0), 40: (0.9, 0.25)})
    (group,) = build_report(tmp_path).groups
    assert group.title == "wikitext-2 data, model 1×32, trained at 16 tokens for 10 steps"
    for draw in (value_figure, position_figure, accuracy_figure):
        (axes,) = draw(group).axes
        assert axes.get_title() == group.title
    make_run(tmp_path / "synthetic", ppls={16: 5.0, 40: 6.0})
    titles = {group.title for group in build_report(tmp_path).groups}
    assert titles == {"data=synthetic", "data=wikitext-2"}
