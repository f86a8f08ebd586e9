"""The import graph of `t2r/`: no cycles, and every import goes down the layers.

Every module is parsed with `ast`; every `import` counts, at module level or inside a function (an import
inside a function only hides a cycle, it does not remove it), relative imports resolved. `from package import
name` counts as an import of the submodule `package.name` when there is one, else of the package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "t2r"

LAYERS = (
    {"t2r.paths", "t2r.dtypes", "t2r.outputs", "t2r.ranking", "t2r.manifest", "t2r.words", "t2r.lazy",
     "t2r.version", "t2r.optim", "t2r.settings"},
    {"t2r.ops", "t2r.data"},
    {"t2r.layers"},
    {"t2r.models", "t2r.sources", "t2r.model_check", "t2r.model_dir"},
    {"t2r.convert"},
    {"t2r.eval"},
    {"t2r.train", "t2r"},
    {"t2r.cli", "t2r.lm_eval", "t2r.__main__"},
)
"""Lowest first: a module may import from its own layer and the ones below. `t2r.paths`, `dtypes`, `outputs`,
`ranking`, `manifest`, `words` and `lazy` import nothing of t2r; evaluation imports no training code (a recipe's
`eval:` section reads `t2r.eval.settings`); `t2r.data` reads documents and imports none of the model
code, so conversion's calibration reads text through it; `t2r.sources` loads source models (checked by
`t2r.model_check`); `t2r` (the package's `__init__`) is the public API over conversion; `t2r.lm_eval` and
`t2r.__main__` (`python -m t2r`) are command lines."""

KNOWN_CYCLES: list[set[str]] = []
"""Cycles that exist and are being removed; each entry must still be a cycle of the graph."""


def module_names() -> dict[str, Path]:
    """Dotted name -> file of every module of t2r (a package by its `__init__.py`)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules) -> list[str]:
    """The t2r modules one import statement of `module` imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module
        submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
        names = submodules + ([target] if len(submodules) < len(node.names) else [])
    found = []
    for name in names:
        while name and name not in modules:  # `import t2r.a.b.c` where c is an attribute: module t2r.a.b
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first such import}."""
    modules = module_names()
    graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported(node, module, path.name == "__init__.py", modules):
                    if target != module:
                        edges.setdefault(target, node.lineno)
    return graph


def strongly_connected(graph) -> list[set[str]]:
    """Tarjan's strongly connected components with more than one module: every cycle lies inside one."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def a_cycle(graph, component: set[str]) -> list[str]:
    """The shortest cycle through the first module of a strongly connected component (breadth first), as a list
    of modules that ends where it starts."""
    start = min(component)
    parent, queue = {start: None}, [start]
    for module in queue:
        for target in sorted(graph[module]):
            if target == start:
                path = [module]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if target in component and target not in parent:
                parent[target] = module
                queue.append(target)
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def describe(graph, cycle: list[str]) -> str:
    return "\n".join(f"  {a} (line {graph[a][b]}) imports {b}" for a, b in zip(cycle, cycle[1:]))


def layer_of(module: str) -> int:
    """The index in LAYERS of the layer holding `module` (by its longest listed prefix)."""
    best = max((name for layer in LAYERS for name in layer if module == name or module.startswith(name + ".")),
               key=len, default=None)
    assert best is not None, f"{module} is in no layer of LAYERS: add it to the layer it belongs to"
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def test_no_import_cycles():
    graph = import_graph()
    found = strongly_connected(graph)
    unknown = [c for c in found if not any(c <= known for known in KNOWN_CYCLES)]
    assert not unknown, "import cycles in t2r:\n" + "\n\n".join(describe(graph, a_cycle(graph, c)) for c in unknown)
    stale = [known for known in KNOWN_CYCLES if not any(c <= known and len(c) > 1 for c in found)]
    assert not stale, f"no longer a cycle, delete its entry in KNOWN_CYCLES: {stale}"


def upward_imports(graph) -> list[str]:
    return [f"  {a} (layer {layer_of(a)}, line {line}) imports {b} (layer {layer_of(b)})"
            for a, edges in sorted(graph.items()) for b, line in edges.items() if layer_of(b) > layer_of(a)]


def test_imports_go_down_the_layers():
    upward = upward_imports(import_graph())
    assert not upward, "imports against the layer order (LAYERS, lowest first):\n" + "\n".join(upward)


def test_the_checks_find_what_they_look_for():
    """A cycle and an upward import, made up, are found and named."""
    graph = {"t2r.a": {"t2r.b": 3}, "t2r.b": {"t2r.c": 5}, "t2r.c": {"t2r.a": 7, "t2r.d": 1}, "t2r.d": {}}
    assert strongly_connected(graph) == [{"t2r.a", "t2r.b", "t2r.c"}]
    cycle = a_cycle(graph, {"t2r.a", "t2r.b", "t2r.c"})
    assert cycle == ["t2r.a", "t2r.b", "t2r.c", "t2r.a"]
    assert describe(graph, cycle).splitlines()[2] == "  t2r.c (line 7) imports t2r.a"
    modules = {"t2r", "t2r.eval", "t2r.eval.bench", "t2r.eval.suite", "t2r.data"}
    relative = ast.parse("from . import bench\nfrom .bench import x\nfrom ..data import y\nimport t2r.eval.bench.z")
    assert [imported(node, "t2r.eval.suite", False, modules) for node in relative.body] == \
        [["t2r.eval.bench"], ["t2r.eval.bench"], ["t2r.data"], ["t2r.eval.bench"]]
    assert imported(ast.parse("from . import suite, BUILTIN").body[0], "t2r.eval", True, modules) == \
        ["t2r.eval.suite", "t2r.eval"]
    assert layer_of("t2r.ops.gla.chunk") < layer_of("t2r.layers.gla") < layer_of("t2r.cli.app")
    assert upward_imports({"t2r.models.modeling": {"t2r.layers": 9, "t2r.convert.conversion": 12},
                           "t2r.convert.conversion": {"t2r.models": 3}}) == \
        ["  t2r.models.modeling (layer 3, line 12) imports t2r.convert.conversion (layer 4)"]


def test_every_import_of_t2r_names_a_module_that_exists():
    """An import inside a function runs only when called: one naming a module that was moved or renamed would fail
    there, not at `import t2r`. Every `from t2r.x import y` must name an existing module `t2r.x`."""
    modules = module_names()
    missing = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("t2r"):
                if node.module not in modules:
                    missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                missing += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: import {alias.name}"
                            for alias in node.names if alias.name.startswith("t2r") and alias.name not in modules]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_subpackages_are_reached_after_import_t2r():
    """`import t2r` then `t2r.eval.evaluate(...)`, as the README shows (the subpackages load on first use)."""
    code = "import t2r; print(callable(t2r.eval.evaluate), t2r.train.__name__, t2r.data.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "t2r.train", "t2r.data"]
