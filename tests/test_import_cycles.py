"""No import cycles among the project's own modules: each module stands above everything it imports.

Every import statement counts, wherever it stands (inside a function, under ``if TYPE_CHECKING:``): an import
deferred to run time is still a dependency, and a cycle of them is two rooms that each need the other.  ``from P
import name`` depends on P's submodule ``name`` when there is one, else on P itself; importing a submodule is not
counted as importing its package's ``__init__`` (a package that re-exports its modules is no cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"tests", "build", "dist", "docs"}

# Cycles known and being removed elsewhere, each with why it is allowed here for now.  An entry whose cycle is gone
# fails the test: take it out.
KNOWN: dict[frozenset, str] = {}  # a cycle allowed for now, with the reason (none)


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project outside tests and hidden folders."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP or any(p.startswith(".") for p in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a.b: the module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, with an explicit stack)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                    out.append(component)
    return out


def test_the_finder_sees_a_cycle_and_a_deferred_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    modules = {
        "pkg": tmp_path / "pkg" / "__init__.py",
        "pkg.x": tmp_path / "pkg" / "x.py",
        "pkg.y": tmp_path / "pkg" / "y.py",
    }
    for path in modules.values():
        path.parent.mkdir(exist_ok=True)
    modules["pkg"].write_text("")
    modules["pkg.x"].write_text("def f():\n    from .y import g\n")
    modules["pkg.y"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import x\n")
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.x": {"pkg.y"}, "pkg.y": {"pkg.x"}}
    assert cycles(graph) == [{"pkg.x", "pkg.y"}]


def test_no_import_cycles_among_the_projects_modules():
    modules = project_modules()
    assert {"train", "training.trainer", "training.config.parallel", "models.gpt", "learn.train"} <= set(modules)
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    found = [frozenset(c) for c in cycles(graph)]
    unknown = [sorted(c) for c in found if c not in KNOWN]
    assert not unknown, "import cycles: " + "; ".join(" <-> ".join(c) for c in unknown)
    gone = [sorted(c) for c in KNOWN if c not in found]
    assert not gone, f"no longer a cycle, take it out of KNOWN: {gone}"
