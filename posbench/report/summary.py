"""A sweep's summary: the records ``posbench report`` reads from each run, kept in the repository
as data (``results/<experiment>/<name>.json``) after the run directories are gone.

    posbench report SWEEP --summary results/ruoss2023_cpu/sweep.json   # write it
    posbench report results/ruoss2023_cpu/sweep.json                   # read it as the runs

A summary holds, per finished run, its flattened config.yaml and its results.json without the
weights, checkpoints and TensorBoard files; and, once, where the runs came from as they
recorded it (every command that made them, the machines, days and commits; the sweep's wall
time: provenance). Tens of KB for a sweep of tens of runs (about 1.6 KB a run, the curve most of
it): what most runs hold alike is stored once (``config``, ``results``: common_part, each run
keeping how it differs), lists of records as columns (as_columns: a value equal in every record
that has it once), a part two runs hold alike but most do not once in a ``pool`` the runs refer
to (pooled), a loss-by-position curve only at the longest length the run has one (the report
draws a group's curves there: only_longest_curve), floats to SIGNIFICANT_DIGITS significant
digits. Reading it gives back the runs' config and results as dicts, rounding and the shorter
curves aside, so a report of the summary is the report of the runs. Re-measuring a result means
replacing its summary (docs are rendered from it: posbench/report/docs/).

A sweep run later adds its runs to a summary, written back as one:

    posbench report results/extrapolation/synthetic.json SWEEP --out OUT \
        --summary results/extrapolation/synthetic.json

Its runs are then named after their sweeps (``<sweep>/<run>``), and its provenance is the
first writing's with each later one's under ``added`` (provenance_parts).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
from collections import Counter
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from posbench.errors import PosbenchError
from posbench.report.published import is_published_table
from posbench.report.run import Run
from posbench.runs.directory import RESULTS_FILE
from posbench.system.atomic import atomic_write

SUMMARY_FORMAT = "posbench-summary/3"
# /1 stored every results.json entry in each run, /2 shared what all runs hold alike, /3 adds the
# pool and effective_context_length as columns: each earlier one reads as /3 without those
READABLE_FORMATS = ("posbench-summary/1", "posbench-summary/2", SUMMARY_FORMAT)
SIGNIFICANT_DIGITS = 6  # far below what a table shows; keeps a sweep's summary small
RECORD_LISTS = ("eval", "effective_context_length")  # results.json's lists stored as columns
POOLED_SIZE = 24  # a part of a run this long in JSON, found in two runs or more, is stored once
# no results.json or config key starts with "@": the summary's own markers do
POOL_REF = "@"  # {"@": i} in a run stands for the pool's entry i
ABSENT = "@absent"  # [key, ...] in a run's dict: keys of the shared dict the run's lacks
MULTIRUN_FILE = "multirun.yaml"  # Hydra's record of a sweep's overrides, in its directory
NOTHING = object()  # common_part of values that share nothing (None is a value they may share)


def is_summary(path: Path) -> bool:
    """Whether ``path`` names a summary file (``posbench report`` reads it as its runs)."""
    return path.suffix == ".json" and path.is_file()


def summary_content(runs: Sequence[Run], sources: Sequence[Path]) -> dict[str, Any]:
    """The summary of ``runs``, the finished runs found below ``sources``: sweep directories,
    and summaries whose runs it takes in as they are, with their provenance (a summary and a
    sweep that adds rows to it make one summary: provenance_parts, in the order of
    ``sources``, the sweep directories one part)."""
    if not runs:
        raise PosbenchError("no finished run to summarize")
    summaries = {source: summary_file_content(source) for source in sources if is_summary(source)}
    sweeps = [source for source in sources if source not in summaries]
    swept = [run for run in runs if not any(run.path.is_relative_to(s) for s in summaries)]
    parts: list[dict[str, Any]] = []
    for source in sources:
        if source in summaries:
            parts += provenance_parts(summaries[source]["provenance"])
        elif source == sweeps[0] and swept:
            parts.append(provenance(swept, sweeps))
    several = len(summary_sweeps({**parts[0], "added": parts[1:]})) > 1
    names = [run_name(run, sweeps, summaries, several) for run in runs]
    if repeated := sorted(name for name, n in Counter(names).items() if n > 1):
        raise PosbenchError(
            f"two runs are named {repeated[0]} (a sweep summarized twice, or two sweeps of one "
            "name); summarize each sweep once"
        )
    configs = [rounded(run.config) for run in runs]
    shared = common_part(configs)
    shared = {} if shared is NOTHING else shared
    first, *added = parts
    results = [compact_results(rounded(run.results)) for run in runs]
    shared_results = common_part(results)
    shared_results = {} if shared_results is NOTHING else shared_results
    own = [
        {
            "name": name,
            "config": difference(config, shared),
            "results": difference(result, shared_results),
        }
        for name, config, result in sorted(
            zip(names, configs, results, strict=True), key=lambda item: item[0]
        )
    ]
    pool, own = pooled(own)
    return {
        "format": SUMMARY_FORMAT,
        "provenance": {**first, "added": added} if added else first,
        "config": shared,
        "results": shared_results,
        "pool": pool,
        "runs": own,
    }


def write_summary(path: Path, runs: Sequence[Run], sources: Sequence[Path]) -> None:
    """Write the summary of ``runs`` (found below ``sources``: summary_content) to ``path``
    atomically, one line per pool entry and per run, for diffs; ``path`` may be one of
    ``sources``."""
    content = summary_content(runs, sources)
    lines = {key: content.pop(key) for key in ("pool", "runs")}
    text = json.dumps(content, indent=1)[:-2]
    for key, items in lines.items():
        rows = ",\n".join(json.dumps(item, separators=(",", ":")) for item in items)
        text += f',\n "{key}": [\n{rows}\n ]'
    atomic_write(path, (text + "\n}\n").encode())


def read_summary(path: Path) -> list[Run]:
    """The runs a summary holds, each at the path ``<summary>/<run name>`` (no such directory
    exists: the path names the run in tables and figures)."""
    return summary_runs(path, summary_file_content(path))


def summary_file_content(path: Path) -> dict[str, Any]:
    """The summary at ``path`` as its JSON; a one-line error where it is none."""
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PosbenchError(f"{path} is not a readable summary ({err}); write it again") from err
    check_summary(path, content)
    return content


def check_summary(path: Path, content: Any) -> None:
    """A one-line error where ``content``, read from ``path``, is no summary."""
    if is_published_table(content):
        raise PosbenchError(
            f"{path} is a published table, not a summary: it holds no per-run records to "
            "report (python -m posbench.report.docs renders it)"
        )
    if not isinstance(content, dict) or content.get("format") not in READABLE_FORMATS:
        raise PosbenchError(
            f'{path} is not a posbench summary (no "format": "{SUMMARY_FORMAT}"); pass a '
            "run directory, or a file written by `posbench report DIR --summary FILE`"
        )


def summary_runs(path: Path, content: dict[str, Any]) -> list[Run]:
    """The runs of the summary ``content`` read from ``path`` (read_summary)."""
    pool = content.get("pool", [])
    return [
        Run(
            path / run["name"],
            merged(content["config"], unpooled(run["config"], pool)),
            expanded_results(merged(content.get("results", {}), unpooled(run["results"], pool))),
        )
        for run in content["runs"]
    ]


def provenance_parts(provenance: dict[str, Any]) -> list[dict[str, Any]]:
    """A summary's provenance as one entry per writing from run directories: the first (the
    experiment's own sweep), then each written into it later (``added``: ``posbench report
    SUMMARY SWEEP --summary SUMMARY``), each with its sweeps' commands and names, runs,
    commits, machine, date and wall time."""
    first = {key: value for key, value in provenance.items() if key != "added"}
    return [first, *provenance.get("added", [])]


def summary_sweeps(provenance: dict[str, Any]) -> list[str]:
    """Every sweep a summary's runs came from, in the order they were written into it."""
    # a summary written before provenance named its sweeps: none known
    return [sweep for part in provenance_parts(provenance) for sweep in part.get("sweeps", [])]


