"""Experiment configs and launchers compose, and sweep what they promise."""

import logging

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

from posbench import cli
from posbench.commands import train as train_command
from posbench.commands.overrides import (
    expand_sweeps,
    force_added_in_sweeps,
    group_options,
    sweep_overrides,
)
from posbench.config import compose_config, eval_lengths, validate, with_steps_share
from posbench.data import ALGORITHMIC_TASKS, RULER_TASKS, WINDOW_TASKS
from posbench.data.algorithmic.curriculum import BatchLengths, Curriculum
from posbench.data.algorithmic.kazemnejad import KazemnejadTask
from posbench.encodings import encoding_names
from posbench.errors import PosbenchError
from posbench.system.output_dirs import register_output_dir_resolvers
from posbench.training.train_loop import lr_at


def swept_values(cfg, key: str) -> list[str]:
    (override,) = OverridesParser.create().parse_overrides(
        [f"{key}={cfg.hydra.sweeper.params[key]}"]
    )
    return list(override.sweep_string_iterator())


def swept_as_stated(experiment: str, pages: tuple[str, ...]) -> tuple[list[str], ...]:
    """The encodings, tasks and seeds ``experiment`` sweeps, each a distinct registered
    encoding, after checking that its config comment and ``pages`` state its job count."""
    from posbench.report.docs import ROOT

    cfg = compose_config([f"+experiment={experiment}"], with_hydra=True)
    encodings, tasks, seeds = (swept_values(cfg, key) for key in ("encoding", "data", "seed"))
    assert set(encodings) <= set(encoding_names()) and len(set(encodings)) == len(encodings)
    count = f"{len(encodings)} encodings x {len(tasks)} tasks x {len(seeds)} seeds = "
    count += f"{len(encodings) * len(tasks) * len(seeds)} jobs"
    assert count in (ROOT / "conf" / "experiment" / f"{experiment}.yaml").read_text()
    for page in pages:
        assert count.replace(" x ", " × ") in (ROOT / "docs" / page).read_text(), page
    return encodings, tasks, seeds


@pytest.mark.parametrize(
    "overrides",
    [
        ["+experiment=extrapolation"],
        ["+experiment=extrapolation_text", "data.path=x"],
        ["+experiment=alibi_wt103"],
    ],
)
def test_the_experiment_sweeps_every_registered_encoding(overrides):
    """A new encoding cannot be silently left out of the experiment."""
    cfg = compose_config(overrides, with_hydra=True)
    encodings = swept_values(cfg, "encoding")
    assert sorted(encodings) == encoding_names()
    assert len(encodings) == len(set(encodings))


def test_extrapolation_trains_once_per_seed_0_1_2_and_evaluates_1x_to_32x():
    cfg = compose_config(["+experiment=extrapolation"], with_hydra=True)
    assert swept_values(cfg, "seed") == ["0", "1", "2"]
    assert eval_lengths(cfg) == [cfg.train.seq_len * m for m in (1, 2, 4, 8, 16, 32)]
    assert (cfg.data.name, cfg.model.n_layer, cfg.model.d_model) == ("synthetic", 2, 128)
    validate(compose_config(["+experiment=extrapolation"]))


def test_extrapolation_text_reads_local_text_and_requires_its_path():
    cfg = compose_config(["+experiment=extrapolation_text", "data.path=corpus.txt"])
    assert (cfg.data.name, cfg.data.path, cfg.train.steps) == ("text", "corpus.txt", 600)
    with pytest.raises(PosbenchError, match=r"^data\.path must be set \(data\.path=\.\.\.\)$"):
        validate(compose_config(["+experiment=extrapolation_text"]))


