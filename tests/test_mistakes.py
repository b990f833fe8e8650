"""A new user's mistakes, each as its command line: one error line that names the fix, before
anything is trained (`posbench`'s main in this process: every one of them stops before Hydra
starts a job)."""

import os
import shutil
from pathlib import Path

import pytest
from conftest import TINY_RUN, error_line
from omegaconf import OmegaConf

from posbench.commands.overrides import check_overrides, group_options, unknown_key_hint
from posbench.commands.train import train_help
from posbench.config import compose_config
from posbench.encodings import encoding_names
from posbench.evaluation.reevaluate import default_run
from posbench.runs.directory import SWEEP_MARKER, save_config
from posbench.runs.sweep_summary import SweepSummary


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_an_experiment_that_is_a_sweep_without_m_gives_the_m_command(experiment, capsys):
    line = error_line(capsys, "train", f"+experiment={experiment}", "seed=0")
    assert line.startswith(f"+experiment={experiment} is a sweep (over ")
    assert line.endswith(f"run it with -m: `posbench train -m +experiment={experiment} seed=0`")


def fake_run(path: Path, encoding: str, mtime: float) -> Path:
    """A run directory of ``encoding`` whose weights were written at ``mtime`` (empty: the
    commands below refuse before reading them)."""
    path.mkdir(parents=True)
    save_config(path, compose_config([f"encoding={encoding}", *TINY_RUN]))
    weights = path / "model.safetensors"
    weights.write_bytes(b"")
    os.utime(weights, (mtime, mtime))
    return path


def test_rope_scaling_of_the_newest_run_that_is_not_rope_names_the_newest_rope_run(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    fake_run(Path("outputs/day/08-00-00_rope"), "rope", 1_000)
    fake_run(Path("outputs/multirun/day/09-00-00/1_alibi_seed0"), "alibi", 2_000)
    line = error_line(capsys, "eval", "--length", "2048", "--rope-scaling", "yarn")
    assert line == (
        "RoPE scaling needs a run trained with encoding=rope; "
        "outputs/multirun/day/09-00-00/1_alibi_seed0 used 'alibi'; the newest rope run is "
        "outputs/day/08-00-00_rope: pass --run outputs/day/08-00-00_rope"
    )


def test_rope_scaling_without_any_rope_run_says_to_train_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fake_run(Path("outputs/day/09-00-00_alibi"), "alibi", 2_000)
    line = error_line(capsys, "eval", "--length", "2048", "--rope-scaling", "yarn")
    assert line.endswith("train one with `posbench train encoding=rope` and pass --run DIR")


def test_eval_without_run_takes_the_newest_weights_and_says_which_sweep_they_ended(tmp_path):
    fake_run(tmp_path / "day" / "08-00-00_rope", "rope", 1_000)
    newest = fake_run(tmp_path / "multirun" / "day" / "09-00-00" / "1_alibi_seed0", "alibi", 2_000)
    (newest.parent / SWEEP_MARKER).write_text("")  # what a sweep leaves in its directory
    run_dir, why = default_run(tmp_path)
    assert run_dir == newest
    assert why.startswith(f"no --run given: evaluating the newest run under {tmp_path}/")
    assert f"the last job of the sweep {newest.parent}" in why
    assert why.endswith("; pass --run DIR to choose another")


def test_train_help_lists_the_groups_and_the_config_its_overrides_compose():
    """What `posbench train --help encoding=learned` prints (tests/test_cli.py runs it)."""
    text = train_help(["encoding=learned"])
    assert "encoding   " + ", ".join(encoding_names()) in text
    assert "max_length" in text  # the learned encoding's own option, composed


def test_run_at_a_file_says_it_is_a_file_and_names_its_directory(tmp_path, capsys):
    run_dir = fake_run(tmp_path / "run", "rope", 1_000)
    line = error_line(capsys, "eval", "--length", "16", "--run", str(run_dir / "config.yaml"))
    assert line == (
        f"{run_dir}/config.yaml is a file; pass --run the run directory that holds it: "
        f"--run {run_dir}"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.steps=abc", "train.steps takes an integer, not 'abc': e.g. train.steps=600"),
        ("train.lr=fast", "train.lr takes a number, not 'fast': e.g. train.lr=0.003"),
        ("train.compile=maybe", "train.compile takes true or false, not 'maybe': e.g. "),
        ("eval.stride=x", "eval.stride takes an integer, not 'x': e.g. eval.stride=100"),
    ],
)
def test_a_value_that_does_not_convert_names_the_key_the_type_and_an_example(
    override, message, capsys
):
    assert error_line(capsys, "train", override).startswith(message)


