"""docs/errors.md lists every one-line message posbench stops with, as the code writes it.

The messages are read from the code, not by running it: the first argument of every
``PosbenchError(...)``, ``Diverged(...)``, ``argparse.ArgumentTypeError(...)``, every call of
the CLI's ``fail`` and ``stop``, and what an exception class of posbench passes to
``super().__init__``, anywhere under posbench/ (modules move; their messages go with them).
Each message becomes one or more *templates*: its literal text with a hole for each formatted
part. Local names, posbench's helper functions, ``a if c else b``, ``a or b`` and ``+`` are
followed, so a message built in pieces gives every wording it can have, and a module constant
(``CHECKPOINT_FILE``) gives its text.

The page's messages are the code spans that open the rows of its tables headed ``Message``.
In them ``<...>`` is a placeholder. A row documents a template when the template's text
reads as the row with an example for each hole (``Could not override 'train.stpes' ...``),
or when the row reads as the template with a placeholder for each hole and for any wording
it leaves open (``... (last finite loss <loss>); <checkpoint> in <DIR>; ...``).
"""

from __future__ import annotations

import ast
import itertools
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"
SOURCES = sorted((ROOT / "posbench").rglob("*.py"))

# The calls whose first argument is a message the user reads.
MESSAGE_CALLS = {"PosbenchError", "Diverged", "fail", "stop", "ArgumentTypeError"}
# argparse prints these inside its own line, `<command>: argument <flag>: <message> (see ...)`,
# and the page shows them there.
EMBEDDED_CALLS = {"ArgumentTypeError"}
# The functions holding a call whose message may be wholly another's, with no words of the
# call's own: the page documents that text where it is made.
PASSED_ON = {
    # fail(str(err)): a PosbenchError's message (documented at its own raise site) or an
    # OSError's (the page's "Files and the file system").
    "report",
    # fail(hydra_error_line(...)): Hydra's or OmegaConf's own first line, for the errors
    # posbench does not reword (the page's "Sweeps and Hydra's own messages").
    "compose_or_fail",
}
MAX_TEMPLATES = 32  # wordings of one message: more means one assembled too freely to document
MIN_LETTERS = 8  # of a documented message outside its placeholders: it must say something

HOLE = None  # a formatted part of a message
Template = tuple[str | None, ...]
PLACEHOLDER = re.compile(r"<[^<>=\s][^<>]*>")  # <key>, <DIR>; not the <= of "--length <= 16"


# --------------------------------------------------------------------------- templates


