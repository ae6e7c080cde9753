"""The version matrix: run opscope's fidelity, stack, API, execution-trace and compiled-graph
tests on each supported (torch, Python) pair, each in its own virtualenv, and write COMPAT.md.

Torch wheels other than the local 2.13 CPU build come from the package registry as CUDA builds
of a few GB; they run on the CPU. A machine-wide pip constraints file may cap torch, so the
matrix's own installs run with ``PIP_CONSTRAINT`` pointing at an empty file. Interpreters
come from pyenv (``pyenv versions``) or ``--python VERSION=PATH``. The compiled-graph tests
need a C++ compiler for Inductor (g++); without one they skip, and the row says so.

COMPAT.md keeps the rows of pairs not rerun (each with the date it ran) and any text below
the table, so notes written by hand there survive a rerun.

Usage::

    python bench/compat.py                       # every default pair, writes COMPAT.md
    python bench/compat.py --pairs 2.15.0/3.13   # one pair
    python bench/compat.py --list                # the pairs and their venv folders

A row is reproduced by the command printed in its "reproduce" column. The script runs by
hand and before each release; CI tests the pinned pair only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PAIRS = ("2.4.1/3.10", "2.4.1/3.11", "2.8.0/3.11", "2.8.0/3.12", "2.13.0/3.11",
                 "2.14.1/3.11", "2.15.0/3.12", "2.15.0/3.13")
TEST_FILES = (
    # fidelity: op names and counts against the installed torch.profiler, eager and compiled
    "tests/test_fidelity.py", "tests/test_compile_ranges.py", "tests/test_flops_versions.py",
    # stacks
    "tests/test_with_stack.py", "tests/test_stacks.py", "tests/test_stack_layouts.py",
    # the native observer: input encoding outside the common case, the memory it writes into
    "tests/test_native_inputs.py", "tests/test_native_regions.py",
    # API
    "tests/test_api_names.py", "tests/test_api_215.py", "tests/test_profile_api.py",
    "tests/test_python_collector_hops.py",
    # execution trace and saved torch traces
    "tests/test_execution_trace.py", "tests/test_et_versions.py",
    "tests/test_torch_traces_by_version.py", "tests/test_trace_loader.py",
    # torch.compile'd graphs: kernels as ops, their modules and source lines, Dynamo's frames
    "tests/test_compiled_attribution.py", "tests/test_compiled_report.py",
)
# pip names; a venv that lacks one of them gets it (playwright uses the system chromium;
# duckdb and pyarrow read stores)
TEST_DEPS = ("numpy", "pytest", "ninja", "hypothesis", "psutil", "pandas", "playwright",
             "duckdb", "pyarrow")
COLUMNS = ("torch", "python", "result", "passed", "failed", "skipped", "notes", "date",
           "reproduce")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed)")


def pyenv_python(version: str, overrides: Dict[str, str]) -> Path:
    """The interpreter for ``3.X``: an override, else the newest pyenv 3.X.*."""
    if version in overrides:
        return Path(overrides[version])
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted((p for p in root.glob(f"{version}.*") if (p / "bin" / "python").exists()),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)])
    if not found:
        raise SystemExit(f"compat: no Python {version} under {root}; install it with pyenv "
                         f"or pass --python {version}=/path/to/python")
    return found[-1] / "bin" / "python"


def venv_for(root: Path, torch_version: str, python_version: str) -> Path:
    return root / f"torch{torch_version}-py{python_version}"


def ensure_venv(venv: Path, python: Path, torch_version: str) -> Tuple[bool, str]:
    """Create ``venv`` with torch and the test deps unless it already imports torch; add the
    test deps that an existing venv lacks."""
    exe = venv / "bin" / "python"
    probe = [str(exe), "-c", f"import torch; assert torch.__version__.split('+')[0] == "
                             f"{torch_version!r}"]
    empty = Path(tempfile.mkdtemp()) / "no-constraints.txt"
    empty.write_text("")
    env = dict(os.environ, PIP_CONSTRAINT=str(empty))
    if exe.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        have = subprocess.run([str(exe), "-m", "pip", "list", "--format=freeze"],
                              capture_output=True, text=True).stdout.lower()
        lacking = [d for d in TEST_DEPS if f"{d.lower()}==" not in have]
        if not lacking:
            return True, "reused"
        install = [f"torch=={torch_version}", *lacking]  # torch pinned: never replaced
    else:
        subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
        install = [f"torch=={torch_version}", *TEST_DEPS]
    proc = subprocess.run([str(exe), "-m", "pip", "install", "-q", *install], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return False, "pip: " + (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return True, "installed"


def run_tests(venv: Path, timeout_s: float) -> Tuple[Dict[str, int], str, int]:
    """Run TEST_FILES with the venv's Python from the repo root; (counts, tail, exit status)."""
    files = [f for f in TEST_FILES if (REPO / f).exists()]
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSCOPE_")}
    env["PYTHONPATH"] = str(REPO)
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout_s, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {}, f"timed out after {timeout_s:g} s", 124
    out = proc.stdout + proc.stderr
    last = [line for line in out.splitlines() if SUMMARY.search(line)]
    counts: Dict[str, int] = {}
    for number, word in SUMMARY.findall(last[-1] if last else ""):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(number)
    failures = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return counts, "; ".join(failures[:5]), proc.returncode


