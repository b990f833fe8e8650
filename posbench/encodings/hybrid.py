"""Hybrid: a schedule of encodings over the layers, e.g. NoPE every fourth layer.

``layers`` names each layer's encoding, and the pattern repeats over ``model.n_layer``
(default ``[rope, none]``, alternating): ``[rope, rope, rope, none]`` is Llama 4's iRoPE (three
RoPE layers, then one without positions; Meta 2025, "The Llama 4 herd"), and the same with a
``window`` Cohere's RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid
Attention Strategy", https://arxiv.org/abs/2501.18795: RoPE layers attend within a sliding
window, NoPE layers globally). Every layer that encodes positions (every one but ``none``)
gets the ``window``; the ``none`` layers keep full attention (Llama 4 chunks the RoPE layers'
attention where posbench slides a window: the same memory bound, no chunk edges).

Each named encoding keeps its own options, under ``encodings.<name>`` (conf/encoding/hybrid.yaml
composes every encoding's own config there, so ``encoding.encodings.rope.base=500000`` sets the
RoPE layers' base). One instance of each name serves all its layers, as one encoding serves
every layer of a plain model; a ``per_layer`` one (FoX, CoPE, or FIRE with ``per_layer``) gets
a fresh instance for each of its layers. Encodings that add positions to the embeddings
(learned, sinusoidal) act once, before the first layer, so they cannot be scheduled per layer.

A hybrid of one encoding everywhere computes exactly what that encoding computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import ENCODINGS, encoding_config, encoding_names, register
from posbench.errors import PosbenchError


@dataclass
class HybridConfig(EncodingConfig):
    name: str = "hybrid"
    # each layer's encoding, repeated over model.n_layer
    layers: list[str] = field(default_factory=lambda: ["rope", "none"])
    # tokens a query attends to in every layer but the `none` ones; null: every key
    window: int | None = None
    # each named encoding's options, by name (conf/encoding/hybrid.yaml composes them)
    encodings: dict[str, Any] = field(default_factory=dict)


def layer_names() -> list[str]:
    """The registered encodings a hybrid can schedule: those that act inside attention."""
    return [name for name in encoding_names() if name != "hybrid" and not embeds(ENCODINGS[name])]


def embeds(cls: type[PositionalEncoding]) -> bool:
    """Whether encodings of this class add positions to the token embeddings."""
    return cls.embed is not PositionalEncoding.embed


@register("hybrid")
class HybridEncoding(PositionalEncoding):
    Config = HybridConfig

    def __init__(self, config: HybridConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if not config.layers:
            raise PosbenchError("encoding.layers is empty; name one encoding per layer")
        allowed = layer_names()
        for name in config.layers:
            if name not in allowed:
                raise PosbenchError(
                    f"encoding.layers: {name!r} cannot be a hybrid layer; choose from "
                    f"{', '.join(allowed)} (learned and sinusoidal add positions to the "
                    "embeddings, once, not per layer)"
                )
        if config.window is not None and config.window < 1:
            raise PosbenchError(f"encoding.window must be at least 1 or null (got {config.window})")
        self.members = nn.ModuleDict()
        for name in dict.fromkeys(config.layers):  # each name once, in order
            # Options not given (the Python API) are the encoding's defaults.
            options = encoding_config(config.encodings.get(name) or {"name": name})
            if options.name != name:
                raise PosbenchError(
                    f"encoding.encodings.{name} configures {options.name!r}, not {name!r}"
                )
            member = ENCODINGS[name](options, d_model, n_head)
            member.window = None if name == "none" else config.window
            self.members[name] = member

    def layer_encodings(self, n_layer: int) -> list[PositionalEncoding]:
        schedule = [self.config.layers[i % len(self.config.layers)] for i in range(n_layer)]
        encodings, seen = [], set()
        for name in schedule:
            member = self.members[name]
            if member.per_layer and name in seen:  # its own parameters in every layer
                member = type(member)(member.config, self.d_model, self.n_head)
                member.window = self.members[name].window
            encodings.append(member)
            seen.add(name)
        return encodings

    @property
    def max_length(self) -> int | None:
        bounds = [m.max_length for m in self.members.values() if m.max_length is not None]
        return min(bounds, default=None)

    def beyond_max_length_remedy(self, length: int, trained: bool = True) -> str:
        bounded = [m for m in self.members.values() if m.max_length is not None]
        return min(bounded, key=lambda m: m.max_length).beyond_max_length_remedy(length, trained)

    def scaling_record(self, length: int) -> dict[str, Any]:
        """The record of the first layer encoding that scales at ``length`` (RoPE's YaRN in
        the RoPE layers), else the record of none."""
        records = (member.scaling_record(length) for member in self.members.values())
        scaled = (record for record in records if record["scaling"] != "none")
        return next(scaled, super().scaling_record(length))
