"""Config schemas: typed dataclasses registered in Hydra's ConfigStore.

The YAML files in the top-level ``conf/`` hold the values users see; these schemas give them
types, so a typo or a wrong type fails when the config is composed, not halfway through a run.
``validate`` adds the range checks that types cannot express.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from posbench.data import ALGORITHMIC_TASKS, DATA_SCHEMAS, TASKS, load_data
from posbench.encodings import ENCODINGS, build_encoding
from posbench.errors import PosbenchError
from posbench.model.args import ModelArgs
from posbench.model.attention.bidirectional import check_two_sided
from posbench.model.config import ModelConfig
from posbench.model.position_remap import SelfExtendSettings, StringSettings
from posbench.model.random_positions import (
    PositionSampler,
    RandomPositionsMode,
    pose_sampler,
    randomizes_distances,
)
from posbench.system.distributed import check_divisible, world_size
from posbench.system.threads import AUTO, is_threads_setting

DEFAULT_LENGTH_MULTIPLES = (1, 2, 4, 8, 16)
# eval.task_lengths=reference: the task paper's grid (AlgorithmicTask.reference_eval_lengths)
REFERENCE_TASK_LENGTHS = "reference"


class Device(Enum):
    auto = "auto"  # cuda when available, else cpu
    cpu = "cpu"
    cuda = "cuda"


class Precision(Enum):
    auto = "auto"  # bf16 where measured faster (posbench/system/precision.py), else fp32
    fp32 = "fp32"
    bf16 = "bf16"  # autocast: bf16 products, fp32 weights and optimizer state


class EvalPrecision(Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class EvalPositions(Enum):
    auto = "auto"  # random for a run trained with train.random_positions, else consecutive
    consecutive = "consecutive"  # 0..L-1
    random = "random"  # each window at a sorted random subset of [0, train.random_positions)


class EvalDecode(Enum):
    greedy = "greedy"  # a task's answers decoded from the model's own argmax (accuracy)
    teacher_forced = "teacher_forced"  # not decoded: argmax given the true prefix only


class WandbMode(Enum):
    online = "online"
    offline = "offline"  # written under <run>/wandb/ only: `wandb sync` uploads it later
    disabled = "disabled"  # wandb's calls do nothing


@dataclass
class TrainConfig:
    seq_len: int = 128
    steps: int = 600
    # the global batch: split among the ranks (torchrun, SLURM), then into grad_accum micro-batches
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 60
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    log_every: int = 10
    val_every: int = 100
    val_batches: int = 8
    # write <run>/checkpoint.pt every N steps (0: only at the end and on SIGINT/SIGTERM)
    checkpoint_every: int = 100
    # continue from <run>/checkpoint.pt if there is one (posbench train --resume DIR)
    resume: bool = False
    # randomized positions (Ruoss et al. 2023): each step's sequences sit at a sorted random
    # subset of seq_len positions from [0, N) instead of 0..seq_len-1 (null: off)
    random_positions: int | None = None
    # with random_positions: a fresh draw in every layer (the reference's), or one for all (false)
    random_positions_per_layer: bool = True
    # auto | positions | distances: what random_positions randomizes (auto: the distances of a
    # bias of the distance alone, the positions of others; posbench/model/random_positions.py)
    random_positions_mode: RandomPositionsMode = RandomPositionsMode.auto
    # consecutive | pose: PoSE's skip-wise positions up to pose_length (null: 16 x seq_len)
    positions: str = "consecutive"
    pose_length: int | None = None
    # start from this run's weights (a fine-tune: same model and encoding, scaling may differ)
    init_from: str | None = None
    # train this share of train.steps (rounded): one phase of a budget (+experiment=drope's)
    steps_share: float = 1.0
    # auto | fp32 | bf16 (autocast; auto: bf16 where measured faster, posbench/system/precision.py)
    precision: Precision = Precision.auto
    # torch.compile the model for training (compile time reported apart: train.compile_s)
    compile: bool = False


@dataclass
class EvalConfig:
    # null: 1x, 2x, 4x, 8x, 16x train.seq_len (a corpus's windows, a passkey/copy/recall task)
    lengths: list[int] | None = None
    # an algorithmic task's problem lengths; null: its default grid, reference: its paper's
    # (posbench/data/algorithmic/base.py, kazemnejad.py; docs/tasks.md). Any, not
    # list[int] | None: OmegaConf types no list-or-string union, so validate() checks it.
    task_lengths: Any = None
    # null: non-overlapping windows; S: sliding windows advancing S tokens
    stride: int | None = None
    # windows per forward pass; null: as many as fit in ~64k tokens
    batch_size: int | None = None
    # score at most this many validation tokens per length (null: the whole split)
    max_tokens: int | None = 262144
    # fp32 | bf16 (autocast for the forward passes; log-probabilities stay fp32/fp64)
    precision: EvalPrecision = EvalPrecision.fp32
    # auto | consecutive | random (randomized positions: as the run trained, the default for
    # runs with train.random_positions; see posbench/evaluation/positions.py)
    positions: EvalPositions = EvalPositions.auto
    # greedy | teacher_forced: how a task's autoregressive answers are scored (see
    # posbench/evaluation/task_accuracy.py); accuracy is the greedy decode's, null under
    # teacher_forced (answers at placeholders: one forward pass, nothing to decode)
    decode: EvalDecode = EvalDecode.greedy
    temperature: str = "none"  # none | fit: checked by posbench/evaluation/temperature.py
    # none | self_extend | string: far keys at remapped positions (posbench/model/position_remap.py)
    position_remap: str = "none"
    # torch.compile a corpus's forward passes once per length (evaluation/compiled.py)
    compile: bool = False
    self_extend: SelfExtendSettings = field(default_factory=SelfExtendSettings)
    string: StringSettings = field(default_factory=StringSettings)


@dataclass
class LoggerConfig:
    """``logger=tensorboard`` and ``logger=none``: nothing to set besides the name."""

    name: str = "tensorboard"


@dataclass
class WandbConfig(LoggerConfig):
    name: str = "wandb"
    project: str = "posbench"
    entity: str | None = None  # null: the account's default entity
    mode: WandbMode | None = None  # null: WANDB_MODE, else online


# The schema of each option of the logger group (posbench/runs/loggers/ holds the loggers).
LOGGER_SCHEMAS = {"tensorboard": LoggerConfig, "wandb": WandbConfig, "none": LoggerConfig}


@dataclass
class PosbenchConfig:
    encoding: Any = MISSING
    model: ModelConfig = MISSING
    data: Any = MISSING
    logger: Any = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    device: Device = Device.auto
    # CPU threads per job: auto (the cores free of other work / the jobs run at once, adapted
    # while training: posbench/system/threads.py) or an int, kept as given
    threads: Any = AUTO


@functools.cache  # once a process: each compose would otherwise spend 40 % of its time here
def register_schemas() -> None:
    """Put every schema into Hydra's ConfigStore, once (Hydra copies a stored schema on each
    load, so a compose never changes the stored one).

    conf/config.yaml extends ``posbench_schema``; each group file extends its schema with
    ``/schema/<group>/<name>@_here_``, so groups stay free of schema-only options.
    """
    if not OmegaConf.has_resolver("coalesce"):
        # ${coalesce:a,b,...}: the first value that is not null (e.g. the learned table's rows)
        OmegaConf.register_new_resolver(
            "coalesce", lambda *values: next((v for v in values if v is not None), None)
        )
    if not OmegaConf.has_resolver("add"):
        # ${add:a,b,...}: the sum (e.g. CoPE's npos, one more than the training length)
        OmegaConf.register_new_resolver("add", lambda *values: sum(values))
    store = ConfigStore.instance()
    store.store(name="posbench_schema", node=PosbenchConfig)
    store.store(group="schema/model", name="model", node=ModelConfig)
    for name, encoding in ENCODINGS.items():
        store.store(group="schema/encoding", name=name, node=encoding.Config)
    for name, schema in DATA_SCHEMAS.items():
        store.store(group="schema/data", name=name, node=schema)
    for name, schema in LOGGER_SCHEMAS.items():
        store.store(group="schema/logger", name=name, node=schema)


def config_dir() -> Path:
    """The directory holding config.yaml: inside the package when installed from a wheel,
    the repository's top-level conf/ when running from a source checkout (editable install)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise PosbenchError(f"posbench's conf/ directory is missing next to {package}; reinstall")


