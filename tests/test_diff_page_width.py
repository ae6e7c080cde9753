"""The diff page fits its window (issue 27, item 23): it was 1,872 px wide in 1,400 px.

Each table scrolls inside a box as wide as the page, and headers wrap. In Chromium
(when there) the page is no wider than a 1,400 px window.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from opscope.analysis.diff import DiffRow, SessionDiff
from opscope.export.diff_html import render_diff_html, write_diff_html


def wide_diff() -> SessionDiff:
    rows = [DiffRow(f"aten::some_long_operator_name_{k}.with_overload_{k}" * 2, (k, 2 * k + 1),
                    (10.0 * k, 12345.678 * k), (10.0 * k, 23456.789 * k),
                    status="regression") for k in range(1, 30)]
    return SessionDiff(rows, rows[:5], self_total_us=(100.0, 9e6))


def test_each_table_scrolls_in_its_own_box():
    page = render_diff_html(wide_diff(), names=("a" * 200, "b"))
    assert len(re.findall(r'<div class="wrap"><table class="diff"', page)) == 2
    assert re.search(r"\.wrap \{[^}]*overflow-x: auto", page)


def test_the_page_fits_a_1400_px_window(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs chromium (Debian's chromium package)")
    path = write_diff_html(wide_diff(), str(tmp_path / "d.html"))
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"file://{os.path.abspath(path)}")
            assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        finally:
            browser.close()
