"""Golden files under tests/golden: compared by default, rewritten with OPSCOPE_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE_GOLDEN = os.environ.get("OPSCOPE_UPDATE_GOLDEN") == "1"


def check_golden(name: str, text: str) -> None:
    """Assert ``text`` equals golden file ``name`` (or rewrite it, atomically, when updating)."""
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        fd, tmp = tempfile.mkstemp(dir=GOLDEN, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    assert path.exists(), f"{path} is missing; run with OPSCOPE_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8")
