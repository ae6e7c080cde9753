"""``export_memory_timeline``: torch's JSON layouts, plus an offline HTML plot.

The suffix picks the format, as in torch:

* ``.json``: ``[times, sizes]`` (see ``analysis.memory_timeline.timeline``);
* ``.json.gz``: the same, gzipped;
* ``.raw.json.gz``: ``[time, action, bytes, category]`` rows;
* ``.html``: one self-contained page, a stacked-area SVG of the categories
  over time. It fetches nothing. Sizes are labelled in GiB/MiB/KiB, which is
  what they are (torch writes "GB" over GiB values: pytorch #120171), one unit
  per axis, at round ticks (:func:`nice_ticks`). The report's Memory view uses
  the same colours (``analysis.memory_timeline.COLORS``) and units.

``memory_timeline_to(session, out, path, device)`` writes to an open text
stream (the format registry, ``opscope.outputs``, opens it).

Example::

    >>> import os, tempfile
    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> path = os.path.join(tempfile.mkdtemp(), "mem.json")
    >>> write_memory_timeline(build_session(RawSession.empty()), path)
    >>> open(path).read()
    '[[], []]'
"""

from __future__ import annotations

import html
import json
import math
from typing import List, Sequence, TextIO

from opscope.analysis.memory_timeline import (COLORS, categorized_blocks, raw_timeline,
                                              timeline)
from opscope.files import PathLike, output_file
from opscope.model.memory import CATEGORY_MEANINGS, CATEGORY_NAMES
from opscope.model.session import ProfileSession


def write_memory_timeline(session: ProfileSession, path: PathLike, device: str = "cpu") -> None:
    """Write the timeline of ``device`` to ``path``; the suffix picks the format."""
    destination = output_file(path, "export_memory_timeline")
    with destination.open() as out:  # gzips a .gz path
        memory_timeline_to(session, out, destination.path, device)


def memory_timeline_to(session: ProfileSession, out: TextIO, path: str,
                       device: str = "cpu") -> None:
    """Write the timeline of ``device`` to the text stream ``out``; ``path``'s suffix
    picks the format."""
    blocks = categorized_blocks(session)
    if path.endswith(".html"):
        times, sizes = timeline(session, device, blocks)
        out.write(render_html(times, sizes, device))
        return
    if path.endswith("raw.json.gz"):
        data = raw_timeline(session, device, blocks)
    else:
        data = list(timeline(session, device, blocks))
    json.dump(data, out)


def nice_ticks(top: float, count: int = 5) -> List[float]:
    """Round ticks from 0 up to at least ``top``: steps of 1, 2 or 5 times a power of ten.

    >>> nice_ticks(417.375), nice_ticks(7.3), nice_ticks(0)
    ([0, 100, 200, 300, 400, 500], [0, 2, 4, 6, 8], [0])
    """
    if not top > 0:
        return [0]
    raw = top / count
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    n = math.ceil(top / step - 1e-9)
    return [_round(k * step) for k in range(n + 1)]


def _round(value: float):
    value = float(f"{value:.12g}")
    return int(value) if value.is_integer() else value


def size_unit(peak: int):
    """The binary unit to label a plot whose largest value is ``peak`` bytes.

    >>> size_unit(3 * 1024 ** 3), size_unit(5000)
    (('GiB', 1073741824), ('KiB', 1024))
    """
    for name, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if peak >= scale:
            return name, scale
    return "B", 1


def render_html(times: Sequence[int], sizes: Sequence[Sequence[int]], device: str) -> str:
    """A page with a stacked-area SVG of each category's bytes over time."""
    width, height, left, bottom, top = 960, 420, 80, 50, 20
    totals = [sum(row) for row in sizes]
    peak = max(totals, default=0)
    unit, scale = size_unit(peak)
    t0 = times[0] if times else 0
    y_ticks = nice_ticks(peak / scale) if peak else [0, 1]
    y_max = y_ticks[-1]
    span_us = max(times[-1] - t0, 1) if times else 1
    t_unit, t_scale = ("s", 1e6) if span_us >= 1e6 else ("ms", 1e3) if span_us >= 1e3 \
        else ("us", 1.0)
    x_ticks = nice_ticks(span_us / t_scale)
    x_max = x_ticks[-1] * t_scale
    plot_w, plot_h = width - left - 20, height - top - bottom

    def x(t):
        return left + (t - t0) / x_max * plot_w

    def y(v):
        return top + plot_h - v / scale / y_max * plot_h

    layers: List[str] = []
    below = [0] * len(times)
    for cat in range(len(CATEGORY_NAMES)):
        above = [b + row[cat + 1] for b, row in zip(below, sizes)]
        if any(r[cat + 1] for r in sizes):
            pts = []
            for i, t in enumerate(times):  # step shape: a value holds until the next time
                if i:
                    pts.append((x(t), y(above[i - 1])))
                pts.append((x(t), y(above[i])))
            back = []
            for i in range(len(times) - 1, -1, -1):
                back.append((x(times[i]), y(below[i])))
                if i:
                    back.append((x(times[i]), y(below[i - 1])))
            poly = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts + back)
            layers.append(f'<polygon class="layer" data-category="{CATEGORY_NAMES[cat]}" '
                          f'points="{poly}" fill="{COLORS[cat]}" fill-opacity="0.85">'
                          f'<title>{CATEGORY_NAMES[cat]}</title></polygon>')
        below = above
    ticks = []
    for v in y_ticks:
        ticks.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v * scale):.1f}" '
                     f'y2="{y(v * scale):.1f}" stroke="#ddd"/><text class="ytick" '
                     f'x="{left - 8}" y="{y(v * scale) + 4:.1f}" text-anchor="end">{v}</text>')
    for v in x_ticks:
        ticks.append(f'<text class="xtick" x="{x(t0 + v * t_scale):.1f}" '
                     f'y="{top + plot_h + 18}" text-anchor="middle">{v}</text>')
    legend = "".join(
        f'<li><span class="swatch" style="background:{COLORS[c]}"></span>{name}: '
        f'{html.escape(CATEGORY_MEANINGS[c])}</li>' for c, name in enumerate(CATEGORY_NAMES))
    peak_text = f"{peak / scale:.3f} {unit}" if peak else "0 B"
    title = html.escape(f"Memory timeline ({device})")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 24px; color: #222; }}
svg text {{ font-size: 12px; fill: #333; }}
ul.legend {{ list-style: none; padding: 0; }} ul.legend li {{ margin: 3px 0; }}
.swatch {{ display: inline-block; width: 12px; height: 12px; margin-right: 6px; }}
</style></head><body>
<h1>{title}</h1>
<p id="peak">Peak: {peak_text}</p>
<svg id="plot" width="{width}" height="{height}" role="img" aria-label="{title}">
{''.join(ticks)}
{''.join(layers)}
<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>
<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">Time ({t_unit})</text>
<text transform="translate(16 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">Memory ({unit})</text>
</svg>
<ul class="legend">{legend}</ul>
</body></html>
"""
