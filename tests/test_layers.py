"""The package's layout (docs/development.md, "Layout"): a module imports only from its own
layer or the layers below it, every module has a layer, no imports run in a circle, and modules
keep to their bounds (model.py at most 300 lines; any module at most 500 unless its docstring
starts with why it is longer)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "posbench"

# From the bottom up. A name is a module (posbench/<name>.py) or a package (posbench/<name>/,
# every module inside it).
LAYERS = [
    [
        "errors",
        "atomic",
        "cache_root",
        "cpu_load",
        "job_registry",
        "signals",
        "threads",
        "output_dirs",
        "precision",
        "distributed",
        "versions",
    ],
    ["encodings", "data", "references"],
    [
        "attention",
        "attention_options",
        "attention_scaling",
        "kv_cache",
        "loss",
        "model",
        "model_args",
        "random_positions",
    ],
    ["config", "memory", "checkpoint", "runs", "finetune", "resume"],
    ["decode", "evaluation", "tensorboard_log", "loggers", "sweep_summary", "reevaluate"],
    ["train", "train_loop", "diagnose"],
    ["report"],
    ["commands"],
    ["cli", "__main__", "__init__"],
]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
# The decoder reads in one file of at most this many lines; what is not its reading path lives in
# modules named for their job.
MODEL_LINES = 300
# A module past this many lines holds more than one job, unless its docstring starts with
# LONGER_BECAUSE and the reason a split would hurt reading.
MODULE_LINES = 500
LONGER_BECAUSE = "Longer than 500 lines because"


def unit(module: str) -> str:
    """The layer entry of a dotted module name under posbench: ``posbench.data.cache`` ->
    ``data``; the package itself (``posbench``) is its ``__init__``."""
    parts = module.split(".")
    assert parts[0] == "posbench", module
    return parts[1] if len(parts) > 1 else "__init__"


def source_modules() -> list[tuple[str, Path]]:
    """(dotted name, path) of every module of the package."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]  # posbench/data/__init__.py is posbench.data
        modules.append((".".join(parts), path))
    return modules


def imported_modules(path: Path, module: str) -> set[str]:
    """The posbench modules ``path`` imports, anywhere in it (a function-level import counts:
    it is a dependency all the same)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package of this module
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module
            # `from posbench import distributed` imports the module posbench.distributed
            for alias in node.names:
                name = f"{source}.{alias.name}"
                imported.add(name if is_module(name) else source)
    return {name for name in imported if name == "posbench" or name.startswith("posbench.")}


def is_module(name: str) -> bool:
    """Whether a dotted name under posbench is a module or package of it."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = source_modules()


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_every_module_has_a_layer(module, path):
    assert unit(module) in LAYER_OF, f"{module} is in no layer: add it to LAYERS and the docs"


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_no_module_imports_from_a_layer_above_its_own(module, path):
    level = LAYER_OF[unit(module)]
    upward = sorted(
        name for name in imported_modules(path, module) if LAYER_OF.get(unit(name), -1) > level
    )
    assert not upward, f"{module} (layer {level}) imports from above: {upward}"


def test_the_layer_table_in_the_docs_names_every_layer_entry():
    text = (PACKAGE.parent / "docs" / "development.md").read_text()
    missing = [name for name in LAYER_OF if f"`{name}.py`" not in text and f"`{name}/`" not in text]
    assert not missing, f"docs/development.md's layer table lacks {missing}"


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in ``graph`` (each module's imported modules), as the modules
    along it with the first again at the end; None when there is none."""
    finished: set[str] = set()
    path: list[str] = []

    def circle_from(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in finished or module not in graph:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            if circle := circle_from(imported):
                return circle
        path.pop()
        finished.add(module)
        return None

    for module in sorted(graph):
        if circle := circle_from(module):
            return circle
    return None


def test_the_circle_check_finds_a_circle_and_only_a_circle():
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_imports_run_in_a_circle():
    graph = {module: imported_modules(path, module) - {module} for module, path in MODULES}
    circle = import_circle(graph)
    assert circle is None, f"an import circle: {' -> '.join(circle)}; move what both need below"


def test_the_model_file_reads_in_at_most_300_lines():
    lines = len((PACKAGE / "model.py").read_text().splitlines())
    assert lines <= MODEL_LINES, (
        f"posbench/model.py has {lines} lines (at most {MODEL_LINES}): keep the decoder there "
        "and move what is not on its reading path to a module named for its job"
    )


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_a_module_over_500_lines_starts_its_docstring_with_why(module, path):
    source = path.read_text()
    lines = len(source.splitlines())
    docstring = ast.get_docstring(ast.parse(source, str(path))) or ""
    assert lines <= MODULE_LINES or docstring.startswith(LONGER_BECAUSE), (
        f"{module} has {lines} lines (at most {MODULE_LINES}): split it by responsibility, or "
        f"start its docstring with '{LONGER_BECAUSE} ...' where a split would hurt reading"
    )
