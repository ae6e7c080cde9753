"""``opscope.autograd``: the deprecated ``torch.autograd.profiler_legacy`` API.

``opscope.autograd.profile`` is the legacy autograd profiler (deprecated; use
``opscope.profile``). ``KinetoStepTracker`` is torch's name for the step
tracker in :mod:`opscope.step_tracker`.

Example::

    >>> import warnings, torch, opscope.autograd
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", FutureWarning)
    ...     with opscope.autograd.profile() as prof:
    ...         _ = torch.ones(2) * 3
    >>> prof.key_averages()[0].key
    'aten::ones'
"""

from __future__ import annotations

from opscope.autograd.profiler_legacy import profile
from opscope.step_tracker import KinetoStepTracker

__all__ = ["profile", "KinetoStepTracker"]
