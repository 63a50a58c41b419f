"""Tests of txlog's layout: imports flow one way, and only txlog.spark needs Spark.

The import graph is read from the sources with ``ast`` (module-level and
function-level imports; what sits under ``if TYPE_CHECKING:`` is for type
checkers only and never runs), so a cycle or a stray ``pyspark`` import is
found here rather than by the first user who imports modules in another order.
The layers' order is checked on every import, type-only ones included (LAYERS,
with the listed exceptions), and below the Log no module keeps a ``Log`` or
reaches through one: they are handed the Root (``log.services``).
docs/architecture.md describes the layers.
"""

from __future__ import annotations

import ast
import re
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
    assert "txlog.partition.partition_log" in graph["txlog.api.log"]  # module level
    assert "txlog.transactions.group_members" in graph["txlog.admin.gc"]  # inside a function
    assert "txlog.api.log" not in graph["txlog.clients.consumer"]  # under TYPE_CHECKING only
    assert "txlog.api.log" in import_graph(runtime_only=False)["txlog.clients.consumer"]


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


# --- the layers, bottom up; a module imports only from its own layer and those below ------------

# The shared modules, then one package per layer.  The package's own ``__init__`` (the
# public API, gathering names from the layers below) stands with the front door.
SHARED = ("txlog.errors", "txlog.clock", "txlog.integers")
LAYERS = ("storage", "format", "partition", "transactions", "root", "clients", "exactly_once",
          "tables", "admin", "api", "kafka", "cli", "spark", "examples")
PUBLIC_SIGNATURE = "public signature kept: takes a Log and unwraps log.services at once"
# Imports that point up a layer (type-only ones included), each with its reason.
UPWARD_IMPORTS = {
    ("txlog.clients.consumer", "txlog.api.log"): PUBLIC_SIGNATURE,
    ("txlog.clients.membership", "txlog.api.log"): PUBLIC_SIGNATURE,
    ("txlog.clients.producer", "txlog.api.log"): PUBLIC_SIGNATURE,
    ("txlog.exactly_once.shared_transaction", "txlog.api.log"): PUBLIC_SIGNATURE,
    ("txlog.exactly_once.stream_sink", "txlog.api.log"): PUBLIC_SIGNATURE,
    ("txlog.exactly_once.app_versions", "txlog.api.log"): PUBLIC_SIGNATURE,
    ("txlog.exactly_once.id_pool", "txlog.api.log"):
        "passes the Log on to SharedTransaction's (begin_job); its own steps take log.services",
}
# The layers below the Log, and those above it that only pass a Log on: they hold the Root.
ROOT_HOLDERS = ("txlog.clients", "txlog.exactly_once", "txlog.tables", "txlog.admin", "txlog.kafka",
                "txlog.spark")
# Modules that still keep or reach through a Log, each with its reason (none).
LOG_HOLDERS: dict[str, str] = {}


def layer_of(module: str) -> int | None:
    """0 for the shared modules, then 1 + the layer's place in LAYERS; None: no layer."""
    if module in SHARED:
        return 0
    if module == "txlog":
        return 1 + LAYERS.index("api")
    package = module.split(".")[1]
    return 1 + LAYERS.index(package) if package in LAYERS else None


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every edge of ``graph`` from a module to a module of a higher layer."""
    return sorted((m, t) for m, targets in graph.items() for t in targets
                  if (layer_of(t) or 0) > (layer_of(m) or 0))


def test_every_module_is_in_a_layer() -> None:
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_every_layer_but_the_shared_one_is_a_package() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == sorted(["__init__"] + [m.rpartition(".")[2] for m in SHARED])


def test_no_import_points_up_a_layer_but_the_listed_ones() -> None:
    found = upward_imports(import_graph(runtime_only=False))
    assert [edge for edge in found if edge not in UPWARD_IMPORTS] == []


def test_the_layer_check_sees_an_upward_type_only_import() -> None:
    graph = {"txlog.partition.reader": {"txlog.api.log", "txlog.storage.paths"},
             "txlog.cli.main": {"txlog.api.log"}, "txlog.errors": set()}
    assert upward_imports(graph) == [("txlog.partition.reader", "txlog.api.log")]


def _names_log(annotation: ast.expr | None) -> bool:
    """Whether a parameter's or function's annotation names ``Log`` (``Log | None`` too)."""
    return annotation is not None and any(
        (isinstance(n, ast.Name) and n.id == "Log") or
        (isinstance(n, ast.Constant) and isinstance(n.value, str) and
         re.search(r"\bLog\b", n.value) is not None) for n in ast.walk(annotation))


def log_factories() -> set[str]:
    """``Log`` and every txlog function annotated to return one (``open_log``, ...)."""
    return {"Log"} | {node.name for path in MODULES.values()
                      for node in ast.walk(ast.parse(path.read_text(), str(path)))
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and _names_log(node.returns)}


def _log_names(scope: ast.AST, factories: set[str]) -> set[str]:
    """Names that hold a Log in ``scope`` (nested functions included): parameters
    annotated Log, and names assigned one (a factory's result, or another such name)."""
    names = {a.arg for node in ast.walk(scope)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
             if _names_log(a.annotation)}
    while True:
        more = {t.id for node in ast.walk(scope) if isinstance(node, ast.Assign)
                and _holds_log(node.value, names, set(), factories)
                for t in node.targets if isinstance(t, ast.Name)} - names
        if not more:
            return names
        names |= more


def _holds_log(node: ast.expr, names: set[str], attributes: set[str],
               factories: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "self" and \
            node.attr in attributes
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else None
        return name in factories
    return False


def log_uses(tree: ast.Module, factories: set[str]) -> list[str]:
    """Where a module keeps a Log in an attribute, or uses one other than by its
    ``services`` or by passing it on."""
    scopes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scopes += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body
               if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names = {id(s): _log_names(s, factories) for s in scopes}
    attributes: set[str] = set()  # self.<attribute> assigned a Log anywhere in the module
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and \
                    _holds_log(node.value, names[id(scope)], set(), factories):
                attributes |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)}
    found = [(n.lineno, f"keeps a Log in .{n.attr}") for s in scopes for a in ast.walk(s)
             if isinstance(a, ast.Assign) for n in a.targets if isinstance(n, ast.Attribute)
             and _holds_log(a.value, names[id(s)], set(), factories)]
    found += [(n.lineno, f"reaches .{n.attr} through a Log") for s in scopes
              for n in ast.walk(s) if isinstance(n, ast.Attribute) and n.attr != "services"
              and _holds_log(n.value, names[id(s)], attributes, factories)]
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_below_the_log_no_module_keeps_a_log_or_reaches_through_one() -> None:
    factories = log_factories()
    offenders = []
    for module, path in MODULES.items():
        if module in LOG_HOLDERS or not any(module == p or module.startswith(p + ".")
                                            for p in ROOT_HOLDERS):
            continue
        offenders += [f"{module} {use}"
                      for use in log_uses(ast.parse(path.read_text(), str(path)), factories)]
    assert offenders == []


