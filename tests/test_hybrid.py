"""Specification of the hybrid encoding (posbench/encodings/hybrid.py): a schedule of encodings
over the layers computes what each layer's encoding computes, one of them everywhere what that
encoding computes; windows go to the layers that encode positions."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from posbench.config import compose_config, config_dir
from posbench.encodings.hybrid import layer_names
from posbench.errors import PosbenchError
from posbench.model import build_model

SHAPE = {"n_layer": 4, "n_head": 2, "d_model": 16}


def hybrid(layers: list[str], window: int | None = None, **encodings) -> dict:
    return {"name": "hybrid", "layers": layers, "window": window, "encodings": encodings}


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter away from its initial value, so shared or copied weights are visible."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.uniform_(-0.5, 0.5)
    return model.eval()


@pytest.mark.parametrize(
    "encoding",
    [
        {"name": "rope"},
        {"name": "alibi"},
        {"name": "t5"},
        {"name": "fire", "threshold": 8.0},  # 24 tokens: past its threshold
        {"name": "fire", "threshold": 8.0, "per_layer": True},
    ],
    ids=lambda e: e["name"] + "+per_layer" * ("per_layer" in e),
)
def test_a_hybrid_of_one_encoding_everywhere_computes_what_that_encoding_computes(encoding):
    name = encoding["name"]
    plain = randomised(build_model(SHAPE, encoding))
    mixed = build_model(SHAPE, hybrid([name], **{name: encoding}))
    # The plain model's encoding weights are the hybrid's member's, under its name.
    renamed = {
        key.replace("encoding.", f"encoding.members.{name}.", 1): value
        for key, value in plain.state_dict().items()
    }
    mixed.load_state_dict(renamed)
    tokens = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(mixed.eval()(tokens), plain(tokens), rtol=0, atol=1e-6)


def test_the_schedule_repeats_over_the_layers_and_one_instance_serves_a_name():
    model = build_model({**SHAPE, "n_layer": 5}, hybrid(["rope", "none"]))
    names = [e.config.name for e in model.layer_encodings]
    assert names == ["rope", "none", "rope", "none", "rope"]
    assert model.layer_encodings[0] is model.layer_encodings[2] is model.layer_encodings[4]


def test_each_layer_attends_with_its_own_encoding():
    mixed = randomised(build_model(SHAPE, hybrid(["alibi", "rope"])))
    rope = build_model(SHAPE, {"name": "rope"})
    alibi = build_model(SHAPE, {"name": "alibi"})
    tokens = torch.randint(0, 256, (2, 24))
    # Layer by layer: a hybrid block computes what the block of the plain model of its layer's
    # encoding computes with the same weights.
    x = mixed.token_embedding(tokens)
    positions = torch.arange(24)
    with torch.no_grad():
        for i, block in enumerate(mixed.blocks):
            plain = alibi if i % 2 == 0 else rope
            got = block(x, positions, mixed.layer_encodings[i], None)
            expected = block(x, positions, plain.encoding, None)
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
            x = got


def test_a_per_layer_member_gets_an_instance_of_its_own_in_each_of_its_layers():
    model = build_model(SHAPE, hybrid(["fire", "none"], fire={"name": "fire", "per_layer": True}))
    fires = [e for e in model.layer_encodings if e.config.name == "fire"]
    assert len(fires) == 2 and fires[0] is not fires[1]
    keys = model.state_dict().keys()
    assert any(k.startswith("encoding.members.fire.") for k in keys)
    assert any(k.startswith("deeper_encodings.0.") for k in keys)  # the second FIRE's own


def test_the_window_goes_to_every_layer_but_the_ones_without_positions():
    model = build_model(SHAPE, hybrid(["rope", "alibi", "none"], window=16))
    windows = {e.config.name: e.window for e in model.layer_encodings}
    assert windows == {"rope": 16, "alibi": 16, "none": None}


def test_a_window_as_long_as_the_input_changes_nothing():
    windowed = randomised(build_model(SHAPE, hybrid(["rope", "none"], window=24)))
    full = build_model(SHAPE, hybrid(["rope", "none"]))
    full.load_state_dict(windowed.state_dict())
    tokens = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(windowed(tokens), full.eval()(tokens), rtol=0, atol=0)


def test_a_shorter_window_changes_the_rope_layers_outputs_past_it():
    windowed = randomised(build_model(SHAPE, hybrid(["rope", "none"], window=8)))
    full = build_model(SHAPE, hybrid(["rope", "none"]))
    full.load_state_dict(windowed.state_dict())
    tokens = torch.randint(0, 256, (1, 24))
    with torch.no_grad():
        a, b = windowed(tokens), full.eval()(tokens)
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=1e-6)  # all in view: equal
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-3


def test_the_rope_layers_scaling_is_what_evaluation_records():
    scaling = {"method": "yarn", "factor": 4.0, "original_length": 8}
    model = build_model(SHAPE, hybrid(["rope", "none"], rope={"name": "rope", "scaling": scaling}))
    assert model.encoding.eval().scaling_record(32)["scaling"] == "yarn"


def test_the_config_composes_every_encoding_a_layer_can_have_with_its_own_options():
    cfg = compose_config(["encoding=hybrid", "encoding.encodings.rope.base=500000"])
    assert sorted(cfg.encoding.encodings) == layer_names()
    model = build_model(cfg.model, cfg.encoding)
    assert model.encoding.members["rope"].config.base == 500000
    # The members' options follow the run's settings as their own configs do.
    assert cfg.encoding.encodings.fire.threshold == cfg.train.seq_len
    text = (config_dir() / "encoding" / "hybrid.yaml").read_text()
    assert OmegaConf.create(text).layers == ["rope", "none"]


@pytest.mark.parametrize(
    ("encoding", "message"),
    [
        (hybrid([]), "encoding.layers is empty"),
        (hybrid(["learned", "rope"]), "'learned' cannot be a hybrid layer"),
        (hybrid(["rope", "bogus"]), "'bogus' cannot be a hybrid layer; choose from alibi"),
        (hybrid(["rope"], window=0), "encoding.window must be at least 1"),
        (hybrid(["rope"], rope={"name": "alibi"}), "encoding.encodings.rope configures 'alibi'"),
    ],
)
def test_a_bad_schedule_is_one_line_that_says_what_to_do(encoding, message):
    with pytest.raises(PosbenchError, match=message):
        build_model(SHAPE, encoding)
