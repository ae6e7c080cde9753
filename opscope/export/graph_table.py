"""``opscope table TRACE --group-by graph``: one line per torch.compile'd graph, then one per
Dynamo frame with Dynamo's own time (``analysis.compiled_frames``), then the graph breaks.

Example::

    >>> from opscope.analysis.compiled_graphs import GraphRow
    >>> from opscope.analysis.compiled_frames import FrameRow
    >>> frame = FrameRow("0", ["0/1"], "forward (m.py:9)", 3, 900.0, 600.0, 1200.0, 2, 3,
    ...                  30.0, 210.0, compiles=2, recompile_reasons=["0/0: k == 1"],
    ...                  break_lines=["m.py:12"], break_reasons=["Call to graph_break()"])
    >>> print(format_graph_table([GraphRow("fabc", "forward", "0/1", "train.py(9): step", 3,
    ...                                    1500.0, 4, 97.5)], {"a Python builtin": 2}, [frame]))
    -----  ---------  -----  -----  -------  -------  ----------  -----------------
    Graph  Direction  Frame  Calls     Time  Kernels  In modules  Called from
    -----  ---------  -----  -----  -------  -------  ----------  -----------------
    fabc   forward    0/1        3  1.500ms        4       97.5%  train.py(9): step
    -----  ---------  -----  -----  -------  -------  ----------  -----------------
    Dynamo frames (Guards: TorchDynamo Cache Lookups; Wrappers: AOT time outside graph calls):
    -----  -----  ---------  ---------  ---------  ------  ----------  ---------  ---------  --------  ----------------
    Frame  Calls    Forward   Backward  In graphs  Guards  Guard time   Wrappers  Compiling  Compiles  Code
    -----  -----  ---------  ---------  ---------  ------  ----------  ---------  ---------  --------  ----------------
    0          3  900.000us  600.000us    1.200ms       3    30.000us  210.000us          -         2  forward (m.py:9)
    -----  -----  ---------  ---------  ---------  ------  ----------  ---------  ---------  --------  ----------------
      frame 0: recompiled (0/0: k == 1)
      frame 0: graph break at m.py:12: Call to graph_break()
    Graph breaks so far in the process (reason: count):
      a Python builtin: 2
"""

from __future__ import annotations

from typing import Dict, List, Sequence

from opscope.analysis.compiled_frames import FrameRow, frame_notes
from opscope.analysis.compiled_graphs import GraphRow
from opscope.export.table import format_time

HEADER = ("Graph", "Direction", "Frame", "Calls", "Time", "Kernels", "In modules", "Called from")
FRAME_HEADER = ("Frame", "Calls", "Forward", "Backward", "In graphs", "Guards", "Guard time",
                "Wrappers", "Compiling", "Compiles", "Code")
FRAMES_TITLE = ("Dynamo frames (Guards: TorchDynamo Cache Lookups; "
                "Wrappers: AOT time outside graph calls):")
KEY_WIDTH = 12
GAP = "  "


def _cells(row: GraphRow) -> List[str]:
    return [row.key[:KEY_WIDTH], row.direction, row.frame or "-", str(row.calls),
            format_time(row.time_us), str(row.kernels), f"{row.in_modules_pct:.1f}%",
            row.caller or "-"]


def _frame_cells(row: FrameRow) -> List[str]:
    return [row.frame, str(row.calls), format_time(row.time_us), format_time(row.backward_us),
            format_time(row.graph_us), str(row.guard_calls), format_time(row.guard_us),
            format_time(row.wrapper_us),
            format_time(row.compile_us) if row.compile_us else "-", str(row.compiles),
            row.code or "-"]


def aligned(header: Sequence[str], body: List[List[str]], numeric: set) -> List[str]:
    """``header`` and ``body`` as aligned columns between rules (``numeric`` ones right)."""
    widths = [max(len(line[k]) for line in body + [list(header)]) for k in range(len(header))]
    rule = GAP.join("-" * w for w in widths)

    def line(cells: List[str]) -> str:
        return GAP.join(c.rjust(w) if k in numeric else c.ljust(w)
                        for k, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [rule, line(list(header)), rule] + [line(c) for c in body] + [rule]


def format_graph_table(rows: Sequence[GraphRow], breaks: Dict[str, int],
                       frames: Sequence[FrameRow] = ()) -> str:
    """The compiled graphs as aligned columns, then the Dynamo frames and graph breaks."""
    if not rows and not frames:
        return "No torch.compile'd graph ran in this recording."
    out = aligned(HEADER, [_cells(r) for r in rows], {3, 4, 5, 6}) if rows else []
    if frames:
        out += [FRAMES_TITLE] + aligned(FRAME_HEADER, [_frame_cells(f) for f in frames],
                                        set(range(1, 10)))
        out += ["  " + note for f in frames for note in frame_notes(f)]
    if breaks:
        out.append("Graph breaks so far in the process (reason: count):")
        out.extend(f"  {' '.join(reason.split())[:200]}: {count}" for reason, count in breaks.items())
    return "\n".join(out)