def test_alibi_wt103_is_the_papers_setup_on_wikitext103_with_its_lengths_and_one_seed():
    cfg = compose_config(["+experiment=alibi_wt103"], with_hydra=True)
    assert (cfg.data.name, cfg.data.hub_name, cfg.data.tokenizer) == (
        "wikitext103",
        "wikitext-103-raw-v1",
        "bpe",
    )
    assert cfg.train.seq_len == 512
    assert eval_lengths(cfg) == [512, 1012, 1512, 2512, 5512, 10512, 15512]
    assert cfg.eval.stride is None  # non-overlapping windows, as the paper evaluates
    assert swept_values(cfg, "encoding")[:4] == ["sinusoidal", "rope", "t5", "alibi"]
    assert "seed" not in cfg.hydra.sweeper.params and cfg.seed == 0  # one run each, as the paper
    validate(compose_config(["+experiment=alibi_wt103"]))


def test_alibi_wt103s_model_has_the_papers_shape_and_model_small_is_its_cpu_variant():
    large = compose_config(["+experiment=alibi_wt103"]).model
    assert (large.n_layer, large.d_model, large.n_head, large.d_model * large.mlp_ratio) == (
        16,
        1024,
        8,
        4096,
    )
    small = compose_config(["+experiment=alibi_wt103", "model=small"]).model
    assert (small.n_layer, small.d_model) == (4, 256)


def test_the_large_models_parameter_count_is_the_one_its_config_states():
    from posbench.config import config_dir
    from posbench.model import build_model

    cfg = compose_config(["model=large", "encoding=alibi"])
    stated = (config_dir() / "model" / "large.yaml").read_text()
    with torch.device("meta"):
        with_bpe = build_model(cfg.model, cfg.encoding, vocab_size=8192).num_parameters()
    embedding = 8192 * cfg.model.d_model
    assert f"{with_bpe / 1e6:.0f}M parameters" in stated
    assert f"{(with_bpe - embedding) / 1e6:.0f}M" in stated


def test_command_line_choices_override_the_experiment():
    cfg = compose_config(["+experiment=extrapolation", "model=small", "train.steps=7"])
    assert (cfg.model.n_layer, cfg.train.steps) == (4, 7)


def test_the_slurm_launcher_composes_with_its_cluster_options():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install .[launchers]")
    cfg = compose_config(
        [
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=1",
        ],
        with_hydra=True,
    )
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert (cfg.hydra.launcher.partition, cfg.hydra.launcher.gpus_per_node) == ("gpu", 1)


def test_run_and_sweep_directories_are_claimed_uniquely():
    cfg = compose_config(["+experiment=extrapolation"], with_hydra=True)
    for key in ("run", "sweep"):
        assert cfg.hydra[key]._get_node("dir")._value().startswith("${unique_dir:")


def test_a_sweep_is_prechecked_with_the_experiments_values_the_command_line_winning():
    overrides = ["+experiment=extrapolation", "seed=5", "encoding=rope,none"]
    candidates = expand_sweeps(sweep_overrides(overrides))
    assert sorted(sorted(c) for c in candidates) == [
        ["+experiment=extrapolation", "encoding=none", "seed=5"],
        ["+experiment=extrapolation", "encoding=rope", "seed=5"],
    ]


def test_validating_a_config_with_its_hydra_node_claims_no_directory(tmp_path, monkeypatch):
    register_output_dir_resolvers()
    monkeypatch.chdir(tmp_path)
    validate(compose_config(["+experiment=extrapolation"], with_hydra=True))
    assert list(tmp_path.iterdir()) == []


def test_the_retrieval_experiment_sweeps_its_encodings_and_window_tasks_as_its_docs_count():
    """A representative set of registered encodings (every one does not fit its CPU budget)
    over the window tasks a CPU budget learns, seeds 0, 1, 2."""
    pages = ("diagnostics.md", "experiments.md", "results.md")
    _, tasks, seeds = swept_as_stated("retrieval", pages)
    assert set(tasks) <= set(WINDOW_TASKS) and len(set(tasks)) == len(tasks)
    assert seeds == ["0", "1", "2"]
    for task in tasks:
        validate(compose_config(["+experiment=retrieval", f"data={task}"]))


