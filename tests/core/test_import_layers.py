"""The project's import graph has no cycle and points down the layers only.

An AST walk over every module of `toolserver`, `canvasagent`, `rewards` and `canvascraft`
collects every import of a project module, at module level or inside a function, in the
`import a.b` and `from a import b` forms (relative ones resolved). Imports of third-party
packages are not edges. The layers, bottom first (`LAYERS`, longest prefix wins):

    toolbox   toolserver
    core      canvasagent.core, the loop's core
    middle    rewards, canvascraft
    apps      the rest of canvasagent (training, evaluation, easel, ui, cli, pipeline, ...)

A module may import its own layer or a lower one. Two views of the graph are checked: every
edge must point down or sideways, and the graph must have no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("toolserver", "canvasagent", "rewards", "canvascraft")
ORDER = ("toolbox", "core", "middle", "apps")

# Module-name prefix -> layer; the longest matching prefix decides.
LAYERS = {
    "toolserver": "toolbox",
    "canvasagent.core": "core",
    "rewards": "middle",
    "canvascraft": "middle",
    "canvascraft.__main__": "apps",  # the CanvasCraft command line
    "canvasagent": "apps",
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise KeyError(module)


def project_modules() -> dict[str, Path]:
    """Module name -> file, for every .py file of the packages (a package is its __init__)."""
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _resolve(target: str, mods: dict[str, Path]) -> str | None:
    """The project module an import of `target` loads last: itself or its nearest package."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in mods:
            return name
    return None


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported project module, line) for every import statement in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                hit = _resolve(alias.name, mods)
                if hit:
                    out.append((hit, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                # `from pkg import sub` loads the submodule pkg.sub when there is one.
                hit = _resolve(f"{base}.{alias.name}", mods) if alias.name != "*" else None
                if hit is None or hit == _resolve(base, mods):
                    hit = _resolve(base, mods)
                if hit:
                    out.append((hit, node.lineno))
    return out


def import_graph() -> dict[str, dict[str, list[str]]]:
    """module -> {imported module: ["file:line", ...]} (self-imports dropped)."""
    mods = project_modules()
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in mods}
    for mod, path in mods.items():
        where = path.relative_to(ROOT).as_posix()
        for dst, line in imports_of(mod, path, mods):
            sites = graph[mod].setdefault(dst, []) if dst != mod else []
            if dst != mod and f"{where}:{line}" not in sites:
                sites.append(f"{where}:{line}")
    return graph


def strongly_connected(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def upward_edges(graph: dict[str, dict[str, list[str]]]) -> dict[tuple[str, str], list[str]]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return {
        (src, dst): where
        for src, deps in graph.items()
        for dst, where in deps.items()
        if rank[layer_of(dst)] > rank[layer_of(src)]
    }


def cycle_edges(graph: dict[str, dict[str, list[str]]]) -> dict[tuple[str, str], list[str]]:
    """Every edge that lies inside a cycle (both ends in one strongly connected component)."""
    out: dict[tuple[str, str], list[str]] = {}
    for comp in strongly_connected(graph):
        members = set(comp)
        for src in comp:
            for dst, where in graph[src].items():
                if dst in members:
                    out[(src, dst)] = where
    return out


def _report(title: str, edges: dict[tuple[str, str], list[str]]) -> str:
    lines = [title]
    for (src, dst), where in sorted(edges.items()):
        lines.append(f"  {src} [{layer_of(src)}] -> {dst} [{layer_of(dst)}]: {', '.join(where)}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_every_module_has_a_layer(graph):
    for mod in graph:
        layer_of(mod)


def test_imports_point_down_the_layers(graph):
    up = upward_edges(graph)
    assert not up, _report("imports that point up the layers (move the code down, or pass it in):", up)


def test_no_import_cycle(graph):
    edges = cycle_edges(graph)
    comps = "\n".join("  cycle: " + " <-> ".join(c) for c in strongly_connected(graph))
    assert not edges, _report(f"import cycles:\n{comps}\nedges inside them:", edges)


def test_walk_sees_function_local_relative_and_from_imports(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text(
        "import a.b\n"
        "from . import c\n"
        "from .. import d\n"
        "from a.b import name\n"
        "def f():\n"
        "    from a.e import thing\n"
        "    import numpy\n"
    )
    mods = {m: src for m in ("a", "a.b", "a.e", "p", "p.q", "p.q.c", "p.d")}
    assert imports_of("p.q.mod", src, mods) == [("a.b", 1), ("p.q.c", 2), ("p.d", 3), ("a.b", 4), ("a.e", 6)]
