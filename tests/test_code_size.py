"""Functions and modules stay short enough to read in one sitting.

No function of the package is over MAX_FUNCTION_LINES lines (decorators and
docstring included). No module is over MAX_MODULE_LINES lines unless its first
docstring has a line starting ``Over 400 lines:`` that says why. No C++ file of the
package (``.cpp``, ``.h``) is over MAX_CPP_LINES lines: the native observer is one
translation unit split into headers by job (collect/native/observer/), so that a file of it
holds one job.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Tuple

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "opscope"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
REASON_MARK = "Over 400 lines:"
# The largest C++ file, load/trace_scan.cpp, is 531 lines (then
# collect/native/cupti_observer.cpp 510, collect/native/et_observer.cpp 507; the observer's
# headers are 346 at most): a file that grows past this holds a second job, which goes in a
# file of its own.
MAX_CPP_LINES = 540
CPP_SUFFIXES = (".cpp", ".h")

# Long code that must stay long, with the reason, by path under opscope/ (and function
# name). An entry that is no longer too long fails the test.
ALLOWED_LONG_MODULES: Dict[str, str] = {}
ALLOWED_LONG_FUNCTIONS: Dict[Tuple[str, str], str] = {}


def _files(package_dir: Path) -> List[Path]:
    return sorted(package_dir.rglob("*.py"))


def long_functions(package_dir: Path, limit: int = MAX_FUNCTION_LINES) -> Dict[Tuple[str, str], int]:
    """(path under the package, qualified name) -> lines, for each function over ``limit``."""
    found = {}
    for path in _files(package_dir):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(package_dir).as_posix()
        for name, node in _functions(tree, ""):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - first + 1
            if lines > limit:
                found[(where, name)] = lines
    return found


def _functions(node: ast.AST, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                yield name, child
            yield from _functions(child, name + ".")
        else:
            yield from _functions(child, prefix)


def long_modules(package_dir: Path, limit: int = MAX_MODULE_LINES) -> Dict[str, int]:
    """Path under the package -> lines, for each module over ``limit`` with no reason given."""
    found = {}
    for path in _files(package_dir):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines <= limit:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not any(line.strip().startswith(REASON_MARK) for line in doc.splitlines()):
            found[path.relative_to(package_dir).as_posix()] = lines
    return found


def test_no_function_is_over_80_lines():
    found = {k: v for k, v in long_functions(PACKAGE_DIR).items() if k not in ALLOWED_LONG_FUNCTIONS}
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: split them: {found}"


def test_no_module_is_over_400_lines_without_a_reason():
    found = {k: v for k, v in long_modules(PACKAGE_DIR).items() if k not in ALLOWED_LONG_MODULES}
    assert not found, (f"modules over {MAX_MODULE_LINES} lines: split them, or start a line "
                       f"of the module docstring with {REASON_MARK!r}: {found}")


def test_allowed_long_code_is_still_long():
    stale = sorted(set(ALLOWED_LONG_MODULES) - set(long_modules(PACKAGE_DIR)))
    stale += sorted(set(ALLOWED_LONG_FUNCTIONS) - set(long_functions(PACKAGE_DIR)))
    assert not stale, f"now short enough: remove from the allow-lists: {stale}"


def test_the_checks_catch_long_code(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (package / "long.py").write_text(
        "class C:\n    @staticmethod\n    def method():\n" + body.replace("    ", "        ")
        + "def short():\n    pass\n" + "\n" * 330)
    (package / "explained.py").write_text(
        '"""A table.\n\nOver 400 lines: one entry per operator.\n"""\n' + "\n" * 400)
    (package / "fine.py").write_text("def f():\n" + body[:-len("    x79 = 79\n")])
    assert long_functions(package) == {("long.py", "C.method"): 82}
    assert long_modules(package) == {"long.py": 415}


def cpp_files(package_dir: Path) -> List[Path]:
    return sorted(p for p in package_dir.rglob("*") if p.suffix in CPP_SUFFIXES)


def long_cpp_files(package_dir: Path, limit: int = MAX_CPP_LINES) -> Dict[str, int]:
    """Path under the package -> lines, for each C++ file (.cpp, .h) over ``limit``."""
    found = {}
    for path in cpp_files(package_dir):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found[path.relative_to(package_dir).as_posix()] = lines
    return found


def test_no_cpp_file_is_over_540_lines():
    names = {p.relative_to(PACKAGE_DIR).as_posix() for p in cpp_files(PACKAGE_DIR)}
    # the check sees them
    assert {"collect/native/observer.cpp", "collect/native/observer/records.h"} <= names
    found = long_cpp_files(PACKAGE_DIR)
    assert not found, f"C++ files over {MAX_CPP_LINES} lines: split them by job: {found}"


def test_the_cpp_check_catches_long_files(tmp_path):
    package = tmp_path / "pkg"
    (package / "native").mkdir(parents=True)
    (package / "native" / "long.h").write_text("int x;\n" * 541)
    (package / "long.cpp").write_text("int y;\n" * 600)
    (package / "fine.cpp").write_text("int z;\n" * 540)
    (package / "notes.txt").write_text("x\n" * 1000)
    assert long_cpp_files(package) == {"native/long.h": 541, "long.cpp": 600}
