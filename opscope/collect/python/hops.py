"""Higher-order ops (``torch.cond``, ``while_loop``...) under the Python collector's mode.

torch 2.13 hands a higher-order op (HOP) to any ``TorchDispatchMode`` whose
``supports_higher_order_operators`` is True, through its ``__torch_dispatch__``.
Older torch (2.4 to 2.8) has no such flag: a HOP that meets a mode with no rule
registered for it raises (``AssertionError: ... not registered`` on 2.4,
``NotImplementedError: There was no rule registered for HOP cond`` on 2.8).
There, ``route_higher_order_ops`` registers one rule per HOP for our mode's
class, which calls the mode's ``__torch_dispatch__`` exactly as newer torch
does (our mode already popped, so the HOP then runs as it would unprofiled).

Example::

    >>> import torch
    >>> from torch.utils._python_dispatch import TorchDispatchMode
    >>> class Passthrough(TorchDispatchMode):
    ...     supports_higher_order_operators = True  # what torch 2.9+ reads
    ...     def __torch_dispatch__(self, func, types, args=(), kwargs=None):
    ...         return func(*args, **(kwargs or {}))
    >>> _ = route_higher_order_ops(Passthrough)  # what torch 2.4 to 2.8 need
    >>> with Passthrough():
    ...     torch.cond(torch.tensor(True), torch.sin, torch.cos, (torch.zeros(2),))
    tensor([0., 0.])
    >>> torch._dynamo.reset()  # eager cond compiled its branches: leave no cache behind
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils._python_dispatch import TorchDispatchMode


def torch_routes_higher_order_ops() -> bool:
    """True when the installed torch sends HOPs to a mode's ``__torch_dispatch__`` itself."""
    return hasattr(TorchDispatchMode, "supports_higher_order_operators")


def _has_rule(hop: Any, mode_cls: type) -> bool:
    # The table was renamed between versions (python_key_mode_table -> python_key_table).
    for attr in ("python_key_table", "python_key_mode_table"):
        table = getattr(hop, attr, None)
        if isinstance(table, dict) and mode_cls in table:
            return True
    return False


def _rule_for(hop: Any) -> Callable[..., Any]:
    def through_mode(mode, *args, **kwargs):
        # torch calls this with the mode popped, as it calls __torch_dispatch__ on 2.13.
        return mode.__torch_dispatch__(hop, (), args, kwargs)

    return through_mode


def route_higher_order_ops(mode_cls: type) -> int:
    """Register ``mode_cls``'s rule on every HOP that lacks one; the number registered.

    Does nothing (returns 0) where torch routes HOPs itself. Idempotent, so it is
    called at every start, which also covers HOPs defined since the last one. A
    HOP that refuses the rule is left as it was: it raises only if it is used
    while recording, as it did before.
    """
    if torch_routes_higher_order_ops():
        return 0
    try:
        from torch._ops import _higher_order_ops
    except ImportError:  # a torch without a HOP registry has no HOPs to route
        return 0
    added = 0
    for hop in list(_higher_order_ops.values()):
        if _has_rule(hop, mode_cls):
            continue
        try:
            hop.py_impl(mode_cls)(_rule_for(hop))
        except Exception:
            continue
        added += 1
    return added
