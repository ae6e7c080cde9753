"""The memory summary as text (``prof.memory_summary()``).

Example::

    >>> from opscope.analysis.memory_summary import MemorySummary
    >>> print(render_memory_summary(MemorySummary(peak=2048)))
    Peak memory held: 2.00 KB
"""

from __future__ import annotations

from typing import List

from opscope.analysis.memory_summary import MemorySummary, summarize_memory
from opscope.arguments import check_int, check_type
from opscope.export.table import format_memory
from opscope.model.memory import CATEGORY_NAMES
from opscope.model.session import ProfileSession


def render_memory_summary(summary: MemorySummary) -> str:
    """The summary as lines of text: peak, peak per step, largest self allocations."""
    check_type("render_memory_summary", "summary", summary, MemorySummary,
               "a MemorySummary")
    lines: List[str] = [f"Peak memory held: {format_memory(summary.peak)}"]
    if summary.step_peaks:
        lines += ["", "Peak per step:"]
        for name, peak, by_cat in summary.step_peaks:
            parts = ", ".join(f"{CATEGORY_NAMES[c]} {format_memory(v)}"
                              for c, v in enumerate(by_cat) if v)
            lines.append(f"  {name:<24} {format_memory(peak):>12}   ({parts})")
    if summary.top_ops:
        lines += ["", "Largest self allocations:"]
        width = max(len(name) for name, _, _ in summary.top_ops)
        for name, nbytes, calls in summary.top_ops:
            lines.append(f"  {name:<{width}}  {format_memory(nbytes):>12}  in {calls} calls")
    return "\n".join(lines)


def format_memory_summary(session: ProfileSession, top: int = 10) -> str:
    """The memory summary of ``session`` with its ``top`` (an int >= 0) largest ops.

    >>> format_memory_summary(None, top=-1)
    Traceback (most recent call last):
    ...
    ValueError: memory_summary: top must be >= 0, got -1
    """
    top = check_int("memory_summary", "top", top, minimum=0)
    check_type("memory_summary", "session", session, ProfileSession, "a ProfileSession")
    return render_memory_summary(summarize_memory(session, top=top))
