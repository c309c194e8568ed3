"""The import graph of the installed ``somatile`` package: no cycle, no private name taken from another module.

An import cycle means a concept lives in the wrong module (STYLE.md rule 11): the fix is to move the concept,
not to hide the import inside a function, so imports inside functions count here as much as module-level
ones. The modules are read with ``ast`` from the installed package's folders; nothing is imported from them.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import sys
import warnings
from pathlib import Path

import somatile

# Import cycles allowed for now (each entry the module set of one strongly connected component of the import
# graph): none are left. A cycle not listed fails the test; a listed one that is gone is reported (a warning)
# so that its entry is deleted.
KNOWN_CYCLES: set[frozenset[str]] = set()


def subpackages() -> set[str]:
    """``somatile.model``, ``somatile.hw``, ...: what pkgutil finds in a regular install, plus the folders an
    editable install maps (its finder lists them in ``MAPPING``; pkgutil cannot see through it)."""
    names = {m.name for m in pkgutil.iter_modules(somatile.__path__, "somatile.")}
    for finder in sys.meta_path:
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", ""), None), "MAPPING", {})
        names |= {name for name in mapping if name.startswith("somatile.")}
    return names


def package_modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the installed package."""
    modules = {}
    for package in sorted(subpackages()):
        for folder in importlib.util.find_spec(package).submodule_search_locations:
            for path in sorted(Path(folder).rglob("*.py")):
                parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
                modules[".".join([package, *parts])] = path
    return modules


MODULES = package_modules()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports_of(name: str) -> list[tuple[str, str | None, int]]:
    """(imported module, name taken from it or None, line) for every import statement in module ``name``,
    at module level and inside functions and classes, relative imports resolved."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    package = name if is_package(name) else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in MODULES:  # `from somatile.model import soma`: the module itself
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
    return [(target, taken, line) for target, taken, line in found if target.split(".")[0] == "somatile"]


def import_graph() -> dict[str, set[str]]:
    return {name: {target for target, _, _ in imports_of(name) if target in MODULES and target != name}
            for name in MODULES}


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module (the import cycles)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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
                    components.append(frozenset(component))
    return components


def test_walks_the_whole_package():
    for package in ("somatile.model", "somatile.eval", "somatile.hw", "somatile.sim", "somatile.host",
                    "somatile.boards"):
        assert package in MODULES, f"{package} is not installed (pip install -e . after editing pyproject.toml)"
    assert "somatile.model.hccs" in MODULES and "somatile.host.cli" in MODULES


def test_no_import_cycle():
    cycles = set(strongly_connected(import_graph()))
    new = sorted(sorted(c) for c in cycles - KNOWN_CYCLES)
    assert not new, f"import cycles (move the shared concept into a module both use): {new}"
    gone = sorted(sorted(c) for c in KNOWN_CYCLES - cycles)
    if gone:
        warnings.warn(f"import cycles gone: delete them from KNOWN_CYCLES in {__file__}: {gone}")


def test_every_import_names_a_module_of_the_package():
    """After a move, no import still names the old place (functions' imports run only when called)."""
    stale = [f"{MODULES[name]}:{line}: {target}" for name in MODULES for target, _, line in imports_of(name)
             if target not in MODULES and target != "somatile"]
    assert not stale, "imports of modules that do not exist: " + "; ".join(stale)


def test_no_private_name_imported_across_modules():
    private = [f"{MODULES[name]}:{line}: from {target} import {taken}"
               for name in MODULES for target, taken, line in imports_of(name)
               if taken is not None and taken.startswith("_") and not taken.startswith("__") and target != name]
    assert not private, "private names imported from another module: " + "; ".join(private)


def test_cycle_finder():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert strongly_connected(graph) == [frozenset("abc")]
