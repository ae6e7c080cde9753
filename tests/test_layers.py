"""Imports point down the layers, and no modules import each other in a cycle.

The package is read with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` at module level or inside a function, absolute or relative,
that names a module of the package. The ranks, lowest first (docs/architecture.md,
"The layers"): model, files; collect, load; analysis; export, report, store; the API
(api/, outputs.py and the other top-level modules); cli. A module may import from
its own rank or a lower one; collect and load, and export and report, not from each other.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Set, Tuple

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "opscope"

# Rank of each part of the package: an import may point to the same rank or lower.
# The longest matching dotted prefix wins; anything unlisted is DEFAULT_RANK.
RANKS: Dict[str, int] = {
    "opscope.model": 0,
    "opscope.arguments": 0,
    "opscope.version": 0,
    "opscope.files": 0,
    "opscope.collect": 1,
    "opscope.load": 1,
    "opscope.step_tracker": 1,
    "opscope.analysis": 2,
    "opscope.export": 3,
    "opscope.report": 3,
    "opscope.store": 3,
    "opscope.api": 4,
    "opscope.cli": 5,
    "opscope.__main__": 5,
}
DEFAULT_RANK = 4  # outputs.py and the other top-level modules, dynamo, autograd, ...

# Parts of one rank that must not import each other: the two sources; the writers of
# output formats and the report (what both need lives below them, the registry above).
APART: List[Tuple[str, str]] = [("opscope.collect", "opscope.load"),
                                ("opscope.export", "opscope.report")]

# Known violations in files other slices of issue 15 own: (importer, imported) -> reason.
# The lead empties this list after merging; an entry that no longer matches fails the test.
ALLOWED_UPWARD: Dict[Tuple[str, str], str] = {
}


class Import(NamedTuple):
    """One import of a package module: who imports what, where."""

    importer: str
    target: str
    path: Path
    line: int
    text: str


def module_files(package_dir: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``package_dir``."""
    root = package_dir.parent
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: Dict[str, Path]) -> str:
    """The deepest module of the package that ``name`` names ('' if none)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _base_of(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute dotted name that ``from <base> import ...`` reads from."""
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = ".".join(parts[:max(keep, 0)])
    return f"{base}.{node.module}" if node.module else base


def _targets(node: ast.AST, importer: str, is_package: bool,
             modules: Dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield _resolve(alias.name, modules)
    elif isinstance(node, ast.ImportFrom):
        base = _base_of(node, importer, is_package)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            yield submodule if submodule in modules else _resolve(base, modules)


def package_imports(package_dir: Path) -> List[Import]:
    """Every import, at any depth of the code, of one of the package's own modules."""
    modules = module_files(package_dir)
    found = []
    for importer, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, filename=str(path))):
            targets = set(_targets(node, importer, path.name == "__init__.py", modules))
            for target in sorted(targets - {"", importer}):
                found.append(Import(importer, target, path, node.lineno,
                                    lines[node.lineno - 1].strip()))
    return found


def _matching(name: str, table: Dict[str, int]) -> str:
    return max((p for p in table if name == p or name.startswith(p + ".")), key=len, default="")


def rank_of(module: str, ranks: Dict[str, int] = RANKS, default: int = DEFAULT_RANK) -> int:
    """The layer ``module`` belongs to."""
    prefix = _matching(module, ranks)
    return ranks[prefix] if prefix else default


def upward_imports(imports: List[Import], ranks: Dict[str, int] = RANKS,
                   default: int = DEFAULT_RANK) -> List[Import]:
    """The imports that point to a higher rank than their importer's."""
    return [i for i in imports if rank_of(i.target, ranks, default) > rank_of(i.importer, ranks, default)]


def imports_across(imports: List[Import], apart: List[Tuple[str, str]]) -> List[Import]:
    """The imports from one of a pair of parts into the other."""
    def inside(module: str, part: str) -> bool:
        return module == part or module.startswith(part + ".")

    return [i for i in imports for a, b in apart
            if (inside(i.importer, a) and inside(i.target, b))
            or (inside(i.importer, b) and inside(i.target, a))]


def import_cycles(imports: List[Import]) -> List[List[str]]:
    """The strongly connected groups of two or more modules (Tarjan), each sorted."""
    graph: Dict[str, Set[str]] = {}
    for i in imports:
        graph.setdefault(i.importer, set()).add(i.target)
        graph.setdefault(i.target, set())
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def _describe(found: List[Import], ranks: Dict[str, int] = RANKS) -> str:
    return "\n".join(
        f"{i.path}:{i.line}: {i.importer} (rank {rank_of(i.importer, ranks)}) imports "
        f"{i.target} (rank {rank_of(i.target, ranks)}): {i.text}" for i in found)


@pytest.fixture(scope="module")
def imports() -> List[Import]:
    return package_imports(PACKAGE_DIR)


def test_the_reader_sees_the_package(imports):
    importers = {i.importer for i in imports}
    assert {"opscope", "opscope.api.profiler", "opscope.cli.main"} <= importers
    assert len(imports) > 100


def test_imports_point_down_the_layers(imports):
    upward = [i for i in upward_imports(imports)
              if (i.importer, i.target) not in ALLOWED_UPWARD]
    assert not upward, "imports pointing up the layers:\n" + _describe(upward)


def test_allowed_upward_imports_still_exist(imports):
    seen = {(i.importer, i.target) for i in upward_imports(imports)}
    stale = sorted(set(ALLOWED_UPWARD) - seen)
    assert not stale, f"fixed: remove from ALLOWED_UPWARD: {stale}"


def test_apart_parts_do_not_import_each_other(imports):
    across = imports_across(imports, APART)
    assert not across, "parts kept apart import each other:\n" + _describe(across)


def test_no_import_cycles(imports):
    cycles = import_cycles(imports)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _write(root: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/base/__init__.py": "",
        "pkg/base/low.py": "def f():\n    from ..top import main\n",  # lazy, relative, upward
        "pkg/base/a.py": "from pkg.base import b\n",
        "pkg/base/b.py": "import pkg.base.a\n",
        "pkg/mid/__init__.py": "from .one import x\n",
        "pkg/mid/one.py": "from pkg.mid.two import y\n",
        "pkg/mid/two.py": "from pkg.base.a import z\n",
        "pkg/top.py": "from . import mid\nfrom .mid import one\n",
    })
    ranks = {"pkg.base": 0, "pkg.mid": 1, "pkg.top": 2}
    found = package_imports(package)
    targets = {(i.importer, i.target) for i in found}
    assert {("pkg.top", "pkg.mid"), ("pkg.top", "pkg.mid.one"), ("pkg.mid", "pkg.mid.one"),
            ("pkg.base.low", "pkg.top")} <= targets
    upward = upward_imports(found, ranks, default=9)
    assert [(i.importer, i.target, i.line) for i in upward] == [("pkg.base.low", "pkg.top", 2)]
    assert "pkg/base/low.py:2" in _describe(upward, ranks)
    assert import_cycles(found) == [["pkg.base.a", "pkg.base.b"]]
    assert imports_across(found, [("pkg.base", "pkg.mid")]) == [
        i for i in found if i.importer == "pkg.mid.two"]
