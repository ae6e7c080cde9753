"""FLOP estimates per recorded op (``with_flops=True``), from recorded input shapes.

Which ops count:

- matrix products: ``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``
  (a ``matmul`` by a 1-D tensor runs as ``dot``/``mv``, which torch's registry does not
  count, and neither does opscope);
- convolutions: ``aten::conv1d/2d/3d``, ``conv_transpose1d/2d/3d``, ``convolution``,
  ``_convolution`` and ``convolution_backward``;
- attention: ``aten::scaled_dot_product_attention`` and every fused kernel behind it
  (flash, flash for CPU, efficient, cuDNN, overrideable) with their ``_backward`` ops;
  the math backend is counted through the ``bmm``/``matmul`` ops it runs;
- elementwise ``aten::add`` and ``aten::mul`` (not the in-place ``add_``/``mul_``): the
  number of elements of the first input, as torch.profiler counts them.

The matrix-product and convolution formulas are torch's own
(``torch.utils.flop_counter.flop_registry``), applied to the recorded shapes; ``matmul``
and ``linear`` go through the ``bmm``/``mm`` formulas. The attention formulas are
opscope's (:func:`attention_flops`): they give torch 2.13+'s numbers on every torch,
grouped-query shapes included. A counted op whose recorded shapes a formula rejects
gets 0 and a RuntimeWarning that names it, never a silent 0.

Each FLOP is counted once. A composite op records its kernel op inside it
(``aten::linear`` holds ``aten::addmm``, ``aten::conv2d`` holds ``aten::convolution``
and ``aten::_convolution``): the *innermost* op that has a formula carries the count
and every op above it gets 0. A composite op counts only when nothing below it does
(its kernel was not recorded, as under the Python collector).

What differs from torch, per version (torch 2.4 to 2.15):

- ``torch.profiler.profile(with_flops=True)`` counts only ``mm``, ``addmm``, ``bmm``,
  ``baddbmm``, ``conv2d``, ``add`` and ``mul``, on every version. opscope gives those ops
  the same numbers, except that a ``conv2d``'s count sits on the ``_convolution`` inside
  it (``conv2d`` shows 0); the other ops are counted by opscope only.
- ``FlopCounterMode``: the forward + backward total of the non-elementwise ops is
  equal, but for the CPU attention kernel
  (``_scaled_dot_product_flash_attention_for_cpu`` and its backward): torch 2.15 counts it
  as opscope does; older versions (2.4, 2.8 and 2.13 checked) have no formula for it and
  count 0. On torch 2.4 and 2.8 its attention formulas assert on grouped-query shapes
  (fewer key/value heads than query heads); opscope counts them with the query's heads.
  FlopCounterMode does not count elementwise ops at all; :func:`flop_totals` reports
  them apart (``elementwise``).

Example::

    >>> from opscope.model.records import RecordedInputs
    >>> op_flops("aten::mm", RecordedInputs([[8, 16], [16, 4]], ["float"] * 2, [[], []], ["", ""]))
    1024
    >>> op_flops("aten::add", RecordedInputs([[3, 4], [3, 4], []], ["float", "float", "Scalar"],
    ...                                      [[], [], []], ["", "", "1"]))
    12
    >>> op_flops("aten::relu", RecordedInputs([[3]], ["float"], [[]], [""])) is None
    True
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from math import prod
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX
from opscope.analysis.ancestry import has_marked_descendant, nearest_marked
from opscope.model.events import EventTable
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, RecordedInputs

ELEMENTWISE_OPS = frozenset({"aten::add", "aten::mul"})
EVALUATE_PREFIX = EVALUATE_FUNCTION_PREFIX
# Input types that are not tensors in RecordedInputs.types
_NOT_TENSOR = frozenset({"", "Scalar", "ScalarList", "TensorList", "String"})
# Ops allocating the gradients inside convolution_backward (see _conv_backward_mask)
_GRAD_ALLOCATIONS = frozenset({"aten::resize_", "aten::as_strided_", "aten::empty_like"})

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


def _convolution_backward(inputs: RecordedInputs, mask: Sequence[bool]) -> Optional[int]:
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


# -- attention -----------------------------------------------------------------------------
# opscope's own formulas, not torch's registry: torch 2.4 to 2.12 assert that the
# query and key have as many heads, so a grouped-query call (``enable_gqa``, fewer key
# and value heads) got no count. Every query head attends over the keys of its group,
# so both formulas use the query's head count, as torch 2.13+ does.
def _attention_dims(q, k, v) -> Optional[tuple]:
    """(batch * query heads, s_q, s_k, d_qk, d_v) of a [b, h, s, d] attention, or None."""
    if any(s is None or len(s) != 4 for s in (q, k, v)):
        return None
    (b, h_q, s_q, d_q), (b_k, h_k, s_k, d_k), (b_v, h_v, s_v, d_v) = q, k, v
    if not (b == b_k == b_v and h_k == h_v and s_k == s_v and d_q == d_k):
        raise ValueError(f"attention shapes do not fit: q={q} k={k} v={v}")
    if h_k <= 0 or h_q % h_k != 0:
        raise ValueError(f"query heads {h_q} are not a multiple of key heads {h_k}")
    return b * h_q, s_q, s_k, d_q, d_v


def attention_flops(q, k, v) -> Optional[int]:
    """Forward FLOPs of ``softmax(q @ k^T) @ v`` on [batch, heads, seq, dim] shapes.

    Two matrix products per query head: scores (s_q x d x s_k) and output
    (s_q x s_k x d_v), 2 FLOPs per multiply-add. Key/value heads may be fewer than
    query heads (grouped-query attention).

    >>> attention_flops([2, 4, 6, 8], [2, 2, 7, 8], [2, 2, 7, 8])  # 2*8*6*7*(8+8)
    10752
    """
    dims = _attention_dims(q, k, v)
    if dims is None:
        return None
    bh, s_q, s_k, d_qk, d_v = dims
    return 2 * bh * s_q * s_k * (d_qk + d_v)


def attention_backward_flops(grad_out, q, k, v) -> Optional[int]:
    """Backward FLOPs of attention: the scores recomputed, then the gradients of the
    scores, of v, of q and of k: five products, three over d_qk and two over d_v.

    >>> attention_backward_flops([2, 4, 6, 8], [2, 4, 6, 8], [2, 2, 7, 8], [2, 2, 7, 8])
    26880
    """
    dims = _attention_dims(q, k, v)
    if dims is None or grad_out is None or len(grad_out) != 4:
        return None
    bh, s_q, s_k, d_qk, d_v = dims
    if list(grad_out) != [q[0], q[1], s_q, d_v]:
        raise ValueError(f"attention gradient shape {grad_out} does not fit q={q} v={v}")
    return 2 * bh * s_q * s_k * (3 * d_qk + 2 * d_v)


def _attention(inputs: RecordedInputs) -> Optional[int]:
    return attention_flops(*(_shape(inputs, i) for i in range(3)))


def _attention_backward(inputs: RecordedInputs) -> Optional[int]:
    return attention_backward_flops(*(_shape(inputs, i) for i in range(4)))


def _elementwise(inputs: RecordedInputs) -> Optional[int]:
    x = _shape(inputs, 0)
    return None if x is None else prod(x)


ATTENTION_KERNELS = ("_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention",
                     "_scaled_dot_product_fused_attention_overrideable")

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
CONV_BACKWARD = "aten::convolution_backward"
COUNTED_OPS = frozenset(FORMULAS) | {CONV_BACKWARD}


_FORMULA_ERRORS = (AssertionError, ValueError, TypeError, IndexError, ZeroDivisionError)


def _op_flops_or_raise(name: str, inputs: Optional[RecordedInputs],
                       output_mask: Optional[Sequence[bool]]) -> Optional[int]:
    """op_flops, but shapes that a formula rejects raise (one of _FORMULA_ERRORS)."""
    if inputs is None or name not in COUNTED_OPS:
        return None
    if name == CONV_BACKWARD:
        mask = recorded_output_mask(inputs) or output_mask or (True, True, True)
        return _convolution_backward(inputs, mask)
    return FORMULAS[name](inputs)


def op_flops(name: str, inputs: Optional[RecordedInputs],
             output_mask: Optional[Sequence[bool]] = None) -> Optional[int]:
    """FLOPs of one op from its recorded inputs; None when there is no formula or data.

    ``output_mask`` is for ``aten::convolution_backward`` when its recorded inputs
    lack it (default: every gradient computed).
    """
    try:
        return _op_flops_or_raise(name, inputs, output_mask)
    except _FORMULA_ERRORS:
        return None  # shapes that do not fit the formula (torch would reject the op)


class _Rejections:
    """Counted ops whose recorded shapes a formula rejected: reported in one warning,
    so that an op that ran is never given 0 FLOPs silently."""

    def __init__(self):
        self.names: List[str] = []
        self.first: Optional[str] = None

    def flops(self, name: str, inputs: RecordedInputs,
              output_mask: Optional[Sequence[bool]] = None) -> Optional[int]:
        try:
            return _op_flops_or_raise(name, inputs, output_mask)
        except _FORMULA_ERRORS as e:
            if name not in self.names:
                self.names.append(name)
            if self.first is None:
                self.first = f"{name} with input shapes {inputs.shapes}: " \
                             f"{type(e).__name__}: {e}".replace("\n", " ")
            return None

    def warn(self) -> None:
        if not self.names:
            return
        ops = ", ".join(self.names)
        warnings.warn(f"opscope with_flops: no FLOP count for {ops}: the recorded shapes "
                      f"do not fit the formula (first: {self.first})", RuntimeWarning,
                      stacklevel=2)


# -- per event ---------------------------------------------------------------------------------
def event_flops(table: EventTable) -> np.ndarray:
    """FLOPs of every event (int64, 0 where none), each FLOP on the innermost counted op.

    Needs recorded inputs (``with_flops`` makes the collector record them). A counted
    op whose shapes its formula rejects gets 0 and one RuntimeWarning names it.
    """
    n = len(table)
    flops = np.zeros(n, dtype=np.int64)
    if n == 0:
        return flops
    names = table.symbols.names
    counted_ids = [i for i, name in enumerate(names) if name in COUNTED_OPS]
    if not counted_ids:
        return flops
    rows = np.flatnonzero(np.isin(table.name_id, counted_ids))
    sig, decoded = table.input_signatures()
    cache: Dict[tuple, Optional[int]] = {}
    rejections = _Rejections()
    conv_backward_id = table.symbols.id_of(CONV_BACKWARD)
    for row in rows.tolist():
        name_id, s = int(table.name_id[row]), int(sig[row])
        if s < 0:
            continue
        if name_id == conv_backward_id and recorded_output_mask(decoded[s]) is None:
            flops[row] = rejections.flops(CONV_BACKWARD, decoded[s],
                                          _conv_backward_mask(table, row, decoded[s])) or 0
            continue
        key = (name_id, s)
        if key not in cache:
            cache[key] = rejections.flops(names[name_id], decoded[s])
        flops[row] = cache[key] or 0
    rejections.warn()
    # a composite op whose recorded kernel already counts gets nothing itself
    flops[has_marked_descendant(table.parent, flops > 0)] = 0
    return flops


def _conv_backward_mask(table: EventTable, row: int, inputs: RecordedInputs) -> List[bool]:
    """Which gradients a convolution_backward computed, when ``output_mask`` is unrecorded.

    The native collector does not record bool lists. The weight and bias
    gradients are taken as computed; the input gradient is computed when an
    allocation op directly inside the backward op was handed a tensor of the
    input's shape (the gradient buffer). With no child recorded, all three.
    """
    children = np.flatnonzero(table.parent == row)
    if len(children) == 0:
        return [True, True, True]
    x_shape = inputs.shapes[1]
    sig, decoded = table.input_signatures()
    for child in children.tolist():
        if table.name(child) in _GRAD_ALLOCATIONS and sig[child] >= 0:
            shapes = decoded[sig[child]].shapes
            if shapes and shapes[0] == x_shape:
                return [True, True, True]
    return [False, True, True]


def backward_mask(table: EventTable) -> np.ndarray:
    """True for events run by the autograd engine: backward nodes and what they contain."""
    names = table.symbols.names
    wrapper_ids = [i for i, name in enumerate(names) if name.startswith(EVALUATE_PREFIX)]
    marked = (table.scope == SCOPE_BACKWARD_FUNCTION) | np.isin(table.name_id, wrapper_ids)
    return nearest_marked(table.parent, marked) >= 0


@dataclass(frozen=True)
class FlopTotals:
    """FLOP sums of a session: ``forward + backward == total``.

    ``elementwise`` is the part of ``total`` from ``aten::add``/``aten::mul``;
    ``total - elementwise`` is what FlopCounterMode reports (see the module doc).
    """

    forward: int
    backward: int
    elementwise: int

    @property
    def total(self) -> int:
        return self.forward + self.backward

    @property
    def without_elementwise(self) -> int:
        return self.total - self.elementwise


def flop_totals(table: EventTable, flops: np.ndarray) -> FlopTotals:
    """Forward, backward and elementwise sums of a per-event FLOP column.

    >>> from opscope.model.records import RawSession
    >>> flop_totals(EventTable.from_raw(RawSession.empty()), np.zeros(0, np.int64))
    FlopTotals(forward=0, backward=0, elementwise=0)
    """
    if len(table) == 0:
        return FlopTotals(0, 0, 0)
    backward = backward_mask(table)
    ids = [table.symbols.id_of(name) for name in ELEMENTWISE_OPS]
    elementwise = np.isin(table.name_id, [i for i in ids if i is not None])
    return FlopTotals(int(flops[~backward].sum()), int(flops[backward].sum()),
                      int(flops[elementwise].sum()))
