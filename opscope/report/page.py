"""Render the report's data into one self-contained HTML file.

The page is ``assets/report.html`` with ``assets/report.css`` and the scripts
in ``SCRIPTS`` pasted inline, and the data as a JSON block. Nothing is
fetched: no CDN, no other file, so the report opens offline and can be
mailed around as one file.

Example::

    >>> page = render_html({"meta": {"title": "a </script> b"}})
    >>> page.count("</script>") == page.count("<script")
    True
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any, Dict

SCRIPTS = ("core.js", "overview.js", "operators.js", "flame.js", "timeline.js", "views.js")


def asset(name: str) -> str:
    """The text of ``opscope/report/assets/<name>``."""
    return resources.files("opscope.report").joinpath("assets", name).read_text("utf-8")


def json_for_script(data: Dict[str, Any]) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element.

    ``<`` is written as ``\\u003c`` so no name can close the element or open a comment.

    >>> json_for_script({"name": "</script>"})
    '{"name":"\\\\u003c/script>"}'
    """
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c")


def render_html(data: Dict[str, Any]) -> str:
    """The whole page as a string."""
    title = str(data.get("meta", {}).get("title", "profile"))
    script = "\n".join(asset(name) for name in SCRIPTS)
    if "</script" in script.lower():
        raise ValueError("a report script contains '</script'")
    page = asset("report.html")
    for marker, value in (("{{TITLE}}", html.escape(f"opscope report: {title}")),
                          ("/*{{STYLE}}*/", asset("report.css")),
                          ("/*{{SCRIPT}}*/", script),
                          ("{{DATA}}", json_for_script(data))):
        head, sep, tail = page.partition(marker)
        if not sep:
            raise ValueError(f"report.html has no {marker} marker")
        page = head + value + tail
    return page
