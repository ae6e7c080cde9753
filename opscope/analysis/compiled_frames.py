"""One row per Dynamo frame of torch.compile'd code: Dynamo's own time around the graphs.

A Dynamo frame is a Python function that ``torch.compile`` turned into compiled code
(``forward``, or ``torch_dynamo_resume_in_forward_at_12``: the rest of ``forward`` after a
graph break at line 12). Each run of it is a ``Torch-Compiled Region: <frame>/<compile>``
range; per frame, over the recording:

- ``calls`` and ``time_us``: its regions (the forward, inclusive), and ``backward_us``: its
  ``CompiledFunctionBackward`` ranges (linked to the forward by autograd,
  ``compiled_graphs.call_regions``);
- ``graph_us``: the time of its ``## Call CompiledFxGraph ##`` calls, forward and backward;
- ``guard_calls``/``guard_us``: Dynamo's guard checks, the ``TorchDynamo Cache Lookup``
  range right before each region (a sibling on the same thread);
- ``wrapper_us``: the AOT wrappers, the ``CompiledFunction``/``CompiledFunctionBackward``
  ranges' time outside their graph calls, plus the ``Pregraph bytecode`` and
  ``AOTDispatcher Runtime Wrapper ...`` ranges beside them;
- ``compile_us``: compiling it inside the window (Dynamo's ``dynamo`` ranges);
- ``compiles``: its compiles so far in the process (a live recording's metadata,
  ``COMPILED_FRAMES_KEY``; else the highest compile number the window shows, plus one), so
  ``compiles - 1`` recompiles, with Dynamo's ``recompile_reasons``;
- ``code``: the frame's function and ``file:line`` (the metadata's), else, with stacks, the
  program line that ran it; ``break_lines``/``break_reasons``: the graph breaks Dynamo
  restarted at when compiling it (the lines are those its resume functions name).

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> frame_rows(build_session(RawSession.empty()))
    []
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List

import numpy as np

from opscope.analysis.ancestry import nearest_marked_ancestor
from opscope.analysis.compiled_graphs import (call_regions, caller_line, compile_id,
                                              metadata_json, named)
from opscope.model.session import ProfileSession
from opscope.model.torch_names import (AOT_WRAPPER_PREFIXES, COMPILED_BACKWARD,
                                       COMPILED_CALL_PREFIX, COMPILED_FORWARD,
                                       COMPILED_FRAME_PREFIX, COMPILED_FRAMES_KEY,
                                       DYNAMO_CACHE_LOOKUP, DYNAMO_COMPILE,
                                       DYNAMO_COMPILE_DATA_PREFIX, DYNAMO_RESUME_PREFIX,
                                       compiled_graph_key)

_RESUME = re.compile(re.escape(DYNAMO_RESUME_PREFIX) + r"(.+)_at_(\d+)$")


@dataclass
class FrameRow:
    """One Dynamo frame; times in microseconds (see the module doc)."""

    frame: str
    compile_ids: List[str] = field(default_factory=list)  # those run in the window
    code: str = ""
    calls: int = 0
    time_us: float = 0.0
    backward_us: float = 0.0
    graph_us: float = 0.0
    graphs: int = 0
    guard_calls: int = 0
    guard_us: float = 0.0
    wrapper_us: float = 0.0
    compile_us: float = 0.0
    compiles: int = 0
    recompile_reasons: List[str] = field(default_factory=list)
    break_lines: List[str] = field(default_factory=list)
    break_reasons: List[str] = field(default_factory=list)

    @property
    def recompiles(self) -> int:
        return max(0, self.compiles - 1)


def frame_of(compile_id_text: str) -> str:
    """The frame of a compile id: ``0/1`` -> ``0``.

    >>> frame_of("0/1"), frame_of("3")
    ('0', '3')
    """
    return compile_id_text.rsplit("/", 1)[0]


def first_line(text: str) -> str:
    """The first non-blank line of Dynamo's message, its spaces collapsed.

    >>> first_line("\\n  Call to `graph_break()`\\n  Explanation: ...")
    'Call to `graph_break()`'
    """
    return next((" ".join(line.split()) for line in text.splitlines() if line.strip()), "")


def frame_notes(row: FrameRow) -> List[str]:
    """The frame's recompile reasons and graph breaks, one line each."""
    out = [f"frame {row.frame}: recompiled ({reason[:200]})" for reason in row.recompile_reasons]
    if len(row.break_lines) == 1 and len(row.break_reasons) == 1:
        return out + [f"frame {row.frame}: graph break at {row.break_lines[0]}: "
                      f"{row.break_reasons[0][:200]}"]
    if row.break_lines:
        out.append(f"frame {row.frame}: graph breaks at {', '.join(row.break_lines)}")
    out.extend(f"frame {row.frame}: graph break: {r[:200]}" for r in row.break_reasons)
    return out


def frame_rows(session: ProfileSession) -> List[FrameRow]:
    """The session's Dynamo frames, in the order of their first region."""
    table = session.table
    is_region = table.named_like(COMPILED_FRAME_PREFIX)
    if not is_region.any():
        return []
    regions = np.flatnonzero(is_region)
    region_frame = {int(r): frame_of(compile_id(table.name(int(r)))) for r in regions}
    rows: Dict[str, FrameRow] = {}
    for r in regions[np.argsort(table.start_ns[regions], kind="stable")].tolist():
        frame = rows.setdefault(region_frame[r], FrameRow(region_frame[r]))
        if frame.calls == 0:
            frame.code = caller_line(session, r)
        frame.calls += 1
        frame.time_us += float(table.duration_ns[r]) / 1000.0
        cid = compile_id(table.name(r))
        if cid not in frame.compile_ids:
            frame.compile_ids.append(cid)
    region_of = call_regions(table)
    _add_graphs_and_wrappers(session, rows, region_of, region_frame)
    _add_guards(session, rows, is_region, region_frame)
    _add_compiles(session, rows)
    _add_metadata(session, rows)
    return list(rows.values())


