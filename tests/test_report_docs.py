"""The renderers of README's and docs/results.md's results (posbench/report/docs/): summaries
that grow by a later sweep, the rows each table takes, each summary read once."""

import json
import re
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_report import make_run, sweep  # noqa: F401 (sweep: test_report's real tiny sweep)

from posbench.report.docs import EXTRAPOLATION, ROOT, load
from posbench.report.docs.corpus import ratio_table
from posbench.report.docs.source import Source, commands_text, provenance_line
from posbench.report.read import find_runs
from posbench.report.summary import read_summary, write_summary

PPLS = {16: 5.0, 32: 4.5, 64: 4.8}


def fabricated_sweep(path: Path, overrides: str, runs: dict[str, dict], commit: str) -> Path:
    """A finished sweep directory as `posbench train -m OVERRIDES` leaves it: Hydra's
    multirun.yaml and one run per entry of ``runs`` (its name: make_run's keywords), trained
    at ``commit``."""
    for name, options in runs.items():
        ran = {"command": None, "machine": "M", "date": "2026-12-06"}  # None: its sweep's
        results = {"versions": {"git_commit": commit}, "ran": ran}
        make_run(path / name, ppls=PPLS, results=results, **options)
    overrides_node = {"task": overrides.split(), "hydra": ["hydra.mode=MULTIRUN"]}
    OmegaConf.save({"hydra": {"overrides": overrides_node}}, path / "multirun.yaml")
    return path


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A summary of a first sweep (none and rope, two seeds), and the summary that
    `posbench report SUMMARY SWEEP --summary SUMMARY` writes back when a later sweep adds pope
    as the experiment runs it and rope with another base (a variant); tests only read it."""
    from posbench.cli import main

    tmp_path = tmp_path_factory.mktemp("grown")
    first = {
        f"{i}_{e}_seed{s}": {"encoding": e, "seed": s}
        for i, (e, s) in enumerate((e, s) for e in ("none", "rope") for s in (0, 1))
    }
    first_sweep = fabricated_sweep(
        tmp_path / "08-37-24", "encoding=none,rope seed=0,1", first, "a" * 40
    )
    summary = tmp_path / "results" / "x" / "synthetic.json"
    summary.parent.mkdir(parents=True)
    runs, _ = find_runs([first_sweep])
    write_summary(summary, runs, [first_sweep])
    later = {
        "0_pope_seed0": {"encoding": "pope", "seed": 0},
        "1_pope_seed1": {"encoding": "pope", "seed": 1},
        "2_rope_seed0": {"encoding": "rope", "seed": 0, "encoding__base": 500},
    }
    later_sweep = fabricated_sweep(tmp_path / "15-02-11", "encoding=pope seed=0,1", later, "b" * 40)
    out = tmp_path / "out"  # posbench's main in this process (test_cli.py: the command)
    main(["report", str(summary), str(later_sweep), "--out", str(out), "--summary", str(summary)])
    return summary


def test_a_later_sweep_written_into_a_summary_keeps_both_provenances_and_every_run(grown):
    content = json.loads(grown.read_text())
    provenance = content["provenance"]
    assert provenance["commands"] == ["posbench train -m encoding=none,rope seed=0,1"]
    assert provenance["sweeps"] == ["08-37-24"] and provenance["posbench_commits"] == ["a" * 40]
    (added,) = provenance["added"]
    assert added["commands"] == ["posbench train -m encoding=pope seed=0,1"]
    assert added["sweeps"] == ["15-02-11"] and added["posbench_commits"] == ["b" * 40]
    assert (provenance["runs"], added["runs"]) == (4, 3)
    names = [run["name"] for run in content["runs"]]
    assert names == sorted([f"08-37-24/{i}_{e}_seed{s}" for i, e, s in (
        (0, "none", 0), (1, "none", 1), (2, "rope", 0), (3, "rope", 1))] + [
        "15-02-11/0_pope_seed0", "15-02-11/1_pope_seed1", "15-02-11/2_rope_seed0"])  # fmt: skip


def test_a_summary_written_back_with_its_own_runs_again_is_refused_in_one_line(
    grown, capsys, tmp_path
):
    from conftest import error_line

    line = error_line(capsys, "report", str(grown), str(grown.parents[2] / "15-02-11"),
                      "--out", str(tmp_path), "--summary", str(grown))  # fmt: skip
    assert line.startswith("two runs are named 15-02-11/0_pope_seed0")


def test_a_new_encoding_of_a_later_sweep_joins_the_main_rows_and_a_variant_stays_beside(grown):
    source = load(grown.parents[2], "results/x/synthetic.json")
    group = source.main_group()
    assert [row.label for row in group.rows] == ["none", "pope", "rope", "rope (base=500)"]
    assert [row.label for row in source.main_rows(group)] == ["none", "pope", "rope"]
    assert [line.split(" |")[0] for line in ratio_table(source).splitlines()[2:]] == [
        "| none",
        "| pope",
        "| rope",
    ]  # equal ratios: in the order found


def test_the_provenance_line_names_each_sweep_its_command_commit_and_date(grown):
    line = provenance_line(load(grown.parents[2], "results/x/synthetic.json"))
    first, later = line.split("; then ")
    assert first.startswith("4 runs of `posbench train -m encoding=none,rope seed=0,1` at aaaaaaa")
    assert later.startswith("3 runs of `posbench train -m encoding=pope seed=0,1` at bbbbbbb on M")
    assert later.endswith("; summary: `results/x/synthetic.json`.")


def test_todays_extrapolation_runs_join_the_committed_summarys_group():
    """The sweep that adds rows to results/extrapolation/synthetic.json runs today's code:
    keys its runs' config.yaml has and the summary's predate must not split the group."""
    from posbench.config import compose_config, flat_config
    from posbench.report.read import Run
    from posbench.report.settings import group_setting

    summarized = read_summary(ROOT / EXTRAPOLATION)[0]
    config = flat_config(compose_config(["+experiment=extrapolation", "encoding=pope"]))
    today = Run(Path("today"), config, {})
    assert group_setting(today, False) == group_setting(summarized, False)


def test_a_summary_is_read_once_to_render_from_it(grown, monkeypatch):
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda p, *a, **k: reads.append(p) or read_text(p))
    assert isinstance(load(grown.parents[2], "results/x/synthetic.json"), Source)
    assert reads == [grown]


def test_the_effective_length_table_has_each_rows_runs_length_in_training_lengths(grown):
    """PPLS: 4.5 and 4.8 at 2x and 4x stay within 5.0 / 0.9, so every run keeps to 64 (4x)."""
    from posbench.report.docs.corpus import effective_lengths

    table = effective_lengths(load(grown.parents[2], "results/x/synthetic.json"))
    rows = [line for line in table.splitlines() if line.startswith("| rope")]
    assert rows == [
        "| rope | 2 | ppl | 64 ± 0 | 4.00 ± 0.00 |",
        "| rope (base=500) | 1 | ppl | 64 | 4.00 |",
    ]


def drope_sweep(path: Path) -> Path:
    """+experiment=drope's sweep directory at seeds 0 and 1, as its two sweeps and YaRN's
    re-evaluations leave it: per run, perplexity 4 at 16 tokens and 4 + seed + a method's
    offset at 32, its records of the eval-time extension the method is evaluated with."""
    methods = {  # method: (encoding, offset, extensions, temperature c by seed)
        "nope": ("none", 1.0, ["none"], None),
        "rope": ("rope", 2.0, ["none", "yarn"], None),
        "rnope_swa": ("hybrid", 3.0, ["none"], None),
        "drope_rope": ("rope", 9.0, ["none"], None),  # DroPE's first phase: no row
        "drope": ("none", 0.0, ["temperature"], (0.25, 0.5)),
    }
    for name, (encoding, offset, extensions, c) in methods.items():
        for seed in (0, 1):
            records = [
                {"length": n, "stride": None, "ppl": p, "status": "ok", "reason": None,
                 "scaling": scaling, **({} if c is None else {"temperature_c": c[seed]})}
                for scaling in extensions
                for n, p in {16: 4.0, 32: 4.0 + seed + offset + (scaling == "yarn")}.items()
            ]  # fmt: skip
            if name == "nope" and seed == 0:  # a LongPPL record beside the plain one: no row's
                records.append({**records[1], "longppl": 3.0, "longppl_evaluator": "E"})
            # DroPE's phases: fewer steps, the recalibration from its seed's RoPE phase
            parent = str(path.absolute() / f"drope_rope_seed{seed}")
            phase = {"drope_rope": {"train__steps": 7},
                     "drope": {"train__steps": 3, "train__init_from": parent}}  # fmt: skip
            init = {"init_from": parent} if name == "drope" else {}
            results = {"eval": records, **init}
            make_run(
                path / f"{name}_seed{seed}", encoding, seed, results=results, **phase.get(name, {})
            )
    return path


def test_drope_sits_in_one_table_with_its_baselines_mean_and_std_over_seeds(tmp_path):
    from posbench.report.docs.drope import drope_table

    runs, _ = find_runs([drope_sweep(tmp_path / "S")])
    write_summary(tmp_path / "drope.json", runs, [tmp_path / "S"])
    assert drope_table(load(tmp_path, "drope.json")).splitlines() == [
        "| method | runs | ppl at 16 | 32 (2×) |",
        "| --- | --- | --- | --- |",
        "| NoPE | 2 | 4.00 ± 0.00 | 1.38 ± 0.18 |",  # 5 / 4 and 6 / 4
        "| RoPE | 2 | 4.00 ± 0.00 | 1.62 ± 0.18 |",
        "| RoPE + YaRN | 2 | 4.00 ± 0.00 | 1.88 ± 0.18 |",
        "| RNoPE-SWA | 2 | 4.00 ± 0.00 | 1.88 ± 0.18 |",
        "| DroPE (c = 0.375 ± 0.177) | 2 | 4.00 ± 0.00 | **1.12** ± 0.18 |",
    ]


def repository_copy(tmp_path: Path) -> Path:
    """``tmp_path`` holding a copy of what rendering reads and writes: results/, docs/ (its
    figures left out) and README.md."""
    shutil.copytree(ROOT / "results", tmp_path / "results")
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    shutil.copy(ROOT / "README.md", tmp_path)
    return tmp_path


def test_the_drope_block_awaits_its_summary_and_renders_it_once_committed(tmp_path):
    """docs/results.md's DroPE block holds no number while results/drope/synthetic.json is
    not committed; once it is, rendering fills in its table and provenance."""
    from posbench.report.docs import DROPE, render
    from posbench.report.docs.drope import drope_results

    assert render(repository_copy(tmp_path), check=True) == []
    runs, _ = find_runs([drope_sweep(tmp_path / "S")])
    write_summary(tmp_path / DROPE, runs, [tmp_path / "S"])
    assert render(tmp_path, check=True) == ["docs/results.md: drope/table"]
    table, provenance = drope_results(load(tmp_path, DROPE)).split("\n\n")
    assert table.startswith("| method | runs | ppl at 16 | 32 (2×) |")
    assert provenance.startswith("10 runs of the commands above, ")  # no machine: none recorded
    assert provenance.endswith("; summary: `results/drope/synthetic.json`.")


def test_the_drope_table_reads_the_methods_its_experiment_sweeps():
    from posbench.report.docs.drope import ROWS

    options = {path.stem for path in (ROOT / "conf" / "drope_method").glob("*.yaml")}
    assert {option for _, option, _ in ROWS} == options - {"drope_rope"}


def test_a_real_sweep_written_into_a_fabricated_summary_joins_its_main_table(request, tmp_path):
    """test_report's tiny sweep (none and rope, two seeds, built once a session) added to a
    summary of a first sweep fabricated from it (its none runs relabelled alibi): the real
    runs' encodings join the table, their command and commit under it."""
    from posbench.cli import main

    runs_dir = request.getfixturevalue("sweep")
    first = tmp_path / "07-00-00"
    for run in sorted(runs_dir.glob("*_none_seed*")):
        copy = first / run.name.replace("none", "alibi")
        shutil.copytree(run, copy)
        config = OmegaConf.load(copy / "config.yaml")
        config.encoding = {"name": "alibi"}
        OmegaConf.save(config, copy / "config.yaml")
    summary = tmp_path / "results" / "x" / "synthetic.json"
    summary.parent.mkdir(parents=True)
    write_summary(summary, find_runs([first])[0], [first])
    main(["report", str(summary), str(runs_dir), "--out", str(tmp_path / "out"),
          "--summary", str(summary)])  # fmt: skip
    source = load(tmp_path, "results/x/synthetic.json")
    rows = ratio_table(source).splitlines()[2:]
    assert sorted(row.split(" |")[0] for row in rows) == ["| alibi", "| none", "| rope"]
    later = provenance_line(source).split("; then ")[1]
    assert later.startswith("4 runs of `posbench train -m encoding=none,rope seed=0,1")


