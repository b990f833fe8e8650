"""Positional encodings: one module per encoding, each registered under its config name.

Importing this package imports every module in it, so adding an encoding is one new file
here plus one ``conf/encoding/<name>.yaml``.
"""

import importlib
import pkgutil

from posbench.encodings.alibi import alibi_slopes
from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import (
    ENCODINGS,
    build_encoding,
    encoding_config,
    encoding_names,
)
from posbench.encodings.rope import apply_rope
from posbench.encodings.sinusoidal import sinusoidal_table
from posbench.encodings.t5 import t5_bucket

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ENCODINGS",
    "EncodingConfig",
    "PositionalEncoding",
    "alibi_slopes",
    "apply_rope",
    "build_encoding",
    "encoding_config",
    "encoding_names",
    "sinusoidal_table",
    "t5_bucket",
]
