"""House rules of the library's shape, read from the sources with `ast` (nothing is imported):

- no function or method in src/flashwatt is longer than MAX_FUNCTION_LINES lines;
- the imports between flashwatt modules form no circle. Every import counts: at module
  level and inside functions (a lazy import hides a circle from Python, not from a reader),
  `import flashwatt.x`, `from flashwatt.x import y`, relative imports; `from flashwatt.pkg
  import name` is an import of the submodule `flashwatt.pkg.name` where one exists, else of
  the package, whose __init__ is a module of its own.

A circle is reported as its strongly connected component: every module on some cycle with
the others, with the import lines that join them.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "flashwatt"
MAX_FUNCTION_LINES = 100

@dataclass(frozen=True)
class Module:
    name: str  # dotted; a package's __init__ is the package's name
    path: Path
    is_package: bool


def modules(src: Path, package: str) -> dict[str, Module]:
    """Every module of `package` under `src`, by dotted name."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = Module(".".join(parts), path, is_package)
    return out


# ---- function length --------------------------------------------------------------
def function_lengths(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length in lines from `def` to its last line) of every
    function and method, nested ones included."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def long_functions(src: Path, package: str, limit: int) -> list[str]:
    out = []
    for module in modules(src, package).values():
        for name, line, length in function_lengths(ast.parse(module.path.read_text(), str(module.path))):
            if length > limit:
                out.append(f"{module.path.relative_to(src)}:{line} {name} is {length} lines (limit {limit})")
    return out


# ---- import graph -------------------------------------------------------------------
def _owner(name: str, known: dict[str, Module]) -> str | None:
    """The module that `name` (a module, or a name inside one) lives in, or None outside."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(module: Module, known: dict[str, Module]) -> list[tuple[str, int]]:
    """(module, line) of every import of a module of `known` in `module`, at any depth."""
    here = module.name if module.is_package else module.name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(module.path.read_text(), str(module.path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import sub` imports the submodule; `from pkg import name`, the package
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            owner = _owner(target, known)
            if owner is not None and owner != module.name:
                out.append((owner, node.lineno))
    return out


def import_graph(src: Path, package: str) -> dict[str, dict[str, list[int]]]:
    """module -> {imported module: [lines]} over the modules of `package`."""
    known = modules(src, package)
    graph: dict[str, dict[str, list[int]]] = {name: {} for name in known}
    for module in known.values():
        for target, line in imported_modules(module, known):
            lines = graph[module.name].setdefault(target, [])
            if line not in lines:
                lines.append(line)
    return graph


def cycles(graph: dict[str, dict[str, list[int]]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
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
                        found.add(frozenset(component))
    return found


def describe(component: frozenset[str], graph: dict[str, dict[str, list[int]]]) -> str:
    """A circle as the imports that close it: `a:12 -> b` for every edge inside it."""
    edges = [f"    {source}:{','.join(map(str, lines))} -> {target}"
             for source in sorted(component) for target, lines in sorted(graph[source].items()) if target in component]
    return "{" + ", ".join(sorted(component)) + "}\n" + "\n".join(edges)


# ---- the rules --------------------------------------------------------------------
def test_no_function_is_longer_than_the_limit():
    too_long = long_functions(SRC, PACKAGE, MAX_FUNCTION_LINES)
    assert not too_long, "functions over the limit; split them into parts with names that say what each does:\n" + \
        "\n".join(too_long)


def test_no_import_cycle():
    graph = import_graph(SRC, PACKAGE)
    found = cycles(graph)
    assert not found, "import cycles (move what both sides use into a module below them):\n" + \
        "\n".join(describe(c, graph) for c in sorted(found, key=sorted))


# ---- the checks themselves, on a package written for them --------------------------
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_every_import_form_is_an_edge(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "from pkg.core import thing\n",
        "core.py": "thing = 1\n",
        "sub/__init__.py": "",
        "sub/absolute.py": "import pkg.core\n",
        "sub/relative.py": "from ..core import thing\nfrom . import absolute\n",
        "sub/lazy.py": "def f():\n    from pkg.sub import relative\n    return relative\n",
        "sub/package_name.py": "from pkg import thing\n",
        "outside.py": "import os\nfrom json import dumps\n",
    })
    graph = {name: set(targets) for name, targets in import_graph(src, "pkg").items()}
    assert graph == {
        "pkg": {"pkg.core"},
        "pkg.core": set(),
        "pkg.sub": set(),
        "pkg.sub.absolute": {"pkg.core"},
        "pkg.sub.relative": {"pkg.core", "pkg.sub.absolute"},
        "pkg.sub.lazy": {"pkg.sub.relative"},  # the submodule, not the package pkg.sub
        "pkg.sub.package_name": {"pkg"},  # a name of the package's __init__
        "pkg.outside": set(),
    }


def test_a_lazy_import_back_is_a_cycle(tmp_path):
    src = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import g\n\ndef f():\n    return g()\n",
        "b.py": "def g():\n    from pkg import a\n    return a\n",
        "c.py": "from pkg.a import f\n",
    })
    graph = import_graph(src, "pkg")
    assert cycles(graph) == {frozenset({"pkg.a", "pkg.b"})}
    assert "pkg.b:2 -> pkg.a" in describe(frozenset({"pkg.a", "pkg.b"}), graph)


def test_a_long_method_is_named_with_its_length(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(100))
    src = _package(tmp_path, {
        "__init__.py": "",
        "m.py": f"class C:\n    def short(self):\n        pass\n\n    def long(self):\n{body}",
    })
    assert long_functions(src, "pkg", 100) == ["pkg/m.py:5 C.long is 101 lines (limit 100)"]
    assert long_functions(src, "pkg", 101) == []