def test_the_long_context_table_puts_longppl_beside_ppl_and_the_effective_length(tmp_path):
    """Two encodings x two seeds, each with LongPPL records at 32 and 64 from one evaluator
    (key tokens: 7 and 9 at 32, 12 at 64); none's LongPPL is 2x its ppl, rope's 3x."""
    from posbench.report.docs.corpus import long_context_table

    runs = {
        f"{i}_{e}_seed{s}": {"encoding": e, "seed": s}
        for i, (e, s) in enumerate((e, s) for e in ("none", "rope") for s in (0, 1))
    }
    sweep_dir = fabricated_sweep(tmp_path / "sweep", "encoding=none,rope seed=0,1", runs, "a" * 40)
    for name, options in runs.items():
        path = sweep_dir / name
        results = json.loads((path / "results.json").read_text())
        factor = 2.0 if options["encoding"] == "none" else 3.0
        results["eval"] += [
            {**record, "longppl": record["ppl"] * factor + options["seed"],
             "key_tokens": {32: 7 + 2 * options["seed"], 64: 12}[record["length"]],
             "longppl_evaluator": str(sweep_dir / "2_rope_seed0"),
             "longppl_alpha": 2.0, "longppl_beta": -2.0}
            for record in results["eval"] if record["length"] > 16
        ]  # fmt: skip
        (path / "results.json").write_text(json.dumps(results))
    summary = tmp_path / "results" / "x" / "text.json"
    summary.parent.mkdir(parents=True)
    write_summary(summary, find_runs([sweep_dir])[0], [sweep_dir])
    lines = long_context_table(load(tmp_path, "results/x/text.json")).splitlines()
    assert lines[0] == (
        "| encoding | runs | effective length (× 16) | ppl at 32 | LongPPL at 32 | ppl at 64 "
        "| LongPPL at 64 |"
    )
    assert lines[2:4] == [
        "| none | 2 | 64 ± 0 (4.0×) | 4.50 ± 0.00 | **9.50** ± 0.71 | 4.80 ± 0.00 "
        "| **10.10** ± 0.71 |",
        "| rope | 2 | 64 ± 0 (4.0×) | 4.50 ± 0.00 | 14.00 ± 0.71 | 4.80 ± 0.00 | 14.90 ± 0.71 |",
    ]
    assert lines[-1].endswith(
        "evaluator run `2_rope_seed0` selected (alpha 2, beta -2): 7 to 9 at 32, 12 at 64 "
        "tokens were key."
    )


