"""``train.init_from``: a run that starts from another run's weights (a fine-tune), e.g. after
switching on a RoPE scaling method, which is how position interpolation and YaRN are used.

The child keeps the parent's model shape and encoding; only ``encoding.scaling`` may differ,
and it is then applied while training too (``encoding.scaling.in_training``). Or the child drops
the parent's encoding, ``encoding=none`` (DroPE, Gelberg et al. 2025, arXiv 2512.12167: RoPE
dropped for a short recalibration at the training length): every weight the parent has then
loads into the child, so only an encoding without weights of its own (rope, alibi, xpos, ...)
and without a window may be dropped; adding one, or dropping FIRE's MLP or a learned table, has
no well-defined start and is refused in one line (``check_droppable``); the switch may add
QK-norm (``model.qk_norm``), as the reference does. Encoding options
the child did not set explicitly but derived from its own config (``original_length:
${train.seq_len}``, FIRE's initial threshold, ...) take the parent's values, so that a child
trained at a longer length still extends from the parent's training length. Every refusal
but a vocabulary that differs (known once the data loads) comes before the run writes anything
(``fine_tune_config``).
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from posbench.encodings import build_encoding, encoding_config
from posbench.errors import PosbenchError
from posbench.model import ModelArgs, Transformer
from posbench.runs.directory import (
    WEIGHTS_FILE,
    load_weights,
    saved_config,
    weights_description,
)

SCALING = "scaling"  # the encoding options a fine-tune may change
NO_ENCODING = "none"  # the encoding a fine-tune may switch to (DroPE)


def parent_dir(cfg: DictConfig) -> Path | None:
    """The run ``train.init_from`` names (None: a run from scratch), or a one-line error when
    it is not a finished run."""
    if cfg.train.init_from is None:
        return None
    parent = Path(cfg.train.init_from)
    if not (parent / WEIGHTS_FILE).is_file():
        raise PosbenchError(
            f"train.init_from={parent} holds no {WEIGHTS_FILE}; point it at the directory of a "
            "finished `posbench train` run"
        )
    return parent


def fine_tune_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` prepared for a start from ``train.init_from`` (unchanged without it): derived
    encoding options take the parent's values, scaling applies in training, and an encoding
    that differs from the parent's in anything but ``scaling`` is a one-line error."""
    parent = parent_dir(cfg)
    if parent is None:
        return cfg
    parent_cfg = saved_config(parent)
    if parent_cfg.encoding.name != cfg.encoding.name:
        if cfg.encoding.name != NO_ENCODING:
            raise PosbenchError(
                f"train.init_from={parent} was trained with encoding={parent_cfg.encoding.name}, "
                f"not {cfg.encoding.name}; a fine-tune keeps the parent's encoding or drops it "
                f"(encoding={NO_ENCODING}, DroPE)"
            )
        check_droppable(parent_cfg, parent)
        check_parent_model(cfg, parent)
        return cfg
    cfg = copy.deepcopy(cfg)
    inherit_derived_options(cfg.encoding, parent_cfg.encoding)
    if OmegaConf.select(cfg, "encoding.scaling") is not None:
        cfg.encoding.scaling.in_training = True
    ours, theirs = encoding_options(cfg.encoding), encoding_options(parent_cfg.encoding)
    for key in sorted(ours.keys() | theirs.keys()):
        if ours.get(key) != theirs.get(key):
            raise PosbenchError(
                f"train.init_from={parent} was trained with encoding.{key}={theirs.get(key)}, "
                f"not {ours.get(key)}; a fine-tune may change only encoding.{SCALING}.*"
            )
    check_parent_model(cfg, parent)
    return cfg


def check_parent_model(cfg: DictConfig, parent: Path) -> None:
    """The parent's model shape against ``cfg``'s, from its weights file's description (no
    tensor read), so that a refusal comes before the run writes anything. The vocabulary,
    known once the data is loaded, is checked as the weights load (load_parent_weights)."""
    description = weights_description(parent / WEIGHTS_FILE)
    theirs = ModelArgs(**description["model"]).to_dict()  # a key newer than it: its default
    ours = {k: v for k, v in ModelArgs(**cfg.model).to_dict().items() if k != "vocab_size"}
    drops = cfg.encoding.name == NO_ENCODING != description["encoding"]["name"]
    same_shape(parent, theirs, ours, drops)


