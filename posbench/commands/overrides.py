"""``posbench train``'s Hydra overrides, checked before Hydra starts any job: a typo, an unknown
option or an unparsable override is one line saying how to fix it (Hydra's own messages span
many lines, and a sweep would meet the mistake only in its jobs)."""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

from posbench.commands.exits import fail
from posbench.config import (
    check_model_config,
    compose_config,
    config_dir,
    flat_config,
    validate,
)
from posbench.data import check_data
from posbench.errors import PosbenchError
from posbench.evaluation.positions import eval_remap
from posbench.runs.directory import check_can_create
from posbench.system.output_dirs import unclaimed


def group_options(group: str) -> list[str]:
    """The options of a config group, as the YAML files in conf/<group>/ name them."""
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


def hydra_error_line(err: Exception, overrides: Sequence[str] = ()) -> str:
    """One line for a Hydra/OmegaConf composition error (their messages span many lines) of
    the command line ``overrides``."""
    if isinstance(err, OverrideParseException):
        return parse_error_line(err, overrides)
    text = str(err)
    ambiguous = re.match(r"Ambiguous value for argument '([^']+)'", text)
    if ambiguous:
        return ambiguous_sweep_line(ambiguous.group(1))
    missing = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text, flags=re.MULTILINE)
        message = f"unknown {group} '{option}'; choose one of: {', '.join(options)}"
        if group == "hydra/launcher":
            message += " (joblib, submitit_*: pip install 'posbench[launchers]')"
        return message
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException | HydraException):
        lines.append(str(cause).strip().splitlines()[0])
    summary = lines[0].rstrip(".")
    if "Could not override" in summary or "Key '" in summary:
        unknown = re.search(r"Could not override '([^']+)'", summary)
        hint = unknown_key_hint(unknown.group(1), overrides) if unknown else NO_SUCH_KEY
        summary += f" ({hint})"
    elif len(lines) > 1:
        summary += f": {lines[-1]}"
    mistyped = re.match(
        r"Error merging override ([^=]+)=(.*?): Value .* (?:could not be converted to (\w+)|"
        r"is not a valid (bool))",
        summary,
    )
    if mistyped:
        return wrong_type_line(mistyped[1], mistyped[2], mistyped[3] or mistyped[4])
    return summary


# What a typed key takes, in words and by example (when its default is null), by the name
# OmegaConf gives the type.
TYPE_WORDS = {
    "Integer": ("an integer", 100),
    "Float": ("a number", 0.5),
    "bool": ("true or false", "true"),
}


def wrong_type_line(key: str, value: str, wanted: str) -> str:
    """One line for a value that does not convert to its key's type (``train.steps=abc``): the
    type wanted and an example, the key's default where it has one."""
    words, example = TYPE_WORDS.get(wanted, (wanted, None))
    default = OmegaConf.select(compose_config([]), key)
    if default is not None:  # as the command line writes it: true, not True
        example = str(default).lower() if isinstance(default, bool) else default
    return f"{key} takes {words}, not {value!r}: e.g. {key}={example}"


LIST_KEYS = "`posbench train --cfg job` lists every key"
NO_SUCH_KEY = f"no such key; {LIST_KEYS}"


def unknown_key_hint(key: str, overrides: Sequence[str]) -> str:
    """What to do about ``key``, which the config that the other ``overrides`` compose lacks:
    choose the option of its group that has it (``data.path``: ``data=text``), else the most
    alike key of that config (so a group's options count: ``encoding=t5
    encoding.num_bucket=8``)."""
    parsed = parse_overrides(overrides)
    others = [o for o in parsed if o.key_or_group != key]
    options_chosen = [o for o in others if chooses_an_option(o)]  # data=text, ...
    for attempt in (others, options_chosen):
        try:
            cfg = compose_config([o.input_line for o in attempt], with_hydra=True)
            break
        except (HydraException, OmegaConfBaseException):  # another mistake: fewer overrides
            continue
    else:
        cfg = compose_config([], with_hydra=True)  # the defaults
    group = key.partition(".")[0]
    chosen = cfg.hydra.runtime.choices.get(group)
    having = options_with_key(group, key) if chosen is not None else []
    if having:
        options = " or ".join(f"{group}={option}" for option in having)
        override = next((o.input_line for o in parsed if o.key_or_group == key), f"{key}=...")
        fix = f"{group}={having[0]} {override}"
        return f"{key} is a key of {options}, not of {group}={chosen}: use `{fix}`"
    ours = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # hydra.*: run time
    matches = difflib.get_close_matches(key, flat_config(ours), n=1)
    return f"no such key; did you mean {matches[0]}? {LIST_KEYS}" if matches else NO_SUCH_KEY


