"""Who may import whom: the layout of docs/architecture.md ("Layout"), read
from the source (tests/support/import_graph.py)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from tests.support.import_graph import GENERATED, PACKAGES, ROOT, cycles, graph, imports, modules

DOORS = ("http_bridge", "mcp_bridge")
COMPOSITION_ROOT = "ors_grpc.serving"
#: Other ecosystems' environments (each module needs its extra): reached only through
#: the `ors_grpc.environment_sources` entry points, never imported by the rest.
ADAPTERS = "ors_grpc.adapters"


def _imports_of(prefix: str) -> dict[str, set[str]]:
    return {name: deps for name, deps in graph().items() if name == prefix or name.startswith(prefix + ".")}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_import_cycle_among_hand_written_modules() -> None:
    assert cycles(graph()) == []


def test_only_the_composition_root_imports_a_door() -> None:
    importers = {
        name for name, deps in graph().items()
        if not any(_within(name, door) for door in DOORS) and any(_within(d, door) for d in deps for door in DOORS)
    }
    assert importers <= {COMPOSITION_ROOT}


@pytest.mark.parametrize("layer, forbidden", [
    # The wire protocol is shared by everyone and depends on no audience but the data types.
    ("ors_grpc.protocol", ("ors_grpc._runtime", "ors_grpc.client", "ors_grpc.authoring.environment",
                           "ors_grpc.serving", "ors_grpc.server", "ors_grpc.cli", *DOORS)),
    # What authors write against knows nothing of serving or clients.
    ("ors_grpc.authoring", ("ors_grpc._runtime", "ors_grpc.client", "ors_grpc.serving", "ors_grpc.server",
                            "ors_grpc.cli", *DOORS)),
    ("ors_grpc.client", ("ors_grpc._runtime", "ors_grpc.authoring.environment", "ors_grpc.serving",
                         "ors_grpc.server", "ors_grpc.cli", *DOORS)),
    ("ors_grpc._runtime", ("ors_grpc.client", "ors_grpc.serving", "ors_grpc.server", "ors_grpc.cli", *DOORS)),
    # An adapter makes environments: it writes against the authoring API, as any author does.
    (ADAPTERS, ("ors_grpc._runtime", "ors_grpc.client", "ors_grpc.serving", "ors_grpc.server", "ors_grpc.cli",
                *DOORS)),
    # A door translates onto the gRPC service: no session state, so no runtime and no client.
    *((door, ("ors_grpc._runtime", "ors_grpc.client", "ors_grpc.serving", "ors_grpc.server", "ors_grpc.cli"))
      for door in DOORS),
])
def test_a_layer_imports_only_what_is_below_it(layer: str, forbidden: tuple[str, ...]) -> None:
    wrong = sorted(
        f"{name} -> {dep}" for name, deps in _imports_of(layer).items() for dep in deps
        if any(_within(dep, f) for f in forbidden)
    )
    assert wrong == []


def test_nothing_but_the_adapters_imports_an_adapter() -> None:
    importers = sorted(
        f"{name} -> {dep}" for name, deps in graph().items() if not _within(name, ADAPTERS)
        for dep in deps if _within(dep, ADAPTERS)
    )
    assert importers == []


def test_serving_imports_no_adapter_nor_the_ecosystems_they_need() -> None:
    # Also what a static reading cannot see (importlib, a lazy import): the modules loaded.
    probe = ("import sys, ors_grpc, ors_grpc.cli, ors_grpc.serving, ors_grpc.server, ors_grpc.client; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('reasoning_gym', 'openenv') "
             "or m.startswith('ors_grpc.adapters')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_no_module_takes_another_modules_private_names() -> None:
    known = modules()
    taken = sorted(
        f"{imp.importer}:{imp.line} takes {name} from {imp.module}"
        for imp in imports()
        if imp.module.split(".")[0] in PACKAGES and not imp.module.startswith(GENERATED)
        for name in imp.names
        if name.startswith("_") and not name.startswith("__") and f"{imp.module}.{name}" not in known
    )
    assert taken == []


def test_the_graph_sees_the_known_edges() -> None:
    # Guards the two tests above against a graph that reads nothing.
    edges = graph()
    assert "http_bridge" in edges[COMPOSITION_ROOT]
    assert "ors_grpc._runtime.sessions" in edges["ors_grpc._runtime.service"]
    assert "ors_grpc.protocol.constants" in edges["ors_grpc.client._connection"]
    assert "ors_grpc.authoring.environment" in edges["ors_grpc.adapters.reasoning_gym"]


AUTHORING = "ors_grpc.authoring"
#: A private name (one leading underscore, not a dunder).
_PRIVATE = re.compile(r"_[A-Za-z]\w*(?<!__)")


def _authoring_private_names() -> tuple[set[str], set[str]]:
    """What authoring keeps to itself: the names of the marks it sets on functions and instances
    (string constants such as "_env_tool_exclusive"), and the private members of its classes
    (such as `Environment._is_tool`)."""
    marks: set[str] = set()
    members: set[str] = set()
    for name, path in modules().items():
        if not _within(name, AUTHORING):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _PRIVATE.fullmatch(node.value):
                marks.add(node.value)
            elif isinstance(node, ast.ClassDef):
                members |= {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                            and _PRIVATE.fullmatch(item.name)}
    return marks, members



def _own_private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines itself (its own `_call` is not authoring's)."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    return own


def private_authoring_reads() -> list[str]:
    marks, members = _authoring_private_names()
    found = []
    for name, path in modules().items():
        if _within(name, AUTHORING):
            continue
        tree = ast.parse(path.read_text(), str(path))
        foreign_members = members - _own_private_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (node.attr in marks or node.attr in foreign_members):
                found.append(f"{name}:{node.lineno} reads .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in marks:
                found.append(f"{name}:{node.lineno} names {node.value!r}")
    return found


def test_no_code_outside_authoring_reads_its_private_attributes() -> None:
    # What a tool is (its marks, its signature) is authoring's to say: through its public functions
    # (`tool_marks`, `marks_of`, `resolve_tool`, ...), never by reading what it wrote on a function.
    assert private_authoring_reads() == []


def test_the_private_attribute_scan_sees_authorings_names() -> None:
    # Guards the test above against a scan that finds nothing to look for.
    marks, members = _authoring_private_names()
    assert {"_env_tool", "_env_tool_exclusive", "_env_tool_concurrent", "_env_tool_terminal"} <= marks
    assert "_is_tool" in members
