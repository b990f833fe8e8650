"""Config composition: every group option composes, typos and bad values fail early."""

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from posbench.commands.overrides import compose_group_options, group_options
from posbench.config import (
    compose_config,
    config_dir,
    eval_lengths,
    flat_config,
    validate,
)
from posbench.encodings import encoding_config, encoding_names
from posbench.errors import PosbenchError
from posbench.model.args import ModelArgs
from posbench.model.config import ModelConfig


def keys_under(cfg, group: str):
    return flat_config(cfg[group], resolve=False).keys()


# Each test below also checks that the option composed alone (compose_group_options, which a
# mistyped key's hint reads) has the keys under its group that the whole config has with it.


@pytest.mark.parametrize("encoding", encoding_names())
def test_every_registered_encoding_has_a_config_file_that_composes(encoding):
    cfg = compose_config([f"encoding={encoding}"])
    assert cfg.encoding.name == encoding
    alone = compose_group_options("encoding", [encoding])[encoding]
    assert keys_under(alone, "encoding") == keys_under(cfg, "encoding")


@pytest.mark.parametrize("group", ["model", "data", "logger"])
def test_every_option_of_a_group_composes(group):
    options = group_options(group)
    alone = compose_group_options(group, options)
    for option in options:
        path = ["data.path=x"] if (group, option) == ("data", "text") else []
        cfg = compose_config([f"{group}={option}", *path])
        assert keys_under(alone[option], group) == keys_under(cfg, group), option


def test_the_model_groups_schema_types_every_key_and_builds_the_models_args():
    """conf/model/*.yaml set only ModelConfig's keys (typed, so a typo fails at compose time),
    and every one of them reaches ModelArgs, which the run stores beside its weights."""
    schema_keys = set(ModelConfig.__dataclass_fields__)
    for path in sorted((config_dir() / "model").glob("*.yaml")):
        model = compose_config([f"model={path.stem}"]).model
        assert set(model) == schema_keys
    assert schema_keys <= set(ModelArgs.__dataclass_fields__)


def test_defaults_are_rope_tiny_synthetic():
    cfg = compose_config()
    assert (cfg.encoding.name, cfg.data.name) == ("rope", "synthetic")
    assert cfg.model.n_layer == 2


def test_learned_table_defaults_to_the_training_length():
    cfg = compose_config(["encoding=learned", "train.seq_len=96"])
    assert cfg.encoding.max_length == 96


def test_rope_scaling_extends_from_the_training_length_and_is_off_by_default():
    scaling = encoding_config(compose_config(["train.seq_len=96"]).encoding).scaling
    assert (scaling.method, scaling.factor, scaling.original_length) == ("none", None, 96)


def test_default_eval_lengths_are_1x_to_16x_the_training_length():
    assert eval_lengths(compose_config(["train.seq_len=64"])) == [64, 128, 256, 512, 1024]
    assert eval_lengths(compose_config(["eval.lengths=[10,20]"])) == [10, 20]


def test_a_misspelt_key_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException):
        compose_config(["train.stpes=3"])


def test_a_wrongly_typed_value_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException):
        compose_config(["train.steps=many"])
    with pytest.raises(ConfigCompositionException):
        compose_config(["encoding.base=big"])


def test_an_unknown_encoding_fails_at_compose_time():
    with pytest.raises(MissingConfigException):
        compose_config(["encoding=nope"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.steps=0", "train.steps must be positive"),
        ("train.lr=-1", "train.lr must be positive"),
        ("train.batch_size=-2", "train.batch_size must be positive"),
        ("eval.lengths=[128,0]", "eval.lengths must be positive"),
        ("eval.stride=1000", "eval.stride"),
        ("model.dropout=1.5", "model.dropout"),
    ],
)
def test_out_of_range_values_are_one_line_errors(override, message):
    with pytest.raises(PosbenchError, match=message) as err:
        validate(compose_config([override]))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("task_lengths", ["everything", "[50,abc]", "50", "[50,true]"])
def test_task_lengths_other_than_a_list_reference_or_null_are_a_one_line_error(task_lengths):
    cfg = compose_config(["data=parity_check", f"eval.task_lengths={task_lengths}"])
    with pytest.raises(
        PosbenchError, match=r"^eval\.task_lengths must be a list of problem"
    ) as err:
        validate(cfg)
    assert "eval.task_lengths=reference" in str(err.value) and "\n" not in str(err.value)


def test_reference_task_lengths_validate_and_are_refused_for_a_corpus():
    validate(compose_config(["data=parity_check", "eval.task_lengths=reference"]))
    with pytest.raises(PosbenchError, match=r"eval\.task_lengths are problem lengths"):
        validate(compose_config(["eval.task_lengths=reference"]))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["encoding=alibi"], {"name": "alibi"}),
        (["encoding=t5"], {"name": "t5", "num_buckets": 32, "max_distance": 128}),
        (["encoding=t5", "encoding.num_buckets=64"], {"num_buckets": 64, "max_distance": 128}),
        (["encoding=kerple"], {"name": "kerple", "kernel": "log"}),
        (["encoding=kerple", "encoding.kernel=power"], {"kernel": "power"}),
    ],
)
def test_bias_encoding_options_compose_from_overrides(overrides, expected):
    encoding = compose_config(overrides).encoding
    assert {key: encoding[key] for key in expected} == expected
