"""README's and docs/'s results, rendered from the summaries committed under results/ (summary.py;
published.py for a result whose runs are gone), never typed:

    python -m posbench.report.docs           # re-render every block and figure from results/
    python -m posbench.report.docs --check   # exit 1, naming each block a hand edit changed

A block in a Markdown file sits between ``<!-- rendered: NAME -->`` and ``<!-- /rendered -->``;
NAME is one of BLOCKS, each drawn from one summary by one function; a block whose summary is
not committed yet (its sweep is running) says that it awaits it, and shows no number. FIGURES
are the PNGs drawn the same way (the check compares the Markdown only: a PNG's bytes vary with
the fonts and the matplotlib build). Re-measuring a result: replace its summary, run this,
commit both.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posbench.report.docs.algorithmic import accuracy_panels, compact_table, detail_tables
from posbench.report.docs.corpus import (
    corpus_details,
    corpus_provenance,
    effective_lengths,
    long_context_table,
    main_group_figure,
    main_position_figure,
    ratio_table,
    rope_variants_figure,
)
from posbench.report.docs.drope import drope_results
from posbench.report.docs.published import (
    published_provenance,
    published_ratio_figure,
    published_ratio_table,
)
from posbench.report.docs.ruler import ruler_table, task_details
from posbench.report.docs.source import Source, provenance_line
from posbench.report.figures import FIGURE_DPI
from posbench.report.published import (
    PublishedTable,
    is_published_table,
    published_table,
)
from posbench.system.atomic import atomic_path, atomic_write

ROOT = Path(__file__).resolve().parents[3]  # the repository: README.md, docs/, results/
PAGES = ("README.md", "docs")  # the Markdown searched for blocks (docs/: every page)
RENDERED = re.compile(
    r"(?P<open><!-- rendered: (?P<name>[\w/.-]+) -->\n)(?P<body>.*?)(?P<close><!-- /rendered -->)",
    re.DOTALL,
)


EXTRAPOLATION = "results/extrapolation/synthetic.json"
RUOSS2023_CPU = "results/ruoss2023_cpu/sweep.json"
ALIBI_WT103_H200 = "results/alibi_wt103/h200.json"
DROPE = "results/drope/synthetic.json"
WIKITEXT2 = "results/extrapolation/wikitext2.json"
SYNTHETIC_LONGPPL = "results/extrapolation/synthetic_longppl.json"
RULER = "results/ruler/cpu.json"
RETRIEVAL = "results/retrieval/cpu.json"
# block name -> (summary or published table, what it shows)
BLOCKS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "extrapolation/table": (EXTRAPOLATION, ratio_table),
    "extrapolation/provenance": (EXTRAPOLATION, corpus_provenance),
    "extrapolation/details": (EXTRAPOLATION, corpus_details),
    "extrapolation/effective": (EXTRAPOLATION, effective_lengths),
    "ruoss2023_cpu/table": (RUOSS2023_CPU, compact_table),
    "ruoss2023_cpu/provenance": (RUOSS2023_CPU, provenance_line),
    "ruoss2023_cpu/details": (RUOSS2023_CPU, detail_tables),
    "alibi_wt103/h200/provenance": (ALIBI_WT103_H200, published_provenance),
    "alibi_wt103/h200/table": (ALIBI_WT103_H200, published_ratio_table),
    "drope/table": (DROPE, drope_results),
    "wikitext2/table": (WIKITEXT2, ratio_table),
    "wikitext2/long_context": (WIKITEXT2, long_context_table),
    "wikitext2/details": (WIKITEXT2, corpus_details),
    "synthetic_longppl/provenance": (SYNTHETIC_LONGPPL, provenance_line),
    "synthetic_longppl/long_context": (SYNTHETIC_LONGPPL, long_context_table),
    "ruler/table": (RULER, ruler_table),
    "ruler/details": (RULER, task_details),
    "retrieval/provenance": (RETRIEVAL, provenance_line),
    "retrieval/details": (RETRIEVAL, task_details),
}
# figure path -> (summary or published table, what it draws)
FIGURES: dict[str, tuple[str, Callable]] = {
    "docs/figures/extrapolation_synthetic.png": (EXTRAPOLATION, main_group_figure),
    "docs/figures/extrapolation_synthetic_rope.png": (EXTRAPOLATION, rope_variants_figure),
    "docs/figures/loss_by_position_synthetic.png": (EXTRAPOLATION, main_position_figure),
    "docs/figures/ruoss2023_cpu.png": (RUOSS2023_CPU, accuracy_panels),
    "docs/figures/alibi_protocol_wikitext2_h200.png": (ALIBI_WT103_H200, published_ratio_figure),
    "docs/figures/extrapolation_wikitext2.png": (WIKITEXT2, main_group_figure),
}


def load(root: Path, name: str) -> Source | PublishedTable:
    """The file ``name`` below ``root``, read once, as what it is: a summary or a published
    table."""
    path = root / name
    content = json.loads(path.read_text())
    if is_published_table(content):
        return published_table(name, path, content)
    return Source.of(name, path, content)


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def rendered_text(text: str, render: Callable[[str], str]) -> str:
    """``text`` with every block's body replaced by ``render(name)``."""
    return RENDERED.sub(
        lambda m: m["open"] + render(m["name"]).rstrip("\n") + "\n" + m["close"], text
    )


def render(root: Path = ROOT, check: bool = False) -> list[str]:
    """Re-render every block in README.md and docs/ (and, unless ``check``, every figure) from
    the summaries below ``root``; return the blocks whose text differed (``check``: left as
    they are), as ``page: block``."""
    sources: dict[str, Source | PublishedTable] = {}

    def source(summary: str) -> Source | PublishedTable:
        if summary not in sources:
            sources[summary] = load(root, summary)
        return sources[summary]

    def block(name: str) -> str:
        if name not in BLOCKS:
            raise SystemExit(f"error: no rendered block {name!r}; known: {', '.join(BLOCKS)}")
        summary, show = BLOCKS[name]
        if not (root / summary).is_file():  # its sweep has not run yet: no number to show
            return f"(Awaits `{summary}`: the commands above write it.)"
        return show(source(summary))

    differing = []
    for page in pages(root):
        text = page.read_text()
        new = rendered_text(text, block)
        if new != text:
            old_blocks = {m["name"]: m["body"] for m in RENDERED.finditer(text)}
            new_blocks = {m["name"]: m["body"] for m in RENDERED.finditer(new)}
            differing += [
                f"{page.relative_to(root)}: {name}"
                for name in new_blocks
                if new_blocks[name] != old_blocks.get(name)
            ]
            if not check:
                atomic_write(page, new.encode())
    if not check:
        for path, (summary, draw) in FIGURES.items():
            if not (root / summary).is_file():
                continue
            with atomic_path(root / path) as tmp:
                draw(source(summary)).savefig(tmp, format="png", dpi=FIGURE_DPI)
    return differing


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m posbench.report.docs",
        description="Render README's and docs/'s result tables and figures from results/.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 naming each block whose text differs from its rendering",
    )
    options = parser.parse_args(argv)
    differing = render(check=options.check)
    for entry in differing:
        print(("differs from its summary: " if options.check else "rendered: ") + entry)
    if options.check and differing:
        print("run `python -m posbench.report.docs` and commit; never edit a rendered block")
        sys.exit(1)