def ruler_sweep(path: Path) -> Path:
    """+experiment=ruler's sweep directory for two tasks, none and rope, seeds 0 and 1: each
    run's accuracy of its own answers at 16, 32 and 64 tokens, seed 1's 0.1 below seed 0's."""
    accuracies = {  # (task, encoding): accuracy by length at seed 0
        ("niah_single", "rope"): (0.9, 0.5, 0.2),
        ("niah_single", "none"): (0.6, 0.6, 0.6),
        ("flip_flop", "rope"): (1.0, 0.9, 0.8),
        ("flip_flop", "none"): (0.7, 0.7, 0.7),
    }
    baselines = {"niah_single": (0.1, 0.2), "flip_flop": (0.5, 0.5)}  # chance, constant answer
    for (task, encoding), by_length in accuracies.items():
        chance, constant = baselines[task]
        for seed in (0, 1):
            records = [
                {"length": n, "stride": None, "ppl": 2.0, "status": "ok", "reason": None,
                 "answer_mode": "autoregressive", "decode": "greedy",
                 "accuracy": a - 0.1 * seed, "sequence_accuracy": 0.0,
                 "teacher_forced_accuracy": a, "chance_accuracy": chance,
                 "constant_answer_accuracy": constant}
                for n, a in zip((16, 32, 64), by_length, strict=True)
            ]  # fmt: skip
            name = f"{task}_{encoding}_seed{seed}"
            make_run(path / name, encoding, seed, data__name=task, results={"eval": records})
    return path


