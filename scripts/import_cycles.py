"""List the import circles between sibling modules of every kinetoscope package.

A circle is a set of modules (or subpackages) of one package that import each other, directly
or through other siblings; it is reported once, as a strongly connected component of the
package's sibling graph (an import from ``p.a.x`` to ``p.b.y`` is an edge ``a -> b``). Imports
under ``if TYPE_CHECKING:`` count, as they do for import-linter's ``acyclic_siblings`` contract
(pyproject.toml) that keeps the number at zero in ``make lint``; this script says *which* modules
form each circle and through which imports, which the contract's output shows only as the
imports to remove.

Run: ``PYTHONPATH=. python scripts/import_cycles.py`` (exit status 1 when a circle exists).
"""

from __future__ import annotations

import sys

import grimp


def sibling_edges(graph: grimp.ImportGraph, package: str) -> dict[str, dict[str, list[str]]]:
    """Map each child of ``package`` to the siblings it imports, with the imports that do it."""
    children = sorted(graph.find_children(package))
    owner = {}
    for child in children:
        owner[child] = child
        for descendant in graph.find_descendants(child):
            owner[descendant] = child
    edges: dict[str, dict[str, list[str]]] = {child: {} for child in children}
    for importer, head in owner.items():
        for imported in graph.find_modules_directly_imported_by(importer):
            tail = owner.get(imported)
            if tail is not None and tail != head:
                edges[head].setdefault(tail, []).append(f"{importer} -> {imported}")
    return edges


def circles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main(root: str = "kinetoscope") -> int:
    """Print every circle of every package under ``root``; return 1 when there is one."""
    graph = grimp.build_graph(root)
    packages = sorted(m for m in graph.modules if graph.find_children(m))
    total = 0
    for package in packages:
        edges = sibling_edges(graph, package)
        for component in circles(edges):
            total += 1
            print(f"{package}: circle between {', '.join(component)}")
            members = set(component)
            for head in component:
                for tail in sorted(set(edges[head]) & members):
                    for line in edges[head][tail][:3]:
                        print(f"    {line}")
    print(f"{total} circle(s) in {len(packages)} package(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
