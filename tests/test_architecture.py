"""Tests of txlog's layout: imports flow one way, and only txlog.spark needs Spark.

The import graph is read from the sources with ``ast`` (module-level and
function-level imports; what sits under ``if TYPE_CHECKING:`` is for type
checkers only and never runs), so a cycle or a stray ``pyspark`` import is
found here rather than by the first user who imports modules in another order.
docs/architecture.md describes the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "txlog"
# Where pyspark may be imported: the data source and the examples that run under Spark.
SPARK_PACKAGES = ("txlog.spark", "txlog.examples")
# The core, lowest layer first: none of them imports a layer above it at run time.
CORE_LAYERS = ("txlog.storage", "txlog.format", "txlog.partition", "txlog.transactions")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, runtime_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth; with ``runtime_only``, not those
    under ``if TYPE_CHECKING:`` (their ``else:`` branch runs, so it is kept)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if runtime_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute names ``node`` imports from (a module, or a package's ``__init__``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        package = module.split(".") if MODULES[module].name == "__init__.py" else \
            module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    # ``from pkg import sub`` imports the submodule when there is one, else a name of pkg.
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names]


def import_graph(runtime_only: bool = True) -> dict[str, set[str]]:
    """txlog module -> the txlog modules it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = {t for node in _imports(tree, runtime_only)
                         for t in _targets(module, node) if t in MODULES and t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_module_and_function_level_imports_but_not_type_checking_ones() -> None:
    graph = import_graph()
    assert "txlog.partition.partition_log" in graph["txlog.log"]  # module level
    assert "txlog.clients.producer" in graph["txlog.log"]  # inside Log.producer()
    assert "txlog.log" not in graph["txlog.clients.producer"]  # under TYPE_CHECKING only
    assert "txlog.log" in import_graph(runtime_only=False)["txlog.clients.producer"]


def test_find_cycle_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_among_txlog_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_submodule_imports_from_its_own_package_init() -> None:
    graph = import_graph(runtime_only=False)
    offenders = [f"{m} imports from {m.rpartition('.')[0]}/__init__"
                 for m, targets in graph.items()
                 if MODULES[m].name != "__init__.py" and m.rpartition(".")[0] in targets]
    assert offenders == []


def test_the_core_layers_never_import_a_layer_above_them() -> None:
    graph = import_graph()
    above: list[str] = []
    for i, layer in enumerate(CORE_LAYERS):
        allowed = CORE_LAYERS[:i + 1] + ("txlog.errors", "txlog.clock", "txlog.integers")
        for module, targets in graph.items():
            if module == layer or module.startswith(layer + "."):
                above += [f"{module} -> {t}" for t in sorted(targets)
                          if not any(t == a or t.startswith(a + ".") for a in allowed)]
    assert above == []


def test_only_txlog_spark_and_the_examples_import_pyspark() -> None:
    offenders = []
    for module, path in MODULES.items():
        if any(module == p or module.startswith(p + ".") for p in SPARK_PACKAGES):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports(tree, runtime_only=False):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if node.level == 0 else []
            offenders += [f"{module}: {n}" for n in names if n.split(".")[0] == "pyspark"]
    assert offenders == []


def test_only_package_inits_re_export_names() -> None:
    """A module's ``__all__`` names what it defines: old import paths are not kept alive
    by re-exports; a package's ``__init__`` (the public API at the top) may gather names."""
    offenders = []
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    if isinstance(t, ast.Name)}
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names = [e.value for e in getattr(node.value, "elts", [])
                         if isinstance(e, ast.Constant)]
                offenders += [f"{module}: {n}" for n in names if n not in defined]
    assert offenders == []
