"""RELIABILITY.md names real tests: every test it cites exists in the file it names."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cited_tests():
    """(file, test name) for every test cited in RELIABILITY.md's tables."""
    text = (REPO / "RELIABILITY.md").read_text()
    cited = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        default = re.search(r"Tests?:\s+`tests/(test_\w+\.py)`", section)
        for row in section.splitlines():
            if not row.startswith("| ") or row.startswith(("| fault", "|---")):
                continue
            last = row.rstrip(" |").rsplit("|", 1)[-1]
            file = default.group(1) if default else None
            for item in re.findall(r"`([^`]+)`", last):
                path, _, name = item.rpartition("::")
                if path:
                    file = Path(path).name
                cited.append((file, name))
    return cited


def test_every_cited_test_exists():
    cited = cited_tests()
    assert len(cited) > 100
    missing = []
    for file, name in cited:
        assert file is not None, f"{name}: RELIABILITY.md does not say which file holds it"
        source = (REPO / "tests" / file).read_text()
        if not re.search(rf"^def {re.escape(name)}\(", source, flags=re.M):
            missing.append(f"{file}::{name}")
    assert not missing, f"RELIABILITY.md cites tests that do not exist: {missing}"
