"""The linter: ``ruff check`` with the rules of pyproject.toml's ``[tool.ruff]``, clean.

ruff comes with the ``test`` extra, pinned (its rules change between releases); where it
is not installed, these tests skip. To see the findings: ``python -m ruff check``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "pyproject.toml"
# every Python file of ours: the package, its tests, benchmarks and examples, the two
# top-level modules
PATHS = ["opscope", "tests", "bench", "examples", "setup.py", "_opscope_startup.py"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                                reason="ruff is not installed (pip install -e '.[test]')")


def ruff_check(*paths: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``ruff check`` with the repository's config, writing no cache into the checkout."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(CONFIG), "--no-cache",
         "--output-format", "concise", *paths],
        cwd=cwd, capture_output=True, text=True, timeout=300)


def ruff_version() -> str:
    done = subprocess.run([sys.executable, "-m", "ruff", "--version"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or done.stderr.strip()


def test_the_tree_is_clean():
    done = ruff_check(*PATHS)
    assert done.returncode == 0, (
        f"{ruff_version()} finds, with pyproject.toml's [tool.ruff] rules "
        f"(fix them, or `# noqa: CODE  (why)` where a finding is intended):\n"
        f"{done.stdout}{done.stderr}")


def test_the_rules_catch_what_they_should(tmp_path):
    """The config is in force: a file with an unused import, an undefined name and a
    mutable default argument fails, each finding named."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\n"
                   "def f(items=[]):\n"
                   "    return items + undefined_name\n")
    done = ruff_check(str(bad), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    for code in ("F401", "F821", "B006"):
        assert f" {code} " in done.stdout, (code, done.stdout)
    good = tmp_path / "good.py"
    good.write_text("import os\n\nprint(os.sep)\n")
    done = ruff_check(str(good), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