def flag_overrides(flag: str, value: str) -> list[str]:
    """The overrides a ``--flag value`` that posbench train does not take may have meant: the
    config group (``--encoding alibi``) or top-level key (``--seed``) the flag names, else the
    keys whose last part it names (``--steps 100``: ``train.steps=100``; ``--batch-size``:
    train's and eval's)."""
    name = flag.removeprefix("--").replace("-", "_")
    keys = flat_config(compose_config([]))
    if name in ("encoding", "model", "data") or name in keys:
        return [f"{name}={value}"]
    return [f"{key}={value}" for key in keys if key.rpartition(".")[2] == name]


def chooses_an_option(override: Override) -> bool:
    """Whether ``override`` chooses a config group's option (``data=text``,
    ``+experiment=retrieval``) rather than setting a key (``data.path=...``)."""
    return "." not in override.get_key_element()


def compose_group_options(group: str, options: Sequence[str]) -> dict[str, DictConfig]:
    """Each of ``options`` of config group ``group`` composed alone (its file and its
    defaults, under ``group``'s package; interpolations unresolved): what keys an option
    brings, at a third of composing the whole config for each. An option that does not compose
    alone is left out."""
    configs = {}
    for option in options:
        try:
            configs[option] = compose_config(name=f"{group}/{option}")
        except (HydraException, OmegaConfBaseException):
            continue
    return configs


def options_with_key(group: str, key: str) -> list[str]:
    """The options of config group ``group`` whose config has ``key``."""
    configs = compose_group_options(group, group_options(group))
    return [option for option, cfg in configs.items() if key in flat_config(cfg, resolve=False)]


LEXER_ERROR = "LexerNoViableAltException: "


def parse_error_line(err: OverrideParseException, overrides: Sequence[str]) -> str:
    """One line for an override that Hydra's grammar rejects: why (Hydra's reason, without
    the grammar's token names) and how to write it."""
    *details, see = str(err).splitlines()  # the last line: "See <the grammar's page> for details"
    if details[0].startswith(LEXER_ERROR):  # the line below it marks the first unreadable char
        reason = f"unexpected {err.override[details[-1].index('^') - len(LEXER_ERROR) :]!r}"
    else:
        reason = re.sub(r" expecting \{.*\}$", "", details[-1])
    fix = override_fix(err.override, overrides)
    return f"cannot parse the override {err.override!r} ({reason}): {fix} (see {see.split()[1]})"


def override_fix(override: str, overrides: Sequence[str]) -> str:
    """How to write the unparsable ``override``, where the mistake is clear: a sweep split at a
    space (``encoding=rope, alibi``), a group's option without its group (``alibi``)."""
    given = list(overrides)
    after = given[given.index(override) + 1 :] if override in given else []
    if override.endswith(",") and after:
        return f"did you mean {override}{after[0]}? A sweep's values are one word, no spaces"
    groups = [group for group in ("encoding", "model", "data") if override in group_options(group)]
    if groups:
        return "did you mean " + " or ".join(f"{group}={override}" for group in groups) + "?"
    return "write key=value, key=a,b for a sweep (with -m), key=[a,b] for a list"


def ambiguous_sweep_line(override: str) -> str:
    """One line for ``key=a,b`` without ``-m``: Hydra's three readings of it, for this key."""
    key, _, values = override.partition("=")
    return (
        f"{override} is ambiguous: write {key}=[{values}] for a list, "
        f"\"{key}='{values}'\" for a string, or add -m to sweep over {values.replace(',', ', ')}"
    )


