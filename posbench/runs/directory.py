"""A run directory on disk: its files, written atomically and read back safely (the content of
results.json is results.py's).

    <run>/model.safetensors  weights + (in the header metadata) everything needed to rebuild them
    <run>/config.yaml        the fully resolved config the run was trained with
    <run>/checkpoint.pt      training state for resuming (posbench/training/checkpoint.py)
    <run>/results.json       training summary and one record per evaluated length
    <run>/events.out.tfevents.*  TensorBoard scalars, hparams and figures (logger=tensorboard)
    <run>/wandb/, wandb_run.json  W&B's local files, and the W&B run's id and group (logger=wandb)
    <run>/.hydra/            Hydra's own record of the composed config and overrides

Weights are safetensors, so loading a run never executes code from the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_model

from posbench.data import ALGORITHMIC_TASKS, AnswerMode, Corpus, Task
from posbench.errors import PosbenchError
from posbench.model import Transformer, build_model
from posbench.system.atomic import atomic_path, atomic_write, leftover_temp_files

if TYPE_CHECKING:
    from tokenizers import Tokenizer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
TOKENIZER_FILE = "tokenizer.json"  # a run on tokens (data.tokenizer): the tokenizer it used
RESULTS_FILE = "results.json"
CHECKPOINT_FILE = "checkpoint.pt"  # posbench/training/checkpoint.py writes it
METADATA_KEY = "posbench"
# Hydra writes this file into every sweep directory, next to the sweep's job directories.
SWEEP_MARKER = "multirun.yaml"


def sweep_of(run_dir: Path) -> Path | None:
    """The directory of the sweep whose job ``run_dir`` is, or None for a single run."""
    parent = Path(run_dir).parent
    return parent if (parent / SWEEP_MARKER).is_file() else None


def save_weights(run_dir: Path, model: Transformer) -> Path:
    """Save the weights with the model's architecture and encoding in the file's metadata."""
    description = {"model": model.args.to_dict(), "encoding": asdict(model.encoding.config)}
    path = Path(run_dir) / WEIGHTS_FILE
    with atomic_path(path) as tmp:
        # save_model (unlike save_file) handles the tied input/output embedding.
        save_model(model, str(tmp), metadata={METADATA_KEY: json.dumps(description)})
    return path


def load_weights(
    path: Path,
    device: str | torch.device = "cpu",
    encoding_overrides: Mapping[str, Any] | None = None,
) -> Transformer:
    """Rebuild a model from a weights file written by ``save_weights``, its encoding config
    updated by ``encoding_overrides`` (nested keys merge, e.g. ``{"scaling": {...}}``)."""
    path = Path(path)
    description = weights_description(path)
    try:
        encoding = OmegaConf.merge(description["encoding"], encoding_overrides or {})
        model = build_model(description["model"], encoding)
    except (KeyError, ValueError, TypeError) as err:
        raise foreign_weights(path, err) from None
    try:
        load_model(model, str(path), strict=True, device=str(device))
    except (SafetensorError, RuntimeError) as err:
        first_line = str(err).strip().splitlines()[0]
        raise PosbenchError(f"{path} does not match its model description: {first_line}") from None
    return model.to(device)


def weights_description(path: Path) -> dict[str, Any]:
    """What a weights file written by ``save_weights`` says it holds (``{"model": ModelArgs as
    a dict, "encoding": its config}``), its tensors left unread."""
    if not path.is_file():
        raise PosbenchError(f"no weights at {path}; train a run with `posbench train` first")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        return json.loads(metadata[METADATA_KEY])
    except (SafetensorError, KeyError, ValueError) as err:
        raise foreign_weights(path, err) from None


def foreign_weights(path: Path, err: Exception) -> PosbenchError:
    return PosbenchError(
        f"{path} is not a posbench weights file (truncated or foreign: {err}); "
        "retrain the run or point at another one"
    )


def save_config(run_dir: Path, cfg: DictConfig) -> None:
    atomic_write(Path(run_dir) / CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True).encode())


def check_run_dir(run_dir: Path) -> Path:
    """``run_dir`` as a Path, or a one-line error if it is not a trained run."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        raise PosbenchError(
            f"{run_dir} is a file; pass --run the run directory that holds it: "
            f"--run {run_dir.parent}"
        )
    if not run_dir.is_dir():
        raise PosbenchError(
            f"run directory {run_dir} not found; pass --run with a directory made by "
            "`posbench train`"
        )
    if not (run_dir / WEIGHTS_FILE).is_file() and (run_dir / CHECKPOINT_FILE).is_file():
        raise PosbenchError(
            f"{run_dir} holds no {WEIGHTS_FILE} yet: its training stopped at a checkpoint; "
            f"finish it with `posbench train --resume {run_dir}`"
        )
    if not (run_dir / WEIGHTS_FILE).is_file():
        raise PosbenchError(
            f"{run_dir} holds no {WEIGHTS_FILE}; pass --run with a finished `posbench train` run"
        )
    return run_dir