def compose_config(
    overrides: Sequence[str] = (), with_hydra: bool = False, name: str = "config"
) -> DictConfig:
    """The config ``posbench train`` composes for ``overrides`` (Hydra's compose API);
    ``with_hydra`` keeps the ``hydra`` node (launcher, sweeper, output directories). ``name``:
    another config of conf/ to compose instead, e.g. a group's option alone (``data/text``)."""
    register_schemas()
    with initialize_config_dir(str(config_dir()), version_base="1.3", job_name="posbench"):
        return compose(name, overrides=list(overrides), return_hydra_config=with_hydra)


def eval_lengths(cfg: DictConfig) -> list[int]:
    """The evaluation lengths: an algorithmic task's ``eval.task_lengths`` (its default problem
    lengths for null, its reference grid for ``reference``), else ``eval.lengths`` or the
    default multiples of ``train.seq_len``."""
    if cfg.data.source in ALGORITHMIC_TASKS:
        task_lengths = OmegaConf.select(cfg, "eval.task_lengths")
        if task_lengths == REFERENCE_TASK_LENGTHS:
            return load_data(cfg.data).reference_eval_lengths()
        if task_lengths is not None:
            return list(task_lengths)
        return load_data(cfg.data).default_eval_lengths()
    if cfg.eval.lengths is not None:
        return list(cfg.eval.lengths)
    return [m * cfg.train.seq_len for m in DEFAULT_LENGTH_MULTIPLES]