@pytest.mark.parametrize(
    ("flag", "meant"),
    [
        (["--steps", "100"], "train.steps=100"),
        (["--seed=3"], "seed=3"),
        (["--batch-size", "8"], "train.batch_size=8 or eval.batch_size=8"),
        (["--encoding", "alibi"], "encoding=alibi"),
    ],
)
def test_a_flag_that_names_a_config_key_suggests_the_override(flag, meant, capsys):
    line = error_line(capsys, "train", *flag)
    name = flag[0].partition("=")[0]
    assert line == (
        f"posbench train: unrecognized arguments: {name}; config keys are set as KEY=VALUE: "
        f"did you mean {meant}? (see posbench train --help)"
    )


def test_a_sweep_finds_a_missing_data_path_of_its_third_job_before_the_first_job(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 500)
    paths = "data.path=corpus.txt,corpus.txt,missing.txt"
    line = error_line(capsys, "train", "-m", "data=text", paths, *TINY_RUN)
    assert line == (
        "data.path 'missing.txt' matches no file; point data.path at a text file, a directory "
        "or a glob"
    )
    assert not Path("outputs").exists()  # no job ran


@pytest.mark.parametrize(("runs", "said"), [(1, "1 run in"), (2, "2 runs in")])
def test_a_sweep_counts_its_runs_in_words(tmp_path, capsys, runs, said):
    for job in range(runs):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "results.json").write_text("{}")
    summary, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    summary.on_multirun_start(config)
    summary.on_multirun_end(config)
    assert f"sweep finished: {said} {tmp_path}" in capsys.readouterr().out