def test_the_algorithmic_experiment_sweeps_every_encoding_and_algorithmic_task_over_three_seeds():
    cfg = compose_config(["+experiment=algorithmic"], with_hydra=True)
    assert sorted(swept_values(cfg, "encoding")) == encoding_names()
    assert sorted(swept_values(cfg, "data")) == sorted(ALGORITHMIC_TASKS)
    assert swept_values(cfg, "seed") == ["0", "1", "2"]
    for task in ALGORITHMIC_TASKS:
        validate(compose_config(["+experiment=algorithmic", f"data={task}"]))
    randomized = ["+experiment=algorithmic", "data=parity_check", "train.random_positions=2048"]
    validate(compose_config(randomized))


def test_a_sweep_takes_values_of_the_groups_the_experiment_sweeps():
    """``data.val_examples`` exists only once the sweep has chosen a task for ``data``."""
    overrides = ["+experiment=retrieval", "encoding=rope", "seed=0", "data.val_examples=4"]
    candidates = expand_sweeps(sweep_overrides(overrides))
    assert sorted(c[-1] for c in candidates) == ["data=copy", "data=passkey"]
    for candidate in candidates:
        assert compose_config(candidate).data.val_examples == 4


RUOSS_TASKS = sorted(
    name for name, task in ALGORITHMIC_TASKS.items() if not issubclass(task, KazemnejadTask)
)
RECIPE_KEYS = ("lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip")


def test_ruoss2023_is_the_references_recipe_on_their_15_tasks():
    cfg = compose_config(["+experiment=ruoss2023"], with_hydra=True)
    assert len(RUOSS_TASKS) == 15 and sorted(swept_values(cfg, "data")) == RUOSS_TASKS
    assert swept_values(cfg, "encoding") == ["none", "sinusoidal", "rope", "alibi", "learned"]
    assert swept_values(cfg, "seed") == ["0", "1", "2"]
    model, train, data = cfg.model, cfg.train, cfg.data
    assert (model.n_layer, model.d_model, model.n_head, model.mlp_ratio) == (5, 64, 8, 4)
    assert (model.dropout, model.norm_position, model.activation) == (0.1, "post", "relu")
    assert (train.steps, train.batch_size, train.grad_clip, train.weight_decay) == (
        10000,
        128,
        1.0,
        0.0,
    )
    assert {lr_at(step, train) for step in (0, 1, 5000, 9999)} == {1e-3}  # constant
    assert (data.batch_lengths, list(data.train_lengths), data.curriculum) == (
        BatchLengths.same,
        [1, 40],
        Curriculum.uniform,
    )
    assert data.val_examples == 512 and eval_lengths(cfg)[8:] == list(range(41, 501))
    for task in RUOSS_TASKS:
        validate(compose_config(["+experiment=ruoss2023", f"data={task}"]))
    randomized = ["+experiment=ruoss2023", "encoding=learned", "train.random_positions=2048"]
    validate(compose_config(randomized))


def test_ruoss2023_cpu_sweeps_each_row_of_their_table_once_on_some_of_their_tasks():
    """README's algorithmic table: their answers at placeholders, read both ways, their model's
    shape; each row of their Table 1 that posbench has once (NoPE has no positions to
    randomize), each a valid config on each task."""
    cpu = compose_config(["+experiment=ruoss2023_cpu"], with_hydra=True)
    full = compose_config(["+experiment=ruoss2023"])
    assert not cpu.model.causal and cpu.model.n_layer == full.model.n_layer
    assert cpu.train.steps * cpu.train.batch_size < full.train.steps * full.train.batch_size
    tasks = swept_values(cpu, "data")
    assert set(tasks) <= set(RUOSS_TASKS)
    rows = []
    for variant in swept_values(cpu, "+ruoss2023_encoding"):
        for task in tasks:
            cfg = compose_config(
                ["+experiment=ruoss2023_cpu", f"data={task}", f"+ruoss2023_encoding={variant}"]
            )
            validate(cfg)
            assert cfg.data.answer_mode.value == "placeholders"
        rows.append((cfg.encoding.name, cfg.train.random_positions))
    assert len(set(rows)) == len(rows) and ("none", 2048) not in rows
    assert {name for name, _ in rows} == {"none", "sinusoidal", "rope", "alibi"}
    assert {name for name, positions in rows if positions == 2048} == {
        "sinusoidal",
        "rope",
        "alibi",
    }


