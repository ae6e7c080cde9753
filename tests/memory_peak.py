"""The peak of the memory Python allocates while a call runs, as ``tracemalloc`` counts it.

Tests that bound memory compare peaks: a small input's with a large one's, or one
reader's with another's.

    >>> traced_peak(lambda: bytes(10 ** 6)) >= 10 ** 6
    True
"""

from __future__ import annotations

import tracemalloc
from typing import Any, Callable


def traced_peak(fn: Callable[[], Any]) -> int:
    """The most bytes traced at once while ``fn()`` runs (tracing only during the call)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
