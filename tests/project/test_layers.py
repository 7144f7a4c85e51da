"""Layers point one way: every import of radixlang/, radixlang_runtime/ and the kernels' package
(kernels/radixlang_kernels/) read with ast (module level and inside functions alike: a lazy import is still a
dependency), folded to one node per package (radixlang_runtime.model with its executor / layers / loader /
models, .scheduler, .mem, .server, .protocol, .entrypoints, .utils, .speculative, ...; each top-level module of
radixlang_runtime its own node; the DSL radixlang/ one node; radixlang_kernels
one node). Fails on any cycle between nodes and on
the declared forbidden directions. Fast (no imports run)."""

from __future__ import annotations

import ast
import functools
import os
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("radixlang", "radixlang_runtime", "radixlang_kernels")
ROOTS = {"radixlang": REPO, "radixlang_runtime": REPO, "radixlang_kernels": os.path.join(REPO, "kernels")}
RT = "radixlang_runtime"

# (from node, to node or external top-level package): never. A node "X" also covers "X.*" modules.
FORBIDDEN = [
    (f"{RT}.model", f"{RT}.scheduler"),  # the runner's contract is model/executor/step_io.py; the scheduler drives it
    (f"{RT}.model", f"{RT}.server"),
    (f"{RT}.model", f"{RT}.wiring"),
    (f"{RT}.model", f"{RT}.entrypoints"),
    (f"{RT}.model", f"{RT}.speculative"),  # the draft model's runner is built on the model, not inside it
    (f"{RT}.mem", f"{RT}.model"),  # mem/ sits below the model and the scheduler
    (f"{RT}.mem", f"{RT}.scheduler"),
    (f"{RT}.mem", f"{RT}.server"),
    (f"{RT}.scheduler", f"{RT}.server"),
    (f"{RT}.scheduler", f"{RT}.wiring"),  # the wiring builds the scheduler, not the other way round
    (f"{RT}.scheduler", f"{RT}.entrypoints"),
    (f"{RT}.protocol", "torch"),  # the request protocol is torch-free (the DSL and the router import it)
    (f"{RT}.protocol", f"{RT}.model"),
    (f"{RT}.protocol", f"{RT}.scheduler"),
    (f"{RT}.protocol", f"{RT}.server"),
    (f"{RT}.utils", "torch"),
    (f"{RT}.utils", f"{RT}.model"),
    (f"{RT}.utils", f"{RT}.scheduler"),
    (f"{RT}.utils", f"{RT}.server"),
    (f"{RT}.speculative", f"{RT}.server"),
    ("radixlang", "torch"),  # the DSL runs without torch (tests/dsl/test_dsl_import.py checks it at run time)
    ("radixlang", "triton"),
]
KERNELS = "radixlang_kernels"  # the kernels import nothing of the runtime or the DSL above them