def test_the_ruler_experiment_sweeps_its_encodings_over_ruler_tasks_as_its_docs_count():
    """A representative set of registered encodings over RULER-style tasks that fit the
    training window."""
    _, tasks, _ = swept_as_stated("ruler", ("ruler.md", "experiments.md"))
    assert {compose_config([f"data={task}"]).data.source for task in tasks} <= set(RULER_TASKS)
    for task in tasks:  # every prompt fits the training window
        validate(compose_config(["+experiment=ruler", f"data={task}"]))


def test_drope_sweeps_its_baselines_and_rope_phase_and_recalibrates_for_the_papers_share():
    cfg = compose_config(["+experiment=drope"], with_hydra=True)
    methods = swept_values(cfg, "drope_method")
    assert sorted(methods) == sorted(set(group_options("drope_method")) - {"drope"})
    assert swept_values(cfg, "seed") == ["0", "1", "2"]
    rope, drope, swa = (
        compose_config(["+experiment=drope", f"drope_method={method}"])
        for method in ("drope_rope", "drope", "rnope_swa")
    )
    # The recalibration starts from the RoPE phase of its seed, in the same sweep directory.
    init_from = drope.train._get_node("init_from")._value()
    assert init_from == "${sweep_dir:}/drope_rope_seed${seed}"
    drope.train.init_from = "parent"
    for run in (rope, drope, swa):
        validate(run)
        assert run.train.seq_len == cfg.train.seq_len  # like with like
    # QK-norm is added at the switch, as the reference adds it to a model trained without it.
    assert (rope.model.qk_norm, swa.model.qk_norm, drope.model.qk_norm) == (False, False, True)
    rope, drope = with_steps_share(rope), with_steps_share(drope)
    assert rope.train.steps + drope.train.steps == cfg.train.steps
    assert drope.train.steps / cfg.train.steps == pytest.approx(0.12)
    assert (rope.encoding.name, drope.encoding.name, drope.eval.temperature) == (
        "rope",
        "none",
        "fit",
    )
    assert (swa.encoding.layers, swa.encoding.window) == (["rope", "none"], 64)


def test_remaps_sweeps_pose_and_both_remaps_on_rope_over_three_seeds():
    cfg = compose_config(["+experiment=remaps"], with_hydra=True)
    assert cfg.encoding.name == "rope"
    assert swept_values(cfg, "train.positions") == ["consecutive", "pose"]
    assert swept_values(cfg, "eval.position_remap") == ["none", "self_extend", "string"]
    assert swept_values(cfg, "seed") == ["0", "1", "2"]
    validate(compose_config(["+experiment=remaps", "train.positions=pose"]))


def test_a_swept_key_of_a_swept_group_is_prechecked_with_each_of_the_groups_options():
    """``data.val_examples`` is a key of the tasks the sweep chooses, not of the default data."""
    overrides = ["data=flip_flop,variable_tracking", "data.val_examples=50,60"]
    candidates = expand_sweeps(sweep_overrides(overrides))
    assert sorted(c for c in candidates if "data.val_examples=50" in c) == [
        ["data=flip_flop", "data.val_examples=50"],
        ["data=variable_tracking", "data.val_examples=50"],
    ]


