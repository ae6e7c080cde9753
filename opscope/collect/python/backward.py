"""Backward recording for the Python collector: autograd node hooks.

While recording, ``torch.autograd.backward``/``grad`` are wrapped (by the
collector); each call hooks every node of the graph it runs, so each node is
recorded as ``autograd::engine::evaluate_function: <Node>`` around ``<Node>``
(scope BACKWARD_FUNCTION, with the node's sequence number). Hooks are removed
when the call returns.

The mixin expects the recording to provide ``active``, ``intern(name)``,
``buffer()``, ``join_thread()`` and ``_local`` (see recording.py).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from opscope.model.torch_names import EVALUATE_FUNCTION_PREFIX
from opscope.collect.python.rows import close_row, monotonic_ns, open_row
from opscope.model.records import SCOPE_BACKWARD_FUNCTION, SCOPE_FUNCTION

EVALUATE_PREFIX = EVALUATE_FUNCTION_PREFIX


class BackwardHooks:
    """Mixin: record autograd nodes run by a wrapped backward()/grad() call."""

    def hook_graph(self, roots) -> list:
        """Put our pre/post hooks on every node reachable from ``roots``."""
        if not isinstance(roots, (list, tuple)):  # a tensor or edge; never consume an iterator
            roots = [roots]
        todo = []
        for r in roots or ():
            todo.append(r.grad_fn if isinstance(r, torch.Tensor) else getattr(r, "node", None))
        seen = set()
        handles = []
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            name = node.name()
            seq = node._sequence_nr()
            ids = (self.intern(EVALUATE_PREFIX + name), self.intern(name),
                   seq if seq < 2**63 else seq - 2**64)  # uint64 max means none: -1
            try:
                handles.append(node.register_prehook(functools.partial(self._node_pre, ids)))
                handles.append(node.register_hook(self._node_post))
            except RuntimeError:
                pass
            todo.extend(f for f, _ in node.next_functions)
        return handles

    def _node_pre(self, ids, grad_outputs):
        if not self.active:
            return None
        buf = self.buffer()
        outer = open_row(buf, monotonic_ns(), ids[0], SCOPE_FUNCTION)
        inner = open_row(buf, monotonic_ns(), ids[1], SCOPE_BACKWARD_FUNCTION, ids[2])
        buf.rows.append(outer)
        buf.rows.append(inner)
        buf.backward.append((outer, inner))
        return None

    def _node_post(self, grad_inputs, grad_outputs):
        buf = getattr(self._local, "buf", None)
        if buf is not None and buf.backward:
            outer, inner = buf.backward.pop()
            close_row(inner, monotonic_ns())
            close_row(outer, monotonic_ns())
        return None

    def run_backward(self, original: Callable, root_param: str, args, kwargs):
        if not self.active:
            return original(*args, **kwargs)
        buf = self.join_thread()
        depth = len(buf.backward)
        handles = self.hook_graph(args[0] if args else kwargs.get(root_param))
        try:
            return original(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()
            while len(buf.backward) > depth:  # nodes a raising backward left open
                outer, inner = buf.backward.pop()
                close_row(inner, monotonic_ns())
                close_row(outer, monotonic_ns())
