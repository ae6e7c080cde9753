"""Re-encode a trace's input args into the int64 input format of model/records.py.

The Chrome trace writes an op's recorded inputs as four parallel lists:
``Input Dims``, ``Input type``, ``Input Strides`` and ``Concrete Inputs``.
:func:`encode_trace_inputs` turns them back into the encoding
``records.decode_inputs`` reads, so a loaded trace's inputs decode to the same
lists. What the encoding cannot hold is dropped to its nearest form: a type
name outside ``SCALAR_TYPE_NAMES`` becomes ``""`` (a tensor keeps its shape),
a tensor list loses its length (the trace does not write it either).

Example::

    >>> from opscope.model.records import decode_inputs
    >>> import numpy as np
    >>> enc = encode_trace_inputs([[2, 3], [], []], ["float", "Scalar", "ScalarList"],
    ...                           [[3, 1], [], []], ["", "1", "[4, 5]"])
    >>> rec = decode_inputs(np.array(enc, dtype=np.int64), 0)
    >>> rec.shapes, rec.types, rec.concrete
    ([[2, 3], [], []], ['float', 'Scalar', 'ScalarList'], ['', '1', '[4, 5]'])
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from opscope.model.records import (INPUT_NONE, INPUT_STRING, INPUT_TENSOR, INPUT_TENSOR_LIST,
                                   SCALAR_TYPE_NAMES, encode_plain_value)

_DTYPE_INDEX = {name: i for i, name in enumerate(SCALAR_TYPE_NAMES)}


def _item(values: Optional[Sequence], k: int, default):
    if isinstance(values, list) and k < len(values):
        return values[k]
    return default


def _scalar_value(text: object) -> object:
    """The Python value a ``Concrete Inputs`` scalar text stands for (None if unknown).

    >>> _scalar_value("3"), _scalar_value("0.5"), _scalar_value("True")
    (3, 0.5, True)
    """
    if not isinstance(text, str):
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        value = int(text)
        if -2 ** 63 <= value < 2 ** 63:
            return value
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _int64_list(value: object) -> List[int]:
    """``value`` when it is a list of 64-bit integers (a shape, strides), else ``[]``.

    >>> _int64_list([2, 3]), _int64_list([2, "a"]), _int64_list([2 ** 70]), _int64_list(None)
    ([2, 3], [], [], [])
    """
    if isinstance(value, list) and all(type(x) is int and -2 ** 63 <= x < 2 ** 63
                                       for x in value):
        return value
    return []


def _int_list(text: object) -> Optional[List[int]]:
    """``"[2, 5]"`` -> ``[2, 5]``; None when it is not a list of integers."""
    if not isinstance(text, str):
        return None
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    body = body[1:-1].strip()
    if not body:
        return []
    try:
        values = [int(part) for part in body.split(",")]
    except ValueError:
        return None
    return values if all(-2 ** 63 <= v < 2 ** 63 for v in values) else None


def encode_trace_inputs(dims: object, types: object, strides: object,
                        concrete: object) -> List[int]:
    """The int64 encoding of one op's inputs from its four trace lists.

    Any of the lists may be missing (None); the count of inputs is the longest.
    """
    lengths = [len(v) for v in (dims, types, strides, concrete) if isinstance(v, list)]
    n = max(lengths, default=0)
    out: List[int] = [n]
    for k in range(n):
        kind = _item(types, k, "")
        shape = _int64_list(_item(dims, k, []))
        dtype = _DTYPE_INDEX.get(kind) if isinstance(kind, str) else None
        if dtype is not None or (shape and kind not in ("Scalar", "ScalarList", "TensorList",
                                                        "String")):
            stride = _int64_list(_item(strides, k, []))
            stride = stride if len(stride) == len(shape) else [0] * len(shape)
            out.extend((INPUT_TENSOR, len(shape)))
            out.extend(shape)
            out.extend(stride)
            out.append(-1 if dtype is None else dtype)
        elif kind == "Scalar":
            value = _scalar_value(_item(concrete, k, ""))
            if value is None:
                out.append(INPUT_NONE)
            else:
                encode_plain_value(value, out)
        elif kind == "ScalarList":
            values = _int_list(_item(concrete, k, ""))
            if values is None:
                out.append(INPUT_NONE)
            else:
                encode_plain_value(values, out)
        elif kind == "TensorList":
            out.extend((INPUT_TENSOR_LIST, 0))
        elif kind == "String":
            out.append(INPUT_STRING)
        else:
            out.append(INPUT_NONE)
    return out
