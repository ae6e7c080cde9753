"""Sightings of tensors whose role is known, for memory categories.

While ``profile_memory`` records, these hooks note which allocations hold
what, by storage address and time:

* a module's parameters, the first time the module runs (``PARAMETER``);
* the tensor arguments of an outermost module call (``INPUT``);
* tensors autograd saves for backward, through a default saved-tensors hook
  (``ACTIVATION``);
* after each ``optimizer.step()``: the parameters, their ``.grad``
  (``GRADIENT``) and every tensor in ``optimizer.state`` (``OPTIMIZER_STATE``).

Nothing is kept but integers: no tensor outlives its own use.

Example::

    >>> import torch
    >>> hooks = TensorSightings(clock=lambda: 0)
    >>> hooks.install()
    >>> _ = torch.nn.Linear(2, 2)(torch.ones(1, 2))
    >>> hooks.uninstall()
    >>> sorted({CATEGORY_NAMES[c] for c in hooks.to_array()["category"].tolist()})
    ['ACTIVATION', 'INPUT', 'PARAMETER']
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, List, Tuple

import numpy as np
import torch

from opscope.model.memory import (ACTIVATION, CATEGORY_NAMES, GRADIENT, INPUT,  # noqa: F401
                                  OPTIMIZER_STATE, PARAMETER, SIGHTING_DTYPE)



class TensorSightings:
    """Installs the hooks; ``to_array()`` returns what they saw (SIGHTING_DTYPE)."""

    def __init__(self, clock: Callable[[], int]):
        self._clock = clock
        self._rows: List[Tuple[int, int, int, int, int, int]] = []
        self._seen_modules: set = set()
        self._seen_tensors: dict = {}  # id -> (weakref, data_ptr), see _see_once
        self._depth = threading.local()
        self._handles: list = []
        self._saved_hooks = None

    # -- hooks --------------------------------------------------------------------
    def _see(self, tensor, category: int) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.is_meta:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, functional wrappers
            return
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr and nbytes:
            device = tensor.device
            index = -1 if device.index is None else device.index
            self._rows.append((self._clock(), ptr, nbytes, category,
                               _DEVICE_TYPES.get(device.type, -1), index))

    def _pre_forward(self, module, args):
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        if id(module) not in self._seen_modules:
            self._seen_modules.add(id(module))
            for p in module.parameters(recurse=False):
                self._see(p, PARAMETER)
        if depth == 0:
            for a in args:
                self._see(a, INPUT)

    def _post_forward(self, module, args, output):
        self._depth.value = max(0, getattr(self._depth, "value", 1) - 1)

    def _pack(self, tensor):
        self._see(tensor, ACTIVATION)
        return tensor

    def _see_once(self, tensor, category: int) -> None:
        """``_see``, skipped for a tensor already seen at the same address (one
        sighting covers an allocation's whole life): parameters and optimizer
        state are the same tensors every step."""
        if not isinstance(tensor, torch.Tensor):
            return
        ptr = tensor.data_ptr()
        known = self._seen_tensors.get(id(tensor))
        if known is not None and known[1] == ptr and known[0]() is tensor:
            return
        self._seen_tensors[id(tensor)] = (weakref.ref(tensor), ptr)
        self._see(tensor, category)

    def _after_step(self, optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._see_once(p, PARAMETER)
                if p.grad is not None:
                    self._see_once(p.grad, GRADIENT)
        for state in optimizer.state.values():
            for value in state.values():
                self._see_once(value, OPTIMIZER_STATE)

    # -- lifetime -----------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre_forward),
            nn_module.register_module_forward_hook(self._post_forward, always_call=True),
            register_optimizer_step_post_hook(self._after_step),
        ]
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._saved_hooks.__enter__()

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._saved_hooks is not None:
            hooks, self._saved_hooks = self._saved_hooks, None
            try:
                hooks.__exit__(None, None, None)
            except RuntimeError:  # popped out of order by user code: nothing left to undo
                pass

    def to_array(self) -> np.ndarray:
        return np.array(self._rows, dtype=SIGHTING_DTYPE)


def _unpack(tensor):
    return tensor


# torch.device.type -> c10::DeviceType code, as the allocator reports it
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "mkldnn": 2, "opengl": 3, "opencl": 4, "ideep": 5,
                 "hip": 6, "fpga": 7, "maia": 8, "xla": 9, "vulkan": 10, "metal": 11,
                 "xpu": 12, "mps": 13, "meta": 14, "hpu": 15, "ve": 16, "lazy": 17,
                 "ipu": 18, "mtia": 19}
