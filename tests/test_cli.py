"""The posbench command end to end, through subprocesses, as a user runs it; where a test
checks what a command computes rather than what the process shows (the eval tests of one
trained run), posbench's main runs in this process."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch
from conftest import TINY, TINY_RUN, built_once, error_line, forked_posbench, posbench
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posbench.cli import main
from posbench.commands.overrides import group_options
from posbench.config import compose_config
from posbench.encodings import encoding_names
from posbench.evaluation.perplexity import position_buckets
from posbench.runs.directory import save_config, saved_config
from posbench.runs.sweep_summary import SWEEP_ID_VARIABLE, SweepSummary, record_failed_job
from posbench.system.threads import available_cores

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("outputs/**/results.json"))


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory, cache_dir):
    """One tiny `posbench train` run and what it printed, trained once for every worker."""

    def train_in(workdir):
        (workdir / "stdout.txt").write_text(
            posbench("train", "encoding=rope", *TINY, cwd=workdir).stdout
        )

    return built_once(tmp_path_factory, "cli-trained", train_in)


@pytest.fixture
def trained(trained_once, tmp_path):
    """A copy of that run for a test to evaluate: its working directory, the run, its stdout."""
    workdir = tmp_path / "cli"
    shutil.copytree(trained_once, workdir)
    (run_dir,) = run_dirs(workdir)
    return workdir, run_dir, (workdir / "stdout.txt").read_text()


def evaluated(workdir: Path, *args: str, monkeypatch, capsys) -> str:
    """What `posbench eval ARGS` prints, run by posbench's main in this process from
    ``workdir``, on one thread (test_eval_appends_new_lengths_to_the_newest_run runs the
    command)."""
    monkeypatch.chdir(workdir)
    main(["eval", *args, "--threads", "1"])
    return capsys.readouterr().out


def results_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def top_level_help(tmp_path_factory) -> str:
    """What `posbench --help` prints."""
    return posbench("--help", cwd=tmp_path_factory.mktemp("help")).stdout


def test_top_level_help_lists_commands_encodings_and_key_options(top_level_help):
    out = top_level_help
    for word in [
        "train",
        "eval",
        "none",
        "learned",
        "sinusoidal",
        "rope",
        "train.seq_len",
        "eval.lengths",
        "model=",
        "data=",
    ]:
        assert word in out


def test_train_help_lists_groups_and_the_composed_config(tmp_path):
    out = posbench("train", "--help", "encoding=learned", cwd=tmp_path).stdout
    assert "encoding   " + ", ".join(encoding_names()) in out
    assert "experiment " + ", ".join(sorted(group_options("experiment"))) in out
    assert "-m +experiment=OPTION" in out
    assert "max_length" in out  # the learned encoding's own option, composed
    assert "seq_len: 128" in out


def test_train_writes_a_complete_run_directory(trained):
    _, run_dir, result = trained
    names = {p.name for p in run_dir.iterdir()}
    assert {"model.safetensors", "config.yaml", "results.json", ".hydra", "train.log"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert [r["length"] for r in results_of(run_dir)["eval"]] == [16, 32, 64]
    assert "ratio" in result and "64" in result  # the summary table
    command = shlex.join(["posbench", "train", "encoding=rope", *TINY])
    assert results_of(run_dir)["ran"]["command"] == command


def test_eval_appends_new_lengths_to_the_newest_run(trained):
    workdir, run_dir, _ = trained
    before = results_of(run_dir)["eval"]
    out = posbench("eval", "--length", "48", cwd=workdir).stdout
    assert "48" in out
    why = "no --run given: evaluating the newest run under outputs/ (the one whose "
    assert f"{why}model.safetensors was written last): {run_dir.relative_to(workdir)}" in out
    after = results_of(run_dir)["eval"]
    assert [r for r in after if r["length"] != 48] == before
    (new,) = [r for r in after if r["length"] == 48]
    assert new["status"] == "ok" and new["stride"] is None
    # The re-evaluation names its code; the training's records take results.json's versions.
    assert new["versions"] == results_of(run_dir)["versions"]
    assert not any("versions" in r for r in before)
    assert new["ran"]["command"] == "posbench eval --length 48"


def test_eval_keeps_tensorboard_in_step_with_results_json(trained, monkeypatch, capsys):
    """A re-evaluated length replaces its TensorBoard point, and the figure shows every record."""
    workdir, run_dir, _ = trained
    args = ["--run", str(run_dir), "--length", "16", "--length", "48"]
    evaluated(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    plain = [
        r for r in results_of(run_dir)["eval"] if r["stride"] is None and r["scaling"] == "none"
    ]
    logged = [(e.step, e.value) for e in events.Scalars("eval/ppl")]
    assert logged == [(r["length"], pytest.approx(r["ppl"])) for r in plain]
    assert len(events.Images("eval/ppl_vs_length")) == 1


def test_eval_of_other_lengths_shows_the_ratio_to_the_recorded_training_length(
    trained, monkeypatch, capsys
):
    workdir, run_dir, _ = trained
    args = ["--run", str(run_dir), "--length", "32"]
    out = evaluated(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == ["32"]]
    plain = {
        r["length"]: r["ppl"]
        for r in results_of(run_dir)["eval"]
        if r["stride"] is None and r["scaling"] == "none"
    }
    assert float(row[4]) == pytest.approx(plain[32] / plain[16], abs=0.005)


def test_eval_with_a_chosen_run_several_lengths_and_a_stride(trained, monkeypatch, capsys):
    workdir, run_dir, _ = trained
    args = ["--run", str(run_dir), "--length", "32", "--length", "128", "--stride", "8"]
    evaluated(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    strided = {r["length"]: r for r in results_of(run_dir)["eval"] if r["stride"] == 8}
    assert set(strided) == {32, 128}
    assert all(r["status"] == "ok" and r["ppl"] > 1 for r in strided.values())


def test_eval_records_longppl_beside_ppl_with_how_its_key_tokens_were_selected(
    trained, monkeypatch, capsys
):
    workdir, run_dir, _ = trained
    args = ["--run", str(run_dir), "--length", "64", "--metric", "longppl"]
    out = evaluated(
        workdir, *args, "--evaluator", str(run_dir), monkeypatch=monkeypatch, capsys=capsys
    )
    # a plain record at 64 (an earlier test's) stands beside it: the evaluator keys the record
    (record,) = [
        r for r in results_of(run_dir)["eval"] if r["length"] == 64 and r.get("longppl_evaluator")
    ]
    assert record["ppl"] > 1 and record["key_tokens"] >= 0 and "longppl" in record
    assert record["longppl_evaluator"] == str(run_dir.resolve())
    assert (record["longppl_alpha"], record["longppl_beta"], record["longppl_short_stride"]) == (
        2.0,
        -2.0,
        4,
    )
    assert f"LongPPL, key tokens selected by {run_dir}:" in out
    # again: the evaluator's selection read back from the cache gives the same record
    evaluated(workdir, *args, "--evaluator", str(run_dir), monkeypatch=monkeypatch, capsys=capsys)
    (again,) = [
        r for r in results_of(run_dir)["eval"] if r["length"] == 64 and r.get("longppl_evaluator")
    ]
    assert {**again, "ran": None} == {**record, "ran": None}


def test_eval_of_the_training_length_reproduces_the_training_run_number(
    trained, monkeypatch, capsys
):
    workdir, run_dir, _ = trained
    trained_ppl = results_of(run_dir)["eval"][0]["ppl"]
    evaluated(
        workdir, "--run", str(run_dir), "--length", "16", monkeypatch=monkeypatch, capsys=capsys
    )
    (again,) = [r for r in results_of(run_dir)["eval"] if r["length"] == 16 and r["stride"] is None]
    assert again["ppl"] == pytest.approx(trained_ppl, rel=1e-6)


def test_eval_compile_reproduces_the_eager_number_and_records_its_compile_time(
    trained, monkeypatch, capsys
):
    """Inductor's code itself (test_precision traces with eager kernels), at a length whose last
    batch is partial: 256 windows of 16 tokens in batches of 100, 100 and 56."""
    workdir, run_dir, _ = trained
    (eager,) = [r for r in results_of(run_dir)["eval"] if r["length"] == 16]
    args = ["--run", str(run_dir), "--length", "16", "--batch-size", "100", "--compile"]
    evaluated(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    (compiled,) = [r for r in results_of(run_dir)["eval"] if r["length"] == 16]
    assert eager["compile_s"] is None and compiled["compile_s"] > 0
    assert compiled["tokens"] == eager["tokens"]
    assert compiled["ppl"] == pytest.approx(eager["ppl"], rel=1e-5)


def test_eval_with_rope_scaling_records_the_method_beside_the_plain_records(
    trained, monkeypatch, capsys
):
    workdir, run_dir, _ = trained
    plain_before = [r for r in results_of(run_dir)["eval"] if r["scaling"] == "none"]
    assert plain_before  # training writes the field too
    args = ["--run", str(run_dir), "--length", "16", "--length", "64"]
    args += ["--rope-scaling", "yarn", "--factor", "4"]
    out = evaluated(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    assert "yarn scaling factor s: 4 at length 16, 4 at length 64" in out
    after = results_of(run_dir)["eval"]
    assert [r for r in after if r["scaling"] == "none"] == plain_before
    yarn = {r["length"]: r for r in after if r["scaling"] == "yarn"}
    assert set(yarn) == {16, 64}
    assert all(r["status"] == "ok" and r["scaling_factor"] == 4.0 for r in yarn.values())

    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = {"eval/ppl", "eval/ppl/yarn_s4", "eval/bits_per_byte/yarn_s4"}  # factor 4 given
    assert tags <= set(events.Tags()["scalars"])
    logged = {e.step: e.value for e in events.Scalars("eval/ppl/yarn_s4")}
    assert logged == pytest.approx({n: r["ppl"] for n, r in yarn.items()}, rel=1e-6)


def test_eval_logs_the_loss_by_position_it_writes_to_results_json(trained, monkeypatch, capsys):
    workdir, run_dir, _ = trained
    args = ["--run", str(run_dir), "--length", "64", "--rope-scaling", "linear", "--factor", "4"]
    evaluated(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    (record,) = [r for r in results_of(run_dir)["eval"] if r["scaling"] == "linear"]
    events = EventAccumulator(str(run_dir))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("eval/loss_by_position/L64/linear_s4")]
    buckets = record["loss_by_position"]
    assert [(b["start"], b["end"]) for b in buckets] == position_buckets(64, 16)  # train.seq_len
    assert logged == [(b["end"], pytest.approx(b["nll"])) for b in buckets]


def test_dynamic_scaling_without_a_factor_derives_it_from_the_training_length(
    trained, monkeypatch, capsys
):
    workdir, run_dir, _ = trained
    args = ["--run", str(run_dir), "--length", "64", "--rope-scaling", "dynamic"]
    evaluated(workdir, *args, monkeypatch=monkeypatch, capsys=capsys)
    (record,) = [r for r in results_of(run_dir)["eval"] if r["scaling"] == "dynamic"]
    assert (record["length"], record["scaling_factor"]) == (64, 4.0)  # 64 / train.seq_len 16


def test_rope_scaling_on_a_run_without_rope_is_one_line(tmp_path, capsys):
    run_dir = tmp_path / "learned_run"
    run_dir.mkdir()
    save_config(run_dir, compose_config(["encoding=learned", *TINY]))
    (run_dir / "model.safetensors").write_bytes(b"")  # refused before the weights are read
    args = ["eval", "--run", str(run_dir), "--length", "16", "--rope-scaling", "yarn"]
    line = error_line(capsys, *args)  # posbench's main in this process
    assert "encoding=rope" in line and "'learned'" in line


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache_dir):
    """A two-job sweep: its working directory and what it printed."""
    workdir = tmp_path_factory.mktemp("sweep")
    out = posbench("train", "-m", "encoding=none,learned", *TINY, cwd=workdir).stdout
    return workdir, out


def test_multirun_sweep_makes_one_run_directory_per_job(sweep):
    workdir, _ = sweep
    runs = {results_of(d)["encoding"]: results_of(d) for d in run_dirs(workdir)}
    assert set(runs) == {"none", "learned"}
    learned = {r["length"]: r["status"] for r in runs["learned"]["eval"]}
    assert learned == {16: "ok", 32: "unsupported", 64: "unsupported"}


def test_a_sweep_ends_with_its_directory_and_the_report_command(sweep):
    workdir, out = sweep
    (sweep_dir,) = {d.parent.relative_to(workdir) for d in run_dirs(workdir)}
    assert out.splitlines()[-2:] == [
        f"sweep finished: 2 runs in {sweep_dir}",
        f"compare them: posbench report {sweep_dir}",
    ]


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_failed_sweep_job_is_one_line_the_others_still_run_and_the_sweep_exits_2(
    tmp_path, launcher
):
    """With joblib the jobs run in worker processes, which must record their failure for the
    sweep that started them (posbench.runs.sweep_summary.SWEEP_ID_VARIABLE). A diverging job: what
    can be checked before training (a missing data.path) stops the sweep before its first job."""
    if launcher == "joblib":
        pytest.importorskip(
            "hydra_plugins.hydra_joblib_launcher", reason="pip install .[launchers]"
        )
    overrides = [*TINY, "train.lr=1e-2,1e30", f"hydra/launcher={launcher}"]
    result = posbench("train", "-m", *overrides, cwd=tmp_path, check=False)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: job 1 (") and "): training diverged at step " in line
    assert line.endswith("lower train.lr (now 1e+30) or raise train.warmup_steps")
    trained, diverged = sorted(run_dirs(tmp_path), key=lambda d: results_of(d)["status"] != "ok")
    assert results_of(diverged)["status"] == "diverged"  # its results.json says how it ended
    sweep_dir = trained.parent.relative_to(tmp_path)
    assert f"sweep finished: 2 runs in {sweep_dir}, 1 failed" in result.stdout


def test_sweeps_sharing_a_directory_at_once_each_name_only_their_own_failed_jobs(
    tmp_path, monkeypatch, capsys
):
    """The plain sweep and the one at randomized positions in one hydra.sweep.dir, the second
    started while the first runs. In use each sweep is its own process with its own id in the
    environment; here both share this one, so the last start's id stands for the jobs'."""
    monkeypatch.setenv(SWEEP_ID_VARIABLE, "restored after the test")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    plain, randomized, again = SweepSummary(), SweepSummary(), SweepSummary()
    plain.on_multirun_start(config)
    record_failed_job(tmp_path, tmp_path / "0_rope_seed0", 0, ["encoding=rope"], "plain's error")
    randomized.on_multirun_start(config)
    overrides = ["encoding=rope", "train.random_positions=2048"]
    record_failed_job(tmp_path, tmp_path / "0_rope_random2048_seed0", 0, overrides, "its error")
    for summary, error in ((plain, "plain's error"), (randomized, "its error")):
        with pytest.raises(SystemExit) as exited:
            summary.on_multirun_end(config)
        assert exited.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: job 0 (encoding=rope") and line.endswith(error)
    # Run again in the directory (train.resume=true), a sweep starts with no failures.
    again.on_multirun_start(config)
    again.on_multirun_end(config)
    assert "failed" not in capsys.readouterr().out


def test_eval_without_run_after_a_sweep_says_it_took_the_sweeps_last_job(sweep):
    workdir, _ = sweep
    out = posbench("eval", "--length", "16", cwd=workdir).stdout
    newest = max(run_dirs(workdir), key=lambda d: (d / "model.safetensors").stat().st_mtime)
    job, sweep_dir = newest.relative_to(workdir), newest.parent.relative_to(workdir)
    assert f"{job}, the last job of the sweep {sweep_dir}" in out


# One mistake of each command's kind, through the `posbench` command: what a user sees is one
# line on stderr and a non-zero exit, nothing printed at import or by the interpreter.
# tests/test_mistakes.py runs each of these and the other mistakes through posbench's main in
# its own process, which is what decides the line.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "encoding=nope"], "unknown encoding 'nope'; choose one of"),
        (
            ["train", "--frob", "10"],
            "posbench train: unrecognized arguments: --frob (see posbench train --help)",
        ),
        (["eval", "--length", "0"], "positive integer"),
        (["report", "no/such/dir"], "no/such/dir is neither a directory nor a summary file"),
        (["train", "-m", "hydra/launcher=nope"], "unknown hydra/launcher 'nope'"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_a_nonzero_exit(tmp_path, args, message):
    result = posbench(*args, cwd=tmp_path, check=False)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:") and message in lines[0]


def test_tqdm_disable_turns_the_progress_bars_off(tmp_path, cache_dir):
    result = posbench("train", *TINY, "train.steps=4", cwd=tmp_path, env={"TQDM_DISABLE": "1"})
    assert "train rope" not in result.stderr and "eval length" not in result.stderr


def test_the_training_bar_is_on_without_tqdm_disable(tmp_path, cache_dir, monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE")  # conftest.py sets it for every test
    result = posbench("train", *TINY, "train.steps=4", cwd=tmp_path)
    assert "train rope: 100%" in result.stderr


def test_an_empty_text_corpus_is_one_line_naming_the_fix(tmp_path, cache_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    result = posbench(
        "train", "data=text", f"data.path={empty}", *TINY_RUN, cwd=tmp_path, check=False
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "data.path" in lines[0] and "Traceback" not in result.stderr


def test_an_uncached_hub_corpus_offline_fails_before_building_anything(tmp_path):
    env = {"HF_HOME": str(tmp_path / "empty_hf_home"), "HF_DATASETS_OFFLINE": "1"}
    result = posbench("train", "data=wikitext103", cwd=tmp_path, check=False, env=env)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot download 'Salesforce/wikitext'") and "data=text" in line
    assert "building corpus" not in result.stdout + result.stderr


def checked(command: list, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` that fails the test with the child's stderr, not just its exit code."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} failed:\n{result.stderr}")
    return result


def venv_seeing_this_interpreters_packages(env_dir: Path) -> Path:
    """A fresh virtual environment whose imports fall back on this interpreter's: a .pth file
    lists every directory on this sys.path except source trees holding posbench. (A venv with
    system_site_packages would see the *base* interpreter's packages, not those of the venv
    the tests may be running in.) Returns its python."""
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site_packages = checked(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
    ).stdout.strip()
    outer = [
        p for p in sys.path if Path(p).is_dir() and not Path(p, "posbench/__init__.py").is_file()
    ]
    Path(site_packages, "outer_interpreter.pth").write_text("\n".join(outer) + "\n")
    return python


def test_installed_wheel_runs_with_its_bundled_configs(tmp_path, cache_dir):
    """A plain `pip install` (no source tree) finds conf/ inside the package."""
    dist = tmp_path / "dist"
    build = ["pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, REPO]
    checked([sys.executable, "-m", *build])
    (wheel,) = dist.glob("posbench-*.whl")
    env_dir = tmp_path / "venv"
    python = venv_seeing_this_interpreters_packages(env_dir)
    checked([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel])
    # Without PYTHONPATH, so that nothing but the wheel can provide posbench.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # One interpreter for three questions (each would import torch again: 2.5 s of CPU).
    asked = (
        "import torch, posbench.config as c, posbench.references as r\n"
        "print(c.config_dir())\n"
        "print(r.load_reference('alibi-wt103').name)\n"
        "print(torch.__file__)\n"
    )
    where, shipped, torch_there = checked(
        [python, "-c", asked], cwd=tmp_path, env=env
    ).stdout.splitlines()
    assert where.startswith(str(env_dir)) and where.endswith("posbench/conf")
    # ... and the published results posbench report --reference reads, inside the package too.
    assert shipped == "alibi-wt103"
    # Its dependencies are those the tests run with (in a venv: the venv's, not the base's).
    assert torch_there == torch.__file__
    workdir = tmp_path / "work"
    workdir.mkdir()
    posbench(
        "train",
        "encoding=sinusoidal",
        *TINY,
        cwd=workdir,
        executable=str(env_dir / "bin" / "posbench"),
        env=env,
    )
    (run_dir,) = run_dirs(workdir)
    assert results_of(run_dir)["encoding"] == "sinusoidal"


def test_help_lists_every_encoding(top_level_help):
    assert ", ".join(encoding_names()) in top_level_help


def test_bias_encoding_options_are_set_from_the_command_line(tmp_path, cache_dir):
    posbench(
        "train",
        "encoding=t5",
        "encoding.num_buckets=8",
        "encoding.max_distance=12",
        *TINY,
        cwd=tmp_path,
    )
    (run_dir,) = run_dirs(tmp_path)
    config = (run_dir / "config.yaml").read_text()
    assert "num_buckets: 8" in config and "max_distance: 12" in config
    results = results_of(run_dir)
    assert results["encoding_options"] == {"num_buckets": 8, "max_distance": 12}
    assert all(r["status"] == "ok" for r in results["eval"])


def test_two_trainings_started_together_never_share_a_directory(tmp_path, cache_dir):
    """Both ask for the same directory name at once, as two runs started in the same second do."""
    same_name = "hydra.run.dir=${unique_dir:outputs/same}"
    jobs = [
        subprocess.Popen(
            [*forked_posbench(), "train", f"seed={seed}", *TINY, same_name],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (0, 1)
    ]
    for job in jobs:
        assert job.wait(timeout=600) == 0, job.stderr.read()
    runs = run_dirs(tmp_path)
    assert [d.name for d in runs] == ["same", "same_2"]
    assert {results_of(d)["seed"] for d in runs} == {0, 1}


def test_a_randomized_positions_sweep_writes_beside_the_plain_one_in_one_sweep_directory(
    tmp_path, cache_dir
):
    # Both number their jobs from 0: without the positions in the subdirectory name, the second
    # sweep's job would find the first's run in its directory.
    sweep = ["train", "-m", "encoding=rope", *TINY, "train.steps=4", "hydra.sweep.dir=outputs/s"]
    posbench(*sweep, cwd=tmp_path)
    posbench(*sweep, "train.random_positions=64", cwd=tmp_path)
    runs = run_dirs(tmp_path)
    assert [d.name for d in runs] == ["0_rope_random64_seed0", "0_rope_seed0"]
    assert [saved_config(d).train.random_positions for d in runs] == [64, None]


def test_the_joblib_launcher_runs_a_two_job_sweep_into_one_sweep_directory_sharing_the_cores(
    tmp_path, cache_dir
):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install .[launchers]")
    posbench(
        "train",
        "-m",
        "seed=0,1",
        *TINY,
        "threads=auto",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        cwd=tmp_path,
    )
    runs = run_dirs(tmp_path)
    assert len({d.parent for d in runs}) == 1
    assert sorted(results_of(d)["seed"] for d in runs) == [0, 1]
    share = max(1, available_cores() // 2)  # less where other work keeps cores busy
    assert all(1 <= results_of(d)["threads"] <= share for d in runs)


def test_a_run_saved_before_the_threads_key_existed_resumes_with_the_default(tmp_path, cache_dir):
    posbench("train", *TINY, "train.steps=4", "hydra.run.dir=run", cwd=tmp_path)
    config = tmp_path / "run" / "config.yaml"
    config.write_text(
        "".join(
            line for line in config.read_text().splitlines(True) if not line.startswith("threads:")
        )
    )
    posbench("train", "--resume", "run", "train.steps=6", cwd=tmp_path)
    assert results_of(tmp_path / "run")["train"]["steps"] == 6
