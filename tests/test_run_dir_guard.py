"""A run directory is never overwritten by another run: `posbench train` into a directory that
holds a run either continues that very run or refuses in one line that says what to run.

The refusals come before Hydra starts the job, so they run `posbench`'s main in this process;
the paths that train or evaluate run it as a user does, in a subprocess."""

import shutil
from pathlib import Path

import pytest
from conftest import TINY, error_line, posbench

from posbench.config import compose_config
from posbench.errors import PosbenchError
from posbench.runs.directory import CHECKPOINT_FILE
from posbench.training.train import train

RUN = [*TINY, "train.checkpoint_every=20"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache_dir):
    """A finished tiny run, trained once; tests work on copies of it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(compose_config([*RUN, f"data.cache_dir={cache_dir}"]), run_dir)
    return run_dir


@pytest.fixture
def run(finished, tmp_path, monkeypatch):
    """A copy of the finished run at ./run, in a working directory of its own."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(finished, tmp_path / "run")
    return Path("run")


def contents(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_resuming_with_another_config_refuses_naming_the_keys_and_leaves_the_run_untouched(
    run, capsys
):
    before = contents(run)
    line = error_line(capsys, "train", "train.resume=true", "hydra.run.dir=run")
    # TINY's corpus and model against the defaults, the first three keys by name
    assert line.startswith("run holds another run: this config differs in data.document_length ")
    assert "data.successors (2, not 4)" in line and " more; " in line
    assert "resume that run with its own config: `posbench train --resume run`" in line
    assert contents(run) == before  # results.json, TensorBoard events, .hydra/, train.log


def test_a_fresh_run_into_a_directory_holding_a_run_refuses_before_writing(run, capsys):
    before = contents(run)
    line = error_line(capsys, "train", *RUN, "hydra.run.dir=run")
    assert line == (
        "run already holds a run (config.yaml); continue it with `posbench train --resume run` "
        "or choose another hydra.run.dir"
    )
    assert contents(run) == before


@pytest.mark.parametrize("resume", [["--resume", "run"], [*RUN, "train.resume=true"]])
def test_a_finished_run_without_its_checkpoint_says_it_cannot_continue(run, capsys, resume):
    (run / CHECKPOINT_FILE).unlink()
    before = contents(run)
    line = error_line(capsys, "train", *resume, "hydra.run.dir=run")
    assert line == (
        "run is a finished run whose checkpoint.pt is missing, so it cannot be resumed or "
        "extended; `posbench eval --run run` re-evaluates it, and a longer run is a new run in "
        "another hydra.run.dir"
    )
    assert contents(run) == before


def test_a_finished_run_with_an_unreadable_checkpoint_says_it_cannot_continue(run):
    (run / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(PosbenchError, match=r"is a finished run whose checkpoint\.pt cannot be"):
        train(compose_config([*RUN, "train.resume=true"]), run)


def test_resume_of_a_directory_without_a_config_says_it_is_not_a_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    line = error_line(capsys, "train", "--resume", str(tmp_path / "empty"))
    assert line.endswith(
        "empty holds no config.yaml, so it is not a run directory; pass "
        "--resume the directory `posbench train` wrote"
    )


def test_resuming_a_finished_run_logs_its_step_and_says_it_is_done(run, tmp_path):
    before = contents(run)
    result = posbench("train", "--resume", "run", cwd=tmp_path)
    out = result.stdout + result.stderr
    assert "from the checkpoint of step 40 (of 40)" in out
    assert "finished at step 40: nothing to resume; `posbench train --resume" in out
    assert contents(run)["results.json"] == before["results.json"]


def test_an_unfinished_run_with_a_corrupt_checkpoint_says_what_to_run_and_that_works(
    run, tmp_path, capsys
):
    """The line names the command; after it, the run trains again from its own config."""
    for name in ("results.json", "model.safetensors"):
        (run / name).unlink()  # as a run stopped before its end leaves it
    (run / CHECKPOINT_FILE).write_bytes(b"half a checkpoint")
    with pytest.raises(PosbenchError) as err:
        train(compose_config([*RUN, "train.resume=true"]), run)
    assert str(err.value) == (
        "run/checkpoint.pt is not a readable checkpoint (truncated or foreign); delete it, then "
        "`posbench train --resume run` trains the run again from the start"
    )
    (run / CHECKPOINT_FILE).unlink()
    posbench("train", "--resume", "run", cwd=tmp_path)  # its own config: TINY's, not the default
    assert (run / "model.safetensors").is_file()
    assert "d_model: 32" in (run / "config.yaml").read_text()
