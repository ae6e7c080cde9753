"""Nested virtualenvs for the tests: a new venv that sees the packages this interpreter sees.

``python -m venv --system-site-packages`` is not that when the tests themselves run in a
virtualenv (the README's set-up): the new venv inherits the *base* interpreter's
site-packages, which may hold no torch, or another torch, or an older setuptools, and
never the outer venv's. So the venv is made without system site-packages, and a ``.pth``
file in its site-packages lists this interpreter's site-packages folders: the nested
venv's own packages come first, then exactly what the running tests import (torch, pip,
setuptools). The outer folders' own ``.pth`` files are not run (an editable opscope's
finder, opscope's start-up hook), so what is installed into the nested venv is what it
imports.
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

PTH_NAME = "_outer_site_packages.pth"


def outer_site_packages() -> List[str]:
    """This interpreter's site-packages folders, in its own order."""
    folders = []
    for folder in site.getsitepackages():
        if Path(folder).is_dir() and folder not in folders:
            folders.append(folder)
    return folders


def make_venv(path: Path, *, env: Optional[dict] = None, timeout: float = 120) -> Path:
    """Make a venv at ``path`` (without pip: it imports this interpreter's) that sees this
    interpreter's packages after its own; returns ``path``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    python = path / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    done = subprocess.run([str(python), "-c", code], check=True, timeout=timeout, env=env,
                          capture_output=True, text=True)
    purelib = Path(done.stdout.strip())
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / PTH_NAME).write_text("".join(f"{folder}\n" for folder in outer_site_packages()))
    return path
