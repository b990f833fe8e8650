"""Encodings are found by their config name; each module registers itself on import."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.errors import PosbenchError

ENCODINGS: dict[str, type[PositionalEncoding]] = {}


def register(name: str) -> Callable[[type[PositionalEncoding]], type[PositionalEncoding]]:
    """Class decorator: make an encoding available as ``encoding=<name>``."""

    def add(cls: type[PositionalEncoding]) -> type[PositionalEncoding]:
        assert name not in ENCODINGS, f"encoding {name!r} registered twice"
        assert cls.Config.name == name, f"{cls.__name__}.Config.name must be {name!r}"
        ENCODINGS[name] = cls
        return cls

    return add


def encoding_names() -> list[str]:
    """Every registered encoding name, sorted."""
    return sorted(ENCODINGS)


def encoding_config(values: Mapping[str, Any] | EncodingConfig) -> EncodingConfig:
    """A typed config for the encoding named in ``values`` (a mapping, DictConfig or dataclass),
    with that encoding's defaults filled in."""
    name = values["name"] if isinstance(values, Mapping) else values.name
    if name not in ENCODINGS:
        raise PosbenchError(
            f"unknown encoding {name!r}; choose one of: {', '.join(encoding_names())}"
        )
    if isinstance(values, DictConfig):  # resolve ${...} against the whole config first
        values = OmegaConf.to_container(values, resolve=True)
    schema = OmegaConf.structured(ENCODINGS[name].Config)
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, values))
    except OmegaConfBaseException as err:
        first_line = str(err).strip().splitlines()[0]
        raise PosbenchError(f"bad {name} encoding config: {first_line}") from None


def build_encoding(
    values: Mapping[str, Any] | EncodingConfig, d_model: int, n_head: int
) -> PositionalEncoding:
    """Instantiate the encoding that ``values`` names, for a model of the given width."""
    config = encoding_config(values)
    return ENCODINGS[config.name](config, d_model=d_model, n_head=n_head)
