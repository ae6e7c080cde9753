"""Text output of the Dynamo profiler: the coverage report and MISSING lines.

``format_report`` turns a ``ProfileResult`` and the uncaptured ops into a
short report that points at graph breaks; ``missing_lines`` gives one line per
uncaptured op call with its Python stack, as ``TORCHDYNAMO_PRINT_MISSING``
prints them.

Example::

    >>> from opscope.dynamo.metrics import ProfileMetrics, ProfileResult
    >>> result = ProfileResult(ProfileMetrics(30.0, 3, 2, 1), ProfileMetrics(40.0, 4, 3, 1), 1)
    >>> ops = [UncapturedOp("aten::item", "train.py(9): forward", 1, 10.0)]
    >>> print(format_report(result, ops, stacks_recorded=True))
    Dynamo profile: 1 graphs, 1 graph calls
    Captured ops:  3 of 4 top-level ops (75%)
    Captured time: 30.0 of 40.0 us (75%)
    Top uncaptured ops (by time; each ran outside every compiled graph):
      Time (us)  Calls  Op          Source
           10.0      1  aten::item  train.py(9): forward
"""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Set, TextIO

from opscope.dynamo.capture import UncapturedOp
from opscope.dynamo.metrics import ProfileResult
from opscope.dynamo.stack_frames import issued_by_profiler, user_frames

MISSING_FRAMES = 3  # innermost user frames shown per MISSING line, as torch shows three
NO_STACK_NOTE = ("(no Python stacks recorded: profile with with_stack=True to see "
                 "source lines)")
NO_STACK_RECORDED_NOTE = "(with_stack was on, but the collector recorded no Python stacks)"

_printed: Set[str] = set()  # MISSING lines already printed by this process


def format_report(result: ProfileResult, uncaptured: Sequence[UncapturedOp], top: int = 10,
                  stacks_recorded: bool = False, stacks_requested: bool = False) -> str:
    """The coverage report: graphs, captured share of ops and time, top uncaptured ops.

    Without recorded stacks a last line says why sources are missing
    (``stacks_requested``: with_stack was on, yet nothing was recorded).
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ValueError(f"report: top must be an int >= 0, got {top!r}")
    captured, total = result.captured, result.total
    share = result.percent()
    lines = [
        f"Dynamo profile: {result.unique_graphs} graphs, {captured.graphs} graph calls",
        f"Captured ops:  {captured.operators} of {total.operators} top-level ops "
        f"({share.operators:.0%})",
        f"Captured time: {captured.microseconds:.1f} of {total.microseconds:.1f} us "
        f"({share.microseconds:.0%})",
    ]
    if captured.graphs == 0:
        lines.append("No compiled graph ran: compile the model with "
                     "torch.compile(model, backend=opscope.dynamo.fx_insert_profiling)")
    if not uncaptured:
        lines.append("No uncaptured ops: every op ran inside a compiled graph.")
        return "\n".join(lines)
    shown = list(uncaptured[:top])
    lines.append("Top uncaptured ops (by time; each ran outside every compiled graph):")
    rows = [("Time (us)", "Calls", "Op", "Source")]
    rows += [(f"{op.microseconds:.1f}", str(op.calls), op.name, op.source or "-") for op in shown]
    widths = [max(len(row[k]) for row in rows) for k in range(3)]
    for time_text, calls, name, source in rows:
        lines.append(f"  {time_text:>{widths[0]}}  {calls:>{widths[1]}}  "
                     f"{name:<{widths[2]}}  {source}".rstrip())
    if len(uncaptured) > len(shown):
        lines.append(f"  ... and {len(uncaptured) - len(shown)} more")
    if not stacks_recorded:
        lines.append(NO_STACK_RECORDED_NOTE if stacks_requested else NO_STACK_NOTE)
    return "\n".join(lines)


def missing_line(name: str, stack: Optional[Sequence[str]]) -> Optional[str]:
    """``MISSING <op>: outer >> ... >> inner`` for one uncaptured op, or None to skip.

    Ops issued by a profiler's own code are skipped, as torch skips them.

    >>> missing_line("aten::item", ["t.py(9): forward", "t.py(30): <module>"])
    'MISSING aten::item: t.py(30): <module> >> t.py(9): forward'
    >>> missing_line("aten::item", None)
    'MISSING aten::item: (no Python stack recorded)'
    """
    if stack is None or len(stack) == 0:
        return f"MISSING {name}: (no Python stack recorded)"
    if issued_by_profiler(stack):
        return None
    frames = user_frames(stack)[:MISSING_FRAMES]
    if not frames:
        return f"MISSING {name}: (no user frame on the stack)"
    return f"MISSING {name}: " + " >> ".join(reversed(frames))


def missing_lines(names: Sequence[str], stacks: Sequence[Optional[Sequence[str]]]) -> List[str]:
    """MISSING lines for parallel lists of op names and stacks, duplicates dropped."""
    out: List[str] = []
    seen: Set[str] = set()
    for name, stack in zip(names, stacks):
        line = missing_line(name, stack)
        if line is not None and line not in seen:
            seen.add(line)
            out.append(line)
    return out


def print_missing(lines: Sequence[str], file: Optional[TextIO] = None) -> None:
    """Print each MISSING line once per process (later profiles repeat none)."""
    out = file if file is not None else sys.stdout
    for line in lines:
        if line not in _printed:
            _printed.add(line)
            print(line, file=out)
