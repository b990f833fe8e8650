"""Run directories: atomic writes, self-describing weights, safe loading, results merging."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model import Transformer
from posbench.model.args import ModelArgs
from posbench.runs.directory import (
    WEIGHTS_FILE,
    latest_run,
    load_weights,
    prepare_run_dir,
    save_weights,
)
from posbench.runs.results import merge_eval_records
from posbench.system.atomic import atomic_path, atomic_write


def small_model(encoding: str = "learned", **options) -> Transformer:
    torch.manual_seed(0)
    args = ModelArgs(n_layer=1, n_head=2, d_model=16)
    return Transformer(args, build_encoding({"name": encoding, **options}, 16, 2))


def record(length, stride=None, ppl=1.0, **scaling):
    return {
        "length": length,
        "stride": stride,
        "ppl": ppl,
        "bits_per_byte": 0.0,
        "tokens": 1,
        "status": "ok",
        "reason": None,
        **scaling,
    }


def test_atomic_write_replaces_content_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "results.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["results.json"]


def test_failed_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    atomic_write(target, b"old")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["results.json"]


def test_weights_round_trip_with_the_model_rebuilt_from_the_file_alone(tmp_path):
    model = small_model("learned", max_length=24)
    save_weights(tmp_path, model)
    loaded = load_weights(tmp_path / WEIGHTS_FILE)
    assert loaded.args == model.args
    assert loaded.max_length == 24
    tokens = torch.randint(0, 256, (2, 24))
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
    assert loaded.lm_head.weight is loaded.token_embedding.weight


def test_missing_weights_is_a_clear_error(tmp_path):
    with pytest.raises(PosbenchError, match="posbench train"):
        load_weights(tmp_path / WEIGHTS_FILE)


def test_truncated_weights_file_is_a_one_line_error_naming_the_file(tmp_path):
    save_weights(tmp_path, small_model())
    path = tmp_path / WEIGHTS_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(PosbenchError, match=WEIGHTS_FILE) as err:
        load_weights(path)
    assert "\n" not in str(err.value)


def test_foreign_safetensors_file_is_rejected(tmp_path):
    path = tmp_path / WEIGHTS_FILE
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(PosbenchError, match="not a posbench weights file"):
        load_weights(path)


def test_weights_that_do_not_match_the_described_model_are_rejected(tmp_path):
    save_weights(tmp_path, small_model())
    other = tmp_path / "other"
    other.mkdir()
    bigger = Transformer(
        ModelArgs(n_layer=1, n_head=2, d_model=32), build_encoding({"name": "none"}, 32, 2)
    )
    save_weights(other, bigger)
    # Splice the header of one file onto the other's tensors: description and shapes disagree.
    header_len = int.from_bytes((tmp_path / WEIGHTS_FILE).read_bytes()[:8], "little")
    header = json.loads((tmp_path / WEIGHTS_FILE).read_bytes()[8 : 8 + header_len])
    other_bytes = (other / WEIGHTS_FILE).read_bytes()
    other_header_len = int.from_bytes(other_bytes[:8], "little")
    other_header = json.loads(other_bytes[8 : 8 + other_header_len])
    other_header["__metadata__"] = header["__metadata__"]
    new_header = json.dumps(other_header).encode()
    (other / WEIGHTS_FILE).write_bytes(
        len(new_header).to_bytes(8, "little") + new_header + other_bytes[8 + other_header_len :]
    )
    with pytest.raises(PosbenchError, match="does not match"):
        load_weights(other / WEIGHTS_FILE)


def test_merging_eval_records_keeps_other_lengths_and_replaces_the_same_measurement():
    results = {"encoding": "rope", "eval": [record(128, ppl=2.0), record(256, ppl=3.0)]}
    merged = merge_eval_records(
        results, [record(256, ppl=4.0), record(256, stride=64), record(512)]
    )
    assert [(r["length"], r["stride"], r["ppl"]) for r in merged["eval"]] == [
        (128, None, 2.0),
        (256, None, 4.0),
        (256, 64, 1.0),
        (512, None, 1.0),
    ]
    assert merged["encoding"] == "rope"


def test_scaled_records_sit_beside_plain_ones_and_records_without_scaling_are_plain():
    old = record(256, ppl=3.0)  # written before the scaling field existed
    results = {"eval": [old, record(512, ppl=5.0, scaling="yarn")]}
    merged = merge_eval_records(
        results,
        [
            record(256, ppl=2.5, scaling="yarn"),
            record(512, ppl=4.0, scaling="yarn"),
            record(256, ppl=2.9, scaling="none"),
        ],
    )
    assert [(r["length"], r.get("scaling"), r["ppl"]) for r in merged["eval"]] == [
        (256, "none", 2.9),  # replaces the old record without the field
        (256, "yarn", 2.5),
        (512, "yarn", 4.0),
    ]


def test_records_of_the_same_method_at_different_factors_sit_side_by_side():
    per_length = record(512, ppl=5.0, scaling="yarn", scaling_factor=4.0)
    results = {"eval": [per_length]}
    by_factor = [
        record(512, ppl=4.0, scaling="yarn", scaling_factor=2.0, scaling_factor_setting=2.0),
        record(512, ppl=4.5, scaling="yarn", scaling_factor=8.0, scaling_factor_setting=8.0),
    ]
    merged = merge_eval_records(results, by_factor)
    assert [r["ppl"] for r in merged["eval"]] == [5.0, 4.0, 4.5]  # from each length first
    again = record(512, ppl=3.9, scaling="yarn", scaling_factor=2.0, scaling_factor_setting=2.0)
    remeasured = merge_eval_records(merged, [again])
    assert [r["ppl"] for r in remeasured["eval"]] == [5.0, 3.9, 4.5]  # the same factor replaced


def test_encoding_overrides_change_the_encoding_config_not_the_weights(tmp_path):
    model = small_model("rope")
    save_weights(tmp_path, model)
    overrides = {"scaling": {"method": "yarn", "factor": 4.0, "original_length": 16}}
    loaded = load_weights(tmp_path / WEIGHTS_FILE, encoding_overrides=overrides)
    assert loaded.encoding.config.scaling.method == "yarn"
    assert loaded.encoding.config.scaling.factor == 4.0
    assert loaded.encoding.config.scaling.beta_fast == 32.0  # the rest keeps its value
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor)


def test_scaling_overrides_on_a_non_rope_run_are_a_one_line_error(tmp_path):
    save_weights(tmp_path, small_model("learned", max_length=8))
    with pytest.raises(PosbenchError, match="scaling") as info:
        load_weights(tmp_path / WEIGHTS_FILE, encoding_overrides={"scaling": {"method": "yarn"}})
    assert "\n" not in str(info.value)


def test_latest_run_is_the_newest_trained_one(tmp_path):
    for i, name in enumerate(["a", "b", "c"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / WEIGHTS_FILE).write_bytes(b"x")
        os.utime(tmp_path / name / WEIGHTS_FILE, (1000 + i * (1 if name != "c" else -5),) * 2)
    assert latest_run(tmp_path).name == "b"


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(PosbenchError, match="posbench train"):
        latest_run(tmp_path / "outputs")


def test_atomic_write_creates_files_with_the_usual_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        atomic_write(tmp_path / "results.json", b"{}")
    finally:
        os.umask(mask)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o644


def test_preparing_a_run_dir_removes_a_killed_writers_temp_file_and_nothing_else(tmp_path):
    class Killed(Exception):
        pass

    with pytest.raises(Killed), atomic_path(tmp_path / "results.json") as tmp:
        tmp.write_text("half")
        stale = tmp_path / f".checkpoint.pt.x{tmp.suffix}"
        stale.write_text("half")  # what a kill -9 mid-write leaves (no except clause runs)
        raise Killed
    (tmp_path / f".report.x{stale.suffix}").mkdir()  # a temp *directory* is not ours to remove
    prepare_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".report.x{stale.suffix}"]