def position_sampler(cfg: DictConfig) -> PositionSampler | None:
    """How the run configured by ``cfg`` draws its randomized (or PoSE's) positions (None: at
    0..T-1), its ``auto`` mode resolved for its encoding. Runs saved before the per-layer and
    mode keys drew one subset for every layer: they keep it. A PosbenchError for a distances
    mode the encoding cannot take."""
    n_positions = OmegaConf.select(cfg, "train.random_positions")
    train = cfg.train
    if (setting := OmegaConf.select(train, "positions", default="consecutive")) != "consecutive":
        return pose_sampler(
            setting, train.pose_length, train.seq_len, n_positions, cfg.model.n_layer
        )
    if n_positions is None:
        return None
    per_layer = OmegaConf.select(cfg, "train.random_positions_per_layer", default=False)
    setting = OmegaConf.select(cfg, "train.random_positions_mode", default="positions")
    setting = setting.value if isinstance(setting, Enum) else setting
    n_layer = cfg.model.n_layer
    with torch.device("meta"):  # the layers' encodings, no table allocated
        encoding = build_encoding(cfg.encoding, cfg.model.d_model, cfg.model.n_head)
        distances = randomizes_distances(encoding.layer_encodings(n_layer))
    if setting == "distances" and not distances:
        raise PosbenchError(
            "train.random_positions_mode=distances randomizes the distances of a bias of the "
            f"distance alone (alibi, t5, kerple, sandwich); encoding={cfg.encoding.name} reads "
            "positions otherwise: use train.random_positions_mode=auto or positions"
        )
    mode = (
        "distances" if setting == "distances" or (setting == "auto" and distances) else "positions"
    )
    return PositionSampler(n_positions, n_layer, per_layer, mode)


def check_length_keys(cfg: DictConfig) -> None:
    """An algorithmic task is evaluated at problem lengths, anything else at window lengths:
    the other key is a mistake, not a silently ignored setting."""
    algorithmic = cfg.data.source in ALGORITHMIC_TASKS
    if algorithmic and cfg.eval.lengths is not None:
        raise PosbenchError(
            f"data={cfg.data.source} is evaluated at problem lengths: set eval.task_lengths "
            "instead of eval.lengths"
        )
    task_lengths = OmegaConf.select(cfg, "eval.task_lengths")
    if not algorithmic and task_lengths is not None:
        raise PosbenchError(
            "eval.task_lengths are problem lengths of an algorithmic task (data=parity_check, "
            "reverse_string, ...); for this data set eval.lengths"
        )
    is_list = isinstance(task_lengths, ListConfig | list)
    if not (
        task_lengths is None
        or task_lengths == REFERENCE_TASK_LENGTHS
        or (is_list and all(type(n) is int for n in task_lengths))
    ):
        raise PosbenchError(
            f"eval.task_lengths must be a list of problem lengths, {REFERENCE_TASK_LENGTHS} or "
            f"null (got {task_lengths!r}); e.g. eval.task_lengths=[50,100] or "
            f"eval.task_lengths={REFERENCE_TASK_LENGTHS}"
        )


