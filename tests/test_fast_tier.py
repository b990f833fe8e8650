"""The fast tier, ``python -m pytest -m "not slow"``, covers every module of the package: each
one is imported by test code that runs there. Both lists are read from the files as they are
(modules found with pkgutil, imports with ast), so modules that move stay covered or fail here.

Test code that runs in the fast tier: a test file's imports at its top (unless every test in it
is slow) and those inside its functions that are not marked slow; a string naming a module
counts (``importlib.import_module("posbench.train")``). Importing a module imports its
packages. Two more ways a module is imported with its tests' knowledge:

* by a covered module of its own subpackage (``report/text.py`` through ``report/tables.py``):
  a package's helpers are tested through what it offers (not across the top-level package,
  whose ``cli`` and ``__init__`` import nearly everything);
* by its package's ``__init__`` walking the package (``pkgutil.iter_modules(__path__)``, as
  the encodings' registry does): importing the package imports each.
"""

import ast
import importlib.util
import pkgutil
from pathlib import Path

import posbench

TESTS = Path(__file__).resolve().parent


def package_modules() -> dict[str, Path]:
    """Every module and package of posbench, by dotted name, with its file (found without
    importing the modules: walk_packages imports packages only)."""
    found = {"posbench": Path(posbench.__file__)}
    for info in pkgutil.walk_packages(posbench.__path__, "posbench."):
        found[info.name] = Path(importlib.util.find_spec(info.name).origin)
    return found


MODULES = package_modules()


def marked_slow(node: ast.AST) -> bool:
    """A ``pytest.mark.slow`` decorator, or a ``pytestmark`` holding it."""
    return "mark.slow" in ast.unparse(node)


def named_modules(node: ast.AST, package: str = "") -> set[str]:
    """The posbench modules an import statement (or a string constant) names; relative imports
    resolve against ``package``."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & MODULES.keys()
    if isinstance(node, ast.ImportFrom):
        source = node.module or ""
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join([*base, *([source] if source else [])])
        # `from posbench.system import distributed` imports the module posbench.system.distributed
        names = {f"{source}.{alias.name}" for alias in node.names}
        return {name if name in MODULES else source for name in names} & MODULES.keys()
    if isinstance(node, ast.Constant) and node.value in MODULES:
        return {node.value}
    return set()


def fast_imports(path: Path) -> set[str]:
    """The posbench modules a test file imports in code that runs in the fast tier."""
    tree = ast.parse(path.read_text(), str(path))
    if any(
        isinstance(node, ast.Assign)
        and any(getattr(target, "id", None) == "pytestmark" for target in node.targets)
        and marked_slow(node.value)
        for node in tree.body
    ):
        return set()
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    tests = [f for f in functions if f.name.startswith("test_")]
    if tests and all(any(marked_slow(d) for d in f.decorator_list) for f in tests):
        return set()
    imported = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                marked_slow(d) for d in child.decorator_list
            ):
                continue
            imported.update(named_modules(child))
            visit(child)

    visit(tree)
    return imported


def own_imports(module: str) -> set[str]:
    """The posbench modules ``module``'s file imports, anywhere in it."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    return set().union(*(named_modules(node, package) for node in ast.walk(tree)))


def submodules(package: str) -> set[str]:
    return {name for name in MODULES if name.rpartition(".")[0] == package}


def walks_its_package(module: str) -> bool:
    """A package ``__init__`` that imports every module in it."""
    path = MODULES[module]
    return path.name == "__init__.py" and "pkgutil.iter_modules(__path__)" in path.read_text()


def covered_modules() -> set[str]:
    covered = set().union(*(fast_imports(path) for path in sorted(TESTS.glob("*.py"))))
    while True:
        more = set()
        for module in covered:
            parts = module.split(".")
            more.update(".".join(parts[:n]) for n in range(1, len(parts)))  # its packages
            package = module if MODULES[module].name == "__init__.py" else ".".join(parts[:-1])
            if package != "posbench":
                more.update(m for m in own_imports(module) if m.startswith(f"{package}."))
            if walks_its_package(module):
                more.update(submodules(module))
        if more <= covered:
            return covered
        covered |= more


def test_every_module_is_imported_by_a_test_of_the_fast_tier():
    missing = sorted(MODULES.keys() - covered_modules())
    assert not missing, f"no test outside the slow tier imports {missing}: test them there"


def test_the_check_sees_a_module_imported_only_by_slow_tests(tmp_path, monkeypatch):
    """A slow test's import and a slow file's do not count; a fast test's does."""
    (tmp_path / "test_slow_file.py").write_text(
        "import pytest\nimport posbench.system.signals\npytestmark = pytest.mark.slow\n"
        "def test_a():\n    pass\n"
    )
    (tmp_path / "test_mixed.py").write_text(
        "import pytest\n@pytest.mark.slow\ndef test_a():\n    import posbench.system.cache_root\n"
        "def test_b():\n    from posbench.commands import diagnose\n"
    )
    monkeypatch.setattr(f"{__name__}.TESTS", tmp_path)
    covered = covered_modules()
    assert "posbench.commands.diagnose" in covered and "posbench.commands" in covered
    assert "posbench.system.signals" not in covered and "posbench.system.cache_root" not in covered
