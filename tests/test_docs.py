"""The docs' code blocks run as written: every ```python and ```bash block of README.md and of
docs/*.md, against small runs; and the docs site's pages and tables match the code.

Each block runs in a fresh copy of one working directory that holds what README's first
command leaves (a `posbench train encoding=rope` run) plus a small sweep. A block marked
``<!-- docs-test: skip (reason) -->`` on the line before it is skipped with that reason:
those need the network, a cluster, a server or minutes, or are CI itself (README's first
block: .ci/run runs its commands as written in a fresh venv; tests/test_ci.py checks that).

Two things keep the blocks cheap without editing what users read:

* ``posbench`` here is a small script that appends ``TRAIN_OVERRIDES`` (a one-layer model,
  40 steps, short lengths) to every ``posbench train``; the command line's last value of a
  key wins in Hydra, so README's own overrides are still parsed and checked; it runs each
  command forked from the worker's warm interpreter (tests/forkserver.py), as the ``python``
  blocks run, and so does ``torchrun ... -m posbench``'s each rank (``posbench-rank``, by
  substitution);
* ``SUBSTITUTIONS`` replaces README's placeholders with the directories they stand for.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import RANK_ENV, TINY_RUN, built_once, forked_posbench, forked_python

from posbench.commands.overrides import group_options
from posbench.data import ALGORITHMIC_TASKS
from posbench.encodings import encoding_names

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
# README's `posbench diagnose --length 2048` averages its default 4 windows: 4 x 2048 + 1 bytes.
TRAIN_OVERRIDES = [
    *TINY_RUN,
    "data.train_tokens=40000",
    "data.val_tokens=8193",
    "data.successors=2",
    "data.document_length=512",
]

# (pattern, replacement, why): applied, in order, to each bash block before it runs.
SUBSTITUTIONS = [
    (
        r"outputs/multirun/<date>/<time1> outputs/multirun/<date>/<time2>",
        "$(newest outputs/multirun/*/*/) outputs/multirun",
        "two sweeps' directories: the newest and the folder of all (its runs counted once)",
    ),
    (
        r"outputs/multirun/<date>/<time>/",
        "$(newest outputs/multirun/*/*/)",
        "a sweep directory: the newest one",
    ),
    (
        r"outputs/(<date>/<time>|\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d|\.\.\./\d\d-\d\d-\d\d)_rope/",
        "$(newest outputs/*/*_rope/)",
        "a rope run's directory: the newest one",
    ),
    (
        r"^torchrun (.*?)-m posbench\b",
        f"{shlex.quote(sys.executable)} -m torch.distributed.run \\1--no-python posbench-rank",
        "torchrun, run by the interpreter that runs the tests; each rank runs `posbench-rank`, the"
        " shim's `posbench` forked from a warm interpreter in a rank's environment",
    ),
    (
        r"\+experiment=extrapolation(?=\s)",
        "+experiment=extrapolation encoding=rope seed=0",
        "the experiment's 24 jobs, narrowed to one as README shows",
    ),
]
# Defined before each bash block: the newest of the directories a glob matches (their names
# are dates and times, so the last in name order).
PRELUDE = 'set -e\nnewest() { ls -d "$@" | sort | tail -n 1; }\n'

# `posbench`, with the small-run overrides after `train`'s own arguments, forked from the
# worker's warm interpreter (conftest.forked_posbench).
SHIM = """#!/bin/sh
if [ "$1" = train ]; then
    exec {posbench} "$@" {overrides}
fi
exec {posbench} "$@"
"""

BLOCK = re.compile(
    r"(?:<!-- docs-test: skip \((?P<skip>[^)]*)\) -->\n)?^```(?P<lang>python|bash)\n"
    r"(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


def code_blocks() -> list:
    """One pytest param per python/bash block of every page, named by page, language and line."""
    params = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("code"))
            marks = [pytest.mark.slow]
            if match["skip"]:
                marks.append(pytest.mark.skip(reason=match["skip"]))
            block = (match["lang"], match["code"])
            name = f"{page.stem}-{match['lang']}-line{line}"
            params.append(pytest.param(*block, id=name, marks=marks))
    return params


def substituted(code: str) -> str:
    for pattern, replacement, _ in SUBSTITUTIONS:
        code = re.sub(pattern, replacement, code, flags=re.MULTILINE)
    return code


def run(command: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{command[-1]}\nfailed:\n{result.stdout}\n{result.stderr}"
    return result


def with_shim(env: dict, bin_dir: Path, name: str, posbench: list[str]) -> dict:
    """``env`` with ``name`` on its PATH first: SHIM running ``posbench`` (a command)."""
    shim = bin_dir / name
    command = " ".join(map(shlex.quote, posbench))
    shim.write_text(SHIM.format(posbench=command, overrides=" ".join(TRAIN_OVERRIDES)))
    shim.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


@pytest.fixture(scope="session")
def readme_env(tmp_path_factory, cache_dir):
    """The environment README's commands run in: ``posbench`` is the shim."""
    bin_dir = tmp_path_factory.mktemp("bin")
    return with_shim(dict(os.environ), bin_dir, "posbench", forked_posbench())


