"""Render the report's data into one self-contained HTML file.

The page is ``assets/report.html`` with ``assets/report.css`` and the scripts
pasted inline (``core.js``, then those of the views the data shows, in the registry's
order: ``opscope.report.views.page_scripts``), and the data as a JSON block. Nothing is
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
from pathlib import Path
from typing import Any, Collection, Dict, Tuple

from opscope.report.views import REGISTRY, View, page_scripts

CORE = "core.js"  # the shared helpers, the page header and the tab switcher: first


def asset(name: str) -> str:
    """The text of ``opscope/report/assets/<name>``."""
    return resources.files("opscope.report").joinpath("assets", name).read_text("utf-8")


def script_names(keys: Collection[str]) -> Tuple[str, ...]:
    """The scripts of a page whose data has ``keys``, in page order.

    >>> script_names({"meta"})[:3]
    ('core.js', 'overview.js', 'operators.js')
    """
    return (CORE,) + tuple(name for _, name in page_scripts(keys))


# the scripts of the views registered at import: a single trace's page, and a job's (the
# job-only views: Ranks); views.js stays last
SCRIPTS = script_names(())
JOB_SCRIPTS = script_names([v.key for v in REGISTRY])


def _script(entry: View, name: str) -> str:
    if entry.folder is None:
        return asset(name)
    return (Path(entry.folder) / name).read_text("utf-8")


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
    script = "\n".join([asset(CORE)] + [_script(entry, name)
                                         for entry, name in page_scripts(data)])
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
