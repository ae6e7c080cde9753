"""What each event's self time was spent on: the Overview's step breakdown.

Every event's self time goes to exactly one category:

- a *context* inherited from the nearest enclosing range that names one:
  data loading (``enumerate(DataLoader)#...``, ranges named like
  "data loading"), optimizer (``Optimizer.step#...``, ``Optimizer.zero_grad#...``)
  or backward (autograd nodes, ``autograd::engine::evaluate_function: ...``);
- ``communication`` for a collective (``c10d::allreduce_``, gloo's and NCCL's
  ranges, ``opscope.analysis.collectives``) and everything inside it, whatever
  its context: on a DDP rank it is most of the time, and must not hide in
  backward or in "other ops";
- else, for an op, the kind of its *outermost* enclosing op, so the
  ``aten::t`` inside ``aten::linear`` counts as a matmul;
- else ``idle`` for a ``ProfilerStep#N`` range's own self time (nothing
  recorded ran on that thread then), and ``Python/other`` for the rest
  (user ranges' self time, Python frames).

Backward time is also split by the same op kinds (:func:`backward_parts`): an
op inside backward counts as the kind of its outermost op (``MmBackward0``'s
``aten::mm`` is matmul/conv), and the autograd engine's own time outside any op
is ``AUTOGRAD_ENGINE``. The parts add up to the ``backward`` category.

Example::

    >>> op_kind("aten::addmm"), op_kind("aten::_to_copy"), op_kind("my_op")
    ('matmul/conv', 'copy/cast', 'other ops')
"""

from __future__ import annotations

import re
from typing import List, Tuple

import numpy as np

from opscope.analysis.ancestry import nearest_marked
from opscope.analysis.collectives import collective_kind
from opscope.analysis.hierarchy import inherit_down, outermost_down
from opscope.model.events import EventTable
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, SCOPE_USER
from opscope.model.torch_names import (AUTOGRAD_ENGINE_PREFIX, EVALUATE_FUNCTION, PROFILER_STEP,
                                      PROFILER_STEP_PREFIX)

DATA_LOADING, OPTIMIZER, BACKWARD = "data loading", "optimizer", "backward"
PYTHON_OTHER, IDLE, COMMUNICATION = "Python/other", "idle", "communication"
CONTEXTS = (DATA_LOADING, OPTIMIZER, BACKWARD)

# Op kinds by the op's name without its namespace; the first match wins.
OP_KINDS: List[Tuple[str, str]] = [
    ("matmul/conv", r"(_?(add)?mm|bmm|baddbmm|addmv|mv|dot|matmul|linear|einsum|"
                    r"_?conv.*|.*convolution.*|.*scaled_dot_product.*|.*attention.*)"),
    ("copy/cast", r"(copy_|to|_to_copy|contiguous|clone|_copy_from.*|copy|cat|stack)"),
    ("allocation", r"(empty.*|zeros.*|ones.*|full.*|new_.*|resize_|fill_|zero_|"
                   r"scalar_tensor|arange|rand.*)"),
    ("view/reshape", r"(view|_unsafe_view|reshape|t|transpose|permute|expand.*|as_strided|"
                     r"slice|select|unsqueeze|squeeze|split.*|chunk|narrow|flatten|"
                     r"unflatten|detach|alias|unbind|lift_fresh|resolve_.*)"),
    ("norm/reduce", r"(.*norm.*|.*softmax.*|sum|mean|max|min|argmax|argmin|amax|amin|"
                    r"prod|std|var|.*nll_loss.*|.*cross_entropy.*|.*loss.*|cumsum)"),
    ("elementwise", r"(.*add.*|.*mul.*|.*sub.*|.*div.*|.*relu.*|.*gelu.*|.*tanh.*|"
                    r".*sigmoid.*|.*silu.*|exp.*|log.*|pow.*|sqrt.*|rsqrt.*|neg.*|abs.*|"
                    r"lerp.*|clamp.*|where|.*dropout.*|erf.*|sign.*|.*_foreach_.*|"
                    r"maximum|minimum|eq|ne|lt|gt|le|ge|masked_fill.*|threshold.*)"),
]
OTHER_OPS = "other ops"
KIND_NAMES = [k for k, _ in OP_KINDS] + [OTHER_OPS]
CATEGORY_NAMES = list(KIND_NAMES) + [BACKWARD, OPTIMIZER, DATA_LOADING, COMMUNICATION,
                                     PYTHON_OTHER, IDLE]
AUTOGRAD_ENGINE = "autograd engine"
BACKWARD_PART_NAMES = list(KIND_NAMES) + [AUTOGRAD_ENGINE]  # backward, by op kind

