"""Per-thread row buffers of the Python collector (rows in RECORD_DTYPE field order).

Example::

    >>> buf = ThreadBuffer(0)
    >>> row = open_row(buf, 10, name_id=3, scope=0)
    >>> close_row(row, 25); row[:2]
    [10, 25]
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

from opscope.model.records import FLAG_UNFINISHED, NO_INPUTS

monotonic_ns = time.monotonic_ns


class ThreadBuffer:
    """One thread's rows (RECORD_DTYPE field order) and encoded inputs."""

    __slots__ = ("index", "os_tid", "rows", "inputs", "backward", "stacks")

    def __init__(self, index: int):
        self.index = index
        self.os_tid = threading.get_native_id()
        self.rows: List[Any] = []  # tuples when complete, lists while open
        self.inputs: List[int] = []
        self.backward: List[tuple] = []  # open (evaluate_function, node) row pairs
        self.stacks: Dict[int, int] = {}  # with_stack: row index -> stack id


def open_row(buf: ThreadBuffer, start: int, name_id: int, scope: int, seq_nr: int = -1) -> list:
    return [start, 0, seq_nr, name_id, buf.index, 0, buf.index + 1, NO_INPUTS, scope,
            FLAG_UNFINISHED, 0]


def close_row(row: list, end: int) -> None:
    row[1] = end
    row[9] &= ~FLAG_UNFINISHED