def test_the_ruler_table_averages_each_encodings_tasks_by_length_beside_the_baselines(tmp_path):
    """rope: (0.85 + 0.95) / 2 at 16, then 0.65 at 32 (below 0.9 × 0.90: effective to 1×);
    none: 0.60 at every length (effective to 4×); chance (0.1 + 0.5) / 2, the constant answer
    (0.2 + 0.5) / 2. docs/results.md's two blocks await the summary, then render it."""
    from posbench.report.docs import RULER, render
    from posbench.report.docs.ruler import ruler_table, task_details

    assert render(repository_copy(tmp_path), check=True) == []
    runs, _ = find_runs([ruler_sweep(tmp_path / "S")])
    write_summary(tmp_path / RULER, runs, [tmp_path / "S"])
    assert render(tmp_path, check=True) == [
        "docs/results.md: ruler/table",
        "docs/results.md: ruler/details",
    ]
    table = ruler_table(load(tmp_path, RULER)).splitlines()
    assert table[:6] == [
        "| encoding | 16 (1×) | 32 (2×) | 64 (4×) | effective length (× 16, threshold 0.9) |",
        "| --- | --- | --- | --- | --- |",
        "| none | 0.60 | 0.60 | **0.60** | 4 |",
        "| rope | **0.90** | **0.65** | 0.45 | 1 |",
        "| *chance* | 0.30 | 0.30 | 0.30 | – |",
        "| *constant answer* | 0.35 | 0.35 | 0.35 | – |",
    ]
    assert table[7].startswith("Averaged over 2 tasks: `flip_flop`, `niah_single`. 8 runs of")
    details = task_details(load(tmp_path, RULER)).splitlines()
    assert details[:8] == [
        "`flip_flop`:",
        "",
        "| encoding | 16 (1×) | 32 (2×) | 64 (4×) | runs |",
        "| --- | --- | --- | --- | --- |",
        "| none | 0.65 ± 0.07 | 0.65 ± 0.07 | 0.65 ± 0.07 | 2 |",
        "| rope | **0.95** ± 0.07 | **0.85** ± 0.07 | **0.75** ± 0.07 | 2 |",
        "| *chance* | 0.50 | 0.50 | 0.50 | – |",
        "| *constant answer* | 0.50 | 0.50 | 0.50 | – |",
    ]