# A mistake and a word of its error line: one of each kind in the fast tier, the rest beside
# them in the slow one (each composes the config, about 0.7 s). tests/test_cli.py runs one of
# each command's kind through the `posbench` command.
COMMAND_LINE_MISTAKES = [
    (
        ["train", "encoding=nope"],
        "unknown encoding 'nope'; choose one of",
    ),
    (
        ["train", "train.steps=-5"],
        "train.steps must be positive",
    ),
    (
        ["train", "--frob", "10"],
        "posbench train: unrecognized arguments: --frob (see posbench train --help)",
    ),
    (
        ["train", "train.stpes=10"],
        "no such key; did you mean train.steps?",
    ),
    (
        ["train", "data.path=corpus.txt"],
        "data.path is a key of data=text, not of data=synthetic: use `data=text "
        "data.path=corpus.txt`",
    ),
    (
        ["train", "-m", "encoding=rope,", "alibi"],
        "did you mean encoding=rope,alibi?",
    ),
    (
        ["train", "encoding=t5", "encoding.num_buckets=0"],
        "encoding.num_buckets must be >= 2",
    ),
    (
        ["eval", "--length", "0"],
        "positive integer",
    ),
    (
        ["eval", "--length", "16"],
        "no trained run under outputs/",
    ),
    (
        ["report", "no/such/dir"],
        "no/such/dir is neither a directory nor a summary file",
    ),
    (
        ["train", "-m", "hydra/launcher=nope"],
        "unknown hydra/launcher 'nope'",
    ),
]
MORE_COMMAND_LINE_MISTAKES = [
    (
        ["train", "model.d_model=36", "model.n_head=4"],
        "head dim",
    ),
    (
        ["train", "threads=0"],
        "threads must be auto or a positive integer",
    ),
    (
        ["train", "model.attention_scaling=bogus"],
        "model.attention_scaling must be one of none, ssmax, llama4 (got 'bogus')",
    ),
    (
        ["eval", "--threads", "two"],
        "expected auto or a positive integer",
    ),
    (
        ["train", "--cfg", "everything"],
        "argument --cfg/-c: invalid choice: 'everything'",
    ),
    (
        ["train", "-m", "encoding=none,rope", "--cfg", "job"],
        "--cfg job prints one job's",
    ),
    (
        ["train", "--info", "--multirun"],
        "one of --multirun (-m), --cfg, --info",
    ),
    (
        ["train", "encoding=t5", "encoding.num_bucket=8"],
        "did you mean encoding.num_buckets?",
    ),
    (
        ["train", "encoding.max_distance=64"],
        "use `encoding=t5 encoding.max_distance=64`",
    ),
    (
        ["train", "alibi"],
        "cannot parse the override 'alibi' (missing EQUAL at '<EOF>'): did you mean "
        "encoding=alibi?",
    ),
    (
        ["train", "eval.lengths=128,256"],
        "write eval.lengths=[128,256] for a list",
    ),
    (
        ["train", "encoding=t5", "encoding.max_distance=10"],
        "encoding.max_distance must exceed",
    ),
    (
        ["train", "encoding=kerple", "encoding.kernel=cubic"],
        "encoding.kernel must be one of log, power",
    ),
    (
        ["train", "encoding=alibi", "encoding.slopes=1"],
        "encoding.slopes",
    ),
    (
        ["eval", "--length", "many"],
        "positive integer",
    ),
    (
        ["eval", "--length", "16", "--run", "no/such/run"],
        "not found",
    ),
    (
        ["eval", "--rope-scaling", "stretch"],
        "invalid choice",
    ),
    (
        ["eval", "--rope-scaling", "yarn", "--factor", "0.5"],
        "a number >= 1",
    ),
    (
        ["eval", "--factor", "2"],
        "--factor needs --rope-scaling",
    ),
    (
        ["eval", "--metric", "longppl"],
        "--metric longppl and --evaluator RUN go together",
    ),
    (
        ["diagnose", "--length", "8", "--sink-token", "9"],
        "--sink-token 9 is not in a window of --length 8",
    ),
    (
        ["report"],
        "the following arguments are required: DIR",
    ),
    (
        ["report", "a", "b"],
        "with several DIRs, say where the report goes: --out OUT",
    ),
    (
        ["train", "-m", "+experiment=extrapolation_text"],
        "data.path must be set",
    ),
]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        *COMMAND_LINE_MISTAKES,
        *(pytest.param(*mistake, marks=pytest.mark.slow) for mistake in MORE_COMMAND_LINE_MISTAKES),
    ],
)
def test_a_mistake_is_one_error_line_exit_2_and_nothing_written(
    args, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert message in error_line(capsys, *args)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # composes the config with each data option: about 6 s
def test_a_key_of_another_option_is_named_against_the_option_chosen_beside_a_second_mistake():
    # data.val_tokens is not a key of data=text either, so the other overrides do not compose;
    # the hint must still say data=text was chosen, not the default data=synthetic.
    overrides = ["data=text", "data.path=f.txt", "data.train_tokens=4000", "data.val_tokens=100"]
    assert unknown_key_hint("data.train_tokens", overrides) == (
        "data.train_tokens is a key of data=synthetic, not of data=text: "
        "use `data=synthetic data.train_tokens=4000`"
    )


@pytest.mark.parametrize("sweep", [[], ["-m"]])
def test_a_key_that_reads_hydras_config_is_checked_with_the_value_its_job_will_see(
    sweep, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    path = "data.path=${hydra:runtime.cwd}/missing.txt"
    line = error_line(capsys, "train", *sweep, "data=text", path)
    assert line.startswith(f"data.path '{tmp_path}/missing.txt' matches no file")


def test_a_key_that_reads_what_only_a_sweeps_job_has_is_one_line_without_m(capsys):
    line = error_line(capsys, "train", "seed=${hydra:job.num}")
    assert line == (
        "seed=${hydra:job.num} does not resolve as its job would (Incompatible value 'None' for "
        "field of type 'int'); hydra.job.num and hydra.job.id are set in a sweep's jobs only: "
        "add -m"
    )


@pytest.fixture
def conf_with(tmp_path, monkeypatch):
    """A copy of conf/ that posbench composes from, with the files given added to it."""
    from posbench import config
    from posbench.commands import overrides

    conf = tmp_path / "conf"
    shutil.copytree(config.config_dir(), conf)
    for module in (config, overrides):
        monkeypatch.setattr(module, "config_dir", lambda: conf)
    monkeypatch.chdir(tmp_path)

    def add(path: str, text: str) -> None:
        (conf / path).write_text(text)

    return add


REQUIRED_WIDTH = """defaults:
  - /schema/model/model@_here_
  - _self_
d_model: ???
"""


def test_a_key_a_group_file_marks_missing_must_be_set_though_its_schema_has_a_default(
    conf_with, capsys
):
    conf_with("model/unsized.yaml", REQUIRED_WIDTH)
    line = error_line(capsys, "train", "model=unsized")
    assert line == "model.d_model must be set (model.d_model=...)"


def test_a_key_a_group_file_marks_missing_is_set_by_the_command_line_or_a_later_file(conf_with):
    conf_with("model/unsized.yaml", REQUIRED_WIDTH)
    conf_with("experiment/sized.yaml", "# @package _global_\nmodel:\n  d_model: 64\n")
    for overrides in (["model.d_model=64"], ["+experiment=sized"]):
        check_overrides(["model=unsized", *overrides], multirun=False)
