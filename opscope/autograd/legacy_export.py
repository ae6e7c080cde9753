"""The legacy profiler's output files: a bare-array Chrome trace and per-event stacks.

``torch.autograd.profiler_legacy`` wrote a Chrome trace that is a bare JSON
array of ``X`` events, times in microseconds since the profiler started, on
the pseudo-process ``"CPU functions"``; ``[memory]`` events are left out.
Its stacks file has one line per event that has a Python stack (root frame
first), not one line per distinct path. Both are kept here for code that
reads those files; names go through ``json.dumps`` and files are written
atomically.

Example::

    >>> import json, os, tempfile
    >>> from opscope.model.function_event import FunctionEvent
    >>> ev = FunctionEvent(id=1, name="aten::mm", trace_name="aten::mm", thread=1,
    ...                    start_us=1.5, end_us=4.0, stack=["a.py(2): f", "a.py(9): <module>"])
    >>> path = os.path.join(tempfile.mkdtemp(), "legacy.json")
    >>> write_legacy_trace([ev], path)
    >>> json.load(open(path))
    [{'name': 'aten::mm', 'ph': 'X', 'ts': 1.5, 'dur': 2.5, 'tid': 1, 'pid': 'CPU functions', 'args': {}}]
    >>> write_legacy_stacks([ev], path)
    >>> open(path).read()
    'a.py(9):_<module>;a.py(2):_f 2\\n'
"""

from __future__ import annotations

import json
from typing import Iterable

from opscope.files import PathLike, output_file

STACK_METRICS = ("self_cpu_time_total", "self_cuda_time_total", "self_xpu_time_total",
                 "self_privateuse1_time_total")
_FRAME_TRANSLATION = str.maketrans(" ;\t\n", "____")


def _us(value: float) -> float:
    # times are ns / 1000: three decimals hold them exactly
    return round(float(value), 3)


def write_legacy_trace(events: Iterable, path: PathLike) -> None:
    """Write ``events`` (FunctionEvents) as the legacy bare-array Chrome trace."""
    with output_file(path, "export_chrome_trace").open() as f:
        f.write("[")
        first = True
        for ev in events:
            if ev.trace_name is None:  # [memory] events have no place on a timeline
                continue
            tid = ev.thread if not ev.is_remote else f" node_id:{ev.node_id}, thread_id:{ev.thread} "
            line = json.dumps({"name": ev.trace_name, "ph": "X", "ts": _us(ev.time_range.start),
                               "dur": _us(ev.time_range.elapsed_us()), "tid": tid,
                               "pid": "CPU functions", "args": {}})
            f.write(line if first else ", " + line)
            first = False
        f.write("]")


def write_legacy_stacks(events: Iterable, path: PathLike,
                        metric: str = "self_cpu_time_total") -> None:
    """One ``frame;frame;... value`` line per event with a stack and a positive ``metric``.

    ``metric`` is one of ``STACK_METRICS`` (device metrics are 0 on the CPU).
    """
    destination = output_file(path, "export_stacks")
    if metric not in STACK_METRICS:
        raise ValueError(f"export_stacks: metric must be one of {', '.join(STACK_METRICS)}; "
                         f"got {metric!r}")
    attribute = metric.replace("cuda", "device").replace("xpu", "device") \
        .replace("privateuse1", "device")
    with destination.open() as f:
        for ev in events:
            stack = getattr(ev, "stack", None)
            if not stack:
                continue
            value = int(getattr(ev, attribute, 0) or 0)
            if value > 0:
                frames = ";".join(frame.translate(_FRAME_TRANSLATION) for frame in reversed(stack))
                f.write(f"{frames} {value}\n")