def _frame(rows: Dict[str, FrameRow], region_frame: Dict[int, str], region: int):
    return rows.get(region_frame.get(int(region), "")) if region >= 0 else None


def _add_graphs_and_wrappers(session, rows, region_of, region_frame) -> None:
    table = session.table
    dur_us = table.duration_ns.astype(np.float64) / 1000.0
    is_call = table.named_like(COMPILED_CALL_PREFIX)
    is_function = named(table, COMPILED_FORWARD) | named(table, COMPILED_BACKWARD)
    wrapper = np.where(is_function, dur_us, 0.0)
    calls = np.flatnonzero(is_call)
    in_function = nearest_marked_ancestor(table.parent, is_function)
    function_of = in_function[calls]
    np.subtract.at(wrapper, function_of[function_of >= 0], dur_us[calls][function_of >= 0])
    keys: Dict[str, set] = {}
    for row in calls.tolist():
        frame = _frame(rows, region_frame, int(region_of[row]))
        if frame is not None:
            frame.graph_us += float(dur_us[row])
            keys.setdefault(frame.frame, set()).add(compiled_graph_key(table.name(row)))
    for name in AOT_WRAPPER_PREFIXES:
        aot = table.named_like(name) & (in_function < 0)
        wrapper[aot] = dur_us[aot]
    for row in np.flatnonzero(wrapper != 0).tolist():
        frame = _frame(rows, region_frame, int(region_of[row]))
        if frame is not None:
            frame.wrapper_us += max(0.0, float(wrapper[row]))
    for row in np.flatnonzero(named(table, COMPILED_BACKWARD)).tolist():
        frame = _frame(rows, region_frame, int(region_of[row]))
        if frame is not None:
            frame.backward_us += float(dur_us[row])
    for frame in rows.values():
        frame.graphs = len(keys.get(frame.frame, ()))


def _add_guards(session, rows, is_region, region_frame) -> None:
    """A cache lookup counts for the region that comes right after it (same thread, parent)."""
    table = session.table
    lookup = named(table, DYNAMO_CACHE_LOOKUP)
    both = np.flatnonzero(lookup | is_region)
    order = np.lexsort((table.start_ns[both], table.parent[both], table.thread_index[both]))
    both = both[order]
    for a, b in zip(both[:-1].tolist(), both[1:].tolist()):
        if lookup[a] and is_region[b] and table.parent[a] == table.parent[b] \
                and table.thread_index[a] == table.thread_index[b]:
            frame = rows[region_frame[b]]
            frame.guard_calls += 1
            frame.guard_us += float(table.duration_ns[a]) / 1000.0


def _add_compiles(session, rows) -> None:
    """Compiles inside the window: a ``dynamo`` range whose data child names the compile id."""
    table = session.table
    compile_range = named(table, DYNAMO_COMPILE)
    for row in np.flatnonzero(table.named_like(DYNAMO_COMPILE_DATA_PREFIX)).tolist():
        up = int(table.parent[row])
        cid = table.name(row)[len(DYNAMO_COMPILE_DATA_PREFIX):].split(",")[0].strip()
        frame = rows.get(frame_of(cid))
        if frame is not None and up >= 0 and compile_range[up]:
            frame.compile_us += float(table.duration_ns[up]) / 1000.0


def _add_metadata(session, rows) -> None:
    """Code, compiles, recompile reasons and graph breaks from a live recording's metadata."""
    meta = {str(k): v for k, v in metadata_json(session, COMPILED_FRAMES_KEY).items()
            if isinstance(v, dict)}
    for frame in rows.values():
        seen = [int(c.rsplit("/", 1)[1]) for c in frame.compile_ids
                if "/" in c and c.rsplit("/", 1)[1].isdigit()]
        frame.compiles = max(seen) + 1 if seen else len(frame.compile_ids)
    by_code: Dict[tuple, FrameRow] = {}
    for cid, entry in sorted(meta.items()):
        frame = rows.get(frame_of(cid))
        if frame is None:
            continue
        ids = [c for c in meta if frame_of(c) == frame.frame]
        frame.compiles = max(frame.compiles, len(ids))
        name, file, line = _text(entry, "name"), _text(entry, "file"), entry.get("line")
        if name:
            frame.code = f"{name} ({file}:{line})"
            by_code[(name, file)] = frame
        reason = first_line(_text(entry, "recompile_reason"))
        if reason and reason not in frame.recompile_reasons:
            frame.recompile_reasons.append(reason)
        for text in entry.get("break_reasons") or ():
            reason = first_line(str(text))
            if reason and reason not in frame.break_reasons:
                frame.break_reasons.append(reason)
    for cid, entry in meta.items():  # a resume function names the line of the break
        found = _RESUME.match(_text(entry, "name"))
        target = by_code.get((found.group(1), _text(entry, "file"))) if found else None
        where = f"{_text(entry, 'file')}:{found.group(2)}" if found else ""
        if target is not None and where not in target.break_lines:
            target.break_lines.append(where)


def _text(entry: Dict[str, Any], key: str) -> str:
    value = entry.get(key)
    return str(value)[:500] if value is not None else ""
