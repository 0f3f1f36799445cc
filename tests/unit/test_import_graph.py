"""The package's import graph: no cycle, counting the imports inside functions too, and no
import of another module's private name.

import-linter's contracts (``make lint``) keep the arrows between the layers pointing down;
inside one layer (the governance modules, the engine's helpers) two modules could still import
each other, one of them from inside a function so that Python's import does not fail. That is
a cycle kept alive by a function-level import, which the layout forbids: this test builds the
graph of every ``dp_spark`` import, at module level or in a function, with the packages each
import initialises, and fails on any cycle (it found governance.statement <-> versions, now
broken by governance.series). A function-level import that remains is there to keep pyspark or
a slow import off a pure path, never to dodge a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dp_spark"


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in it), with their parent packages."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                named = [mod] + [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                continue
            for target in named:
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    q = ".".join(parts[:i])
                    # a module's own parent packages are initialising it already
                    if q in mods and q != name and not name.startswith(q + "."):
                        graph[name].add(q)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_even_through_function_level_imports():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle_kept_alive_by_a_function_level_import(tmp_path):
    pkg = tmp_path / "dp_spark"
    (pkg / "gov").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "gov" / "__init__.py").write_text("")
    (pkg / "gov" / "statement.py").write_text(
        "def build():\n    from dp_spark.gov.versions import history\n    return history\n\ndef is_series(v):\n    return v\n")
    (pkg / "gov" / "versions.py").write_text("from dp_spark.gov.statement import is_series\n\ndef history():\n    pass\n")
    (pkg / "core.py").write_text("import dp_spark.gov.versions\n")
    assert cycles(import_graph(pkg)) == [["dp_spark.gov.statement", "dp_spark.gov.versions"]]


def test_no_module_imports_another_modules_private_name():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dp_spark"):
                bad += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {a.name}" for a in node.names
                        if a.name.startswith("_") and not (a.name.startswith("__") and a.name.endswith("__"))]
    assert bad == []
