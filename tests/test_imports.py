"""No import circle in `impl/`: every import statement, at module level or inside a function.

The graph is read from the source with `ast` (nothing is imported): an edge A -> B for each
`import B`, `from B import name` and `from . import B` in A, wherever the statement stands (a
function-level import is a dependency too, only a later one; a `TYPE_CHECKING` one as well).
`from P import x` counts as an edge to the module `P.x` when that module exists, else to `P`.
Importing a submodule runs its package's `__init__` first, but that implicit edge is not
counted: a package that imports its own submodules is not a circle.

Also: the server's wings import nothing above them (`WINGS`: the store imports no forward, job
or route), and the foundation packages import nothing of the project above them (`FOUNDATIONS`:
the body generators import no harness, server or family). Run it alone: `python -m pytest
tests/test_imports.py` (or `python tests/test_imports.py`, which prints every circle it finds).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "impl"


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of `package` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(name: str, known: dict[str, Path]) -> str | None:
    """`name`, or the nearest package above it that is a module of the tree (None: outside)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the tree that `module` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    here = module if is_package else module.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            names = [f"{parent}.{alias.name}" for alias in node.names]
            names = [n if n in known else parent for n in names]
        else:
            continue
        for name in names:
            target = _target(name, known)
            if target is not None and target != module:
                edges.add(target)
    return edges


def graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imports(name, path, known) for name, path in known.items()}


def components(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per component, as a path `a -> b -> ... -> a` through its first module."""
    return [_path(sorted(c), edges, c) for c in components(edges)]


def _path(members: list[str], edges: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest circle through the first member, inside its component (breadth first)."""
    first = members[0]
    came: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & component):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came[path[-1]])
                    return [first, *reversed(path[:-1]), first]
                if child not in came:
                    came[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {first}")  # pragma: no cover


def describe(edges: dict[str, set[str]]) -> str:
    """Each component's shortest circle and every module caught in it."""
    lines = []
    for component in components(edges):
        members = sorted(component)
        lines.append(" -> ".join(_path(members, edges, component)))
        lines.append(f"  (all {len(members)} in this circle: {', '.join(members)})")
    return "\n".join(lines)


def test_circles_are_found():
    """The checker itself: a two-module and a three-module circle, a self-free tree."""
    edges = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "x": {"y"}, "y": {"z"}, "z": {"x"}}
    assert sorted(map(tuple, circles(edges))) == [("a", "b", "a"), ("x", "y", "z", "x")]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_function_level_and_relative_imports_count(tmp_path):
    """An import inside a function and a relative import are edges like any other."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    edges = graph(tmp_path, "pkg")
    assert edges["pkg.a"] == {"pkg.sub.b"} and edges["pkg.sub.b"] == {"pkg.a"}
    assert circles(edges) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


@pytest.mark.heavy
def test_impl_has_no_import_circle():
    """Every module of impl/ can be read top-down: nothing it imports imports it back."""
    edges = graph()
    assert not circles(edges), "import circles in impl/:\n" + describe(edges)


#: wing -> the parts of impl.server it may import (anything outside impl.server is free)
WINGS = {
    "impl.server.store": ("impl.server.store",),
    "impl.server.offloop": ("impl.server.offloop", "impl.server.upstream"),
    "impl.server.upstream": (),
}


def _inside(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _imports_beyond(part: str, within: str, allowed: tuple[str, ...]) -> list[str]:
    """Each import by a module of `part` of a module inside `within` but outside `allowed`."""
    return [
        f"{module} -> {target}"
        for module, targets in graph().items()
        if _inside(module, part)
        for target in sorted(targets)
        if _inside(target, within) and not any(_inside(target, ok) for ok in allowed)
    ]


@pytest.mark.parametrize("wing", sorted(WINGS))
@pytest.mark.heavy
def test_a_wing_imports_nothing_above_it(wing):
    """The store knows no forward, job or route; off-loop decoding knows only the router call."""
    above = _imports_beyond(wing, "impl.server", (wing, *WINGS[wing]))
    assert not above, above


#: foundation packages: what the harness, the server, benchmarks and tests build on, importing
#: none of them (allowed: the package itself and these others inside `impl`).
FOUNDATIONS = {"impl.workloads": ("impl.workloads", "impl._process")}


@pytest.mark.parametrize("foundation", sorted(FOUNDATIONS))
@pytest.mark.heavy
def test_a_foundation_imports_no_harness_server_or_family(foundation):
    """The body generators stand below everything that is fed with them."""
    above = _imports_beyond(foundation, PACKAGE, FOUNDATIONS[foundation])
    assert not above, above


if __name__ == "__main__":
    edges = graph()
    print(describe(edges) if circles(edges) else "no import circle in impl/")
    sys.exit(1 if circles(edges) else 0)
