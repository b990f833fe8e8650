"""train.init_from: a run that starts from another run's weights, with RoPE scaling switched
on while it trains (how position interpolation and YaRN are meant to be used)."""

import pytest
import torch
from conftest import TINY, train_module
from omegaconf import OmegaConf
from safetensors.torch import load_file

from posbench.config import compose_config
from posbench.errors import PosbenchError
from posbench.model import build_model
from posbench.runs.directory import WEIGHTS_FILE, load_run, save_config, save_weights
from posbench.training.finetune import fine_tune_config
from posbench.training.train import train

PARENT = [*TINY, "train.steps=10", "eval.lengths=[16]", "eval.max_tokens=1024"]


@pytest.fixture(scope="module")
def parent(tmp_path_factory, cache_dir):
    """A tiny finished rope run, trained at 16 tokens."""
    run_dir = tmp_path_factory.mktemp("parent")
    train(compose_config([*PARENT, f"data.cache_dir={cache_dir}"]), run_dir)
    return run_dir


def child_overrides(parent, cache_dir, *extra):
    return [
        *PARENT,
        f"data.cache_dir={cache_dir}",
        f"train.init_from={parent}",
        "train.seq_len=32",
        "train.steps=3",
        "eval.lengths=[32]",
        *extra,
    ]


YARN = ["encoding.scaling.method=yarn", "encoding.scaling.factor=2"]


def test_a_child_run_starts_from_the_parents_weights_and_records_its_parent(
    parent, cache_dir, tmp_path, monkeypatch
):
    initial = {}
    train_steps = train_module.train_steps

    def capture(model, *args, **kwargs):
        initial.update({k: v.clone() for k, v in model.state_dict().items()})
        return train_steps(model, *args, **kwargs)

    monkeypatch.setattr(train_module, "train_steps", capture)
    results = train(compose_config(child_overrides(parent, cache_dir, *YARN)), tmp_path)
    expected = load_file(parent / WEIGHTS_FILE)
    assert initial.keys() >= expected.keys()
    assert all(torch.equal(initial[k], expected[k]) for k in expected)
    assert results["init_from"] == str(parent.resolve())
    trained = load_file(tmp_path / WEIGHTS_FILE)
    assert any(not torch.equal(trained[k], expected[k]) for k in expected)  # it trained on


def test_the_child_scales_while_training_from_the_parents_training_length(parent, cache_dir):
    cfg = fine_tune_config(compose_config(child_overrides(parent, cache_dir, *YARN)))
    assert cfg.encoding.scaling.original_length == 16  # the parent's seq_len, not 32
    assert cfg.encoding.scaling.in_training is True
    model, _ = load_run(parent, encoding_overrides=dict(cfg.encoding))
    model.train()
    assert model.encoding.scaling_record(32)["scaling"] == "yarn"


def test_an_explicit_original_length_is_kept(parent, cache_dir):
    overrides = child_overrides(parent, cache_dir, *YARN, "encoding.scaling.original_length=24")
    assert fine_tune_config(compose_config(overrides)).encoding.scaling.original_length == 24


def test_a_run_from_scratch_keeps_training_unscaled(cache_dir):
    cfg = fine_tune_config(compose_config([*PARENT, *YARN]))
    assert cfg.encoding.scaling.in_training is False


def test_a_missing_parent_is_a_one_line_error(cache_dir, tmp_path):
    overrides = child_overrides(tmp_path / "nowhere", cache_dir)
    with pytest.raises(PosbenchError, match=r"train\.init_from=.* holds no model\.safetensors"):
        train(compose_config(overrides), tmp_path / "child")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("encoding=alibi", "trained with encoding=rope, not alibi"),
        ("encoding.base=500", r"encoding\.base=10000\.0, not 500\.0"),
        ("model.d_model=64", r"model\.d_model=32, not 64"),
        ("model.qk_norm=true", r"model\.qk_norm=False, not True; .* may add model\.qk_norm"),
    ],
)
def test_an_incompatible_parent_is_a_one_line_error(parent, cache_dir, tmp_path, override, message):
    with pytest.raises(PosbenchError, match=message) as info:
        train(compose_config(child_overrides(parent, cache_dir, override)), tmp_path / "child")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "child").exists()  # refused before the run writes anything