def load_run(
    run_dir: str | Path,
    device: str | torch.device = "cpu",
    encoding_overrides: Mapping[str, Any] | None = None,
) -> tuple[Transformer, DictConfig]:
    """Rebuild a trained run: ``(model, config)``, the model in eval mode on ``device``.

    ``model(tokens)`` takes a LongTensor (batch, time) of byte ids and returns logits
    (batch, time, 256); ``config`` is the resolved config the run was trained with.
    ``encoding_overrides`` change the encoding's config, not its weights: e.g.
    ``{"scaling": {"method": "yarn", "factor": 4.0}}`` extends a rope run at eval time.
    """
    config = load_run_config(run_dir)
    model = load_weights(Path(run_dir) / WEIGHTS_FILE, device, encoding_overrides)
    check_weights_match_config(model, config, Path(run_dir))
    return model.eval(), config


def check_weights_match_config(model: Transformer, config: DictConfig, run_dir: Path) -> None:
    """The weights describe their own shape; a config.yaml that disagrees means the
    directory mixes two runs, and its numbers would be attributed to the wrong config."""
    weights = model.args.to_dict()
    differ = [key for key in weights if key in config.model and config.model[key] != weights[key]]
    if differ:
        held = ", ".join(f"{key}={weights[key]}" for key in differ)
        said = ", ".join(f"{key}={config.model[key]}" for key in differ)
        raise PosbenchError(
            f"{run_dir / WEIGHTS_FILE} holds a model with {held} but {CONFIG_FILE} says {said}; "
            "the directory mixes two runs: retrain it or restore the matching weights"
        )


def load_run_config(run_dir: str | Path) -> DictConfig:
    """The resolved config a trained run was trained with (without loading its weights)."""
    return saved_config(check_run_dir(Path(run_dir)))


def saved_config(run_dir: Path) -> DictConfig:
    """``run_dir/config.yaml``, whether or not the run has finished; a run on tokens reads
    its data with its own tokenizer.json (``data.tokenizer`` set to it), whatever its config
    named (``bpe`` trains one afresh: the same, but only if the corpus is). An algorithmic run
    from before ``data.answer_mode`` existed is autoregressive, as every one was then."""
    config_path = Path(run_dir) / CONFIG_FILE
    if not config_path.is_file():
        raise PosbenchError(f"{run_dir} holds no {CONFIG_FILE}; it is not a posbench run")
    config = OmegaConf.load(config_path)
    source = OmegaConf.select(config, "data.source")
    if source in ALGORITHMIC_TASKS and "answer_mode" not in config.data:
        config.data.answer_mode = AnswerMode.autoregressive.value  # the only one before it
    tokenizer = Path(run_dir) / TOKENIZER_FILE
    if tokenizer.is_file():
        config.data.tokenizer = str(tokenizer.resolve())
    return config


def run_tokenizer(run_dir: str | Path) -> Tokenizer | None:
    """The Hugging Face tokenizer a run on tokens was trained with (its tokenizer.json), to
    encode text for its model: ``tokenizer.encode(text).ids``; None for a run on bytes, whose
    tokens are the text's UTF-8 bytes."""
    path = check_run_dir(Path(run_dir)) / TOKENIZER_FILE
    if not path.is_file():
        return None
    from tokenizers import Tokenizer  # only runs on tokens need it

    return Tokenizer.from_file(str(path))


