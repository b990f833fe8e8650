"""A run directory on disk: weights, config and results, written atomically, read back safely.

    <run>/model.safetensors  weights + (in the header metadata) everything needed to rebuild them
    <run>/config.yaml        the fully resolved config the run was trained with
    <run>/checkpoint.pt      training state for resuming (posbench/checkpoint.py)
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
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_model

from posbench.data import ALGORITHMIC_TASKS, AnswerMode, Corpus, Task
from posbench.errors import PosbenchError
from posbench.model import Transformer, build_model
from posbench.system import distributed
from posbench.system.atomic import atomic_path, atomic_write, leftover_temp_files, write_json
from posbench.system.versions import code_versions

if TYPE_CHECKING:
    from tokenizers import Tokenizer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
TOKENIZER_FILE = "tokenizer.json"  # a run on tokens (data.tokenizer): the tokenizer it used
RESULTS_FILE = "results.json"
CHECKPOINT_FILE = "checkpoint.pt"  # posbench/checkpoint.py writes it
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
    if not path.is_file():
        raise PosbenchError(f"no weights at {path}; train a run with `posbench train` first")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        description = json.loads(metadata[METADATA_KEY])
        encoding = OmegaConf.merge(description["encoding"], encoding_overrides or {})
        model = build_model(description["model"], encoding)
    except (SafetensorError, KeyError, ValueError, TypeError) as err:
        raise PosbenchError(
            f"{path} is not a posbench weights file (truncated or foreign: {err}); "
            "retrain the run or point at another one"
        ) from None
    try:
        load_model(model, str(path), strict=True, device=str(device))
    except (SafetensorError, RuntimeError) as err:
        first_line = str(err).strip().splitlines()[0]
        raise PosbenchError(f"{path} does not match its model description: {first_line}") from None
    return model.to(device)


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


def read_results(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PosbenchError(f"{path} is not valid JSON ({err}); delete or restore it") from None


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    write_json(Path(run_dir) / RESULTS_FILE, results)


# results.json of a training run, assembled as the run goes: what ran (run_description), then
# how training ended (train_loop.py's train_summary, or the diverged record), then one record
# per evaluated length.


def run_description(
    cfg: DictConfig, model: Transformer, data: Corpus | Task, precision: str, threads: int
) -> dict[str, Any]:
    """What results.json says about a run besides its numbers: status "ok" until something
    says otherwise, the encoding and its own settings (e.g. t5's num_buckets, rope's scaling),
    training length and seed, the ``threads`` and ranks it ran on, its size, the precision it
    trained in (what ``auto`` resolved to), its data (with its tokenizer and vocabulary) and
    the run it started from
    (``train.init_from``, as an absolute path), and the code that ran it (system/versions.py)."""
    options = OmegaConf.to_container(cfg.encoding, resolve=True, enum_to_str=True)
    options.pop("name")
    init_from = cfg.train.init_from
    return {
        "status": "ok",
        "encoding": cfg.encoding.name,
        "encoding_options": options,
        "train_seq_len": cfg.train.seq_len,
        "seed": cfg.seed,
        "threads": threads,
        "world_size": distributed.world_size(),
        "parameters": model.num_parameters(),
        "precision": precision,
        "data": {
            "name": data.name,
            # data.tokenizer as configured (bytes, bpe, a file, a hub name); tasks are bytes
            "tokenizer": OmegaConf.select(cfg, "data.tokenizer", default="bytes"),
            "vocab_size": data.vocab_size,
            **data.stats,
            # how a task asked for its answers (posbench/data/task.py's AnswerMode)
            **({"answer_mode": data.answer_mode.value} if isinstance(data, Task) else {}),
        },
        "init_from": None if init_from is None else str(Path(init_from).resolve()),
        "versions": code_versions(),
    }


def diverged_results(
    description: dict[str, Any], steps: int, step: int, last_finite_loss: float | None
) -> dict[str, Any]:
    """results.json of a run of ``steps`` whose loss became NaN or infinite at ``step``: no
    evaluation."""
    train = {"steps": steps, "diverged_at_step": step, "last_finite_loss": last_finite_loss}
    return {**description, "status": "diverged", "train": train, "eval": []}


def scaling_method(record: Mapping[str, Any]) -> str:
    """The eval-time extension an eval record was measured with ("none": as trained). Records
    written before eval-time scaling existed have no ``scaling`` field: they are plain."""
    return record.get("scaling") or "none"


def scaling_setting(record: Mapping[str, Any]) -> float | None:
    """The scaling factor an eval record was configured with: None when s followed each length
    (and for records written before the ``scaling_factor_setting`` field existed)."""
    return record.get("scaling_factor_setting")


def scaling_name(record: Mapping[str, Any]) -> str:
    """The eval-time extension as one name: "none", "yarn" (s from each length) or "yarn s=4"
    (a configured factor): one report row, table entry and TensorBoard series per name."""
    method, setting = scaling_method(record), scaling_setting(record)
    return method if setting is None else f"{method} s={setting:g}"


def positions_mode(record: Mapping[str, Any]) -> str:
    """How an eval record numbered its windows' positions: "consecutive" (0, 1, ...; also
    records written before the ``positions`` field existed) or "random"."""
    return record.get("positions") or "consecutive"


def decode_mode(record: Mapping[str, Any]) -> str | None:
    """How a task's eval record scored its answers: "greedy" (the model's own decode),
    "teacher_forced" (also autoregressive records written before the ``decode`` field existed)
    or None for answers at placeholders (one forward pass writes them: nothing to decode)."""
    if record.get("answer_mode") == "placeholders":
        return None
    return record.get("decode") or "teacher_forced"


def headline_accuracy(record: Mapping[str, Any]) -> float | None:
    """A task's eval record's share of answer tokens right in the model's own answer: at
    placeholders, its one forward pass's; autoregressive, its greedy decode's. None when it
    was scored under teacher forcing (records from before the ``decode`` field were, and hold
    the teacher-forced share as ``accuracy``)."""
    return None if decode_mode(record) == "teacher_forced" else record.get("accuracy")


def eval_protocol(record: Mapping[str, Any]) -> tuple:
    """How an eval record was measured, its length aside: stride, eval-time scaling method and
    factor setting (not the factor, which follows each length when unset), positions. A ratio
    compares a record with the one at the training length of the same protocol (precision is
    not part of it: a length re-evaluated in another precision replaces its record)."""
    return (
        record["stride"],
        scaling_method(record),
        scaling_setting(record),
        positions_mode(record),
    )


def protocol_text(record: Mapping[str, Any]) -> str:
    """A record's protocol in words: "stride 64, yarn s=4, random positions"."""
    stride = record["stride"]
    parts = ["non-overlapping windows" if stride is None else f"stride {stride}"]
    parts.append("no scaling" if scaling_method(record) == "none" else scaling_name(record))
    parts.append(f"{positions_mode(record)} positions")
    return ", ".join(parts)


