"""dynamo's recompile limits, under the names the installed torch gives them."""

from __future__ import annotations

import torch


def raised_recompile_limits(minimum: int) -> dict[str, int]:
    """dynamo's recompile limits (per function, and per function over all objects) raised to at
    least ``minimum``: past them dynamo runs the rest uncompiled, saying so only in a warning.
    Keys as torch 2.7 and later name them (``recompile_limit``, ``accumulated_recompile_limit``)
    or as earlier versions did (``cache_size_limit``, ``accumulated_cache_size_limit``, aliases
    since); for ``torch._dynamo.config.patch`` or setattr."""
    config = torch._dynamo.config
    if hasattr(config, "recompile_limit"):
        names = ("recompile_limit", "accumulated_recompile_limit")
    else:
        names = ("cache_size_limit", "accumulated_cache_size_limit")
    return {name: max(getattr(config, name), minimum) for name in names}