def save_tokenizer(run_dir: Path, data: Corpus | Task) -> None:
    """Keep the tokenizer of a run on tokens in its directory (a byte run has none)."""
    tokenizer = getattr(data, "tokenizer", None)
    if tokenizer is not None:
        atomic_write(Path(run_dir) / TOKENIZER_FILE, tokenizer.encode())


def check_can_create(run_dir: Path) -> None:
    """A one-line error, before anything runs, when ``run_dir`` could not be created or
    written (``prepare_run_dir`` checks again by writing, which also catches what
    permissions do not show, e.g. a read-only file system)."""
    existing = Path(run_dir).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise PosbenchError(
            f"cannot create the run directory {run_dir}: {existing} is a file; choose another "
            "with hydra.run.dir=DIR"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PosbenchError(
            f"cannot create the run directory {run_dir}: {existing} is not writable; choose "
            "another with hydra.run.dir=DIR"
        )


def prepare_run_dir(run_dir: Path) -> Path:
    """Create ``run_dir`` and check it takes files, so an unwritable output path fails before
    training rather than at the first checkpoint. Temp files a killed run left behind (never
    read: only complete files are renamed into place) are removed."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        raise PosbenchError(
            f"cannot write to the run directory {run_dir} ({err.strerror}); choose a writable "
            "one with hydra.run.dir=DIR"
        ) from None
    for stale in leftover_temp_files(run_dir):
        stale.unlink(missing_ok=True)
    return run_dir


def latest_run(
    root: str | Path = "outputs", encoding: str | None = None, data: str | None = None
) -> Path:
    """The most recently trained run below ``root`` (by the time its weights were written);
    with ``encoding`` or ``data``, the most recent one trained with that encoding
    (``encoding.name``) on that data (``data.name``): e.g. README's first run, whatever ran
    after it, is ``latest_run(encoding="rope", data="synthetic")``."""
    root = Path(root)
    candidates = list(root.glob(f"**/{WEIGHTS_FILE}")) if root.is_dir() else []
    wanted = {f"{group}.name": name for group, name in (("encoding", encoding), ("data", data))}
    wanted = {key: name for key, name in wanted.items() if name is not None}
    for weights in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        if trained_with(weights.parent, wanted):
            return weights.parent
    chosen = "".join(f" {key.partition('.')[0]}={name}" for key, name in wanted.items())
    of = f" of{chosen}" if chosen else ""
    raise PosbenchError(
        f"no trained run{of} under {root}/; train one with `posbench train{chosen}` or pass "
        "--run DIR"
    )


def trained_with(run_dir: Path, values: Mapping[str, Any]) -> bool:
    """Whether the run in ``run_dir`` was trained with these config ``values`` (by key)."""
    if not values:
        return True
    config = run_dir / CONFIG_FILE
    if not config.is_file():
        return False
    saved = OmegaConf.load(config)
    return all(OmegaConf.select(saved, key) == value for key, value in values.items())


def data_name(config: Mapping[str, Any]) -> str:
    """What a run trained on, as a title names it: a file corpus (``data=text``, every one of
    which is "text") by its ``data.path``, the folder that holds the file ("wikitext-2" for
    wikitext-2/test.txt: the file's own name is often a split's), or the file's stem where the
    path names no folder, or the folder a directory or a glob names; other data by its
    ``data.name`` ("?" where the config has none)."""
    path = config.get("data.path")
    if not isinstance(path, str):
        return str(config.get("data.name", "?"))
    parts = PurePath(path).parts
    while parts and any(c in parts[-1] for c in "*?["):  # a glob's pattern names no corpus
        parts = parts[:-1]
    if not parts:
        return path
    named = PurePath(*parts)
    if not named.suffix:  # a directory
        return named.name
    return named.parent.name or named.stem
