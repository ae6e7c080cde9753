"""The names torch gives its profiler events, spelled once.

opscope's tables and traces must use torch.profiler's exact spellings, and the
analysis recognises torch's own events by them; every module takes them from here.

    >>> f"{PROFILER_STEP}#3".startswith(PROFILER_STEP_PREFIX)
    True
    >>> (EVALUATE_FUNCTION_PREFIX + "AddmmBackward0")[len(EVALUATE_FUNCTION_PREFIX):]
    'AddmmBackward0'
"""

from __future__ import annotations

PROFILER_STEP = "ProfilerStep"              # one range per profile.step(): ProfilerStep#N
PROFILER_STEP_PREFIX = PROFILER_STEP + "#"
PROFILER_STEP_WILDCARD = PROFILER_STEP + "*"  # how torch's tables name the steps together
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"     # one range per optimizer.step(): ...#SGD.step
MEMORY_EVENT = "[memory]"                   # an allocation made outside any op
AUTOGRAD_ENGINE_PREFIX = "autograd::engine::"  # ranges the autograd engine records
# autograd's wrapper around each backward node: "<prefix><NodeName>"
EVALUATE_FUNCTION = AUTOGRAD_ENGINE_PREFIX + "evaluate_function"
EVALUATE_FUNCTION_PREFIX = EVALUATE_FUNCTION + ": "