def squeezed(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def merged(parts: Iterator[str | None]) -> Template:
    """Adjacent literals joined, adjacent holes one hole."""
    out: list[str | None] = []
    for part in parts:
        if part is HOLE and out and out[-1] is HOLE:
            continue
        if part is not HOLE and out and out[-1] is not HOLE:
            out[-1] += part
        else:
            out.append(part)
    return tuple(out)


def concatenations(*choices: list[Template]) -> list[Template]:
    """Every template made of one template from each of ``choices``, in order."""
    return [merged(p for t in combo for p in t) for combo in itertools.product(*choices)]


def has_words(template: Template) -> bool:
    return any(part and re.search(r"[A-Za-z]", part) for part in template)


def shown(template: Template) -> str:
    """``template`` with ``<>`` for each hole, for failure messages."""
    return "".join("<>" if part is HOLE else part for part in template)


# ----------------------------------------------------------------------- reading the code


@dataclass
class Module:
    tree: ast.Module
    functions: dict[str, ast.FunctionDef]  # module level
    constants: dict[str, ast.expr]  # module level NAME = value


def parse_module(source: str) -> Module:
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    constants = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return Module(tree, functions, constants)


MODULES = [parse_module(path.read_text()) for path in SOURCES]


def definition(name: str, table: str, home: Module) -> tuple[Module, ast.AST] | None:
    """``name``'s function or constant (``table``) in ``home``, else its only one in posbench,
    else None."""
    if name in getattr(home, table):
        return home, getattr(home, table)[name]
    found = [(m, getattr(m, table)[name]) for m in MODULES if name in getattr(m, table)]
    return found[0] if len(found) == 1 else None


NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def local_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of function ``node`` in source order, outside the functions, lambdas and
    classes nested in it."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, NESTED_SCOPES):
            yield from local_nodes(child)


@dataclass(frozen=True)
class Scope:
    """Where an expression is read: its module, its function (None: module level), and the
    names and functions being followed already (so a cycle ends in a hole)."""

    home: Module
    function: ast.FunctionDef | None
    seen: frozenset[str] = frozenset()

    def templates(self, node: ast.expr) -> list[Template]:
        """The messages ``node`` can evaluate to."""
        if isinstance(node, ast.Constant):
            return [(node.value,)] if isinstance(node.value, str) else [(HOLE,)]
        if isinstance(node, ast.JoinedStr):
            return concatenations(*(self.formatted(value) for value in node.values))
        if isinstance(node, ast.IfExp):
            return self.templates(node.body) + self.templates(node.orelse)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            return [t for value in node.values for t in self.templates(value)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return concatenations(self.templates(node.left), self.templates(node.right))
        if isinstance(node, ast.Name):
            return self.variable(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return self.constant(node.attr)  # module.CONSTANT; an object's attribute: a hole
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return self.returned(node.func.id)
        return [(HOLE,)]

    def formatted(self, node: ast.expr) -> list[Template]:
        """A part of an f-string: its text, or what its ``{...}`` holds."""
        if isinstance(node, ast.Constant):
            return [(node.value,)]
        assert isinstance(node, ast.FormattedValue)
        if node.conversion != -1 or node.format_spec is not None:  # {x!r}, {x:g}
            return [(HOLE,)]
        return self.templates(node.value)

    def variable(self, name: str) -> list[Template]:
        """The values a local variable is assigned, a hole for a parameter or a loop variable,
        else a module constant's text."""
        if self.function is None or name in self.seen:
            return self.constant(name)
        inner = Scope(self.home, self.function, self.seen | {name})
        assigned: list[Template] = []
        extended: list[Template] = []
        targets: set[ast.AST] = set()
        bound = any(a.arg == name for a in all_arguments(self.function))
        for node in local_nodes(self.function):
            if isinstance(node, ast.Assign) and name in map(assigned_name, node.targets):
                assigned += inner.templates(node.value)
                targets.update(node.targets)
            elif isinstance(node, ast.AugAssign) and assigned_name(node.target) == name:
                # posbench's messages grow by `x += e` in one branch or another, never twice
                # in a row: each extends what x was assigned
                extended += concatenations(assigned, inner.templates(node.value))
                targets.add(node.target)
            elif isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
                bound = bound or node not in targets  # a loop or unpacking target, a walrus
            elif isinstance(node, ast.ExceptHandler) and node.name == name:
                bound = True
        values = assigned + extended + ([(HOLE,)] if bound else [])
        return values or self.constant(name)

    def constant(self, name: str) -> list[Template]:
        found = definition(name, "constants", self.home)
        if found is None or name in self.seen:
            return [(HOLE,)]
        home, value = found
        return Scope(home, None, self.seen | {name}).templates(value)

    def returned(self, name: str) -> list[Template]:
        """What posbench's function ``name`` returns; a hole for any other function."""
        found = definition(name, "functions", self.home)
        if found is None or name in self.seen:
            return [(HOLE,)]
        home, function = found
        inner = Scope(home, function, self.seen | {name})
        returns = [n.value for n in local_nodes(function) if isinstance(n, ast.Return) and n.value]
        return [t for value in returns for t in inner.templates(value)] or [(HOLE,)]


def assigned_name(target: ast.expr) -> str:
    """The variable an assignment to ``target`` binds ("" for ``x[i]``, ``x.a``, ``a, b``)."""
    return target.id if isinstance(target, ast.Name) else ""


def all_arguments(function: ast.FunctionDef) -> list[ast.arg]:
    a = function.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]


def calls(
    node: ast.AST, function: ast.FunctionDef | None = None, cls: ast.ClassDef | None = None
) -> Iterator[tuple[ast.Call, ast.FunctionDef | None, ast.ClassDef | None]]:
    """Every call under ``node``, with the function and the class it is in."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Call):
            yield child, function, cls
        yield from calls(
            child,
            child if isinstance(child, ast.FunctionDef) else function,
            child if isinstance(child, ast.ClassDef) else cls,
        )


def exception_classes() -> set[str]:
    """posbench's exception classes: derived from Exception or KeyboardInterrupt."""
    bases = {
        node.name: {getattr(base, "id", getattr(base, "attr", "")) for base in node.bases}
        for m in MODULES
        for node in ast.walk(m.tree)
        if isinstance(node, ast.ClassDef)
    }
    found = {"Exception", "KeyboardInterrupt"}
    while more := {name for name, of in bases.items() if of & found} - found:
        found |= more
    return found - {"Exception", "KeyboardInterrupt"}


def called(call: ast.Call) -> str:
    """The name ``call`` calls: ``fail``, ``PosbenchError``, ``super().__init__``."""
    func = call.func
    inner = getattr(func, "value", None)
    if isinstance(inner, ast.Call) and getattr(inner.func, "id", "") == "super":
        return f"super().{func.attr}"
    return getattr(func, "id", getattr(func, "attr", ""))


@dataclass
class Site:
    where: str  # path:line
    function: str  # the function that holds the call ("" at module level)
    call: str
    templates: list[Template]


def module_sites(m: Module, path: str, exceptions: set[str]) -> Iterator[Site]:
    """The calls in module ``m`` that give the user a message; ``exceptions``: the exception
    classes whose ``super().__init__`` message counts."""
    for call, function, cls in calls(m.tree):
        name = called(call)
        passes_on = name == "super().__init__" and cls is not None and cls.name in exceptions
        if not call.args or (name not in MESSAGE_CALLS and not passes_on):
            continue
        templates = list(dict.fromkeys(Scope(m, function).templates(call.args[0])))
        if passes_on:  # Diverged(message) hands its caller's message on: that is the site
            templates = [t for t in templates if has_words(t)]
        where = f"{path}:{call.lineno}"
        yield Site(where, function.name if function else "", name, templates)


@cache
def sites() -> list[Site]:
    """Every call in posbench/ that gives the user a message."""
    exceptions = exception_classes()
    return [
        site
        for path, m in zip(SOURCES, MODULES, strict=True)
        for site in module_sites(m, str(path.relative_to(ROOT)), exceptions)
    ]


# ----------------------------------------------------------------------- reading the page


@cache
def documented() -> list[str]:
    """The code spans that open the rows of docs/errors.md's tables headed ``Message``."""
    messages = []
    in_table = False
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        first = re.split(r"(?<!\\)\|", line)[1].strip()
        if re.fullmatch(r"[-: ]+", first):  # the header's underline
            continue
        if not in_table:
            in_table = first == "Message"
            continue
        span = re.fullmatch(r"(`+) ?(.*?) ?\1", first)
        assert span, f"docs/errors.md: a Message cell is not one code span: {first}"
        messages.append(squeezed(span.group(2)))
    return messages


# ------------------------------------------------------------------------------ matching


def reads_as(template: Template) -> re.Pattern[str]:
    """The messages ``template`` reads as: its text, with anything for a hole."""
    return re.compile("".join(".*?" if p is HOLE else re.escape(squeezed(p)) for p in template))


def covers(message: str) -> re.Pattern[str]:
    """The templates documented message ``message`` covers, as text with a NUL for each hole:
    its text, with anything for a placeholder."""
    return re.compile(".*?".join(map(re.escape, PLACEHOLDER.split(message))))


def documents(message: str, template: Template, embedded: bool = False) -> bool:
    """Whether documented ``message`` documents the code's ``template``."""
    if embedded:  # the row shows the line argparse puts the message in
        return reads_as(template).search(message) is not None
    holed = "".join("\0" if p is HOLE else squeezed(p) for p in template)
    return bool(reads_as(template).fullmatch(message) or covers(message).fullmatch(holed))


# ------------------------------------------------------------------- the reading itself


def wordings(source: str) -> list[str]:
    """The wordings of the messages ``source`` raises, ``<>`` for each hole."""
    m = parse_module(textwrap.dedent(source))
    return [shown(t) for site in module_sites(m, "example.py", set()) for t in site.templates]


def test_a_conditional_message_has_each_of_its_wordings() -> None:
    source = """
        def check(n):
            raise PosbenchError(f"{n} runs failed" if n else "no run failed")
    """
    assert wordings(source) == ["<> runs failed", "no run failed"]


def test_a_message_from_a_variable_and_a_helper_function_is_followed() -> None:
    source = """
        def reason(n):
            return f"got {n}"

        def check(n):
            detail = reason(n)
            fail("bad n: " + detail)
    """
    assert wordings(source) == ["bad n: got <>"]


def test_a_module_constant_in_a_message_is_its_text() -> None:
    source = """
        WEIGHTS = "model.safetensors"

        def check(run_dir):
            raise PosbenchError(f"{run_dir} holds no {WEIGHTS}")
    """
    assert wordings(source) == ["<> holds no model.safetensors"]


UNKNOWN = ("unknown encoding ", HOLE, "; choose one of: ", HOLE)


def test_a_row_documents_a_message_with_an_example_or_a_placeholder_for_each_hole() -> None:
    assert documents("unknown encoding 'rop'; choose one of: alibi, rope", UNKNOWN)
    assert documents("unknown encoding <name>; choose one of: <names>", UNKNOWN)


def test_a_placeholder_of_a_row_may_stand_for_a_wording_the_code_chooses() -> None:
    assert documents("diverged; <checkpoint> in <DIR>", ("diverged; no checkpoint yet in ", HOLE))


def test_a_row_with_other_words_or_only_part_of_a_message_documents_none() -> None:
    assert not documents("unknown encoding <name>; pick one of: <names>", UNKNOWN)
    assert not documents("unknown encoding 'rop'", UNKNOWN)


# -------------------------------------------------------------------- the page and the code


def test_the_code_is_read_at_every_kind_of_message_call() -> None:
    assert {site.call for site in sites()} >= MESSAGE_CALLS | {"super().__init__"}
    assert len(sites()) > 100


def test_every_message_the_code_raises_is_documented() -> None:
    missing = [
        f"{site.where} ({site.function}): {shown(template)}"
        for site in sites()
        for template in site.templates
        if has_words(template)
        and not any(documents(m, template, site.call in EMBEDDED_CALLS) for m in documented())
    ]
    assert not missing, "add these messages to docs/errors.md:\n" + "\n".join(missing)


def test_every_documented_message_is_one_the_code_raises() -> None:
    templates = [t for site in sites() for t in site.templates if has_words(t)]
    stale = [m for m in documented() if not any(documents(m, t) for t in templates)]
    assert not stale, "docs/errors.md documents messages no code raises:\n" + "\n".join(stale)


def test_every_documented_message_has_words_of_its_own() -> None:
    vague = [
        m for m in documented() if len(re.findall("[A-Za-z]", PLACEHOLDER.sub("", m))) < MIN_LETTERS
    ]
    assert not vague


def test_only_the_listed_functions_pass_on_a_message_with_no_words_of_their_own() -> None:
    wordless = {site.function for site in sites() if not all(map(has_words, site.templates))}
    assert wordless == PASSED_ON


def test_no_message_has_too_many_wordings_to_document() -> None:
    assert [site.where for site in sites() if len(site.templates) > MAX_TEMPLATES] == []


def test_the_unknown_encoding_examples_list_every_registered_encoding():
    """The page shows the line a typo gets; it went stale as encodings were added."""
    from posbench.encodings import encoding_names

    listed = re.findall(r"unknown encoding 'rop'; choose one of: ([a-z0-9_, ]+)", DOC.read_text())
    assert listed and all(names.split(", ") == encoding_names() for names in listed)
