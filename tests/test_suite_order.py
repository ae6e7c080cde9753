"""The suite's own scheduling: conftest.LONGEST_FIRST names test files that exist, once each,
and collection puts them first in that order (pytest-xdist hands files out in that order)."""

from __future__ import annotations

from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent


def test_longest_first_names_existing_test_files_once():
    names = list(conftest.LONGEST_FIRST)
    assert len(set(names)) == len(names)
    assert [n for n in names if not (TESTS / n).is_file()] == []


class _Item:
    def __init__(self, name: str, test: str):
        self.path = TESTS / name
        self.test = test


def test_collection_runs_the_longest_files_first_and_keeps_the_rest_in_order():
    first, second = conftest.LONGEST_FIRST[:2]
    items = [_Item("test_tree.py", "a"), _Item(second, "b"), _Item("test_schedule.py", "c"),
             _Item(first, "d"), _Item(second, "e"), _Item("test_tree.py", "f")]
    conftest.pytest_collection_modifyitems(items)
    assert [(i.path.name, i.test) for i in items] == [
        (first, "d"), (second, "b"), (second, "e"), ("test_tree.py", "a"),
        ("test_schedule.py", "c"), ("test_tree.py", "f")]