def test_the_log_check_sees_a_kept_log_and_a_reach_through_it() -> None:
    source = '''
class Held:
    def __init__(self, log: Log, root: Root) -> None:
        self.log = log
        self.root = root
        self.services = log.services
        self.other = open_log("x")

    def use(self) -> None:
        self.log.coordinator.complete("t")
        self.root.coordinator.complete("t")


def passes_on(log: Log | None) -> None:
    other = log
    consume(log, other.services)
    other.storage.list("x")
'''
    found = log_uses(ast.parse(source), {"Log", "open_log"})
    assert found == ["line 4: keeps a Log in .log", "line 7: keeps a Log in .other",
                     "line 10: reaches .coordinator through a Log",
                     "line 17: reaches .storage through a Log"]


# --- sizes ---------------------------------------------------------------------------

MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 60
# The few definitions allowed past those sizes, each with its reason.  None may be in
# the producer: it was the class that did everything, and is now composed of parts.
SIZE_EXCEPTIONS = {
    "txlog.partition.state_manager.StateManager":
        "the partition's producer state and its snapshots behind one lock that the appender "
        "and the reader share; its parts are the steps of one refresh under that lock",
    "txlog.partition.storage_cache.StorageCache":
        "where a partition's batches are (listings, segment heads, locations, headers), "
        "kept under the state manager's lock; split, each half would need the other's state",
    "txlog.kafka.consumer.KafkaConsumer":
        "kafka-python's KafkaConsumer surface, method for method; each method maps one of "
        "its calls onto the native consumer",
}


def _definitions() -> list[tuple[str, str, int]]:
    """(qualified name, 'class' or 'function', lines from its def to its last line) for
    every class and function in src/txlog, methods and nested functions included."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                found.append((name, kind, (child.end_lineno or child.lineno) - child.lineno + 1))
                visit(child, name)
            else:
                visit(child, prefix)

    for module, path in MODULES.items():
        visit(ast.parse(path.read_text(), str(path)), module)
    return found


def test_classes_and_functions_stay_small() -> None:
    too_large = [f"{name} ({kind}, {lines} lines)" for name, kind, lines in _definitions()
                 if lines >= (MAX_CLASS_LINES if kind == "class" else MAX_FUNCTION_LINES)
                 and name not in SIZE_EXCEPTIONS]
    assert too_large == []


def test_size_exceptions_are_few_real_and_outside_the_producer() -> None:
    sizes = {name: (kind, lines) for name, kind, lines in _definitions()}
    assert len(SIZE_EXCEPTIONS) <= 3
    for name in SIZE_EXCEPTIONS:
        assert ".clients.producer" not in name and ".clients.sender" not in name
        kind, lines = sizes[name]  # a listed name that no longer exists fails here
        assert lines >= (MAX_CLASS_LINES if kind == "class" else MAX_FUNCTION_LINES), \
            f"{name} is small now: take it off the list"
