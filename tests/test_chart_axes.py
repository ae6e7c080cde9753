"""Chart axes: round ticks in one unit, and the same colours and units for the memory
categories in the report and in export_memory_timeline's page (issue 27, items 20, 21, 27).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opscope.analysis.memory_timeline import COLORS
from opscope.export.memory_timeline import nice_ticks, render_html
from opscope.model.memory import CATEGORY_MEANINGS, CATEGORY_NAMES

ASSETS = Path(__file__).resolve().parent.parent / "opscope" / "report" / "assets"


def run_core_js(expression: str):
    """Evaluate ``expression`` in node with the report's core.js helpers loaded."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not found")
    source = (ASSETS / "core.js").read_text()
    start = source.index("// Axes: round ticks")
    end = source.index("function fmtCount")
    code = source[start:end] + f"\nconsole.log(JSON.stringify({expression}));"
    out = subprocess.run([node, "-e", code], capture_output=True, text=True, timeout=60,
                         check=True)
    return json.loads(out.stdout)


def test_page_axes_are_round_in_one_unit():
    ticks = run_core_js("axisTicks(417375, TIME_UNITS)")  # a 417.375 ms step
    assert [t[1] for t in ticks] == ["0 ms", "100 ms", "200 ms", "300 ms", "400 ms", "500 ms"]
    ticks = run_core_js("axisTicks(3.3 * 1024 ** 2, BYTE_UNITS)")
    assert [t[1] for t in ticks] == ["0 MiB", "1 MiB", "2 MiB", "3 MiB", "4 MiB"]
    assert ticks[-1][0] == 4 * 1024 ** 2
    assert run_core_js("fmtBinary(3 * 1024 ** 2)") == "3.00 MiB"


def test_python_ticks_match():
    assert nice_ticks(417.375) == [0, 100, 200, 300, 400, 500]
    assert nice_ticks(0.73) == [0, 0.2, 0.4, 0.6, 0.8]


def test_memory_timeline_page_ticks_are_round():
    times = [0, 417_375]  # us
    sizes = [[0, 3 * 1024 ** 2] + [0] * 7, [0, 0, 1024 ** 2 // 3] + [0] * 6]
    page = render_html(times, sizes, "cpu")
    ys = re.findall(r'class="ytick"[^>]*>([^<]*)<', page)
    xs = re.findall(r'class="xtick"[^>]*>([^<]*)<', page)
    assert ys == ["0", "1", "2", "3"] and "Memory (MiB)" in page
    assert xs == ["0", "100", "200", "300", "400", "500"] and "Time (ms)" in page
    assert CATEGORY_MEANINGS[0] in page


def test_report_memory_uses_the_pages_colours_and_explains_categories():
    torch = pytest.importorskip("torch")
    import opscope
    from opscope.report.memory import memory_timeline

    model = torch.nn.Linear(16, 16)
    with opscope.profile(profile_memory=True) as prof:
        model(torch.randn(8, 16)).sum().backward()
    mem = memory_timeline(prof.session)
    assert mem["colors"] == [COLORS[CATEGORY_NAMES.index(c)] for c in mem["categories"]]
    assert mem["meanings"] == [CATEGORY_MEANINGS[CATEGORY_NAMES.index(c)]
                               for c in mem["categories"]]
    assert "README" not in mem["note"]
