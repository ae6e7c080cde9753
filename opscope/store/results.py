"""A query's result as text: an aligned table, CSV, or JSON (a list of row objects).

``write_result(columns, batches, fmt, stream)`` writes the rows of
``batches`` (lists of row tuples, as a DuckDB cursor's ``fetchmany`` gives
them). CSV and JSON stream batch by batch; the table keeps every row to size
its columns. NULL is an empty cell in a table and CSV and ``null`` in JSON;
a list or struct cell is written as JSON in a table and CSV.

Example::

    >>> import io
    >>> out = io.StringIO()
    >>> write_result(["name", "self_ns"], [[("aten::mm", 50), ("aten::add", None)]], "table", out)
    >>> print(out.getvalue(), end="")
    name       self_ns
    ---------  -------
    aten::mm        50
    aten::add
    >>> out = io.StringIO()
    >>> write_result(["a", "b"], [[(1, [2, 3])]], "json", out); out.getvalue()
    '[\\n {"a": 1, "b": [2, 3]}\\n]\\n'
"""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import math
from typing import Any, Iterable, List, Sequence, TextIO

FORMATS = ("table", "csv", "json")


def json_value(value: Any) -> Any:
    """A cell as a JSON-ready value (decimals as numbers, times as ISO text, NaN as null)."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (datetime.date, datetime.time, datetime.timedelta)):
        return str(value) if isinstance(value, datetime.timedelta) else value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def cell_text(value: Any) -> str:
    """A cell as text for a table or CSV."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(json_value(value), ensure_ascii=False)
    value = json_value(value)
    return "" if value is None else str(value)


def _numeric(values: Sequence[Any]) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float, decimal.Decimal))
                                 and not isinstance(v, bool) for v in present)


def write_table(columns: List[str], rows: List[tuple], stream: TextIO) -> None:
    """Aligned columns: numbers right-aligned, the rest left; a dashed rule under the header."""
    texts = [[cell_text(v) for v in row] for row in rows]
    right = [_numeric([row[i] for row in rows]) for i in range(len(columns))]
    widths = [max([len(c)] + [len(t[i]) for t in texts]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
        return "  ".join(parts).rstrip() + "\n"

    stream.write(line(columns))
    stream.write(line(["-" * w for w in widths]))
    for t in texts:
        stream.write(line(t))


def write_result(columns: List[str], batches: Iterable[List[tuple]], fmt: str,
                 stream: TextIO) -> None:
    """Write the rows of ``batches`` in ``fmt`` (one of ``FORMATS``) to ``stream``."""
    if fmt == "table":
        write_table(columns, [row for batch in batches for row in batch], stream)
    elif fmt == "csv":
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(columns)
        for batch in batches:
            writer.writerows([cell_text(v) for v in row] for row in batch)
    elif fmt == "json":
        first = True
        stream.write("[")
        for batch in batches:
            for row in batch:
                item = {c: json_value(v) for c, v in zip(columns, row)}
                stream.write(("\n " if first else ",\n ") + json.dumps(item))
                first = False
        stream.write("\n]\n" if not first else "]\n")
    else:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