def _modules() -> dict[str, str]:
    """module name -> file path, for every .py under PACKAGES."""
    out = {}
    for pkg in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOTS[pkg], pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(d, f)
                    parts = os.path.relpath(path, ROOTS[pkg])[:-3].split(os.sep)
                    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: str, modules: dict[str, str]) -> list[str]:
    """Every module (or external top-level package) the file imports at run time (`if TYPE_CHECKING:` blocks
    left out); `from X import y` gives X.y when that is a module, else X."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_pkg = path.endswith("__init__.py")
    found = []
    for n in _runtime_nodes(tree):
        if isinstance(n, ast.Import):
            found += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:  # relative: from the module's package, one level up per extra dot
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module
            subs = [f"{mod}.{a.name}" for a in n.names if f"{mod}.{a.name}" in modules]
            found += subs if len(subs) == len(n.names) else [mod, *subs]
    return found


def _runtime_nodes(tree: ast.AST):
    """ast.walk without the bodies of `if TYPE_CHECKING:` (imports for annotations only)."""
    todo = [tree]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            todo += n.orelse
            continue
        todo += ast.iter_child_nodes(n)


def _node(target: str, modules: dict[str, str]) -> str:
    """The package node of an imported name: the longest known module prefix, folded to its package."""
    parts = target.split(".")
    if parts[0] not in PACKAGES:
        return parts[0]  # external: torch, numpy, ...
    while len(parts) > 1 and ".".join(parts) not in modules:
        parts = parts[:-1]  # `from pkg import name`: a name, not a module
    if parts[0] in ("radixlang", KERNELS):
        return parts[0]
    return ".".join(parts[:2])


@functools.cache
def _graph() -> dict[str, dict[str, set[str]]]:
    """node -> {imported node: the modules importing it}, edges inside a node left out."""
    modules = _modules()
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name, path in modules.items():
        src = _node(name, modules)
        for target in _imports(name, path, modules):
            dst = _node(target, modules)
            if dst != src:
                graph[src][dst].add(name)
    return graph


def _cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Strongly connected components of more than one node among the package nodes (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in graph and not w.startswith(PACKAGES):
                continue  # external packages cannot import us
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_known_edges():
    """The walk itself works: edges that exist by design are found (a broken walk would pass everything)."""
    g = _graph()
    assert f"{RT}.model" in g[f"{RT}.scheduler"]  # the scheduler builds model/step_io.ModelBatch
    assert f"{RT}.mem" in g[f"{RT}.model"]  # the runner owns a KVPool
    assert KERNELS in g[f"{RT}.model"]  # the op table (cpu_ops) and the Triton backend (inside a function)
    assert "torch" in g[KERNELS] and "triton" in g[KERNELS]  # the kernels' package is walked too
    assert "torch" in g[f"{RT}.model"]
    assert {f"{RT}.model", f"{RT}.scheduler"} <= set(g[f"{RT}.wiring"])
    assert {f"{RT}.server", f"{RT}.wiring"} <= set(g[f"{RT}.entrypoints"])


def test_no_cycle_between_packages():
    g = _graph()
    cycles = _cycles(g)
    detail = [{a: {b: sorted(g[a][b]) for b in c if b in g[a]} for a in c} for c in cycles]
    assert not cycles, f"import cycles between packages: {detail}"


def test_forbidden_directions():
    g = _graph()
    bad = {(a, b): sorted(g[a][b]) for a, b in FORBIDDEN if b in g.get(a, {})}
    assert not bad, f"imports against the layering (from node, to node): modules: {bad}"


def test_kernels_import_nothing_above_them():
    g = _graph()
    above = {b: sorted(m) for b, m in g.get(KERNELS, {}).items() if b.startswith(PACKAGES)}
    assert not above, f"radixlang_kernels imports the runtime or the DSL: {above}"


def test_a_planted_cycle_is_found():
    """The cycle search itself works: a cycle planted between two package nodes (and one through three) is
    reported, an acyclic graph is not (a broken search would pass every tree)."""
    two = {"pkg.a": {"pkg.b": {"pkg.a.x"}}, "pkg.b": {"pkg.a": {"pkg.b.y"}}}
    three = {"pkg.a": {"pkg.b": set()}, "pkg.b": {"pkg.c": set()}, "pkg.c": {"pkg.a": set()}, "pkg.d": {"pkg.a": set()}}
    line = {"pkg.a": {"pkg.b": set()}, "pkg.b": {"pkg.c": set()}, "pkg.c": {}}
    assert _cycles(two) == [["pkg.a", "pkg.b"]]
    assert _cycles(three) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert _cycles(line) == []


def test_model_layers_import_no_model_family():
    """Inside the model package, layers/ sits below models/ (the families build on the layers): a layer that
    imported a family would cycle through models/__init__'s registry when imported first in a process."""
    modules = _modules()
    up = {name: sorted(t for t in _imports(name, path, modules) if t.startswith(f"{RT}.model.models"))
          for name, path in modules.items() if name.startswith(f"{RT}.model.layers")}
    assert not {n: t for n, t in up.items() if t}, "layers importing model families"
    assert f"{RT}.model.layers.moe" in up  # the walk sees the layers
