"""The FLOP formula of each counted op, by family: matrix products, convolutions,
attention (``flop_attention``) and elementwise ops. ``analysis/flops.py`` says which
ops count and how a session's events get their counts.

A formula takes an op's ``RecordedInputs`` and returns its FLOPs, or None when the
recorded inputs are not those the formula needs (a formula may raise on shapes that
do not fit; ``flops.op_flops`` turns that into None).

>>> from opscope.model.records import RecordedInputs
>>> FORMULAS["aten::bmm"](RecordedInputs([[2, 3, 4], [2, 4, 5]], ["float"] * 2, [[], []],
...                                      ["", ""]))
240
"""

from __future__ import annotations

import json
from math import prod
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from opscope.analysis.flop_attention import (ATTENTION_KERNELS, attention_backward_flops,
                                             attention_flops)
from opscope.model.records import RecordedInputs

# Input types that are not tensors in RecordedInputs.types
_NOT_TENSOR = frozenset({"", "Scalar", "ScalarList", "TensorList", "String"})

Formula = Callable[[RecordedInputs], Optional[int]]


def _torch_formula(packet: str):
    """torch's registered FLOP formula for ``aten.<packet>`` (takes shapes)."""
    import torch
    from torch.utils.flop_counter import flop_registry

    return flop_registry[getattr(torch.ops.aten, packet)]


def _concrete(inputs: RecordedInputs, i: int):
    """The recorded value of a non-tensor input (int, bool, int list), or None."""
    if i >= len(inputs.concrete):
        return None
    text = inputs.concrete[i]
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except ValueError:
        return None


def _is_tensor(inputs: RecordedInputs, i: int) -> bool:
    return i < len(inputs.types) and inputs.types[i] not in _NOT_TENSOR


def _shape(inputs: RecordedInputs, i: int) -> Optional[List[int]]:
    return list(inputs.shapes[i]) if _is_tensor(inputs, i) else None


