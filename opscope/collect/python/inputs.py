"""An aten call's arguments as the ints torch.profiler's RecordFunction inputs hold.

The Python collector sees ``func(*args, **kwargs)``; RecordFunction sees the full
schema with defaults filled in, and dtypes, layouts and memory formats as ints.

>>> import torch
>>> [ivalue_like(v) for v in (torch.float32, torch.channels_last, 3)]
[6, 2, 3]
>>> int64_blob([1, 2 ** 64 + 5]).tolist()
[1, 5]
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import torch

from opscope.collect.python.input_encoding import encode_inputs, scalar_type_index
from opscope.collect.python.rows import ThreadBuffer
from opscope.model.records import NO_INPUTS

# c10::Layout and c10::MemoryFormat values, as torch.profiler's inputs show them
_ENUM_VALUES = {
    torch.strided: 0, torch.sparse_coo: 1, torch.sparse_csr: 2, torch._mkldnn: 3,
    torch.sparse_csc: 4, torch.sparse_bsr: 5, torch.sparse_bsc: 6,
    torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
    torch.channels_last_3d: 3,
}


def encode_call(arg_specs: Dict[Any, Optional[tuple]], buf: ThreadBuffer, func, args,
                kwargs) -> int:
    """Append the call's encoded inputs to ``buf.inputs``; their offset, or NO_INPUTS.

    ``arg_specs`` caches each op's (argument name, default) pairs.
    """
    spec = arg_specs.get(func, False)
    if spec is False:
        spec = arg_specs[func] = _arg_spec(func)
    values = list(args)
    if spec is not None:  # the full schema, defaults included, as RecordFunction sees it
        values.extend(kwargs.get(name, default) for name, default in spec[len(args):])
    else:
        values.extend(kwargs.values())
    encoded: List[int] = []
    try:
        encode_inputs([ivalue_like(v) for v in values], encoded)
    except Exception:  # symbolic shapes and other values that have no int encoding
        return NO_INPUTS
    offset = len(buf.inputs)
    buf.inputs.extend(encoded)
    return offset


def _arg_spec(func) -> Optional[tuple]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    return tuple((a.name, a.default_value if a.has_default_value() else None)
                 for a in schema.arguments)


def ivalue_like(v: object) -> object:
    """dtype/layout/memory_format as the ints that RecordFunction's IValues hold."""
    if isinstance(v, torch.dtype):
        return scalar_type_index(v)
    if isinstance(v, (torch.layout, torch.memory_format)):
        return _ENUM_VALUES.get(v, v)
    return v


def int64_blob(values: List[int]) -> np.ndarray:
    """``values`` as int64; a Python int past int64 keeps its low 64 bits."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:  # a Python int past int64: keep its low 64 bits
        return np.asarray([(x + 2**63) % 2**64 - 2**63 for x in values], dtype=np.int64)