def reproduce_command(torch_version: str, python_version: str) -> str:
    return f"python bench/compat.py --pairs {torch_version}/{python_version}"


def write_compat(rows: List[Dict[str, str]], path: Path, notes: str = "") -> None:
    """COMPAT.md: the header, the table, then ``notes`` (text kept from below the table)."""
    lines = [
        "# Compatibility matrix",
        "",
        f"Written by `bench/compat.py`, on {platform.machine()} Linux ({os.cpu_count()} "
        f"cores), CPU only; each row on the date it gives. Each row runs "
        f"{', '.join('`' + Path(f).name + '`' for f in TEST_FILES)} in a virtualenv with "
        "that torch and Python (rows run before a file joined the list did not run it). "
        "Torch builds other than 2.13.0 are the registry's CUDA builds, run on the CPU.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        lines.append("| " + " | ".join(f"`{row[c]}`" if c == "reproduce" else row[c]
                                        for c in COLUMNS) + " |")
    text = "\n".join(lines) + "\n" + ("\n" + notes.strip("\n") + "\n" if notes.strip() else "")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_compat(path: Path) -> Tuple[Dict[Tuple[str, str], Dict[str, str]], str]:
    """The rows already in COMPAT.md by (torch, Python), and the text below its table. A row
    written before the date column takes the date its header gave."""
    rows: Dict[Tuple[str, str], Dict[str, str]] = {}
    if not path.exists():
        return rows, ""
    text = path.read_text()
    written = re.search(r"on (\d{4}-\d{2}-\d{2})", text.split("\n|", 1)[0])
    lines = text.splitlines()
    table = [i for i, line in enumerate(lines) if line.startswith("|")][:1]
    while table and table[-1] + 1 < len(lines) and lines[table[-1] + 1].startswith("|"):
        table.append(table[-1] + 1)  # the first table only: notes may hold tables of their own
    for line in (lines[i] for i in table):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8:  # before the date column
            cells = cells[:7] + [written.group(1) if written else "-"] + cells[7:]
        if len(cells) == len(COLUMNS) and re.match(r"\d+\.\d+", cells[0]):
            row = dict(zip(COLUMNS, cells))
            row["reproduce"] = row["reproduce"].strip("`")
            rows[(row["torch"], row["python"])] = row
    notes = "\n".join(lines[table[-1] + 1:]) if table else ""
    return rows, notes


def merge_rows(path: Path, new: List[Dict[str, str]]) -> List[Dict[str, str]]:
    """Rows already in COMPAT.md for other pairs, plus the new ones, in DEFAULT_PAIRS order."""
    keep = read_compat(path)[0]
    for row in new:
        keep[(row["torch"], row["python"])] = row
    order = {tuple(p.split("/")): i for i, p in enumerate(DEFAULT_PAIRS)}
    return sorted(keep.values(), key=lambda r: (order.get((r["torch"], r["python"]), 99),
                                                r["torch"], r["python"]))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS),
                        metavar="TORCH/PY", help="pairs to run (default: all)")
    parser.add_argument("--venv-root", type=Path,
                        default=Path(os.environ.get("OPSCOPE_COMPAT_VENVS", Path.home() / ".cache" / "opscope-compat")),
                        help="folder of the per-pair virtualenvs (reused between runs)")
    parser.add_argument("--python", action="append", default=[], metavar="VER=PATH",
                        help="interpreter for a Python version, e.g. 3.13=/usr/bin/python3.13")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per pair")
    parser.add_argument("--output", type=Path, default=REPO / "COMPAT.md")
    parser.add_argument("--list", action="store_true", help="print the pairs and exit")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.python)
    rows = []
    for pair in args.pairs:
        torch_version, python_version = pair.split("/")
        venv = venv_for(args.venv_root, torch_version, python_version)
        if args.list:
            print(f"{pair}: {venv}")
            continue
        print(f"compat: {pair}: preparing {venv}", file=sys.stderr, flush=True)
        ok, how = ensure_venv(venv, pyenv_python(python_version, overrides), torch_version)
        counts: Dict[str, int] = {}
        notes = how if not ok else ""
        status = 1
        if ok:
            print(f"compat: {pair}: running tests", file=sys.stderr, flush=True)
            counts, notes, status = run_tests(venv, args.timeout)
            if not (shutil.which("g++") or shutil.which("c++")):
                notes = "; ".join(n for n in (notes, "no C++ compiler: Inductor tests skip") if n)
        passed = status == 0 and counts.get("passed", 0) > 0
        rows.append({"torch": torch_version, "python": python_version,
                     "result": "pass" if passed else "FAIL",
                     "passed": str(counts.get("passed", 0)),
                     "failed": str(counts.get("failed", 0) + counts.get("error", 0)),
                     "skipped": str(counts.get("skipped", 0)),
                     "notes": notes.replace("|", "/") or "-",
                     "date": datetime.date.today().isoformat(),
                     "reproduce": reproduce_command(torch_version, python_version)})
        print(f"compat: {pair}: {rows[-1]['result']} {counts}", file=sys.stderr, flush=True)
    if args.list:
        return 0
    write_compat(merge_rows(args.output, rows), args.output, read_compat(args.output)[1])
    print(f"compat: wrote {args.output}", file=sys.stderr)
    return 0 if all(r["result"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
