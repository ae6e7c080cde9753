"""Write collapsed stacks for flamegraph.pl and speedscope.

One line per distinct path (``opscope.analysis.collapsed.collapsed_stacks``):
frames root-first joined by ``;``, a space, then the summed metric in whole
microseconds. ``stacks_to(session, out)`` writes them to an open text stream
(the format registry, ``opscope.outputs``, opens it); ``write_stacks(session,
path)`` opens ``path`` itself (atomic; gzip for .gz).

Example::

    >>> import os, tempfile
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> rows = [(0, 50_000, -1, 0, 0, 0, 1, 0xFFFFFFFF, 7, 0, 0),
    ...         (10_000, 30_000, -1, 1, 0, 0, 1, 0xFFFFFFFF, 0, 0, 0)]
    >>> raw = RawSession(records_from_rows(rows), [], [1], ["my step", "aten::mm"],
    ...                  0, 60_000, 0)
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.stacks")
    >>> write_stacks(build_session(raw), path)
    >>> print(open(path).read(), end="")
    my_step 30
    my_step;aten::mm 20
"""

from __future__ import annotations

from typing import List, TextIO

from opscope.analysis.collapsed import collapsed_stacks
from opscope.files import PathLike, output_file
from opscope.model.session import ProfileSession


def stacks_to(session: ProfileSession, out: TextIO, path: str = "",
              metric: str = "self_cpu_time_total") -> None:
    """Write ``session`` as collapsed stacks to the text stream ``out``.

    ``metric`` is ``"self_cpu_time_total"`` or, for device time,
    ``"self_cuda_time_total"`` / ``"self_device_time_total"`` (nothing on a
    CPU-only session). Paths whose total is under 1 us are left out. ``path``
    (the file's name) is not used.
    """
    totals = collapsed_stacks(session, metric)
    lines: List[str] = []
    for key, ns in totals.items():
        us = ns // 1000
        if us > 0:
            lines.append(f"{key} {us}\n")
            if len(lines) >= 8192:
                out.write("".join(lines))
                lines = []
    out.write("".join(lines))


def write_stacks(session: ProfileSession, path: PathLike,
                 metric: str = "self_cpu_time_total") -> None:
    """Write ``session`` as collapsed stacks to ``path`` (atomic; gzip for .gz)."""
    with output_file(path, "export_stacks").open() as out:
        stacks_to(session, out, metric=metric)
