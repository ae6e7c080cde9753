"""Sightings of tensors whose role is known, for memory categories.

While ``profile_memory`` records, these hooks note which allocations hold
what, by storage address and time:

* a module's parameters, the first time the module runs (``PARAMETER``);
* the tensor arguments of an outermost module call (``INPUT``);
* after each ``optimizer.step()``: the parameters, their ``.grad``
  (``GRADIENT``) and every tensor in ``optimizer.state`` (``OPTIMIZER_STATE``).

Nothing is kept but integers: no tensor outlives its own use.

Example::

    >>> import torch
    >>> hooks = TensorSightings()
    >>> hooks.install()
    >>> _ = torch.nn.Linear(2, 2)(torch.ones(1, 2))
    >>> hooks.uninstall()
    >>> sorted({CATEGORY_NAMES[c] for c in hooks.to_array()["category"].tolist()})
    ['INPUT', 'PARAMETER']
"""

from __future__ import annotations

import weakref
from time import monotonic_ns
from typing import List, Tuple

import numpy as np
import torch

from opscope.model.memory import (CATEGORY_NAMES, GRADIENT, INPUT,  # noqa: F401 (doctest)
                                  OPTIMIZER_STATE, PARAMETER, SIGHTING_DTYPE)


class TensorSightings:
    """Installs the hooks; ``to_array()`` returns what they saw (SIGHTING_DTYPE).

    Times are CLOCK_MONOTONIC ns (``time.monotonic_ns``), the clock of both collectors.
    """

    def __init__(self):
        self._rows: List[Tuple[int, int, int, int, int, int]] = []
        # id -> (weakref, is outermost) for every module seen and its submodules
        self._module_roles: dict = {}
        self._seen_tensors: dict = {}  # id -> (weakref, data_ptr), see _see_once
        self._optimizers: dict = {}  # id -> weakref of each optimizer stepped
        self._forward_handle = None
        self._optimizer_key = None

    # -- hooks --------------------------------------------------------------------
    def _see(self, tensor, category: int) -> None:
        """Note the storage of ``tensor`` with its size (it may predate the window)."""
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
            self._rows.append((monotonic_ns(), ptr, nbytes, category,
                               _DEVICE_TYPES.get(device.type, -1), index))

    def _pre_forward(self, module, args):
        known = self._module_roles.get(id(module))
        if known is not None and known[0]() is module:
            if known[1]:  # an outermost module: its tensor arguments are the input
                for a in args:
                    self._see(a, INPUT)
            return
        # a module seen for the first time: an outermost one unless it sits below one
        # already seen; its parameters, and its submodules', are noted now
        root = self._module_roles.get(id(module), (None, True))[1]
        for sub in module.modules():
            if sub is not module:
                self._module_roles[id(sub)] = (weakref.ref(sub), False)
        self._module_roles[id(module)] = (weakref.ref(module), root)
        for p in module.parameters():
            self._see_once(p, PARAMETER)
        if root:
            for a in args:
                self._see(a, INPUT)

    def _see_once(self, tensor, category: int, size_known: bool = True) -> None:
        """``_see``, skipped for a tensor already seen at the same address (one
        sighting covers an allocation's whole life): parameters and optimizer
        state are the same tensors every step. With ``size_known=False`` only the
        address is noted (cheaper), for memory allocated in the window."""
        if not isinstance(tensor, torch.Tensor):
            return
        ptr = tensor.data_ptr()
        known = self._seen_tensors.get(id(tensor))
        if known is not None and known[1] == ptr and known[0]() is tensor:
            return
        self._seen_tensors[id(tensor)] = (weakref.ref(tensor), ptr)
        if size_known or not tensor.is_cpu:
            self._see(tensor, category)
        else:
            base = ptr - tensor.storage_offset() * tensor.element_size()
            self._rows.append((monotonic_ns(), base, -1, category, 0, -1))

    def _after_step(self, optimizer, args, kwargs):
        # the first step seen may show tensors made before the window (sizes
        # needed); later ones only new gradients and new state, made in it
        seen = self._optimizers.get(id(optimizer))
        first = seen is None or seen() is not optimizer
        self._optimizers[id(optimizer)] = weakref.ref(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if first:
                    self._see_once(p, PARAMETER)
                grad = p.grad
                if grad is not None:
                    self._see_once(grad, GRADIENT, first)
        for state in optimizer.state.values():
            for value in state.values():
                self._see_once(value, OPTIMIZER_STATE, first)

    # -- lifetime -----------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        from opscope.step_tracker import add_optimizer_listener

        # The optimizer side is a step-tracker listener, not an entry of torch's
        # own post-hook table: a profile may start or stop inside an optimizer
        # step (on-demand), and editing the table torch is iterating would end
        # the training with "OrderedDict mutated during iteration".
        self._forward_handle = nn_module.register_module_forward_pre_hook(self._pre_forward)
        self._optimizer_key = add_optimizer_listener(self._after_step)

    def uninstall(self) -> None:
        from opscope.step_tracker import remove_optimizer_listener

        handle, self._forward_handle = self._forward_handle, None
        if handle is not None:
            handle.remove()
        key, self._optimizer_key = self._optimizer_key, None
        if key is not None:
            remove_optimizer_listener(key)

    def to_array(self) -> np.ndarray:
        return np.array(self._rows, dtype=SIGHTING_DTYPE)


# torch.device.type -> c10::DeviceType code, as the allocator reports it
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "mkldnn": 2, "opengl": 3, "opencl": 4, "ideep": 5,
                 "hip": 6, "fpga": 7, "maia": 8, "xla": 9, "vulkan": 10, "metal": 11,
                 "xpu": 12, "mps": 13, "meta": 14, "hpu": 15, "ve": 16, "lazy": 17,
                 "ipu": 18, "mtia": 19}
