"""The HTML report: one self-contained file viewing a whole profile.

``write_report(session, path)`` renders a ``ProfileSession`` (from
``prof.session``, or from a saved trace via ``opscope.analysis.build.load_session``)
with views for the step overview, operators, modules, flame graph, timeline,
memory and rule-based recommendations. All scripts and styles are inline:
the file opens offline in any browser.

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

from typing import Optional

from opscope.export.atomic import PathLike, atomic_text_writer
from opscope.export.output_path import check_output_path
from opscope.model.session import ProfileSession
from opscope.report.data import report_data
from opscope.report.page import render_html


def write_report(session: ProfileSession, path: PathLike, *,
                 title: Optional[str] = None) -> None:
    """Write the HTML report of ``session`` to ``path`` (atomically).

    ``title`` defaults to the session's trace name. Raises ``FileNotFoundError``
    when the folder of ``path`` does not exist; a bad ``path`` fails before any work.
    """
    path = check_output_path("export_report", "path", path)
    page = render_html(report_data(session, title=title))
    with atomic_text_writer(path) as f:
        f.write(page)


__all__ = ["write_report", "report_data", "render_html"]
