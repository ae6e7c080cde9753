"""The HTML report: one self-contained file viewing a whole profile.

``write_report(session, path)`` renders a ``ProfileSession`` (from
``prof.session``, or from a saved trace via ``opscope.analysis.build.load_session``)
with views for the step overview, operators, modules, flame graph, timeline,
memory and rule-based recommendations. All scripts and styles are inline:
the file opens offline in any browser. ``write_job_report(paths, path)`` does
the same for a torch.distributed job's per-rank traces, adding the Ranks view
(``opscope.report.ranks``); its other views show the lowest rank.
``write_report_data(data, path)`` writes the page of data built elsewhere (a
store's job: ``opscope.report.data.job_data``). ``report_to(session, out)`` writes
the page to an open text stream: the format registry (``opscope.outputs``) opens
the file; the ``write_*`` functions open theirs through ``opscope.files``.

Example::

    >>> import os, tempfile
    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> path = os.path.join(tempfile.mkdtemp(), "report.html")
    >>> write_report(ProfileSession(EventTable.from_raw(RawSession.empty())), path)
    >>> open(path).read(15)
    '<!DOCTYPE html>'
"""

from __future__ import annotations

from typing import Optional, Sequence, TextIO

from opscope.files import PathLike, output_file
from opscope.model.session import ProfileSession
from opscope.report.data import job_data, job_report_data, report_data
from opscope.report.page import render_html


def write_report(session: ProfileSession, path: PathLike, *,
                 title: Optional[str] = None) -> None:
    """Write the HTML report of ``session`` to ``path`` (atomically).

    ``title`` defaults to the session's trace name. Raises ``FileNotFoundError``
    when the folder of ``path`` does not exist; a bad ``path`` fails before any work.
    """
    with output_file(path, "export_report").open() as out:
        report_to(session, out, title=title)


def report_to(session: ProfileSession, out: TextIO, path: str = "", *,
              title: Optional[str] = None) -> None:
    """Write the HTML report of ``session`` to the text stream ``out`` (the format
    registry, ``opscope.outputs``, opens it); ``path`` (the file's name) is not used."""
    out.write(render_html(report_data(session, title=title)))


def write_job_report(paths: Sequence[str], path: PathLike, *, title: Optional[str] = None,
                     max_bytes: Optional[int] = None) -> None:
    """Write the HTML report of the job whose per-rank traces are ``paths`` (atomically).

    The traces are read one at a time (see ``opscope.report.ranks``). Raises
    ``opscope.load.ranks.RankTraceError`` when no trace names a rank
    and ``opscope.load.TraceLoadError`` naming a trace that cannot be read.
    """
    destination = output_file(path, "write_job_report")
    page = render_html(job_report_data(list(paths), title=title, max_bytes=max_bytes))
    with destination.open() as out:
        out.write(page)


def write_report_data(data: dict, path: PathLike) -> None:
    """Write the page of report ``data`` (``report_data``, ``job_data``) to ``path``, atomically."""
    with output_file(path, "write_report_data").open() as out:
        out.write(render_html(data))


__all__ = ["write_report", "report_to", "write_job_report", "write_report_data", "report_data",
           "job_report_data", "job_data", "render_html"]