def run_name(
    run: Run, sweeps: Sequence[Path], summaries: dict[Path, dict[str, Any]], several: bool
) -> str:
    """The run's directory below the sweep that holds it (its Hydra subdir), or its name in the
    summary that holds it; after its sweep's name when the summary is of ``several`` sweeps."""
    for summary, content in summaries.items():
        if run.path.is_relative_to(summary):
            name = run.path.relative_to(summary).as_posix()
            own = summary_sweeps(content["provenance"])
            # a summary of one sweep names its runs without the sweep's name
            return f"{own[0]}/{name}" if several and len(own) == 1 else name
    for sweep in sweeps:
        try:
            name = run.path.resolve().relative_to(sweep.resolve()).as_posix()
        except ValueError:
            continue
        return f"{sweep.resolve().name}/{name}" if several else name
    return run.path.name


def common_part(values: Sequence[Any]) -> Any:
    """What ``values`` share, stored once in a summary (each value keeps the rest: difference):
    the value itself where all are equal; for dicts, key by key, the common part of each key
    more than half of them have; else the value most of them hold; NOTHING where no two share
    anything."""
    texts = [json.dumps(v) for v in values]
    if all(text == texts[0] for text in texts):
        return values[0]
    if not all(isinstance(v, dict) for v in values):
        text, count = Counter(texts).most_common(1)[0]
        return values[texts.index(text)] if count > 1 else NOTHING
    keys = dict.fromkeys(key for v in values for key in v)
    common = {
        key: common_part([v[key] for v in values if key in v])
        for key in keys
        if 2 * sum(key in v for v in values) > len(values)
    }
    return {key: part for key, part in common.items() if part is not NOTHING} or NOTHING