def test_a_fixed_key_of_a_swept_group_is_prechecked_with_its_options_beside_other_swept_keys():
    """``encoding.dape`` is a key of alibi, kerple and fire, not of the default rope: the
    experiment's swept seeds are checked with one of the swept encodings, not with rope."""
    overrides = ["+experiment=extrapolation", "encoding=alibi,kerple,fire", "encoding.dape=true"]
    candidates = expand_sweeps(sweep_overrides(overrides))
    assert {c for candidate in candidates for c in candidate if c.startswith("encoding=")} == {
        "encoding=alibi",
        "encoding=kerple",
        "encoding=fire",
    }
    assert all(compose_config(candidate).encoding.dape for candidate in candidates)


def test_hydra_runs_each_job_of_a_swept_group_with_a_key_the_default_option_lacks(
    tmp_path, monkeypatch
):
    """Hydra composes a sweep's first config with the default ``data=synthetic``, which has no
    ``val_examples``; each job has it, set to the command line's value."""
    jobs = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(train_command.FORCE_ADDED_ENV, raising=False)  # set by the sweep
    monkeypatch.setattr(  # each job's config, and the command its run records
        train_command, "train_job", lambda cfg: jobs.append((cfg, train_command.job_command()))
    )
    before = list(logging.root.handlers)  # each job logs to its train.log: give them back
    monkeypatch.setattr(logging.root, "handlers", list(before))
    sweep = ["data=flip_flop,variable_tracking", "train.seq_len=256", "data.val_examples=50"]
    cli.main(["train", "-m", *sweep])
    for handler in set(logging.root.handlers) - set(before):
        handler.close()
    assert [(cfg.data.source, cfg.data.val_examples) for cfg, _ in jobs] == [
        ("flip_flop", 50),
        ("variable_tracking", 50),
    ]
    typed = (
        "posbench train -m data=flip_flop,variable_tracking train.seq_len=256 data.val_examples=50"
    )
    assert {command for _, command in jobs} == {typed}  # not Hydra's ++data.val_examples=50


def test_a_key_of_a_group_an_experiment_sweeps_is_force_added_for_hydra():
    overrides = ["+experiment=retrieval", "seed=0", "data.val_examples=50", "train.steps=5"]
    assert force_added_in_sweeps(overrides) == {"data.val_examples=50": "++data.val_examples=50"}


def test_drope_methods_win_over_the_experiment_in_a_sweeps_order_of_overrides():
    """A sweep's job gets its swept groups before +experiment (Hydra's `#0 : drope_method=drope
    seed=0 +experiment=drope`): the method's keys must still override the experiment's, as the
    recalibration's 7-step warm-up against the experiment's 60 (they did not when the method was
    a +group: the experiment's steps and warm-up won, and DroPE trained 600 + 600 steps)."""
    for order in (
        ["drope_method=drope", "seed=0", "+experiment=drope"],
        ["+experiment=drope", "drope_method=drope", "seed=0"],
    ):
        drope = with_steps_share(compose_config(order))
        assert (drope.train.steps, drope.train.warmup_steps, drope.train.lr) == (72, 7, 1e-3)
        assert drope.model.qk_norm and drope.encoding.name == "none"
    rope = with_steps_share(compose_config(["drope_method=drope_rope", "+experiment=drope"]))
    assert (rope.train.steps, rope.train.warmup_steps, rope.encoding.name) == (528, 60, "rope")


@pytest.mark.parametrize("steps", [100, 1000])
def test_drope_phases_keep_their_share_of_a_train_steps_budget_from_the_command_line(steps):
    overrides = ["+experiment=drope", f"train.steps={steps}"]
    rope, drope, nope = (
        with_steps_share(compose_config([*overrides, f"drope_method={m}"]))
        for m in ("drope_rope", "drope", "nope")
    )
    assert (rope.train.steps, drope.train.steps, nope.train.steps) == (
        round(0.88 * steps),
        round(0.12 * steps),
        steps,
    )
    assert rope.train.steps_share == drope.train.steps_share == 1  # the saved config: what ran
