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
gets 0 and a RuntimeWarning that names it, never a silent 0. The formulas live in
``flop_formulas.py`` (one section per family) and ``flop_attention.py``; this module
puts their counts on a session's events.

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

import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from opscope.analysis.ancestry import has_marked_descendant, nearest_marked
from opscope.analysis.flop_attention import (ATTENTION_KERNELS,  # noqa: F401
                                             attention_backward_flops, attention_flops)
from opscope.analysis.flop_formulas import (CONV_BACKWARD, COUNTED_OPS, FORMULAS,  # noqa: F401
                                            convolution_backward_flops, recorded_output_mask)
from opscope.model.events import EventTable
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, RecordedInputs
from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX

ELEMENTWISE_OPS = frozenset({"aten::add", "aten::mul"})
EVALUATE_PREFIX = EVALUATE_FUNCTION_PREFIX
# Ops allocating the gradients inside convolution_backward (see _conv_backward_mask)
_GRAD_ALLOCATIONS = frozenset({"aten::resize_", "aten::as_strided_", "aten::empty_like"})

_FORMULA_ERRORS = (AssertionError, ValueError, TypeError, IndexError, ZeroDivisionError)


def _op_flops_or_raise(name: str, inputs: Optional[RecordedInputs],
                       output_mask: Optional[Sequence[bool]]) -> Optional[int]:
    """op_flops, but shapes that a formula rejects raise (one of _FORMULA_ERRORS)."""
    if inputs is None or name not in COUNTED_OPS:
        return None
    if name == CONV_BACKWARD:
        mask = recorded_output_mask(inputs) or output_mask or (True, True, True)
        return convolution_backward_flops(inputs, mask)
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
        """Forward plus backward FLOPs."""
        return self.forward + self.backward

    @property
    def without_elementwise(self) -> int:
        """The total less ``aten::add``/``aten::mul``: what FlopCounterMode counts."""
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
