"""What splits a report's runs into groups and rows, and what they are called: the training
setting (every key that changes the trained model, besides encoding and seed), the tokens
scored, the tokenizer where perplexity is compared; the metric chosen when tokenizers differ;
titles that name only the settings telling the groups apart; each run's row label (its
encoding, and the options, positions and attention variants telling it from others)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from posbench.config import flat_config
from posbench.encodings import ENCODINGS
from posbench.encodings.dape import DapeOptions
from posbench.report.read import BOOKKEEPING, Run, is_under, schema_defaults
from posbench.runs.directory import data_name

# The attention variants (docs/attention.md) and their defaults: a run away from its default
# gets a row of its own, labelled with the variant (label_options).
ATTENTION_VARIANTS = {
    "model.qk_norm": False,
    "model.attn_gate": "none",
    "model.attn_sinks": False,
    "model.attention": "softmax",
}

# Keys that do not change the trained model, so runs differing only in them are averaged.
# Seed is what is averaged over; encoding makes the rows; eval records are per length anyway.
NOT_A_SETTING = (
    *BOOKKEEPING,
    "seed",
    "encoding",
    "eval",
    # The tokenizer makes rows, not groups: runs on bytes and on BPE tokens side by side,
    # compared by bits_per_byte or word_ppl (--metric).
    "data.tokenizer",
    "data.vocab_size",
    # Randomized positions make rows too: Ruoss et al.'s method beside the encodings; so do
    # PoSE's skip-wise positions, and the attention variants papers ablate beside an encoding
    # (ATTENTION_VARIANTS: "rope (qk_norm=True)" beside "rope").
    "train.random_positions",
    "train.positions",
    "train.pose_length",
    *ATTENTION_VARIANTS,
    "model.sigmoid_length",  # sigmoid attention's (label_options)
)

# Evaluation keys that make groups: runs that scored other text at each length (more or fewer
# tokens) are never averaged. A record's stride and positions make rows of their own.
MEASUREMENT = ("eval.max_tokens",)

TITLE_CHARACTERS = 80  # of a group's heading and figure title at most (longer ones are cut)

# The settings a group's title names first, where several tell the groups apart: the data, the
# tokenizer, the training length and steps, the tokens scored; then the others by name.
TITLE_ORDER = (
    "data.name",
    "data.tokenizer",
    "train.seq_len",
    "data.train_lengths",
    "train.steps",
    "eval.max_tokens",
)

TITLE_NAMES = {"data.name": "data"}  # as a title writes them
# A fine-tune's parent's encoding and setting (training_setting); after train.init_from in a
# title's order, which names the parent's encoding first.
PARENT = "train.init_from.setting"


def training_setting(
    run: Run, parents: Mapping[Path, Run] | None = None
) -> tuple[tuple[str, str], ...]:
    """What the trained model depends on besides encoding and seed, hashable. A model or train
    key the run's config.yaml lacks (written before posbench had it) takes its default, which
    the run trained with: so it groups with newer runs that left the key at that default. A
    fine-tune whose parent is among ``parents`` (fine_tune_parents) has the parent's encoding
    and training setting for its train.init_from, not the parent's path: fine-tunes of one
    seed each of a parent setting are seeds of one setting (DroPE's recalibrations)."""
    config = {**schema_defaults(), **run.config}
    setting = {
        key: json.dumps(value) for key, value in config.items() if not is_under(key, NOT_A_SETTING)
    }
    if (parent := (parents or {}).get(run.path)) is not None:
        encoding = {k: v for k, v in parent.config.items() if is_under(k, ("encoding",))}
        setting["train.init_from"] = json.dumps(f"{parent.config['encoding.name']} runs")
        setting[PARENT] = json.dumps([encoding, training_setting(parent, parents)])
    return tuple(sorted(setting.items()))


def fine_tune_parents(runs: Sequence[Run]) -> dict[Path, Run]:
    """Each fine-tune's parent among ``runs`` (its train.init_from, as results.json records it
    absolute): the run whose path ends in the most of its parts, where one does; a summary's
    runs keep their sweep's and run's names. A parent not found, or two found alike, leaves
    the fine-tune grouped by the path it names."""
    parents = {}
    for run in runs:
        named = run.results.get("init_from") or run.config.get("train.init_from")
        if named is None:
            continue
        parts = Path(named).parts
        matched = {other.path: common_suffix(parts, other.path.parts) for other in runs}
        longest = max(matched.values())
        found = [other for other in runs if longest and matched[other.path] == longest]
        if len(found) == 1 and found[0] is not run:
            parents[run.path] = found[0]
    return parents


def common_suffix(a: Sequence[str], b: Sequence[str]) -> int:
    """How many of the last parts of ``a`` and ``b`` are equal."""
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def tokenizer_text(run: Run) -> str:
    """A run's tokenizer in a row label: "bytes", "bpe 8192", or the file or hub name."""
    tokenizer = run.config.get("data.tokenizer", "bytes")
    if tokenizer == "bpe":
        return f"bpe {run.config['data.vocab_size']}"
    return tokenizer if tokenizer == "bytes" else Path(tokenizer).name or tokenizer


def group_title(config: dict[str, Any]) -> str:
    """A report of one group's title: its data, model and training."""
    trained = f"{config['train.seq_len']} tokens"
    if (lengths := config.get("data.train_lengths")) is not None:
        trained = f"problem lengths {lengths[0]}–{lengths[1]}"
    return shortened(
        f"{data_name(config)} data, model {config['model.n_layer']}×"
        f"{config['model.d_model']}, trained at {trained} for {config['train.steps']} steps"
    )


def group_titles(settings: Sequence[dict[str, Any]]) -> list[str]:
    """Each group's title among several, from the settings that differ between them: the
    fewest, most telling first (TITLE_ORDER), whose values tell every group from the others
    ("data=wikitext2, train.seq_len=256": data.name as "data", the data's other keys following
    from it), cut to TITLE_CHARACTERS; "–" for a key a group has not. A setting that is null in
    a group is left out of its title (never "train.init_from=null": the other groups' titles
    name their values), unless every one it names is: then "no train.init_from"."""
    keys = sorted(
        {key for setting in settings for key in setting},
        key=lambda k: (TITLE_ORDER.index(k) if k in TITLE_ORDER else len(TITLE_ORDER), k),
    )
    named: list[str] = []
    told: list[tuple[str, ...]] = [() for _ in settings]  # the values named so far, per group
    for key in keys:
        more = [(*t, json.dumps(s.get(key))) for t, s in zip(told, settings, strict=True)]
        if len(set(more)) > len(set(told)):  # it tells apart groups the others do not
            named.append(key)
            told = more
    return [shortened(title_of(setting, named)) for setting in settings]


def title_of(setting: dict[str, Any], named: Sequence[str]) -> str:
    """A group's title of the settings ``named``, those null in it left out (group_titles)."""
    shown = [key for key in named if key not in setting or setting[key] is not None]
    if not shown:
        return ", ".join(f"no {TITLE_NAMES.get(key, key)}" for key in named)
    return ", ".join(f"{TITLE_NAMES.get(k, k)}={setting_text(setting, k)}" for k in shown)


def setting_text(setting: dict[str, Any], key: str) -> str:
    """A setting's value as an override writes it: wikitext2, 256, [16, 2048]; the data as
    data_name calls it (a file corpus by its folder, not "text")."""
    if key not in setting:
        return "–"
    if key == "data.name":
        return data_name(setting)
    value = setting[key]
    return value if isinstance(value, str) else json.dumps(value)


def shortened(title: str) -> str:
    """``title`` cut to TITLE_CHARACTERS, an ellipsis marking the cut."""
    return title if len(title) <= TITLE_CHARACTERS else title[: TITLE_CHARACTERS - 1] + "…"


def group_setting(
    run: Run, by_tokenizer: bool, parents: Mapping[Path, Run] | None = None
) -> tuple[tuple[str, str], ...]:
    """What a run's group is, hashable: its training setting (``parents``: training_setting),
    the tokens it scored (MEASUREMENT), and, ``by_tokenizer``, its tokenizer."""
    config = {**schema_defaults(), **run.config}
    setting = training_setting(run, parents)
    setting += tuple((k, json.dumps(config.get(k))) for k in MEASUREMENT)
    if by_tokenizer:
        setting += (("data.tokenizer", json.dumps(tokenizer_text(run))),)
    return setting


def group_settings(runs: Sequence[Run], by_tokenizer: bool) -> list[tuple[tuple[str, str], ...]]:
    """Each run's group_setting, a fine-tune's by its parent among ``runs``."""
    parents = fine_tune_parents(runs)
    return [group_setting(run, by_tokenizer, parents) for run in runs]


def chosen_metric(metric: str | None, tokenizers: Sequence[str]) -> tuple[str, str | None]:
    """The metric a report shows (``metric``, or by default ppl, or bits_per_byte where the runs
    differ in tokenizer) and, where the tokenizers decide, a line that says so."""
    if len(tokenizers) < 2:
        return metric or "ppl", None
    which = ", ".join(tokenizers)
    if metric is None:
        return "bits_per_byte", (
            f"Bits per byte, not perplexity: the runs differ in tokenizer ({which}), whose "
            "tokens are not alike (`--metric ppl` compares perplexity within each tokenizer)."
        )
    if metric == "ppl":
        return metric, (
            f"Perplexity per token, compared within each tokenizer: the runs differ in tokenizer "
            f"({which}), so each is a group of its own (`--metric bits_per_byte` compares them)."
        )
    return metric, None


def encoding_labels(runs: Sequence[Run]) -> dict[Path, str]:
    """Each run's encoding name, plus the encoding options and randomized positions that
    differ between runs of that name (so rope with two bases makes two rows instead of one
    average; "rope (random_positions=2048)" beside "rope"), plus its tokenizer when the runs
    differ in theirs ("rope [bpe 8192]")."""
    tokenizers = {run.path: tokenizer_text(run) for run in runs}
    several = len(set(tokenizers.values())) > 1
    options = {run.path: label_options(run) for run in runs}
    labels = {}
    for run in runs:
        name = run.config["encoding.name"]
        same_name = [options[r.path] for r in runs if r.config["encoding.name"] == name]
        defaults = encoding_defaults(name)
        differing = sorted(
            k
            for k, value in options[run.path].items()
            if len({json.dumps(o.get(k)) for o in same_name}) > 1
            # an option at its default is not named ("rope" beside "rope (base=500)")
            and (k not in defaults or value != defaults[k])
        )
        details = ", ".join(f"{k.split('.', 1)[1]}={options[run.path][k]}" for k in differing)
        labels[run.path] = f"{name} ({details})" if details else name
        if several:
            labels[run.path] += f" [{tokenizers[run.path]}]"
    return labels


@functools.cache
def encoding_defaults(name: str) -> dict[str, Any]:
    """The defaults of encoding ``name``'s options ({"encoding.base": 10000.0, ...}), from its
    config's schema; none for an encoding no longer registered."""
    if name not in ENCODINGS:
        return {}
    schema = OmegaConf.structured(ENCODINGS[name].Config)
    return {
        f"encoding.{key}": value
        for key, value in flat_config(schema, resolve=False).items()
        if value != "???"
    }


def label_options(run: Run) -> dict[str, Any]:
    """What can tell a run's row from others of its encoding: the encoding's options,
    train.random_positions where it is set, train.positions (and a target length set) where it
    is pose, DAPE where it is on, and the attention variants away from their defaults
    (sigmoid attention's length where it is not the training length, its default)."""
    options = {k: v for k, v in run.config.items() if k.startswith("encoding.")}
    if not options.get("encoding.dape"):
        # DAPE's settings only where it is on ("alibi (dape=True)" beside "alibi"); its width
        # and kernel at their defaults go unnamed, as every option does (encoding_labels)
        for field in [f for f in fields(DapeOptions) if f.name.startswith("dape")]:
            options.pop(f"encoding.{field.name}", None)
    if run.config.get("train.random_positions") is not None:
        options["train.random_positions"] = run.config["train.random_positions"]
    if run.config.get("train.positions", "consecutive") != "consecutive":
        options["train.positions"] = run.config["train.positions"]
        if run.config.get("train.pose_length") is not None:  # null: 16 x train.seq_len
            options["train.pose_length"] = run.config["train.pose_length"]
    for key, default in ATTENTION_VARIANTS.items():
        if run.config.get(key, default) != default:
            options[key] = run.config[key]
    sigmoid_length = run.config.get("model.sigmoid_length")
    if (
        options.get("model.attention") == "sigmoid"
        and sigmoid_length != run.config["train.seq_len"]
    ):
        options["model.sigmoid_length"] = sigmoid_length
    return options