@pytest.fixture(scope="session")
def trained_workdir(tmp_path_factory, readme_env):
    """A directory holding what README's first command leaves, and a small sweep (built once
    for every worker: each test runs in a copy)."""
    commands = "posbench train encoding=rope\nposbench train -m encoding=none,rope\n"
    return built_once(
        tmp_path_factory,
        "readme-runs",
        lambda workdir: run(["bash", "-c", PRELUDE + commands], workdir, readme_env),
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_block_that_is_not_run_says_why(page):
    """The marker must sit right before its block; a misplaced one would run a slow block."""
    text = page.read_text()
    markers = re.findall(r"^<!-- docs-test: skip", text, flags=re.MULTILINE)
    assert len(markers) == sum(1 for m in BLOCK.finditer(text) if m["skip"])


@pytest.mark.parametrize(("lang", "code"), code_blocks())
def test_code_block_runs(lang, code, trained_workdir, readme_env, tmp_path):
    """Over 20 s for some blocks: getting-started's and README's command lists run a dozen
    posbench commands each (the shim's commands, the python blocks and torchrun's ranks are
    forked from a warm interpreter: conftest.forked_posbench and forked_python)."""
    workdir = tmp_path / "work"
    shutil.copytree(trained_workdir, workdir, symlinks=True)
    if "torchrun" in code:  # its ranks' command (SUBSTITUTIONS)
        (tmp_path / "bin").mkdir()
        ranks = forked_posbench(RANK_ENV)
        readme_env = with_shim(readme_env, tmp_path / "bin", "posbench-rank", ranks)
    if lang == "python":
        run([*forked_python(), "-c", code], workdir, readme_env)
    else:
        run(["bash", "-c", PRELUDE + substituted(code)], workdir, readme_env)


# ----------------------------------------------------------------------------- the site


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table that starts with ``header``, as lists of cell texts."""
    lines = text[text.index(header) :].splitlines()[2:]  # past the header and its rule
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_tasks_page_lists_exactly_the_algorithmic_tasks():
    header = "| `data=` | family | prompt → answer | problem length | differs from the reference |"
    rows = markdown_table((DOCS / "tasks.md").read_text(), header)
    assert sorted(row[0].strip("`") for row in rows) == sorted(ALGORITHMIC_TASKS)


def test_every_page_in_docs_is_in_the_sites_navigation_and_back():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = {page for entry in config["nav"] for page in entry.values()}
    assert listed == {page.name for page in DOCS.glob("*.md")}


def test_the_encodings_table_lists_exactly_the_registered_encodings():
    rows = markdown_table((DOCS / "encodings.md").read_text(), "| name | what it does | paper |")
    assert [row[0].strip("`") for row in rows] == encoding_names()


def test_the_config_groups_table_lists_exactly_the_options_in_conf():
    header = "| group | options | what |"
    rows = markdown_table((DOCS / "getting-started.md").read_text(), header)
    documented = {row[0].strip("`"): re.findall(r"`([a-z0-9_]+)`", row[1]) for row in rows}
    groups = (
        "encoding",
        "model",
        "data",
        "logger",
        "experiment",
        "ruoss2023_encoding",
        "drope_method",
    )
    shipped = {group: group_options(group) for group in groups}
    assert {group: sorted(options) for group, options in documented.items()} == shipped


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda page: page.name)
def test_images_are_markdown_so_the_strict_build_checks_them(page):
    """`mkdocs build --strict` checks a Markdown image's path (attr_list sizes it: `{ width=
    "45%" }`), never a raw <img> tag's, which broke on the built site unnoticed."""
    assert not re.search(r"<img\b", page.read_text(), flags=re.IGNORECASE)


def test_the_api_examples_name_their_run_whatever_ran_after_readmes():
    """The newest run may be a task's or another encoding's (docs/tasks.md's run, a sweep's
    last job): an example that took it would crash or print a task's numbers as perplexity."""
    text = (DOCS / "api.md").read_text()
    calls = re.findall(r"latest_run\(([^)]*)\)", text)
    assert calls and all(call == 'encoding="rope", data="synthetic"' for call in calls)


def test_every_rendered_block_is_its_summarys_rendering():
    """Result tables in README and docs/ are rendered from results/ (python -m
    posbench.report.docs): a number edited by hand, or a summary replaced without rendering
    again, fails here."""
    from posbench.report.docs import render

    assert render(ROOT, check=True) == []


def test_a_number_edited_by_hand_in_a_rendered_block_fails_the_check(tmp_path):
    from posbench.report.docs import BLOCKS, FIGURES, RENDERED, pages, render

    for part in ("README.md", "docs", "results"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
        copy(ROOT / part, tmp_path / part)
    blocks = [(page, m) for page in pages(tmp_path) for m in RENDERED.finditer(page.read_text())]
    assert {m["name"] for _, m in blocks} == set(BLOCKS)  # every block stands somewhere
    page, match = next((p, m) for p, m in blocks if re.search(r"\d\.\d\d", m["body"]))
    number = re.search(r"\d\.\d\d", match["body"])
    edited = match["body"][: number.start()] + "9.99" + match["body"][number.end() :]
    text = page.read_text()
    page.write_text(text[: match.start("body")] + edited + text[match.end("body") :])
    name = f"{page.relative_to(tmp_path)}: {match['name']}"
    assert render(tmp_path, check=True) == [name]
    assert render(tmp_path) == [name] and render(tmp_path, check=True) == []
    assert all((tmp_path / figure).stat().st_size > 10_000 for figure in FIGURES)


def prose_paragraphs(text: str) -> list[list[str]]:
    """The paragraphs of a Markdown page outside code blocks, lists, tables, headings, comments
    and rendered blocks: runs of non-blank lines."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"<!-- rendered: .*?<!-- /rendered -->", "", text, flags=re.DOTALL)
    blocks = [block.splitlines() for block in re.split(r"\n\s*\n", text)]
    not_prose = ("|", "- ", "* ", "#", "<!--", "1. ", "![")
    return [lines for lines in blocks if lines and not lines[0].lstrip().startswith(not_prose)]


def test_readme_is_a_front_page():
    """Issue 54: at most 150 lines, and no paragraph over 6 (details go to docs/)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    long = [lines[0] for lines in prose_paragraphs(text) if len(lines) > 6]
    assert not long, f"paragraphs over 6 lines start: {long}"
