"""A session diff (``analysis.diff``) as one self-contained HTML page.

The page has the summary (both traces, total self time before and after, how
many regressions and improvements) and a table per section (ops, and modules
when both sides recorded them), rows in order of absolute change of self
time. Regressions are red, improvements green; a bar shows each row's change
to scale. Given the module diff (``analysis.module_diff``), the page also has one row per
module call path, both sides' forward and backward time and the change, in the module
tree's order (what ``opscope diff --group-by module`` prints). Clicking a column header
sorts by it. Headers wrap and each table scrolls inside its own box, so the page fits its
window (it was 1,872 px wide in a 1,400 px window). Styles and the few lines of script are
inline: nothing is fetched, the file opens offline.

Example::

    >>> import os, tempfile
    >>> from opscope.analysis.diff import DiffRow, SessionDiff
    >>> d = SessionDiff([DiffRow("aten::mm", (1, 2), (10.0, 30.0), (10.0, 30.0),
    ...                          status="regression")], self_total_us=(10.0, 30.0))
    >>> path = os.path.join(tempfile.mkdtemp(), "diff.html")
    >>> _ = write_diff_html(d, path, names=("a.json", "b.json"))
    >>> page = open(path).read()
    >>> page.startswith("<!DOCTYPE html>"), 'class="regression"' in page, "http" in page
    (True, True, False)
"""

from __future__ import annotations

import html
from typing import List, Optional, Sequence, Tuple

from opscope.analysis.diff import DiffRow, SessionDiff
from opscope.analysis.module_diff import ModuleDiffRow
from opscope.export.diff_text import (change_mark, count_text, signed_percent, signed_time,
                                      summary_lines)
from opscope.export.module_diff_text import HEADER as MODULE_HEADER, module_cells
from opscope.export.table import format_time
from opscope.files import PathLike, output_file

_STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 24px; color: #1d1d1f; }
.wrap { max-width: 100%; overflow-x: auto; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.summary p { margin: 2px 0; } .summary code { background: #f2f2f4; padding: 0 4px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 6px; border-bottom: 1px solid #e4e4e8; text-align: right;
         white-space: nowrap; }
th { background: #f6f6f8; cursor: pointer; user-select: none; white-space: normal;
     vertical-align: bottom; min-width: 4em; }
th.sorted::after { content: " \\25BE"; } th.sorted.asc::after { content: " \\25B4"; }
td.name, th.name { text-align: left; max-width: 320px; overflow: hidden;
                   text-overflow: ellipsis; }
tr.regression td { background: #fdecec; } tr.regression td.mark { color: #b3261e; }
tr.improvement td { background: #e9f7ef; } tr.improvement td.mark { color: #1e7b3c; }
#module-paths td.name { padding-left: calc(6px + var(--depth) * 14px); }
#module-paths th:nth-child(2) { text-align: right; }
td.mark { text-align: left; font-weight: 600; }
th:nth-child(2) { text-align: left; }
.track { width: 90px; } .track div { height: 10px; border-radius: 2px; }
.track .up { background: #d93025; } .track .down { background: #188038; }
.nochange { font-weight: 600; color: #1e7b3c; }
"""

# click a header: sort by its data-v values (numbers, else text); again: reverse
_SCRIPT = """
document.querySelectorAll("table.diff").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.classList.contains("sorted") && !th.classList.contains("asc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("sorted", "asc"); });
      th.classList.add("sorted"); if (asc) th.classList.add("asc");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (isNaN(nx) || isNaN(ny)) ? String(x).localeCompare(String(y)) : nx - ny;
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

_HEADERS = ("Name", "Change", "Self CPU change", "", "Self %", "Self CPU A", "Self CPU B",
            "CPU total A", "CPU total B", "CPU total change", "Calls A", "Calls B",
            "Calls change")


def _cell(text: str, value, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'<td{attr} data-v="{html.escape(str(value), quote=True)}">{html.escape(text)}</td>'


def _bar(delta: float, scale: float) -> str:
    width = 0.0 if scale <= 0 else min(100.0, 100.0 * abs(delta) / scale)
    kind = "up" if delta > 0 else "down"
    return (f'<td class="bar" data-v="{delta!r}"><div class="track"><div class="{kind}" '
            f'style="width:{width:.1f}%"></div></div></td>')


def _row(row: DiffRow, scale: float) -> str:
    percent = row.relative_self
    cells = [
        f'<td class="name" data-v="{html.escape(row.key, quote=True)}" '
        f'title="{html.escape(row.key, quote=True)}">{html.escape(row.key)}</td>',
        _cell(change_mark(row), row.status or "~", "mark"),
        _cell(signed_time(row.delta_self), row.delta_self),
        _bar(row.delta_self, scale),
        _cell(signed_percent(row), percent if percent is not None else row.delta_self * 1e9),
        _cell(format_time(row.self_us[0]), row.self_us[0]),
        _cell(format_time(row.self_us[1]), row.self_us[1]),
        _cell(format_time(row.total_us[0]), row.total_us[0]),
        _cell(format_time(row.total_us[1]), row.total_us[1]),
        _cell(signed_time(row.delta_total), row.delta_total),
        _cell(count_text(row.calls[0]), row.calls[0]),
        _cell(count_text(row.calls[1]), row.calls[1]),
        _cell(count_text(row.delta_calls, signed=True), row.delta_calls),
    ]
    status = f' class="{row.status}"' if row.status in ("regression", "improvement") else ""
    return f"<tr{status}>" + "".join(cells) + "</tr>"


def _table(rows: Sequence[DiffRow], table_id: str) -> str:
    scale = max((abs(r.delta_self) for r in rows), default=0.0)
    head = "".join(f'<th class="name">{h}</th>' if h == "Name" else f"<th>{h}</th>"
                   for h in _HEADERS)
    body = "\n".join(_row(r, scale) for r in rows)
    # the wrapper scrolls a table wider than the window, so the page never is
    return (f'<div class="wrap"><table class="diff" id="{table_id}"><thead><tr>{head}</tr>'
            f"</thead><tbody>\n{body}\n</tbody></table></div>")


def _module_path_table(rows: Sequence[ModuleDiffRow]) -> str:
    """One row per module call path: the text diff's cells, sortable by their values."""
    head = "".join(f'<th class="name">{h}</th>' if h == "Module" else f"<th>{h}</th>"
                   for h in MODULE_HEADER)
    lines = []
    for k, row in enumerate(rows):
        cells = module_cells(row)
        total = row.total_us[0]
        values = [k, row.calls[0], row.forward_us[0], row.backward_us[0], row.calls[1],
                  row.forward_us[1], row.backward_us[1], row.change_us,
                  row.change_us / total if total else row.change_us * 1e9]
        name = (f'<td class="name" style="--depth:{row.depth}" data-v="{k}" '
                f'title="{html.escape(row.path, quote=True)}">{html.escape(cells[0].strip())}</td>')
        lines.append("<tr>" + name + "".join(_cell(c, v) for c, v in zip(cells[1:], values[1:]))
                     + "</tr>")
    body = "\n".join(lines)
    return (f'<div class="wrap"><table class="diff" id="module-paths"><thead><tr>{head}</tr>'
            f"</thead><tbody>\n{body}\n</tbody></table></div>")


def render_diff_html(diff: SessionDiff, *, names: Tuple[str, str] = ("A", "B"),
                     title: str = "opscope diff",
                     module_rows: Optional[Sequence[ModuleDiffRow]] = None) -> str:
    """The page as one string."""
    summary = "".join(f"<p>{html.escape(line)}</p>" for line in summary_lines(diff, names))
    parts: List[str] = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>", f'<div class="summary">{summary}</div>',
    ]
    if diff.unchanged:
        parts.append('<p class="nochange">No change: both traces have the same ops, calls '
                     'and times.</p>')
    parts.append("<h2>Ops, by absolute change of self CPU time</h2>")
    parts.append(_table(diff.ops, "ops"))
    if diff.modules:
        parts.append("<h2>Modules (forward + backward), by absolute change of self CPU "
                     "time</h2>")
        parts.append(_table(diff.modules, "modules"))
    if module_rows:
        parts.append("<h2>Modules by call path: forward and backward time (change = B - A; "
                     "an eager and a torch.compile'd trace match module by module)</h2>")
        parts.append(_module_path_table(module_rows))
    parts.append(f"<script>{_SCRIPT}</script></body></html>\n")
    return "\n".join(parts)


def write_diff_html(diff: SessionDiff, path: PathLike, *, names: Tuple[str, str] = ("A", "B"),
                    title: str = "opscope diff",
                    module_rows: Optional[Sequence[ModuleDiffRow]] = None) -> str:
    """Write the page to ``path`` atomically (with the module diff's rows when given);
    returns the path."""
    destination = output_file(path, "write_diff_html")
    with destination.open() as f:
        # lone surrogates (from a trace's JSON escapes) cannot be UTF-8: write them escaped
        f.write(render_diff_html(diff, names=names, title=title, module_rows=module_rows)
                .encode("utf-8", "backslashreplace").decode("utf-8"))
    return destination.path
