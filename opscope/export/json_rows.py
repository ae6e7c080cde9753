"""Render many JSON lines of one layout at once, with numpy instead of a Python loop.

A layout is a sequence of fields: constant text, decimal integers (or
nanoseconds written as microseconds with three decimals) and strings picked
per row from a table. The rows are laid out in a (rows x width) byte matrix
in which every field has a slot as wide as its widest value in the batch;
narrower values leave zero bytes, and one pass drops them at the end. JSON
text never contains a zero byte (``json.dumps`` escapes U+0000, and UTF-8
never uses 0 inside a character), so the output is exact.

On the benchmark's training-step trace this writes events about twice as
fast as ``%``-formatting one line per row (bench/postprocess.py): the
per-row work is a few byte-wide numpy operations per field, and the
constant text is laid out once.

Example::

    >>> import numpy as np
    >>> names = StringTable(['"add"', '"mul"'])
    >>> rows = JsonRows(2)
    >>> rows.text('{"name": '); rows.choice(names, np.array([1, 0]))
    >>> rows.text(', "ts": '); rows.number(np.array([1500, 20]), micros=True)
    >>> has_id = np.array([True, False])
    >>> rows.text(', "id": ', has_id); rows.number(np.array([-7, 0]), present=has_id)
    >>> rows.text("}")
    >>> print(rows.render(",\\n").decode())
    {"name": "mul", "ts": 1.500, "id": -7},
    {"name": "add", "ts": 0.020}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from opscope.collect.native.build import NativeExtension

# The same rows written in C (row_render.cpp), about ten times faster; built once on
# first use like the observer, and used for layouts of at least NATIVE_MIN_ROWS rows,
# so small outputs never wait for a build. Without it (no compiler), numpy writes.
RENDERER = NativeExtension(Path(__file__).with_name("row_render.cpp"), "opscope_rows",
                           "JSON row renderer", "large traces are written more slowly",
                           takes="a few seconds", torch=False)
NATIVE_MIN_ROWS = 20_000
NATIVE_CHUNK_BYTES = 1 << 21  # one buffer, rendered into again for each chunk

# Decimal digits come four at a time from a table of 4-byte words. A number is
# right-aligned in its slot: its padding (zero bytes, dropped by ``render``) is
# one run in front of it, which the final compaction copies around in one step.
#   [0, 10000): "0000".."9999"  a group below the number's leading one
#   [10000, 20000): "", "1".."9999"  the leading group, right-aligned (nothing
#                   when the number is shorter)
#   [20000, 30000): "0".."9999"  the last four digits when they are also the
#                   leading group (0 prints "0")
def _group_words() -> np.ndarray:
    words = np.zeros((30000, 4), dtype=np.uint8)
    for k in range(10000):
        for base, text in ((0, "%04d" % k), (10000, str(k) if k else ""), (20000, str(k))):
            words[base + k, 4 - len(text):] = list(text.encode())
    return words.view("<u4").reshape(30000)


_GROUP_WORDS = _group_words()
# the three decimals of a microsecond figure, with the point: ".000"..".999"
_FRACTION_WORDS = np.frombuffer(b"".join(b".%03d" % k for k in range(1000)),
                                dtype="<u4").copy()


def number_words(values: np.ndarray, micros: bool = False) -> np.ndarray:
    """Integers as decimal text in a (rows x k) byte matrix; zero bytes are padding.

    ``micros`` writes nanoseconds as microseconds with three decimals.

    >>> w = number_words(np.array([5, -1234, 0]))
    >>> [bytes(r).replace(b"\\0", b"").decode() for r in w]
    ['5', '-1234', '0']
    >>> w = number_words(np.array([1500, 7]), micros=True)
    >>> [bytes(r).replace(b"\\0", b"").decode() for r in w]
    ['1.500', '0.007']
    """
    rows = JsonRows(len(values))
    rows.number(values, micros)
    rows._start(len(values))
    grid = np.zeros((len(values), rows._fields[0].width), dtype=np.uint8)
    rows._fill_numbers(grid, 0, len(values))
    return grid


class StringTable:
    """Distinct strings as a zero-padded byte matrix, for ``JsonRows.choice``.

    Index -1 picks the empty string.

    >>> t = StringTable(["ab", "c"])
    >>> t.matrix.tolist(), t.lengths.tolist()
    ([[97, 98], [99, 0], [0, 0]], [2, 1, 0])
    """

    def __init__(self, strings: Sequence[Union[str, bytes]]):
        encoded = [s.encode() if isinstance(s, str) else s for s in strings]
        for b in encoded:
            if b"\0" in b:  # zero bytes are the padding render() drops
                raise ValueError(f"StringTable: strings must not contain a NUL byte, "
                                 f"got {b[:60]!r}; escape it (json.dumps does)")
        width = max((len(b) for b in encoded), default=0)
        self.lengths = np.array([len(b) for b in encoded] + [0], dtype=np.int64)
        self.blob = b"".join(encoded)  # for the C renderer: the strings and their offsets
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.matrix = np.zeros((len(encoded) + 1, width), dtype=np.uint8)
        if width:
            flat = np.frombuffer(self.blob, dtype=np.uint8)
            cols = np.arange(width)
            mask = cols < self.lengths[:, None]
            self.matrix[mask] = flat

    def __len__(self) -> int:
        return len(self.lengths) - 1


class _Field:
    """One field of a layout: its slot (first column, width) and what fills it."""

    __slots__ = ("kind", "width", "at", "data", "index", "present", "micros", "signed",
                 "groups", "column")

    def __init__(self, kind: str, width: int, present: Optional[np.ndarray], data: Any,
                 index: Optional[np.ndarray] = None, micros: bool = False,
                 signed: bool = False, groups: int = 0):
        self.kind, self.width, self.present, self.data = kind, width, present, data
        self.index, self.micros, self.signed, self.groups = index, micros, signed, groups
        self.at = 0
        self.column = -1


class JsonRows:
    """Rows of one layout, built field by field, rendered a chunk of rows at a time.

    Each field call takes whole columns (one value per row) and may take
    ``present`` (bool per row): where false, the field writes nothing, which is
    how optional args are left out. Slots are as wide as the widest value in
    the whole column, so the constant text is written into the byte matrix
    once and only the varying fields are rewritten per chunk.
    """

    def __init__(self, n: int):
        self.n = n
        self._fields: List[_Field] = []
        self._numbers: List[_Field] = []  # set by _start
        self._work: Optional[Tuple[np.ndarray, ...]] = None  # see _fill_numbers

    def text(self, value: str, present: Optional[np.ndarray] = None) -> None:
        """The same text on every row."""
        data = value.encode()
        if self._fields:
            last = self._fields[-1]
            if last.kind == "text" and last.present is present:
                last.data += data
                last.width += len(data)
                return
        self._fields.append(_Field("text", len(data), present, data=data))

    def number(self, values: np.ndarray, micros: bool = False,
               present: Optional[np.ndarray] = None) -> None:
        """Integers in decimal; ``micros`` writes nanoseconds as ``us.nnn``."""
        values = np.asarray(values, dtype=np.int64)
        self._fields.append(_Field("number", -1, present, data=values, micros=micros))

    def choice(self, table: StringTable, index: np.ndarray,
               present: Optional[np.ndarray] = None) -> None:
        """Per row, the string ``table[index[row]]`` (-1: nothing)."""
        index = np.asarray(index, dtype=np.intp)
        self._fields.append(_Field("choice", -1, present, data=table, index=index))

    @staticmethod
    def _measure(f: _Field) -> None:
        """The slot of a number or choice field: as wide as its widest value (numpy's
        layout only; the C renderer needs no slots)."""
        if f.kind == "choice":
            f.width = int(f.data.lengths[f.index].max()) if len(f.index) else 0
            return
        shown = f.data if f.present is None else f.data[f.present]
        # Python ints: np.abs would overflow on the most negative int64
        high = max(int(shown.max()), -int(shown.min())) if len(shown) else 0
        f.signed = bool(len(shown)) and bool(shown.min() < 0)
        f.groups = max(1, -(-len(str(high // 1000 if f.micros else high)) // 4))
        f.width = f.signed + 4 * f.groups + (4 if f.micros else 0)  # "-", digits, ".nnn"

    def render(self, separator: str = "") -> bytes:
        """All rows, each followed by ``separator`` except the last."""
        return separator.encode().join(bytes(c) for c in self.chunks(separator))

    def chunks(self, separator: str = "", rows_per_chunk: int = 0) -> Iterator[memoryview]:
        """The rows a chunk at a time (as bytes-like views), ``separator`` between
        rows (not after a chunk's last). Chunks default to about 512 KiB of
        matrix: big enough that numpy's per-call overhead is spread over many rows,
        small enough that the temporaries come from memory the allocator reuses
        (bigger blocks are fresh pages from the kernel each time, and faulting
        them in costs more than the rendering)."""
        if self.n == 0:
            return
        native = RENDERER.load() if self.n >= NATIVE_MIN_ROWS else None
        if native is not None:
            yield from self.native_chunks(native, separator, rows_per_chunk)
            return
        if separator:
            self.text(separator)
        width = self._start(self.n)
        step = rows_per_chunk or max(64, min(8192, (512 << 10) // max(width, 1)))
        grid = np.empty((min(step, self.n), width), dtype=np.uint8)
        for f in self._fields:
            if f.kind == "text" and f.present is None:
                grid[:, f.at:f.at + f.width] = np.frombuffer(f.data, dtype=np.uint8)
        nonzero = np.empty(grid.shape, dtype=bool)
        cut = len(separator.encode())
        for first in range(0, self.n, step):
            end = min(self.n, first + step)
            part = grid[:end - first]
            self._fill(part, first, end)
            keep = np.not_equal(part, 0, out=nonzero[:end - first])
            out = part[keep]
            yield memoryview(out[:len(out) - cut] if cut else out)

    def native_chunks(self, native: Any, separator: str = "",
                      rows_per_chunk: int = 0) -> Iterator[bytes]:
        """``chunks`` written by the C renderer ``native`` (``RENDERER.load()``) into one
        buffer: each chunk is a view of it, valid until the next one is asked for."""
        fields: List[tuple] = []
        for f in self._fields:
            present = None if f.present is None else np.ascontiguousarray(f.present, bool)
            if present is not None and present.all():
                present = None
            if (present is not None and not present.any()) or (f.kind == "choice"
                                                                 and not len(f.data)):
                continue  # writes nothing on any row
            if f.kind == "text":
                if fields and fields[-1][0] == 0 and fields[-1][1] is present is None:
                    fields[-1] = (0, None, fields[-1][2] + f.data)  # one copy, not two
                else:
                    fields.append((0, present, f.data))
            elif f.kind == "number":
                fields.append((1, present, np.ascontiguousarray(f.data, np.int64), f.micros))
            else:
                fields.append((2, present, np.ascontiguousarray(f.index, np.intp),
                               f.data.blob, f.data.offsets))
        out = bytearray(NATIVE_CHUNK_BYTES)
        sep, first = separator.encode(), 0
        while first < self.n:
            end = min(self.n, first + rows_per_chunk) if rows_per_chunk else self.n
            while first < end:
                done, length = native.render(fields, first, end, sep, out)
                if not done:  # a row wider than the buffer
                    out = bytearray(2 * len(out))
                    continue
                first += done
                yield memoryview(out)[:length]

    def _start(self, n: int) -> int:
        """Place the fields side by side; returns the row width in bytes."""
        at = 0
        for f in self._fields:
            if f.width < 0:
                self._measure(f)
            f.at = at
            at += f.width
        # number columns with the most digit groups first, so the columns that
        # still need a group form a prefix at every step of _fill_numbers
        self._numbers = sorted((f for f in self._fields if f.kind == "number"),
                               key=lambda f: -f.groups)
        for column, f in enumerate(self._numbers):
            f.column = column
        return at

    def _fill(self, grid: np.ndarray, first: int, end: int) -> None:
        """Write rows [first, end) of every varying field into ``grid``."""
        if self._numbers:
            self._fill_numbers(grid, first, end)
        runs: List[Tuple[np.ndarray, int, int]] = []  # (present, first col, end col)
        for f in self._fields:
            if f.width == 0:
                continue
            slot = grid[:, f.at:f.at + f.width]
            if f.kind == "choice":
                # mode='wrap': index -1 is the table's empty last row, and numpy
                # writes straight into ``out`` (mode='raise' buffers it)
                np.take(f.data.matrix[:, :f.width], f.index[first:end], axis=0, out=slot,
                        mode="wrap")
            elif f.kind == "text" and f.present is not None:
                slot[:] = np.frombuffer(f.data, dtype=np.uint8)
            if f.present is not None:
                if runs and runs[-1][0] is f.present and runs[-1][2] == f.at:
                    runs[-1] = (f.present, runs[-1][1], f.at + f.width)
                else:
                    runs.append((f.present, f.at, f.at + f.width))
        for present, a, b in runs:
            grid[:, a:b] *= present[first:end, None]

    def _fill_numbers(self, grid: np.ndarray, first: int, end: int) -> None:
        """All number fields of rows [first, end) at once: four digits per table lookup.

        The work arrays are kept between chunks (``self._work``): fresh ones of this
        size would come from the kernel each time, and faulting their pages in
        costs more than the arithmetic.
        """
        fields = self._numbers
        m, groups = end - first, fields[0].groups
        work = self._work
        if work is None or len(work[0]) < m:
            # index starts at 0: entries of groups a column does not have stay 0
            work = self._work = (np.empty((len(grid), len(fields)), dtype=np.int64),
                                 np.zeros((len(grid), len(fields), groups), dtype=np.intp),
                                 np.empty((len(grid), len(fields), groups), dtype=np.uint32))
        values, index, words = work[0][:m], work[1][:m], work[2][:m]
        for f in fields:
            values[:, f.column] = f.data[first:end]
        x = np.abs(values).view(np.uint64)
        micros = [f.column for f in fields if f.micros]
        fraction = None
        if micros:
            ns = x[:, micros]
            us = ns // 1000
            fraction = _FRACTION_WORDS.take(ns - us * 1000)
            x[:, micros] = us
        for g in range(groups):  # g = 0: the last four digits
            active = sum(f.groups > g for f in fields)  # a prefix of the columns
            part = x[:, :active]
            above = part // 10000
            low = part - above * 10000
            index[:, :active, groups - 1 - g] = low + (part < 10000) * (20000 if g == 0
                                                                        else 10000)
            x[:, :active] = above
        np.take(_GROUP_WORDS, index, out=words, mode="clip")  # unbuffered; all in range
        for f in fields:
            at = f.at
            if f.signed:
                grid[:, at] = 0
                at += 1
            span = 4 * f.groups
            grid[:, at:at + span] = words[:, f.column, groups - f.groups:].view(np.uint8)
            if f.micros:
                k = micros.index(f.column)
                grid[:, at + span:at + span + 4] = fraction[:, k:k + 1].view(np.uint8)
            if f.signed:  # "-" just before the first digit of each negative number
                negative = np.flatnonzero(values[:, f.column] < 0)
                if len(negative):
                    digits = grid[negative, at:at + span] != 0
                    grid[negative, at - 1 + digits.argmax(axis=1)] = ord("-")
