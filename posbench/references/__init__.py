"""Published results a sweep is read against: ``posbench report DIR --reference NAME``.

A reference is one JSON file: ``<name>.json`` in this directory (``alibi-wt103``, the ALiBi
paper's Tables 2 and 3), or any such file given by its path. It holds

- ``title``, ``citation``, ``url``: what the numbers are and where they were published, and
  ``provenance``: how they were checked against that publication;
- ``metric``: the report metric they are (``word_ppl``, ``ppl`` or ``bits_per_byte``), and
  ``protocol`` and ``model``: how they were measured, in words;
- ``encodings``: each posbench encoding name it has numbers for -> the publication's name;
- ``tables``: one per training length, each with its ``source`` (``"Table 2"``),
  ``train_seq_len``, ``values`` (encoding -> {evaluation length: value, or null where the
  publication has no number}) and ``missing`` (encoding -> why its nulls are null).

Every encoding of a table has a number at the table's training length: a ratio to the training
length is what a report compares, and it divides by that number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbench.errors import PosbenchError

DIRECTORY = Path(__file__).resolve().parent
SUFFIX = ".json"
FIELDS = ("title", "citation", "url", "provenance", "metric", "protocol", "model")
TABLE_FIELDS = ("source", "train_seq_len", "values", "missing")


@dataclass(frozen=True)
class ReferenceTable:
    """A publication's numbers for models trained at one length: encoding -> length -> value
    (None where it has no number, ``missing`` saying why)."""

    source: str
    train_seq_len: int
    values: dict[str, dict[int, float | None]]
    missing: dict[str, str]

    @property
    def lengths(self) -> list[int]:
        """Every evaluation length any encoding of the table has (a number or a null) at."""
        return sorted({length for by_length in self.values.values() for length in by_length})

    def ratio_points(self, encoding: str) -> list[tuple[int, float]]:
        """(length, ratio) at every length where the table has a number for ``encoding``."""
        return [(n, r) for n in self.lengths if (r := self.ratio(encoding, n)) is not None]

    def ratio(self, encoding: str, length: int) -> float | None:
        """``encoding``'s value at ``length`` over its value at the training length (None
        where the table has no number at ``length``)."""
        value = self.values[encoding].get(length)
        return None if value is None else value / self.values[encoding][self.train_seq_len]


@dataclass(frozen=True)
class Reference:
    """A reference file's citation, metric and tables (the module docstring)."""

    name: str
    title: str
    citation: str
    url: str
    provenance: str
    metric: str
    protocol: str
    model: str
    encodings: dict[str, str]
    tables: tuple[ReferenceTable, ...]

    def table(self, train_seq_len: int) -> ReferenceTable | None:
        """The table of models trained at ``train_seq_len``, if the reference has one."""
        return next((t for t in self.tables if t.train_seq_len == train_seq_len), None)


def reference_names() -> list[str]:
    """The references shipped with posbench, by name."""
    return sorted(path.stem for path in DIRECTORY.glob(f"*{SUFFIX}"))


def load_reference(setting: str) -> Reference:
    """The reference ``setting`` names: a shipped one by name, or a JSON file by path; a
    one-line error for an unknown name (listing the known ones) or a malformed file."""
    path = Path(setting).expanduser()
    if setting not in reference_names() and not path.is_file():
        raise PosbenchError(
            f"--reference must be a reference posbench ships ({', '.join(reference_names())}) "
            f"or the path of a reference JSON file (got {setting!r})"
        )
    if setting in reference_names():
        path = DIRECTORY / f"{setting}{SUFFIX}"
    try:
        return parsed(path.stem, json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError) as error:
        raise PosbenchError(
            f"{path} is not a reference file ({error}); posbench/references/__init__.py "
            "describes the format"
        ) from None


def require(mapping: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    """ValueError unless ``mapping`` (a JSON object) has every one of ``keys``."""
    if missing := [key for key in keys if key not in mapping]:
        raise ValueError(f"{where} lacks {', '.join(missing)}")


def parsed(name: str, content: dict[str, Any]) -> Reference:
    """A Reference from a reference file's JSON ``content``; ValueError (or TypeError) where it
    does not hold what the module docstring lists."""
    require(content, (*FIELDS, "encodings", "tables"), "it")
    texts = {key: content[key] for key in FIELDS}
    if not all(isinstance(text, str) for text in texts.values()):
        raise ValueError(f"{', '.join(FIELDS)} must be strings")
    tables = tuple(parsed_table(table, set(content["encodings"])) for table in content["tables"])
    if not tables:
        raise ValueError("it has no tables")
    if len({table.train_seq_len for table in tables}) < len(tables):
        raise ValueError("two tables have the same train_seq_len")
    return Reference(name, **texts, encodings=dict(content["encodings"]), tables=tables)


def parsed_table(table: dict[str, Any], encodings: set[str]) -> ReferenceTable:
    """One table of a reference file (its ``encodings`` named in the file's ``encodings``)."""
    require(table, TABLE_FIELDS, "a table")
    source, train_seq_len = table["source"], table["train_seq_len"]
    if not isinstance(train_seq_len, int) or train_seq_len <= 0:
        raise ValueError(f"{source}'s train_seq_len is not a positive integer")
    values = {
        encoding: {int(length): value for length, value in by_length.items()}
        for encoding, by_length in table["values"].items()
    }
    if unknown := sorted(set(values) - encodings):
        raise ValueError(f"{source}'s {', '.join(unknown)} are not in its encodings")
    for encoding, by_length in values.items():
        if not all(length > 0 for length in by_length):
            raise ValueError(f"{source}'s {encoding} has a length that is not positive")
        if any(not is_value(value) for value in by_length.values()):
            raise ValueError(f"{source}'s {encoding} has a value that is neither > 0 nor null")
        if by_length.get(train_seq_len) is None:
            raise ValueError(f"{source}'s {encoding} has no value at its train_seq_len")
        if None in by_length.values() and encoding not in table["missing"]:
            raise ValueError(f"{source}'s {encoding} has nulls that missing does not explain")
    return ReferenceTable(source, train_seq_len, values, dict(table["missing"]))


def is_value(value: Any) -> bool:
    """Whether ``value`` is a table cell: null or a finite positive number."""
    if value is None:
        return True
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0