def training_length_ppl(
    records: Iterable[Mapping[str, Any]], train_seq_len: int, metric: str = "ppl"
) -> dict:
    """Each protocol's (``eval_protocol``) measured perplexity (or another ``metric`` of the
    records: bits_per_byte, word_ppl) at the training length: what a record's ratio
    ppl / ppl(training length) divides by."""
    return {
        eval_protocol(r): r[metric]
        for r in records
        if r["length"] == train_seq_len and r["status"] == "ok" and r.get(metric) is not None
    }


def record_key(record: dict[str, Any]) -> tuple:
    """What identifies one measurement: the same key measured again replaces the old record.
    Its length, protocol and the factor used, so the same method at different factors is kept
    side by side."""
    return (record["length"], *eval_protocol(record), record.get("scaling_factor"))


def merge_eval_records(results: dict[str, Any], records: Iterable[dict[str, Any]]) -> dict:
    """``results`` with ``records`` added; records of other lengths, strides, scaling methods,
    factors or positions are kept as they are. Sorted by length, then stride, then method
    (plain first), then factor (from each length first), then positions."""
    new = {record_key(r): r for r in records}
    kept = [r for r in results.get("eval", []) if record_key(r) not in new]

    def order(record: dict[str, Any]) -> tuple:
        length, stride, scaling, setting, positions, _ = record_key(record)
        plain = (length, stride or 0, scaling != "none", scaling, setting is not None)
        return (*plain, setting or 0, positions)

    merged = sorted([*kept, *new.values()], key=order)
    return {**results, "eval": merged}


def with_length_generalization(results: dict[str, Any], longest_trained: int) -> dict[str, Any]:
    """``results`` of a run on an algorithmic task trained at problem lengths up to
    ``longest_trained``, with Ruoss et al.'s summary of its eval records over the lengths
    beyond: ``length_generalization``, the mean sequence accuracy (the whole answer right),
    and ``length_generalization_accuracy``, the mean accuracy per answer token of the model's
    own answer (``headline_accuracy``: at placeholders the per-token accuracy their Table 1
    averages over lengths 41 to 500, autoregressive answers' greedy decode; None when a length
    was scored under teacher forcing only). None when no such length was measured, or when one
    of them could not be (a learned table too short for it): a mean over the lengths a model
    happens to support would not compare with one over all of them."""
    beyond = [r for r in results["eval"] if r["length"] > longest_trained]
    summary: dict[str, Any] = dict.fromkeys(
        ["length_generalization", "length_generalization_accuracy"]
    )
    if beyond and all(r["status"] == "ok" for r in beyond):
        summary = {
            "length_generalization": sum(r["sequence_accuracy"] for r in beyond) / len(beyond),
            "length_generalization_accuracy": mean_of([headline_accuracy(r) for r in beyond]),
        }
    return {**results, **summary}


def mean_of(values: list[float | None]) -> float | None:
    """The mean of ``values``; None when one of them is None."""
    return None if None in values else sum(values) / len(values)


def append_eval_results(
    run_dir: Path, records: list[dict[str, Any]], longest_trained: int | None = None
) -> dict[str, Any]:
    """Add evaluation records to the run's results.json (atomically) and return the new content;
    with ``longest_trained`` (an algorithmic task's), its ``with_length_generalization``
    summary is recomputed from all its records."""
    results = merge_eval_records(read_results(run_dir), records)
    if longest_trained is not None:
        results = with_length_generalization(results, longest_trained)
    write_results(run_dir, results)
    return results