def parse_overrides(overrides: Sequence[str]) -> list[Override]:
    """Hydra's parse of ``overrides``; a key given twice keeps its last value, as in Hydra's
    basic sweeper."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as err:
        raise PosbenchError(parse_error_line(err, overrides)) from err
    return list({o.get_key_element(): o for o in parsed}.values())


def expand_sweeps(overrides: Sequence[str]) -> list[list[str]]:
    """Override lists to check before a sweep starts: the fixed overrides plus, for each swept
    key, each of its values (linear in the number of values, not their product). A swept
    group's other options are checked with every fixed key, and every other list takes the
    group's first option: a key of the group (``data=a,b data.x=1`` or ``data.x=1,2``), fixed
    or swept, is one its jobs meet with those options, never with the group's default."""
    parsed = parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    swept = [o for o in parsed if o.is_sweep_override()]
    options = {o.key_or_group: settings(o) for o in swept if chooses_an_option(o)}
    variants = []
    for override in swept:
        key = override.key_or_group
        group = key if chooses_an_option(override) else key.partition(".")[0]
        others = [choices[0] for g, choices in options.items() if g != group]
        for setting in settings(override):
            choices = [] if chooses_an_option(override) else options.get(group, [])
            variants += [[*fixed, *others, c, setting] for c in choices] or [
                [*fixed, *others, setting]
            ]
    return variants or [fixed]


def settings(override: Override) -> list[str]:
    """A sweep's overrides one value each: ``data=a,b`` as ``data=a`` and ``data=b``."""
    return [f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()]


def force_added_in_sweeps(overrides: Sequence[str]) -> dict[str, str]:
    """What Hydra's multirun is given instead of some of ``overrides``: a key of a swept group
    (``data=a,b data.x=1``) force-added (``++data.x=1``). Hydra composes a sweep's first config
    with the group's default option, which may lack the key (hydra#2888), before each job
    composes its own, which has it (check_overrides made sure)."""
    parsed = parse_overrides(sweep_overrides(overrides))
    swept = {o.key_or_group for o in parsed if o.is_sweep_override() and chooses_an_option(o)}
    return {
        o.input_line: f"++{o.input_line}"
        for o in OverridesParser.create().parse_overrides(list(overrides))  # each, as Hydra
        if o.type == OverrideType.CHANGE
        and not chooses_an_option(o)
        and o.key_or_group.partition(".")[0] in swept
    }


def check_overrides(overrides: Sequence[str], multirun: bool) -> list[DictConfig]:
    """Compose (and validate) the config for ``overrides`` before Hydra starts any job, so a
    typo is one line here instead of a multi-line report or a failure deep in a sweep.
    Returns each job's composed config (with its hydra node), in the sweep's order."""
    candidates = expand_sweeps(sweep_overrides(overrides)) if multirun else [list(overrides)]
    composed = []
    for num, candidate in enumerate(candidates):
        cfg = compose_or_fail(candidate, with_hydra=True)
        composed.append(cfg)
        if not multirun:
            check_not_a_sweep(cfg, overrides)
        with as_a_job(cfg, multirun, num):
            try:
                resolve_job_keys(cfg)
                validate(cfg)
                check_marked_required(cfg)
                check_model_config(cfg.model, cfg.encoding)
                eval_remap(cfg)
                check_data(cfg.data)  # its files: a sweep's third job must not find them missing
                check_can_create(Path(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))
            except InterpolationResolutionError as err:
                fail(unresolved_line(cfg, err, multirun))
    return composed


@contextmanager
def as_a_job(cfg: DictConfig, multirun: bool, num: int) -> Iterator[None]:
    """Inside, ``${hydra:...}`` in ``cfg`` reads what Hydra's run_job gives job ``num`` (its
    mode, number and output directory), and no ``${unique_dir:...}`` is claimed (Hydra claims
    it when the job starts): the checks above see the values the job will."""
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    with unclaimed(), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        if multirun:  # a single run has neither, as in Hydra
            cfg.hydra.job.id = cfg.hydra.job.num = num
        hydra_config.set_config(cfg)  # the output directory's interpolations read the mode
        directories = cfg.hydra.sweep
        output_dir = Path(directories.dir, directories.subdir) if multirun else cfg.hydra.run.dir
        with read_write(cfg.hydra):
            cfg.hydra.runtime.output_dir = str(Path(output_dir).absolute())
        hydra_config.set_config(cfg)
        try:
            yield
        finally:
            hydra_config.cfg = before


