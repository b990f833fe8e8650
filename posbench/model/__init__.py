"""The model: a small decoder-only transformer (model.py) built from ``ModelArgs`` (args.py),
its attention paths (attention/), the queries' scaling (attention_scaling.py), the next-token
loss (loss.py), the key-value cache a decode steps with (kv_cache.py) and the positions
randomized training draws (random_positions.py). The positional encodings it asks are
posbench/encodings/'s.

``from posbench.model import Transformer, build_model, ModelArgs`` gives what a script builds
a model from."""

from posbench.model.args import ModelArgs
from posbench.model.model import Transformer, build_model

__all__ = ["ModelArgs", "Transformer", "build_model"]
