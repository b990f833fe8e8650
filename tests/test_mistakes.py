"""A new user's mistakes, each as its command line: one error line that names the fix, before
anything is trained (`posbench`'s main in this process: every one of them stops before Hydra
starts a job)."""

import os
from pathlib import Path

import pytest
from conftest import TINY_RUN, error_line
from omegaconf import OmegaConf

from posbench.commands.overrides import group_options
from posbench.config import compose_config
from posbench.runs.directory import save_config
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
