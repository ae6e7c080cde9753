"""Encode Python-side op inputs into the int64 format of model/records.py.

The native observer encodes in C++; the Python collector uses this.

Example::

    >>> import torch
    >>> out = []
    >>> encode_inputs([torch.zeros(2, 3), 1.5], out)
    >>> out[:4]
    [2, 1, 2, 2]
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from opscope.model.records import INPUT_TENSOR, INPUT_TENSOR_LIST, encode_plain_value


def encode_inputs(values: Sequence[object], out: List[int]) -> None:
    """Append the encoding of Python-side inputs (used by the Python collector)."""
    import torch

    out.append(len(values))
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(INPUT_TENSOR)
            out.append(v.dim())
            out.extend(v.shape)
            try:
                out.extend(v.stride())
            except RuntimeError:  # sparse and other layouts have no strides
                out.extend([0] * v.dim())
            out.append(scalar_type_index(v.dtype))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) for x in v):
            out.extend((INPUT_TENSOR_LIST, len(v)))
        else:
            encode_plain_value(v, out)

_DTYPE_INDEX: Optional[dict] = None


def scalar_type_index(dtype) -> int:
    """c10::ScalarType index of a torch dtype (-1 if unknown), as the native encoding uses."""
    global _DTYPE_INDEX
    if _DTYPE_INDEX is None:
        import torch

        order = [
            torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
            torch.float32, torch.float64, torch.complex32, torch.complex64,
            torch.complex128, torch.bool, torch.qint8, torch.quint8, torch.qint32,
            torch.bfloat16,
        ]
        _DTYPE_INDEX = {d: i for i, d in enumerate(order)}
    return _DTYPE_INDEX.get(dtype, -1)