def _per_dim(value, dims: int) -> Optional[List[int]]:
    """A per-dimension int list (one value broadcast); None when not recorded as ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * dims
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return value * dims if len(value) == 1 else value
    return None


# -- matrix products ------------------------------------------------------------------
def _product(name: str, rank: int, a: int, b: int) -> Formula:
    """torch's ``name`` formula over inputs ``a`` and ``b``, both of ``rank`` dims
    (``mm``: 2, ``bmm``: 3)."""
    def formula(inputs: RecordedInputs) -> Optional[int]:
        x, y = _shape(inputs, a), _shape(inputs, b)
        if x is None or y is None or len(x) != rank or len(y) != rank:
            return None
        return _torch_formula(name)(x, y)
    return formula


def _matmul(inputs: RecordedInputs) -> Optional[int]:
    """torch.matmul's shape rules (1-D first operand, broadcast batch) on the bmm formula.

    A 1-D second operand makes torch run ``dot``/``mv``, which torch's registry
    does not count; neither does this.
    """
    x, y = _shape(inputs, 0), _shape(inputs, 1)
    if not x or not y or len(y) < 2:
        return None
    m, k = (1, x[0]) if len(x) == 1 else (x[-2], x[-1])
    k2, n = y[-2], y[-1]
    if k != k2:
        return None
    try:
        batch = list(np.broadcast_shapes(tuple(x[:-2]), tuple(y[:-2])))
    except ValueError:
        return None
    return _torch_formula("bmm")([prod(batch), m, k], [prod(batch), k, n])


def _linear(inputs: RecordedInputs) -> Optional[int]:
    x, w = _shape(inputs, 0), _shape(inputs, 1)
    if not x or w is None or len(w) != 2 or x[-1] != w[1]:
        return None
    return _torch_formula("mm")([prod(x[:-1]), x[-1]], [w[1], w[0]])


# -- convolutions -----------------------------------------------------------------------
def _conv_flops(x, w, stride, padding, dilation, transposed) -> Optional[int]:
    if x is None or w is None or len(x) < 3 or len(x) != len(w):
        return None
    dims = len(x) - 2
    stride, padding, dilation = (_per_dim(v, dims) for v in (stride, padding, dilation))
    if stride is None or padding is None or dilation is None:
        return None  # e.g. padding="same" as a string: the inner convolution counts
    out = None
    if not transposed:  # the formula needs the output size only for a regular conv
        spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
                   zip(x[2:], w[2:], stride, padding, dilation)]
        out = [x[0], w[0]] + spatial
    return _torch_formula("convolution")(x, w, None, stride, padding, dilation,
                                         bool(transposed), out_val=out)


def _conv_nd(transposed: bool) -> Formula:
    # conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups);
    # conv_transpose{1,2,3}d(input, weight, bias, stride, padding, output_padding, groups,
    # dilation)
    dilation_at = 7 if transposed else 5

    def formula(inputs: RecordedInputs) -> Optional[int]:
        return _conv_flops(_shape(inputs, 0), _shape(inputs, 1), _concrete(inputs, 3),
                           _concrete(inputs, 4), _concrete(inputs, dilation_at), transposed)
    return formula


def _convolution(inputs: RecordedInputs) -> Optional[int]:
    # convolution / _convolution(input, weight, bias, stride, padding, dilation, transposed, ...)
    transposed = _concrete(inputs, 6)
    if not isinstance(transposed, bool):
        return None
    return _conv_flops(_shape(inputs, 0), _shape(inputs, 1), _concrete(inputs, 3),
                       _concrete(inputs, 4), _concrete(inputs, 5), transposed)


def convolution_backward_flops(inputs: RecordedInputs, mask: Sequence[bool]) -> Optional[int]:
    """FLOPs of ``aten::convolution_backward`` computing the gradients ``mask`` selects."""
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #  output_padding, groups, output_mask)
    go, x, w = _shape(inputs, 0), _shape(inputs, 1), _shape(inputs, 2)
    transposed = _concrete(inputs, 7)
    if go is None or x is None or w is None or not isinstance(transposed, bool):
        return None
    args = [_concrete(inputs, i) for i in range(3, 10)]
    return _torch_formula("convolution_backward")(go, x, w, *args[:4], transposed, *args[5:],
                                                  list(mask), out_val=[x, w, None])


def recorded_output_mask(inputs: RecordedInputs) -> Optional[List[bool]]:
    """convolution_backward's ``output_mask`` when the collector recorded it, else None.

    >>> recorded_output_mask(RecordedInputs([[]] * 11, [""] * 10 + ["ScalarList"],
    ...                                     [[]] * 11, [""] * 10 + ["[0, 1, 1]"]))
    [False, True, True]
    """
    mask = _concrete(inputs, 10)
    if isinstance(mask, list) and len(mask) == 3:
        return [bool(v) for v in mask]
    return None


# -- attention and elementwise ---------------------------------------------------------
def _attention(inputs: RecordedInputs) -> Optional[int]:
    return attention_flops(*(_shape(inputs, i) for i in range(3)))


def _attention_backward(inputs: RecordedInputs) -> Optional[int]:
    return attention_backward_flops(*(_shape(inputs, i) for i in range(4)))


def _elementwise(inputs: RecordedInputs) -> Optional[int]:
    x = _shape(inputs, 0)
    return None if x is None else prod(x)


FORMULAS: Dict[str, Formula] = {
    "aten::mm": _product("mm", 2, 0, 1),
    "aten::addmm": _product("mm", 2, 1, 2),
    "aten::bmm": _product("bmm", 3, 0, 1),
    "aten::baddbmm": _product("bmm", 3, 1, 2),
    "aten::matmul": _matmul,
    "aten::linear": _linear,
    "aten::convolution": _convolution,
    "aten::_convolution": _convolution,
    **{f"aten::conv{d}d": _conv_nd(False) for d in (1, 2, 3)},
    **{f"aten::conv_transpose{d}d": _conv_nd(True) for d in (1, 2, 3)},
    "aten::scaled_dot_product_attention": _attention,
    **{f"aten::{k}": _attention for k in ATTENTION_KERNELS},
    **{f"aten::{k}_backward": _attention_backward for k in ATTENTION_KERNELS},
    "aten::add": _elementwise,
    "aten::mul": _elementwise,
}
CONV_BACKWARD = "aten::convolution_backward"  # its formula also takes the output mask
COUNTED_OPS = frozenset(FORMULAS) | {CONV_BACKWARD}