def test_an_encoding_option_newer_than_the_parent_takes_its_default(cache_dir, tmp_path):
    # FIRE runs trained before encoding.per_layer existed have none in their config.yaml.
    overrides = [*PARENT, f"data.cache_dir={cache_dir}", "encoding=fire"]
    cfg = compose_config(overrides)
    save_weights(tmp_path, build_model(cfg.model, cfg.encoding))
    saved = OmegaConf.to_container(cfg, resolve=True)
    del saved["encoding"]["per_layer"]
    save_config(tmp_path, OmegaConf.create(saved))
    child = fine_tune_config(compose_config([*overrides, f"train.init_from={tmp_path}"]))
    assert child.encoding.per_layer is False


def saved_parent(tmp_path, cache_dir, *overrides):
    """A parent run's weights and config as training writes them, without training it."""
    cfg = compose_config([*PARENT, f"data.cache_dir={cache_dir}", *overrides])
    save_weights(tmp_path, build_model(cfg.model, cfg.encoding))
    save_config(tmp_path, cfg)
    return tmp_path


def test_dropping_rope_loads_every_weight_and_computes_rope_at_position_zero(parent, cache_dir):
    # DroPE: the child is NoPE with the parent's weights, which is what the parent computes
    # with every query and key rotated by position 0 (the identity): the reference's own way
    # of dropping RoPE (cos = 1, sin = 0 in SakanaAI/DroPE's custom_models/attention.py).
    cfg = fine_tune_config(compose_config(child_overrides(parent, cache_dir, "encoding=none")))
    child = train_module.initial_model(cfg, 256, resuming=False)
    rope_parent, _ = load_run(parent)
    expected = load_file(parent / WEIGHTS_FILE)
    assert child.state_dict().keys() >= expected.keys()  # the tied embedding is saved once
    assert all(torch.equal(child.state_dict()[k], expected[k]) for k in expected)
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    ours = child(tokens)
    theirs = rope_parent(tokens, positions=torch.zeros(24, dtype=torch.long))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, rope_parent(tokens), atol=1e-3)  # positions were dropped
    ours.square().sum().backward()
    theirs.square().sum().backward()
    grads = dict(rope_parent.named_parameters())
    for name, weight in child.named_parameters():
        torch.testing.assert_close(weight.grad, grads[name].grad, rtol=1e-4, atol=1e-6)


def test_a_dropped_encoding_trains_on_from_the_parent(parent, cache_dir, tmp_path):
    results = train(compose_config(child_overrides(parent, cache_dir, "encoding=none")), tmp_path)
    assert results["status"] == "ok" and results["init_from"] == str(parent.resolve())


@pytest.mark.parametrize(
    ("parent_overrides", "child", "message"),
    [
        (["encoding=none"], ["encoding=rope"], "trained with encoding=none, not rope; .* drops it"),
        (["encoding=learned"], ["encoding=none"], r"own weights \(table\.weight\)"),
        (
            ["encoding=hybrid", "encoding.window=8"],
            ["encoding=none"],
            "windows of 8 tokens; encoding=none would widen attention",
        ),
        # DAPE switched on or off: its network's weights would be new, or dropped
        (["encoding=alibi"], ["encoding=alibi", "encoding.dape=true"], "dape=False, not True"),
        (["encoding=fire", "encoding.dape=true"], ["encoding=fire"], "dape=True, not False"),
        (["encoding=alibi", "encoding.dape=true"], ["encoding=none"], r"weights \(dape\.down"),
    ],
)
def test_a_switch_that_is_not_dropping_a_weightless_encoding_is_one_line(
    cache_dir, tmp_path, parent_overrides, child, message
):
    saved = saved_parent(tmp_path, cache_dir, *parent_overrides)
    with pytest.raises(PosbenchError, match=message) as info:
        fine_tune_config(compose_config(child_overrides(saved, cache_dir, *child)))
    assert "\n" not in str(info.value)


def test_dropping_rope_may_add_qk_norm_whose_gains_start_at_one(parent, cache_dir):
    # The reference's qk_norm_nope: RMS norms on q and k added at the switch, gains of 1.
    overrides = child_overrides(parent, cache_dir, "encoding=none", "model.qk_norm=true")
    child = train_module.initial_model(fine_tune_config(compose_config(overrides)), 256, False)
    expected = load_file(parent / WEIGHTS_FILE)
    weights = child.state_dict()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    gains = {k for k in weights if ".qk_norm." in k}
    assert gains == weights.keys() - expected.keys() - {"token_embedding.weight"}
    assert gains and all(torch.equal(weights[k], torch.ones_like(weights[k])) for k in gains)