def validate(cfg: DictConfig) -> None:
    """Range checks the schemas' types cannot express; raise PosbenchError on the first one."""
    # Not the hydra node (present when composed with_hydra): Hydra fills it in at run time,
    # and reading its output directories would claim them (posbench/system/output_dirs.py).
    ours = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    missing = sorted(OmegaConf.missing_keys(ours))
    if missing:
        raise PosbenchError(f"{missing[0]} must be set ({missing[0]}=...)")
    positive = {
        "model.n_layer": cfg.model.n_layer,
        "model.n_head": cfg.model.n_head,
        "model.d_model": cfg.model.d_model,
        "model.mlp_ratio": cfg.model.mlp_ratio,
        "train.seq_len": cfg.train.seq_len,
        "train.steps": cfg.train.steps,
        "train.batch_size": cfg.train.batch_size,
        "train.grad_accum": cfg.train.grad_accum,
        "train.lr": cfg.train.lr,
        "train.log_every": cfg.train.log_every,
        "train.val_every": cfg.train.val_every,
        "train.val_batches": cfg.train.val_batches,
        "eval.stride": cfg.eval.stride,
        "eval.batch_size": cfg.eval.batch_size,
        "eval.max_tokens": cfg.eval.max_tokens,
    }
    for key, value in positive.items():
        if value is not None and value <= 0:
            raise PosbenchError(f"{key} must be positive (got {value})")
    non_negative = {
        "train.min_lr": cfg.train.min_lr,
        "train.warmup_steps": cfg.train.warmup_steps,
        "train.weight_decay": cfg.train.weight_decay,
        "train.grad_clip": cfg.train.grad_clip,
        "train.checkpoint_every": cfg.train.checkpoint_every,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise PosbenchError(f"{key} must be >= 0 (got {value})")
    check_divisible(cfg.train.batch_size, world_size(), cfg.train.grad_accum)
    if not is_threads_setting(cfg.threads):
        raise PosbenchError(
            f"threads must be {AUTO} or a positive integer (got {cfg.threads!r}); e.g. threads=1 "
            "for jobs run side by side"
        )
    positions = cfg.train.random_positions
    if positions is not None and positions < cfg.train.seq_len:
        raise PosbenchError(
            f"train.random_positions ({positions}) must be >= train.seq_len "
            f"({cfg.train.seq_len}): each sequence takes seq_len distinct positions from it"
        )
    if not 0 < cfg.train.steps_share <= 1:
        raise PosbenchError(f"train.steps_share must be in (0, 1] (got {cfg.train.steps_share})")
    check_trained_positions(cfg)
    check_bidirectional(cfg)
    check_logger(cfg)
    position_sampler(cfg)  # a distances mode the encoding cannot take is refused here
    if choice(cfg.eval.positions) == "random" and positions is None:
        raise PosbenchError(
            "eval.positions=random draws from [0, train.random_positions): set "
            "train.random_positions=N too, or use eval.positions=auto or consecutive"
        )
    if not 0 <= cfg.model.dropout < 1:
        raise PosbenchError(f"model.dropout must be in [0, 1) (got {cfg.model.dropout})")
    check_length_keys(cfg)
    lengths = eval_lengths(cfg)
    if not lengths or min(lengths) <= 0:
        algorithmic = cfg.data.source in ALGORITHMIC_TASKS
        lengths_key = "eval.task_lengths" if algorithmic else "eval.lengths"
        raise PosbenchError(f"{lengths_key} must be positive integers (got {lengths})")
    if cfg.data.source in TASKS:
        load_data(cfg.data).check_training(cfg.train.seq_len)
        corpus_only = {"stride": cfg.eval.stride is not None, "compile": cfg.eval.compile}
        if given := [key for key, is_set in corpus_only.items() if is_set]:
            raise PosbenchError(  # a task's examples and decoding change shape: never compiled
                f"data={cfg.data.source} scores whole prompts: eval.{given[0]} applies to "
                f"corpora only; drop eval.{given[0]}"
            )
    if cfg.eval.stride is not None and cfg.eval.stride > min(lengths):
        raise PosbenchError(
            f"eval.stride ({cfg.eval.stride}) must not exceed the shortest eval length "
            f"({min(lengths)})"
        )


def check_logger(cfg: DictConfig) -> None:
    """``logger=wandb`` without the optional wandb package: refused before anything runs (a
    sweep: before its first job; ``posbench eval`` of a W&B run: before evaluating), not when
    the run would be logged."""
    name = OmegaConf.select(cfg, "logger.name")  # none in a run saved before the logger group
    if name == "wandb" and importlib.util.find_spec("wandb") is None:
        raise PosbenchError('logger=wandb needs the wandb package: pip install -e ".[wandb]"')


def check_bidirectional(cfg: DictConfig) -> None:
    """A model that attends both ways (``model.causal=false``) writes its answers at once, at
    placeholders: next-token prediction (a corpus, autoregressive answers, their greedy decode)
    reads each token from those before it, which needs causal attention. Refused with the
    encodings and attention scalings that have no two-sided form, before a sweep's first job."""
    if OmegaConf.select(cfg, "model.causal", default=True):
        return
    answer_mode = OmegaConf.select(cfg, "data.answer_mode")
    if answer_mode is None:
        raise PosbenchError(
            f"model.causal=false attends both ways; data={cfg.data.source} is next-token "
            "prediction, which needs causal attention: use model.causal=true"
        )
    if choice(answer_mode) != "placeholders":
        raise PosbenchError(
            "model.causal=false writes answers at once, at placeholders; autoregressive answers "
            "are decoded a token at a time from those before it: set "
            "data.answer_mode=placeholders or model.causal=true"
        )
    if cfg.model.d_model % cfg.model.n_head == 0:  # else the model's own error says so
        check_model_config(cfg.model, cfg.encoding)


def with_steps_share(cfg: DictConfig) -> DictConfig:
    """``cfg`` with its ``train.steps_share`` taken: train.steps the steps it trains (at least
    one), the share 1, so that the saved config says what ran and a resume compares alike. A
    phase's share follows a ``train.steps=`` budget given on the command line."""
    share = OmegaConf.select(cfg, "train.steps_share", default=1.0)
    if share == 1:
        return cfg
    cfg = copy.deepcopy(cfg)
    cfg.train.steps, cfg.train.steps_share = max(1, round(share * cfg.train.steps)), 1.0
    return cfg


def check_trained_positions(cfg: DictConfig) -> None:
    """That the encoding represents every position training reaches (below
    train.random_positions or PoSE's train.pose_length, else train.seq_len): a learned table's
    rows and xPos's decay bound them. Checked with the config, before the run directory and the
    data are made, not at the first step."""
    if cfg.model.d_model % cfg.model.n_head:
        return  # the model's own error says so when it is built
    with torch.device("meta"):  # the encoding's options and bound, no table allocated
        encoding = build_encoding(cfg.encoding, cfg.model.d_model, cfg.model.n_head)
    sampler = position_sampler(cfg)
    reached = cfg.train.seq_len if sampler is None else sampler.n_positions
    if encoding.max_length is not None and reached > encoding.max_length:
        key = "train.seq_len"
        if sampler is not None:
            key = "train.pose_length" if sampler.mode == "pose" else "train.random_positions"
        raise PosbenchError(
            f"{key}={reached} trains at positions past the {encoding.max_length} this "
            f"{cfg.encoding.name} model represents; "
            f"{encoding.beyond_max_length_remedy(reached, trained=False)}, or lower {key}"
        )


def flat_config(cfg: DictConfig, resolve: bool = True) -> dict[str, Any]:
    """``{"train.lr": 0.003, ...}``: every leaf of ``cfg`` under its dotted key (``resolve``:
    interpolations resolved, else as written, ``???`` too)."""
    flat = {}

    def visit(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                visit(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    visit(OmegaConf.to_container(cfg, resolve=resolve, enum_to_str=True), "")
    return flat


def choice(value: Enum | str) -> str:
    """An enum option's name, as the schema types it (Precision.bf16) or as a config loaded
    without the schema holds it ("bf16": a run's config.yaml, ``posbench.load_run``)."""
    return value.value if isinstance(value, Enum) else value


def resolve_device(device: str | Device) -> torch.device:
    """``auto`` means CUDA when available, else CPU."""
    name = choice(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PosbenchError("device=cuda but no CUDA GPU is visible; use device=cpu or auto")
    return torch.device(name)


def check_model_config(model: Mapping[str, Any], encoding: Mapping[str, Any]) -> None:
    """Raise the PosbenchError ``build_model`` would raise for these configs, without building
    the model: its checks are the model's shape (ModelArgs) and the encoding's own, and an
    encoding's parameters are small. Even on the meta device, initialising the weights would
    cost more than the check (meta normal_ imports torch._dynamo, as slow as importing torch)."""
    args = ModelArgs(**model)
    encoding = build_encoding(encoding, args.d_model, args.n_head)
    check_two_sided(encoding, args.causal, args.attention_scaling)