_KIND_PATTERNS = [(kind, re.compile(pattern + r"\Z")) for kind, pattern in OP_KINDS]
# namespaces and names that look like ops but are torch's own ranges
_NOT_OPS = (AUTOGRAD_ENGINE_PREFIX, "profiler::", PROFILER_STEP)
_DATA_PATTERN = re.compile(r"(enumerate\(DataLoader\).*|.*data[ _.]?load.*|.*dataloader.*)",
                           re.IGNORECASE)


def op_kind(name: str) -> str:
    """The kind of an op by its name (namespace dropped): one of ``KIND_NAMES``."""
    short = name.rsplit("::", 1)[-1].split(".", 1)[0]
    for kind, pattern in _KIND_PATTERNS:
        if pattern.match(short):
            return kind
    return OTHER_OPS


def context_of_name(name: str) -> str:
    """The context a range's name sets, or "" when it sets none.

    >>> context_of_name("Optimizer.step#SGD.step"), context_of_name("forward")
    ('optimizer', '')
    """
    if name.startswith("Optimizer."):
        return OPTIMIZER
    if name.startswith(EVALUATE_FUNCTION):
        return BACKWARD
    if _DATA_PATTERN.match(name):
        return DATA_LOADING
    return ""


def is_op_name(name: str) -> bool:
    """True for a dispatcher op (``ns::name``); ranges and Python frames are not ops."""
    return "::" in name and " " not in name.split("::", 1)[0] and not name.startswith(
        _NOT_OPS)


def event_categories(table: EventTable) -> np.ndarray:
    """Per event: an index into ``CATEGORY_NAMES`` for its self time."""
    return category_codes(table)[0]


def backward_parts(table: EventTable) -> np.ndarray:
    """Per event: an index into ``BACKWARD_PART_NAMES`` for backward time; -1 outside backward."""
    return category_codes(table)[1]


def category_codes(table: EventTable) -> Tuple[np.ndarray, np.ndarray]:
    """Both :func:`event_categories` and :func:`backward_parts`, computed in one pass."""
    n = len(table)
    names = table.symbols.names
    contexts = [context_of_name(nm) for nm in names]
    context_code = np.array([CONTEXTS.index(c) if c else -1 for c in contexts] or [-1],
                            dtype=np.int64)
    kind_code = np.array([KIND_NAMES.index(op_kind(nm)) if is_op_name(nm) else -1
                          for nm in names] or [-1], dtype=np.int64)
    is_step = np.array([nm.startswith(PROFILER_STEP_PREFIX) for nm in names] or [False])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    nid = table.name_id
    own_context = context_code[nid]
    own_context[table.scope == SCOPE_BACKWARD_FUNCTION] = CONTEXTS.index(BACKWARD)
    context = inherit_down(table.parent, own_context)
    user = table.scope == SCOPE_USER
    own_kind = np.where(user, -1, kind_code[nid])
    kind = outermost_down(table.parent, own_kind)
    outside_ops = np.where(is_step[nid], CATEGORY_NAMES.index(IDLE),
                           CATEGORY_NAMES.index(PYTHON_OTHER))
    category = np.where(kind >= 0, kind, outside_ops)
    context_category = np.array([CATEGORY_NAMES.index(c) for c in CONTEXTS])
    category = np.where(context >= 0, context_category[np.maximum(context, 0)], category)
    comm = collective_rows(table)
    if comm.any():  # a collective and what runs inside it
        inside = nearest_marked(table.parent, comm) >= 0
        category = np.where(inside, CATEGORY_NAMES.index(COMMUNICATION), category)
    in_backward = category == CATEGORY_NAMES.index(BACKWARD)
    backward = np.where(in_backward, np.where(kind >= 0, kind, len(KIND_NAMES)), -1)
    return category, backward


def collective_rows(table: EventTable) -> np.ndarray:
    """True for each collective: a ``c10d::`` op or a backend range (``gloo:all_reduce``)."""
    names = table.symbols.names
    if len(table) == 0 or not names:
        return np.zeros(len(table), dtype=bool)
    named = np.array([collective_kind(nm) is not None for nm in names])
    return named[table.name_id]


def top_level_ops(table: EventTable) -> np.ndarray:
    """True for each op (``is_op_name``) whose parent is not an op: the ops Python called.

    Their count and durations say whether a run is host-bound (many short ops).
    """
    if len(table) == 0:
        return np.zeros(0, dtype=bool)
    op_name = np.array([is_op_name(n) for n in table.symbols.names])
    is_op = op_name[table.name_id]
    parent_is_op = np.where(table.parent >= 0, is_op[np.maximum(table.parent, 0)], False)
    return is_op & ~parent_is_op