def same_shape(parent: Path, theirs: dict[str, Any], ours: dict[str, Any], drops: bool) -> bool:
    """A one-line error where the model args ``ours`` differ from the parent's ``theirs``;
    whether the child adds QK-norm, as DroPE's switch to no encoding (``drops``) may: the
    reference does to models pretrained without it (SakanaAI/DroPE's qk_norm_nope)."""
    adds_qk_norm = drops and ours["qk_norm"] and not theirs["qk_norm"]
    for key in ours:
        if key == "sigmoid_length" and ours["attention"] != "sigmoid":
            continue  # train.seq_len's, unused: a fine-tune at another length keeps the model
        if key == "qk_norm" and adds_qk_norm:
            continue
        if theirs[key] != ours[key]:
            raise PosbenchError(
                f"train.init_from={parent} holds a model with model.{key}={theirs[key]}, not "
                f"{ours[key]}; a fine-tune keeps the parent's model shape (DroPE's switch to "
                f"encoding={NO_ENCODING} may add model.qk_norm)"
            )
    return adds_qk_norm


def check_droppable(parent_cfg: DictConfig, parent: Path) -> None:
    """Refuse, in one line, to drop an encoding that holds weights (the NoPE child has no place
    for them) or a window (dropping it would widen attention, not only drop positions)."""
    model = parent_cfg.model
    encoding = build_encoding(parent_cfg.encoding, model.d_model, model.n_head)
    layers = encoding.layer_encodings(model.n_layer)
    name = parent_cfg.encoding.name
    weights = sorted({key for layer in layers for key in layer.state_dict()})
    if weights:
        raise PosbenchError(
            f"train.init_from={parent} was trained with encoding={name}, whose own weights "
            f"({', '.join(weights)}) a model without positional encoding has no place for; "
            f"encoding={NO_ENCODING} drops only an encoding without weights "
            "(rope, alibi, xpos, ...)"
        )
    window = next((layer.window for layer in layers if layer.window is not None), None)
    if window is not None:
        raise PosbenchError(
            f"train.init_from={parent} was trained with encoding={name} attending to windows of "
            f"{window} tokens; encoding={NO_ENCODING} would widen attention, not only drop "
            "positions: fine-tune it with its own encoding"
        )


def inherit_derived_options(ours: DictConfig, parent: DictConfig) -> None:
    """Replace, in place, every option of ``ours`` that is an interpolation (derived from
    the rest of the config, not set by the user) by the parent's resolved value."""
    for key in list(ours.keys()):
        if OmegaConf.is_interpolation(ours, key) and key in parent:
            ours[key] = parent[key]
        elif isinstance(ours[key], DictConfig) and isinstance(parent.get(key), DictConfig):
            inherit_derived_options(ours[key], parent[key])


def encoding_options(encoding: DictConfig) -> dict[str, Any]:
    """The encoding's options a fine-tune must keep: all but ``scaling``, resolved, with the
    encoding's defaults for options a parent's config predates (FIRE's ``per_layer``)."""
    options = asdict(encoding_config(encoding))
    options.pop(SCALING, None)
    return options


def load_parent_weights(model: Transformer, cfg: DictConfig) -> None:
    """Copy the weights of the run ``train.init_from`` names into ``model``, which must have
    the same shape (a one-line error otherwise)."""
    parent = parent_dir(cfg)
    assert parent is not None, "load_parent_weights needs train.init_from"
    source = load_weights(parent / WEIGHTS_FILE)
    drops = model.encoding.config.name == NO_ENCODING != source.encoding.config.name
    # the new QK-norm gains start at 1, every other weight loads
    adds_qk_norm = same_shape(parent, source.args.to_dict(), model.args.to_dict(), drops)
    added = {key for key in model.state_dict() if ".qk_norm." in key} if adds_qk_norm else set()
    loaded = model.load_state_dict(source.state_dict(), strict=not added)
    assert set(loaded.missing_keys) == added and not loaded.unexpected_keys, loaded
