"""Memory categories and tensor sightings: what each allocation was for.

Codes follow torch's plot order (``torch.profiler._memory_profiler``), and a
memory timeline's size rows put category ``c`` in column ``c + 1``.

Example::

    >>> CATEGORY_NAMES[PARAMETER], len(CATEGORY_NAMES)
    ('PARAMETER', 8)
"""

from __future__ import annotations

import numpy as np

PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL, UNKNOWN = \
    range(8)
CATEGORY_NAMES = ("PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION",
                  "GRADIENT", "AUTOGRAD_DETAIL", "unknown")
# What each category holds, as the report's Memory view and docs/guide.md say it.
CATEGORY_MEANINGS = (
    "a module parameter",
    "optimizer state (momentum, Adam moments)",
    "the model's input (tensor arguments of an outermost module call)",
    "memory freed before the op that allocated it returned",
    "a tensor autograd saved for backward (allocated outside backward, freed inside it)",
    "a parameter's .grad",
    "other memory allocated during backward (gradients of activations)",
    "everything else (a loss scalar, tensors made outside any module)",
)
# When several sightings name one allocation, the first in this order wins.
SIGHTING_PRIORITY = (PARAMETER, OPTIMIZER_STATE, GRADIENT, INPUT)

# A tensor seen in a known role at a time: its storage address and size, and
# its device as the allocator reports it (CPU: type 0, index -1). Bytes -1: size
# not known (matched only to memory allocated in the window).
SIGHTING_DTYPE = np.dtype([("time_ns", "<i8"), ("addr", "<i8"), ("bytes", "<i8"),
                           ("category", "i1"), ("device_type", "i1"),
                           ("device_index", "i1")])

# torch's raw timeline actions (torch.profiler._memory_profiler.Action values)
ACTION_PREEXISTING, ACTION_CREATE, ACTION_INCREMENT_VERSION, ACTION_DESTROY = 1, 2, 3, 4
