"""What splits a report's runs into groups and what a group is called: the training setting
(every key that changes the trained model, besides encoding and seed), the tokens scored, the
tokenizer where perplexity is compared; the metric chosen when tokenizers differ; titles that
name only the settings telling the groups apart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posbench.report.read import BOOKKEEPING, Run, is_under, schema_defaults

# The attention variants (docs/attention.md) and their defaults: a run away from its default
# gets a row of its own, labelled with the variant (groups.label_options).
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


def training_setting(run: Run) -> tuple[tuple[str, str], ...]:
    """What the trained model depends on besides encoding and seed, hashable. A model or train
    key the run's config.yaml lacks (written before posbench had it) takes its default, which
    the run trained with: so it groups with newer runs that left the key at that default."""
    config = {**schema_defaults(), **run.config}
    return tuple(
        (key, json.dumps(value))
        for key, value in sorted(config.items())
        if not is_under(key, NOT_A_SETTING)
    )


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
        f"{config.get('data.name', '?')} data, model {config['model.n_layer']}×"
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
    """A setting's value as an override writes it: wikitext2, 256, [16, 2048]."""
    if key not in setting:
        return "–"
    value = setting[key]
    return value if isinstance(value, str) else json.dumps(value)


def shortened(title: str) -> str:
    """``title`` cut to TITLE_CHARACTERS, an ellipsis marking the cut."""
    return title if len(title) <= TITLE_CHARACTERS else title[: TITLE_CHARACTERS - 1] + "…"


def group_setting(run: Run, by_tokenizer: bool) -> tuple[tuple[str, str], ...]:
    """What a run's group is, hashable: its training setting, the tokens it scored
    (MEASUREMENT), and, ``by_tokenizer``, its tokenizer."""
    config = {**schema_defaults(), **run.config}
    setting = training_setting(run) + tuple((k, json.dumps(config.get(k))) for k in MEASUREMENT)
    if by_tokenizer:
        setting += (("data.tokenizer", json.dumps(tokenizer_text(run))),)
    return setting


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