def check_marked_required(cfg: DictConfig) -> None:
    """A key that a file of ``cfg``'s composition marks ``???`` must be set by another file or
    the command line: OmegaConf's merge keeps a schema's default under ``???``, so Hydra would
    run with that default. A PosbenchError naming the first such key."""
    files = [config_dir() / "config.yaml"]
    files += [config_dir() / f"{group}/{option}.yaml" for group, option in choices(cfg)]
    marked, given = set(), set()
    for path in files:
        for key, value in file_keys(path).items():
            (marked if value == "???" else given).add(key)
    given |= {o.key_or_group for o in parse_overrides(cfg.hydra.overrides.task)}
    unset = sorted(marked - given)
    if unset:
        raise PosbenchError(f"{unset[0]} must be set ({unset[0]}=...)")


def choices(cfg: DictConfig) -> list[tuple[str, str]]:
    """The group options ``cfg`` was composed from, Hydra's own groups left out."""
    chosen = cfg.hydra.runtime.choices.items()
    return [(g, o) for g, o in chosen if o is not None and not g.startswith("hydra/")]


def file_keys(path: Path) -> dict[str, Any]:
    """The keys a conf/ file sets, as the composed config names them (under its package: the
    group, or the top for ``# @package _global_``), values as written (``???`` unresolved)."""
    if not path.is_file():  # a schema: structured, not a file
        return {}
    text = path.read_text()
    package = re.match(r"# @package (\S+)", text)
    prefix = path.parent.relative_to(config_dir()).as_posix().replace("/", ".")
    if package is not None:
        prefix = "" if package[1] == "_global_" else package[1]
    keys = flat_config(OmegaConf.create(text), resolve=False).items()
    return {f"{prefix}.{k}".lstrip("."): v for k, v in keys if k.split(".")[0] != "defaults"}


def resolve_job_keys(cfg: DictConfig) -> None:
    """Resolve every interpolation of ``cfg`` outside its hydra node, as the job will read it:
    an InterpolationResolutionError for the first that does not resolve."""
    for key in [key for key in cfg if key != "hydra"]:  # in the config's order
        value = cfg[key]  # a leaf resolves here, a section's keys below
        if isinstance(value, DictConfig):
            OmegaConf.to_container(value, resolve=True)


def unresolved_line(cfg: DictConfig, err: InterpolationResolutionError, multirun: bool) -> str:
    """One line for a key whose interpolation does not resolve as its job would resolve it."""
    parent, _, name = err.full_key.rpartition(".")
    written = (OmegaConf.select(cfg, parent) if parent else cfg)._get_node(name)._value()
    reason = re.sub(r"^While dereferencing interpolation '[^']*': ", "", str(err).splitlines()[0])
    sweep_only = not multirun and re.search(r"\$\{hydra:job\.(num|id)\}", str(written))
    hint = "; hydra.job.num and hydra.job.id are set in a sweep's jobs only: add -m"
    return f"{err.full_key}={written} does not resolve as its job would ({reason})" + (
        hint if sweep_only else ""
    )


def check_not_a_sweep(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """An experiment that sets ``hydra.sweeper.params`` is a sweep: without -m Hydra would run
    its first job alone and exit 0, as if the experiment had run."""
    params = cfg.hydra.sweeper.get("params")
    if params:
        experiment = cfg.hydra.runtime.choices.get("experiment")
        what = "this config" if experiment is None else f"+experiment={experiment}"
        command = shlex.join(["posbench", "train", "-m", *overrides])
        fail(f"{what} is a sweep (over {', '.join(params)}): run it with -m: `{command}`")


def sweep_overrides(overrides: Sequence[str]) -> list[str]:
    """What a multirun sweeps: the config's ``hydra.sweeper.params`` (set by experiments),
    then the command line, whose values win per key. The params are read with the fixed group
    choices and hydra keys only: a value such as ``data.digits=3`` may belong to a group
    choice (``data=passkey``) that only the sweep makes."""
    fixed = [
        o.input_line
        for o in parse_overrides(overrides)
        if not o.is_sweep_override()
        and (chooses_an_option(o) or o.get_key_element().startswith("hydra."))
    ]
    params = compose_or_fail(fixed, with_hydra=True).hydra.sweeper.get("params") or {}
    return [*(f"{key}={value}" for key, value in params.items()), *overrides]


def compose_or_fail(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """The composed config for ``overrides``, or a one-line error."""
    try:
        return compose_config(overrides, with_hydra)
    except (HydraException, OmegaConfBaseException) as err:
        fail(hydra_error_line(err, overrides))
