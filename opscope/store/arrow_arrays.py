"""pyarrow arrays of the store's columns, built from numpy buffers.

``pa.array`` imports pandas on its first call whatever its input (half a second of
CPU here), so the store builds its numbers, strings and lists of them itself:
an array over the values' bytes, a validity bitmap packed by numpy where some
are null. Anything else, and a value that does not fit its column, goes
through ``pa.array``, whose error the caller gets.

Example::

    >>> import pyarrow as pa
    >>> plain_array(pa.int32(), np.array([1, 2], dtype=np.int32),
    ...             np.array([True, False])).to_pylist()
    [1, None]
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from opscope.store.schema import require_pyarrow


def arrow_array(values: Any, kind: Any):
    """``pa.array(values, kind)`` for the store's columns, built from buffers where the
    values are numbers, strings or lists of them (``pa.array`` imports pandas on its
    first call, half a second of CPU, whatever its input); ``pa.array`` otherwise, and
    where a value does not fit (its error is the one the caller gets).

    >>> import pyarrow as pa
    >>> arrow_array(["a", None, "\u00e9"], pa.string()).to_pylist()
    ['a', None, 'é']
    >>> arrow_array([[1, 2], [], [3]], pa.list_(pa.int64())).to_pylist()
    [[1, 2], [], [3]]
    >>> arrow_array([7, None], pa.int64()).to_pylist()
    [7, None]
    """
    pa, _ = require_pyarrow()
    built = None
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        built = _numbers(values, kind)
    elif isinstance(values, (list, tuple)):
        if pa.types.is_string(kind) and all(v is None or type(v) is str for v in values):
            built = _strings(values)
        elif pa.types.is_list(kind) and all(type(v) is list for v in values):
            inner = arrow_array([item for v in values for item in v], kind.value_type)
            offsets = _offsets(len(v) for v in values)
            if offsets is not None:
                built = pa.ListArray.from_arrays(plain_array(pa.int32(), offsets), inner)
    return pa.array(values, kind) if built is None else built


def plain_array(kind: Any, data: np.ndarray, present: Optional[np.ndarray] = None):
    """An array of ``kind`` over ``data``'s bytes, null where not ``present``."""
    pa, _ = require_pyarrow()
    if present is None or present.all():
        return pa.Array.from_buffers(kind, len(data), [None, pa.py_buffer(data)])
    valid = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(kind, len(data), [valid, pa.py_buffer(data)],
                                 null_count=int(len(present) - np.count_nonzero(present)))


def _offsets(lengths: Iterable[int]) -> Optional[np.ndarray]:
    """The int32 offsets of items of these lengths; None past int32."""
    total = np.cumsum(np.fromiter(lengths, dtype=np.int64))
    if len(total) and total[-1] >= 1 << 31:
        return None
    return np.concatenate([np.zeros(1, np.int32), total.astype(np.int32)])


def _numbers(values: Any, kind: Any):
    """Integers or floats from a numpy array or a list of numbers and None; None when
    they are anything else or do not fit ``kind``."""
    pa, _ = require_pyarrow()
    dtype = np.dtype(kind.to_pandas_dtype())
    present = None
    if isinstance(values, (list, tuple)):
        ok = (int,) if dtype.kind in "iu" else (int, float)
        if not all(v is None or type(v) in ok for v in values):
            return None
        present = np.array([v is not None for v in values], dtype=bool)
        try:
            values = np.array([0 if v is None else v for v in values], dtype=dtype)
        except OverflowError:
            return None
    elif not isinstance(values, np.ndarray) or values.dtype.kind not in "iuf" or \
            (values.dtype.kind == "f" and dtype.kind != "f"):
        return None
    elif not np.can_cast(values.dtype, dtype) and len(values) and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            return None
    return plain_array(kind, np.ascontiguousarray(values, dtype=dtype), present)


def _strings(values: Any):
    """A string array of ``values`` (str or None), from its UTF-8 bytes and offsets; None
    past 2 GB of text."""
    pa, _ = require_pyarrow()
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = _offsets(len(b) for b in encoded)
    if offsets is None:
        return None
    present = np.array([v is not None for v in values], dtype=bool)
    nulls = int(len(present) - np.count_nonzero(present))
    valid = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.string(), len(encoded), [
        valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))], null_count=nulls)