def difference(value: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any]:
    """``value``'s entries that ``shared`` (a common_part it has a share in) does not hold, and
    under ABSENT the keys of ``shared`` it lacks: ``merged(shared, difference(value, shared))
    == value``."""
    own = {}
    for key, item in value.items():
        if key not in shared:
            own[key] = item
        elif json.dumps(item) != json.dumps(shared[key]):
            both = isinstance(item, dict) and isinstance(shared[key], dict)
            own[key] = difference(item, shared[key]) if both else item
    if lacking := [key for key in shared if key not in value]:
        own[ABSENT] = lacking
    return own


def merged(shared: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``difference`` undone: ``shared``'s entries with ``own``'s over them, dicts merged, the
    keys own lists under ABSENT left out."""
    lacking = {ABSENT, *own.get(ABSENT, [])}
    return {
        key: merged(shared[key], own[key])
        if isinstance(shared.get(key), dict) and isinstance(own.get(key), dict)
        else value
        for key, value in {**shared, **own}.items()
        if key not in lacking
    }


def only_longest_curve(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evaluation records with loss_by_position kept at the longest length that has one
    only: the report draws each group's curves at the longest length any of its runs has one
    (groups.build_group), which is one of its runs' longest; the shorter curves are most of a
    sweep's records and no report reads them."""
    lengths = [r["length"] for r in records if "loss_by_position" in r]
    return [
        r
        if not lengths or r["length"] == max(lengths)
        else {k: v for k, v in r.items() if k != "loss_by_position"}
        for r in records
    ]


def compact_results(results: dict[str, Any]) -> dict[str, Any]:
    """results.json with each of its lists of records (RECORD_LISTS: the evaluation records,
    the effective context lengths) as columns (as_columns), the curves only at the longest
    length (only_longest_curve)."""
    compact = {**results, "eval": only_longest_curve(results["eval"])}
    return {
        key: as_columns(value) if key in RECORD_LISTS else value for key, value in compact.items()
    }


def expanded_results(results: dict[str, Any]) -> dict[str, Any]:
    """``compact_results`` undone: the lists of records as lists of dicts again (a summary
    of format /2 holds effective_context_length as the list it is)."""
    return {
        key: as_records(value) if key in RECORD_LISTS and isinstance(value, dict) else value
        for key, value in results.items()
    }


def as_columns(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A list of records as ``{"records": n, "constant": {key: value}, "columns": {key: [value
    per record]}, "absent": {key: [index of a record without it]}}``: a key some records lack
    (e.g. loss_by_position) stays absent from them when read back; a value equal in every
    record that has it is a constant, which common_part then shares across runs."""
    keys = list(dict.fromkeys(key for record in records for key in record))
    constant, columns, absent = {}, {}, {}
    for key in keys:
        present = [as_table(record[key]) for record in records if key in record]
        if all(json.dumps(v) == json.dumps(present[0]) for v in present):
            constant[key] = present[0]
        else:
            columns[key] = [as_table(record.get(key)) for record in records]
        if lacking := [i for i, record in enumerate(records) if key not in record]:
            absent[key] = lacking
    table = {"records": len(records), "constant": constant, "columns": columns}
    return {**table, **({"absent": absent} if absent else {})}


def as_records(table: dict[str, Any]) -> list[dict[str, Any]]:
    """``as_columns`` undone."""
    records = [dict(table["constant"]) for _ in range(table["records"])]
    for key, values in table["columns"].items():
        for record, value in zip(records, values, strict=True):
            record[key] = value
    for record in records:
        record.update({key: from_table(value) for key, value in record.items()})
    for key, lacking in table.get("absent", {}).items():
        for i in lacking:
            del records[i][key]
    return records


def pooled(runs: list[dict[str, Any]]) -> tuple[list[Any], list[dict[str, Any]]]:
    """The parts of ``runs`` (dicts and lists of POOLED_SIZE characters of JSON or more) that
    two runs or more hold alike, each once in a pool, and ``runs`` with ``{"@": i}`` in their
    place: the bucket bounds of every curve at one length, a sweep's command and machine, the
    options of an encoding several runs share."""
    counts = Counter(text for run in runs for text in part_texts(run))
    pool: list[Any] = []
    index: dict[str, int] = {}

    def replaced(value: Any) -> Any:
        if not isinstance(value, dict | list):
            return value
        text = json.dumps(value)
        if len(text) >= POOLED_SIZE and counts[text] > 1:
            if text not in index:
                index[text] = len(pool)
                pool.append(value)
            return {POOL_REF: index[text]}
        if isinstance(value, list):
            return [replaced(item) for item in value]
        return {key: replaced(item) for key, item in value.items()}

    return pool, [replaced(run) for run in runs]


def part_texts(value: Any) -> list[str]:
    """The JSON of ``value`` and of every dict and list inside it."""
    if isinstance(value, dict):
        inner = [text for item in value.values() for text in part_texts(item)]
    elif isinstance(value, list):
        inner = [text for item in value for text in part_texts(item)]
    else:
        return []
    return [json.dumps(value), *inner]


def unpooled(value: Any, pool: Sequence[Any]) -> Any:
    """``pooled`` undone for one run's part: each ``{"@": i}`` replaced by a copy of the pool's
    entry i (an entry holds no reference)."""
    if isinstance(value, dict):
        if list(value) == [POOL_REF]:
            return copy.deepcopy(pool[value[POOL_REF]])
        return {key: unpooled(item, pool) for key, item in value.items()}
    if isinstance(value, list):
        return [unpooled(item, pool) for item in value]
    return value


def as_table(value: Any) -> Any:
    """A list of dicts with the same keys (a loss-by-position curve's buckets) as one dict of
    columns, ``{"table": {key: [value per item]}}``, a third of its size; anything else as it
    is."""
    if not isinstance(value, list) or not value or not isinstance(value[0], dict):
        return value
    keys = list(value[0])
    if not all(isinstance(item, dict) and list(item) == keys for item in value):
        return value
    return {"table": {key: [item[key] for item in value] for key in keys}}


def from_table(value: Any) -> Any:
    """``as_table`` undone."""
    if not (isinstance(value, dict) and list(value) == ["table"]):
        return value
    columns = value["table"]
    return [dict(zip(columns, items, strict=True)) for items in zip(*columns.values(), strict=True)]


def rounded(value: Any) -> Any:
    """``value`` with every float to SIGNIFICANT_DIGITS significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def provenance(runs: Sequence[Run], sweeps: Sequence[Path]) -> dict[str, Any]:
    """Where the runs came from, as they recorded it (results.json's ``ran`` and ``versions``,
    and those of each record ``posbench eval`` added): every command that made them, each
    once (the training's, then the re-evaluations'; a run that predates ``ran``: its sweep's,
    from Hydra's multirun.yaml), the sweeps' directory names, the commits, the machines, the
    days (first to last; a run that predates ``ran``: its results.json's) and the sweeps' wall
    time: the first job's start (its directory's .hydra/) to the last results.json."""
    started = [
        os.stat(run.path / ".hydra").st_mtime for run in runs if (run.path / ".hydra").is_dir()
    ]
    ended = [os.stat(run.path / RESULTS_FILE).st_mtime for run in runs]
    evaluations = [r for run in runs for r in run.results["eval"] if "ran" in r]
    trained = [run.results.get("ran") or {} for run in runs]
    by_sweep = {sweep.resolve(): sweep_command(sweep) for sweep in sweeps}
    commands = [
        ran.get("command")
        or next((c for s, c in by_sweep.items() if run.path.resolve().is_relative_to(s)), None)
        for run, ran in zip(runs, trained, strict=True)
    ] + [r["ran"]["command"] for r in evaluations]
    commits = [run.results.get("versions", {}).get("git_commit") for run in runs]
    commits += [r.get("versions", {}).get("git_commit") for r in evaluations]
    machines = [ran.get("machine") for ran in [*trained, *(r["ran"] for r in evaluations)]]
    days = [
        ran.get("date") or date.fromtimestamp(end).isoformat()
        for ran, end in zip(trained, ended, strict=True)
    ] + [r["ran"]["date"] for r in evaluations]
    first, last = min(days), max(days)
    return {
        "commands": [command for command in dict.fromkeys(commands) if command],
        "sweeps": [sweep.resolve().name for sweep in sweeps],  # run names start with these
        "runs": len(runs),
        "posbench_commits": sorted({str(commit) for commit in commits}),
        "machine": "; ".join(m for m in dict.fromkeys(machines) if m) or None,  # None: unrecorded
        "date": first if first == last else f"{first} to {last}",
        "wall_s": round(max(ended) - min(started)) if started else None,
    }


def sweep_command(sweep: Path) -> str | None:
    """``posbench train -m <overrides>`` as the sweep in ``sweep`` was started; None without
    Hydra's multirun.yaml there."""
    path = sweep / MULTIRUN_FILE
    if not path.is_file():
        return None
    overrides = OmegaConf.load(path).hydra.overrides
    launcher = [o for o in overrides.hydra if o != "hydra.mode=MULTIRUN"]
    return shlex.join(["posbench", "train", "-m", *overrides.task, *launcher])