def test_every_committed_summary_is_tens_of_kb():
    """Issue 54: a summary is tens of KB, not MB: at most 2 KB a run beside its provenance
    (measured: 1.3 to 2.2 KB a run; WikiText-2's 60 runs with LongPPL records, 99 KB)."""
    for path in (ROOT / "results").rglob("*.json"):
        runs = json.loads(path.read_text()).get("runs", [])
        assert path.stat().st_size <= 10_000 + 2_000 * len(runs), path


def test_ropes_figure_draws_its_extensions_and_its_attention_variants_apart():
    """Issue 54's figures: past PANEL_CURVES curves RoPE's rows split in two panels, its
    eval-time extensions and positions, then the attention variants; NoPE and plain RoPE in
    both as the reference."""
    from posbench.report.docs.corpus import rope_variants_figure

    figure = rope_variants_figure(load(ROOT, EXTRAPOLATION))
    panels = [axes for axes in figure.axes if axes.get_visible() and axes.get_title()]
    labels = [{line.get_label() for line in axes.get_lines()} - {"train length"} for axes in panels]
    assert [axes.get_title() for axes in panels] == [
        "RoPE's extensions and positions",
        "attention variants",
    ]
    assert {"none", "rope", "rope + yarn"} <= labels[0] and "rope (qk_norm=True)" not in labels[0]
    assert {"none", "rope", "rope (qk_norm=True)"} <= labels[1] and "rope + yarn" not in labels[1]
    # each curve of a panel in a colour of its own: RoPE's rows are not told apart by dashes
    for axes, rows in zip(panels, labels, strict=True):
        colours = [line.get_color() for line in axes.get_lines() if line.get_label() in rows]
        assert len(set(colours)) == len(colours), axes.get_title()


@pytest.mark.parametrize("page", ["README.md", "docs/results.md"])
def test_every_result_number_a_reading_states_is_in_a_rendered_block_of_its_section(page):
    """Results are rendered from summaries, never typed: a decimal the prose around the
    rendered blocks states (a reading) must be one of the numbers its section renders, so that
    re-rendering from a new summary cannot leave a stale number in the text. Config values are
    written as code (`model.dropout=0.3`) and commands are code blocks: neither counts."""
    text = (ROOT / page).read_text()
    rendered_block = re.compile(r"<!-- rendered: [^>]*-->(.*?)<!-- /rendered -->", re.S)
    typed = []
    for section in re.split(r"\n(?=## )", text):
        rendered = " ".join(rendered_block.findall(section))
        prose = re.sub(r"```.*?```|`[^`\n]*`", "", rendered_block.sub("", section), flags=re.S)
        for number in re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", prose):
            if not re.search(rf"(?<![\w.]){re.escape(number)}(?![\w])", rendered):
                typed.append(f"{section.splitlines()[0][:60]}: {number}")
    assert not typed, f"numbers typed in {page}'s readings, not rendered beside them: {typed}"


def test_a_provenance_line_names_a_re_evaluation_of_many_runs_once():
    """A sweep's 45 LongPPL evaluations differ only in their --run: one command, its count."""
    train = "posbench train -m +experiment=extrapolation"
    evals = [f"posbench eval --run S/{n}_rope_seed{n} --metric longppl" for n in range(3)]
    text = commands_text([train, *evals, None, "posbench eval --run=S/x --length 64"])
    assert text == (
        f"`{train}` and `posbench eval --run <run> --metric longppl` (3 runs) and "
        "`posbench eval --run=<run> --length 64`"
    )
