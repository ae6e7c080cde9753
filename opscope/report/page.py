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
import re
from importlib import resources
from typing import Any, Dict

SCRIPTS = ("core.js", "overview.js", "operators.js", "flame.js", "timeline.js", "kernels.js",
           "compiled.js", "black_box.js", "views.js")
# a job's report (data with "ranks") adds the Ranks view; views.js stays last (it starts the page)
JOB_SCRIPTS = SCRIPTS[:-1] + ("ranks.js", "ranks_timeline.js") + SCRIPTS[-1:]


def asset(name: str) -> str:
    """The text of ``opscope/report/assets/<name>``."""
    return resources.files("opscope.report").joinpath("assets", name).read_text("utf-8")


def json_for_script(data: Dict[str, Any]) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element.

    ``<`` is written as ``\\u003c`` (and ``>``/``&`` likewise) so no value can
    close the element or open a comment; lone surrogates are escaped by
    ``json.dumps`` (ASCII output), and non-finite numbers are refused.

    >>> json_for_script({"name": "</script>"})
    '{"name":"\\\\u003c/script\\\\u003e"}'
    """
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_MARKERS = re.compile(r"\{\{TITLE\}\}|/\*\{\{STYLE\}\}\*/|/\*\{\{SCRIPT\}\}\*/|\{\{DATA\}\}")


def render_html(data: Dict[str, Any]) -> str:
    """The whole page as a string.

    The template's markers are replaced in one pass over the template alone,
    so a marker inside a value (a title or op name with ``{{DATA}}``) is
    never substituted again.

    >>> page = render_html({"meta": {"title": "{{DATA}} /*{{SCRIPT}}*/"}})
    >>> page.count("{{DATA}}"), page.count('<script id="opscope-data"')
    (2, 1)
    >>> "a\\\\udcff b" in render_html({"meta": {"title": "a\\udcff b"}})
    True
    """
    # a path or name may hold lone surrogates (undecodable bytes, JSON escapes): escape them
    title = str(data.get("meta", {}).get("title", "profile")).encode(
        "utf-8", "backslashreplace").decode("utf-8")
    names = JOB_SCRIPTS if "ranks" in data else SCRIPTS
    script = "\n".join(asset(name) for name in names)
    if "</script" in script.lower() or "<!--" in script:
        raise ValueError("a report script contains '</script' or '<!--'")
    values = {"{{TITLE}}": html.escape(f"opscope report: {title}"),
              "/*{{STYLE}}*/": asset("report.css"),
              "/*{{SCRIPT}}*/": script,
              "{{DATA}}": json_for_script(data)}
    page = asset("report.html")
    found = _MARKERS.findall(page)
    if sorted(found) != sorted(values):
        raise ValueError(f"report.html must hold each of {', '.join(values)} once; "
                         f"it holds {found}")
    return _MARKERS.sub(lambda m: values[m.group()], page)
