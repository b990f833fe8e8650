"""How a figure draws each row: one colour and marker per encoding, the same in every figure
(ENCODING_STYLES, grouped by family), the rows of one encoding told apart by line style and
marker fill; and which panel a row goes to where a figure has too many curves for one axes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from posbench.report.groups import Row

# One colour and marker per encoding, the same in every figure that draws encodings by name,
# grouped by family (a figure with more than PANEL_CURVES curves draws one panel per family).
# tests/test_report.py checks that every registered encoding has one: a new encoding picks its
# own here.
ENCODING_FAMILIES = {
    "no positions and absolute": {
        "none": ("black", "o"),
        "learned": ("tab:brown", "v"),
        "sinusoidal": ("tab:olive", "^"),
    },
    "rotary": {
        "rope": ("tab:blue", "s"),
        "xpos": ("tab:cyan", "D"),
        "hybrid": ("navy", "P"),
        "pope": ("deepskyblue", "v"),
    },
    "additive biases": {
        "alibi": ("tab:red", "o"),
        "t5": ("tab:orange", "v"),
        "kerple": ("tab:pink", "^"),
        "fire": ("tab:purple", "s"),
        "sandwich": ("gold", "D"),
    },
    "gated and contextual": {
        "fox": ("tab:green", "P"),
        "cope": ("tab:gray", "X"),
        "path": ("darkgreen", "h"),
    },
}
ENCODING_STYLES = {
    name: style for family in ENCODING_FAMILIES.values() for name, style in family.items()
}
REFERENCE_ENCODING = "none"  # NoPE: in every panel, the common reference
OTHER_FAMILY = "other encodings"  # the panel of encodings ENCODING_STYLES lacks

# An encoding ENCODING_STYLES lacks (registered after this map was written) takes the next
# colour and marker in the order its group first meets it; 8 colours and 7 markers give 56
# distinct pairs, none a colour of the map.
FALLBACK_COLOURS = (
    "teal",
    "maroon",
    "yellowgreen",
    "magenta",
    "darkkhaki",
    "slateblue",
    "sienna",
    "darkseagreen",
)
FALLBACK_MARKERS = ("h", "p", "*", "<", ">", "d", "8")

# The colours of an encoding's variants where a figure draws one encoding's (variant_colour_styles):
# distinct from each other and from black (NoPE) and tab:blue (RoPE).
VARIANT_COLOURS = (
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
    "tab:cyan",
    "navy",
    "gold",
    "teal",
    "magenta",
)

# The rows of one encoding, in turn: these line styles with filled markers, then again with
# hollow ones, then ever longer dashes.
LINE_STYLES = ("-", "--", "-.", ":")
FILLS = ("full", "none")

# A figure with more curves than this draws one panel per family (family_rows).
PANEL_CURVES = 8


def encoding_style(encoding: str, dashed: bool = False) -> dict[str, str]:
    """The colour and marker of ``encoding`` (ENCODING_STYLES), its line dashed for a variant."""
    colour, marker = ENCODING_STYLES[encoding]
    return {"color": colour, "marker": marker, "linestyle": "--" if dashed else "-"}


def variant_style(variant: int) -> dict[str, Any]:
    """The line style and marker fill of an encoding's ``variant``-th row (0: solid, filled)."""
    if variant < len(LINE_STYLES) * len(FILLS):
        linestyle: Any = LINE_STYLES[variant % len(LINE_STYLES)]
    else:  # a dash as long as the variant's number: never one drawn before
        linestyle = (0, (variant - 4, 2))
    return {"linestyle": linestyle, "fillstyle": FILLS[variant // len(LINE_STYLES) % len(FILLS)]}


def row_styles(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Each row's colour, marker, line style and marker fill, in the order of ``rows``: the
    colour and marker of its encoding (ENCODING_STYLES, by ``row.name``), its line style and
    fill its place among the rows of that encoding (variant_style), those measured as trained
    first, then in the order of ``rows``. An encoding the map lacks takes the next
    FALLBACK_COLOURS and FALLBACK_MARKERS in the order of ``rows``, its rows' line styles
    starting one further for each round of the colours: distinct, the same on every call."""
    unknown = [n for n in dict.fromkeys(row.name for row in rows) if n not in ENCODING_STYLES]
    variants = Counter(
        {name: k // len(FALLBACK_COLOURS) for k, name in enumerate(unknown)}
    )  # how many rows of each encoding have a style
    styles: list[dict[str, Any]] = [{} for _ in rows]
    for index in sorted(range(len(rows)), key=lambda i: not rows[i].as_trained):
        name = rows[index].name
        if name in ENCODING_STYLES:
            colour, marker = ENCODING_STYLES[name]
        else:
            k = unknown.index(name)
            colour = FALLBACK_COLOURS[k % len(FALLBACK_COLOURS)]
            marker = FALLBACK_MARKERS[k % len(FALLBACK_MARKERS)]
        styles[index] = {"color": colour, "marker": marker, **variant_style(variants[name])}
        variants[name] += 1
    return styles


def variant_colour_styles(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """row_styles for a figure of one encoding's variants (RoPE's extensions, options and
    attention variants), where one colour would leave them told apart by line style alone:
    each encoding's first row keeps its colour and the others take VARIANT_COLOURS in turn,
    with their line styles and fills as row_styles gives them."""
    styles = row_styles(rows)
    seen: set[str] = set()
    turn = 0
    for row, style in zip(rows, styles, strict=True):
        if row.name in seen:
            style["color"] = VARIANT_COLOURS[turn % len(VARIANT_COLOURS)]
            turn += 1
        seen.add(row.name)
    return styles


def family_order(rows: Sequence[Row]) -> list[Row]:
    """``rows`` by family (the order of ENCODING_STYLES; encodings it lacks last), each
    encoding's rows in their own order: a legend reads family by family."""
    order = list(ENCODING_STYLES)
    return sorted(rows, key=lambda row: order.index(row.name) if row.name in order else len(order))


def family_rows(rows: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    """The panels of a crowded figure: each family of ENCODING_FAMILIES that has a row other
    than NoPE, NoPE's rows first in every panel as the common reference, then the family's rows
    in family_order; the encodings ENCODING_STYLES lacks in a last panel, OTHER_FAMILY. One
    panel of every row, untitled, where no row is of another encoding than NoPE."""
    reference = [row for row in rows if row.name == REFERENCE_ENCODING]
    panels = []
    for family, members in [*ENCODING_FAMILIES.items(), (OTHER_FAMILY, None)]:
        own = [
            row
            for row in family_order(rows)
            if row.name != REFERENCE_ENCODING
            and (row.name in members if members is not None else row.name not in ENCODING_STYLES)
        ]
        if own:
            panels.append((family, reference + own))
    return panels or [("", list(rows))]
