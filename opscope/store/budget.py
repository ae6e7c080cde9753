"""The memory that reading a store's windows takes, estimated from footers, and its limit.

Before a verb reads a window it adds up what the footers of the window's files
declare (:func:`rows_size`): each file's rows times its table's column widths
(``ROW_WIDTH``: 8 bytes an int64, 4 an int32, a dictionary index or a string's
or list's offset...) plus the uncompressed bytes the footer declares (the strings
and lists). That is about the size of the rows in memory, as pyarrow or DuckDB
hold them. Building a session from them (``load_store_session``: the report, a
module table) or Python objects (the ranks' facts) takes about ``SESSION_FACTOR``
times that (measured, beyond the ~60 MB that importing pyarrow takes: 3.3 times
for a 1M-event window, 4.1 for a 200k-event one). When the estimate is
over the limit, :func:`check_memory` refuses with a StoreError naming the window
and both figures, before a row is read.

The limit is ``--memory-limit`` (DuckDB's spelling of sizes: :func:`parse_size`),
else ``default_memory_limit()``: 80% of this machine's memory (or of the cgroup's
limit when lower), DuckDB's own default for its ``memory_limit``.

Example::

    >>> parse_size("500MB"), parse_size("1.5 GiB"), format_size(2_500_000_000)
    (500000000, 1610612736, '2.5 GB')
    >>> check_memory("store 's', rank 0, window 0", 3_000_000, 1_000_000)
    Traceback (most recent call last):
    ...
    opscope.store.schema.StoreError: store 's', rank 0, window 0: reading it needs about 3.0 MB of memory, more than the limit of 1.0 MB (--memory-limit)
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional

from opscope.store.folder import Footer
from opscope.store.schema import COLUMNS, StoreError

_WIDTHS = {"int8": 1, "int32": 4, "int64": 8, "dict": 4, "string": 4, "list<int64>": 4,
           "list<string>": 4}
ROW_WIDTH: Dict[str, int] = {t: sum(_WIDTHS[kind] for _, kind in cols)
                             for t, cols in COLUMNS.items()}
SESSION_FACTOR = 4
DEFAULT_FRACTION = 0.8
_UNITS = {"b": 1, "byte": 1, "bytes": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6,
          "mb": 10 ** 6, "g": 10 ** 9, "gb": 10 ** 9, "t": 10 ** 12, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]+)\s*")


def parse_size(text: str) -> int:
    """Bytes of a size as DuckDB's ``memory_limit`` spells it: a number and a unit (KB, MB,
    GB, TB: powers of 1000; KiB, MiB, GiB, TiB: of 1024; B); ValueError otherwise.

    >>> parse_size("2GB")
    2000000000
    >>> parse_size("2")
    Traceback (most recent call last):
    ...
    ValueError: memory_limit '2' is not a size such as 500MB, 2GB or 1.5GiB
    """
    match = _SIZE.fullmatch(text)
    unit = _UNITS.get(match.group(2).lower()) if match else None
    size = int(float(match.group(1)) * unit) if unit else 0
    if size < 1:
        raise ValueError(f"memory_limit {text!r} is not a size such as 500MB, 2GB or 1.5GiB")
    return size


def format_size(size: int) -> str:
    """``size`` bytes in decimal units, as the messages print it.

    >>> format_size(999), format_size(1_234_567)
    ('999 B', '1.2 MB')
    """
    for unit, scale in (("TB", 10 ** 12), ("GB", 10 ** 9), ("MB", 10 ** 6), ("KB", 10 ** 3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def default_memory_limit() -> Optional[int]:
    """80% of the physical memory, or of the cgroup's memory limit when that is lower;
    None where neither can be read."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            text = f.read(64).strip()
        if text.isdigit():
            total = min(total, int(text))
    except OSError:
        pass
    return int(total * DEFAULT_FRACTION) if total > 0 else None


def rows_size(table: str, footer: Footer) -> int:
    """About the bytes the rows a footer declares take in memory (see the module doc)."""
    return footer.rows * ROW_WIDTH.get(table, 8) + footer.bytes


def check_memory(where: str, need: int, limit: Optional[int]) -> None:
    """StoreError naming ``where`` and both figures when ``need`` is over ``limit`` (None:
    no limit)."""
    if limit is not None and need > limit:
        raise StoreError(f"{where}: reading it needs about {format_size(need)} of memory, "
                         f"more than the limit of {format_size(limit)} (--memory-limit)")
