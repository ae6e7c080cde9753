"""The SQL store only answers about the store (issue 28, findings 9 to 15).

A store may come from someone else: its content and its path names are not trusted,
while the SQL is the user's own. These tests build every store they read in tmp_path:
SQL sees only the store's files (no other file, no network, no setting turned back),
a folder name with glob characters reads only its own files, a Parquet footer that
declares more rows than the store holds is refused, deeply nested JSON is one line,
an append keeps the earlier windows' collectives, two writers lose no window, a window
is visible only when whole, and a killed convert's temp folder goes with the next one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from opscope.cli import main as cli_main  # noqa: E402
from opscope.store import StoreError, connect  # noqa: E402
from opscope.store.convert import convert  # noqa: E402

from test_store_convert import rank_trace  # noqa: E402


def collectives_per_window(store) -> list:
    return connect(store).sql('SELECT "window", count(*) FROM collectives GROUP BY ALL '
                              'ORDER BY ALL').fetchall()


def test_an_append_keeps_the_earlier_windows_collectives(tmp_path):
    rank_trace(str(tmp_path / "a.rank0.json"), 0, 1, t0=1000.0)
    rank_trace(str(tmp_path / "b.rank0.json"), 0, 1, t0=900_000.0)
    convert([str(tmp_path / "a.rank0.json")], str(tmp_path / "store"))
    assert collectives_per_window(tmp_path / "store") == [(0, 3)]
    convert([str(tmp_path / "b.rank0.json")], str(tmp_path / "store"))
    assert collectives_per_window(tmp_path / "store") == [(0, 3), (1, 3)]
