"""The Python API for notebooks: load_run and evaluate_run, as docs/api.md documents them, and
every posbench path README and docs/ name, importable from where they name it."""

import importlib
import re
import runpy
import shutil
import sys
from pathlib import Path
from types import FunctionType, ModuleType

import pytest
import torch

import posbench
from posbench.config import compose_config
from posbench.runs.results import read_results

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cache_dir):
    from conftest import TINY

    path = tmp_path_factory.mktemp("run")
    posbench.train(
        compose_config(["encoding=sinusoidal", *TINY, f"data.cache_dir={cache_dir}"]),
        path,
    )
    return path


def test_load_run_gives_a_model_that_maps_bytes_to_logits_at_any_length(run_dir):
    model, cfg = posbench.load_run(run_dir)
    assert cfg.encoding.name == "sinusoidal" and cfg.train.seq_len == 16
    assert not model.training
    tokens = torch.tensor([list(b"hello, world")] * 2)
    assert model(tokens).shape == (2, 12, 256)
    assert model(torch.zeros(1, 1000, dtype=torch.long)).shape == (1, 1000, 256)


def test_evaluate_run_returns_the_records_training_wrote(run_dir):
    results = read_results(run_dir)
    assert posbench.evaluate_run(run_dir, [16, 32, 64], device="cpu") == results["eval"]


def test_evaluate_takes_any_model_and_byte_tensor(run_dir):
    model, _ = posbench.load_run(run_dir)
    tokens = torch.tensor(list(b"abcabcabc" * 100), dtype=torch.uint8)
    (record,) = posbench.evaluate(model, tokens, [64])
    assert record["status"] == "ok" and record["tokens"] == len(tokens) - 1


@pytest.mark.parametrize("name", posbench.__all__)
def test_every_public_name_imports_from_posbench_as_the_object_it_names(name):
    namespace = {}
    exec(f"from posbench import {name}", namespace)  # as a notebook imports it
    expected = {"data": ModuleType, "Diverged": type}.get(name, FunctionType)
    assert isinstance(namespace[name], expected)


def documented_paths() -> list[str]:
    """Every dotted path under posbench that README, benchmarks/README.md and docs/ name:
    ``posbench.x.y`` in text and code, ``::: posbench.x.y`` in api.md's reference,
    ``from posbench.x import y`` as ``posbench.x.y``."""
    paths = set()
    for page in PAGES:
        text = page.read_text()
        paths.update(re.findall(r"\bposbench(?:\.[A-Za-z_]\w*)+", text))
        for module, names in re.findall(r"from (posbench[\w.]*) import ([\w, ]+)", text):
            paths.update(f"{module}.{name.strip()}" for name in names.split(","))
    return sorted(paths)


def resolve(path: str) -> object:
    """The module or object a dotted path names: its longest prefix that imports, then
    attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(path)


@pytest.mark.parametrize("path", documented_paths())
def test_every_posbench_path_the_docs_name_imports(path):
    try:
        resolve(path)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"the docs name {path}, which does not import ({err}): update the page")


@pytest.mark.parametrize(
    "path",
    [path for path in documented_paths() if path.rsplit(".", 1)[-1] in posbench.__all__],
)
def test_a_public_name_is_the_object_at_its_documented_place(path):
    assert resolve(path) is getattr(posbench, path.rsplit(".", 1)[-1])


def test_the_model_package_gives_the_decoder_and_its_arguments():
    from posbench.model import ModelArgs, Transformer, build_model
    from posbench.model.args import ModelArgs as args_model_args
    from posbench.model.model import Transformer as model_transformer
    from posbench.model.model import build_model as model_build_model

    assert (ModelArgs, Transformer, build_model) == (
        args_model_args,
        model_transformer,
        model_build_model,
    )


def test_python_m_posbench_is_the_posbench_command(monkeypatch, capsys):
    """`python -m posbench` (as torchrun starts it) runs posbench's main with its arguments."""
    monkeypatch.setattr(sys, "argv", ["posbench", "--help"])
    monkeypatch.delitem(sys.modules, "posbench.__main__", raising=False)  # run, not imported
    runpy.run_module("posbench.__main__", run_name="__main__")
    assert "posbench train" in capsys.readouterr().out


def test_diverged_is_exported_and_is_the_training_loops_error():
    from posbench.errors import PosbenchError
    from posbench.training.train_loop import Diverged

    assert posbench.Diverged is Diverged and issubclass(posbench.Diverged, PosbenchError)


def test_latest_run_finds_the_newest_trained_run_below_a_directory(run_dir, tmp_path):
    shutil.copytree(run_dir, tmp_path / "outputs" / "run")
    assert posbench.latest_run(tmp_path / "outputs") == tmp_path / "outputs" / "run"


def test_evaluate_run_writes_nothing_to_the_run(run_dir):
    before = read_results(run_dir)
    posbench.evaluate_run(run_dir, [48], device="cpu")
    assert read_results(run_dir) == before


def test_evaluate_task_scores_any_model_on_a_task(run_dir):
    model, _ = posbench.load_run(run_dir)
    task = posbench.data.load_data({"source": "copy", "val_examples": 4})
    (record,) = posbench.evaluate_task(model, task, [32])
    assert record["examples"] == 4 and record["tokens"] == 4 * 16
    assert 0 <= record["sequence_accuracy"] <= record["accuracy"] <= 1


def test_evaluate_run_on_a_task_run_returns_the_records_training_wrote(tmp_path):
    from conftest import TINY_RUN

    cfg = compose_config([*TINY_RUN, "data=copy", "data.val_examples=8", "eval.lengths=[16,32]"])
    results = posbench.train(cfg, tmp_path)
    assert posbench.evaluate_run(tmp_path, [16, 32], device="cpu") == results["eval"]


def test_train_takes_the_config_a_run_saved(run_dir, tmp_path):
    # load_run's config is config.yaml read back without the schema: options are strings.
    _, cfg = posbench.load_run(run_dir)
    results = posbench.train(cfg, tmp_path / "again")
    assert results["eval"] == read_results(run_dir)["eval"]  # same config, same seed
