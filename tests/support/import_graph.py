"""The import graph of the project's hand-written modules, read from their
source with `ast` (nothing is imported): for the layering tests."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The hand-written packages; generated code (`ors_grpc._generated`) is a leaf outside the graph.
PACKAGES = ("ors_grpc", "http_bridge", "mcp_bridge", "bench")
GENERATED = "ors_grpc._generated"


@dataclass(frozen=True)
class Import:
    """`importer` imports `module` (taking `names` from it; empty for `import module`)."""

    importer: str
    module: str
    names: tuple[str, ...]
    line: int


def modules() -> dict[str, Path]:
    """Every hand-written module by its dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            if not name.startswith(GENERATED):
                found[name] = path
    return found


def imports() -> list[Import]:
    """Every import statement of every hand-written module, with relative imports resolved."""
    known = modules()
    found = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [Import(name, alias.name, (), node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                found.append(Import(name, module, tuple(alias.name for alias in node.names), node.lineno))
    return found


def graph() -> dict[str, set[str]]:
    """Module → the hand-written modules it imports. `from package import submodule` counts as
    importing the submodule (and the package only when a name that is not a submodule is taken)."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports():
        if imp.module.startswith(GENERATED):
            continue
        submodules = {f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in known}
        targets = set(submodules)
        if len(submodules) < len(imp.names) or not imp.names:
            targets.add(imp.module)
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != imp.importer:
                edges[imp.importer].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found
