"""The HTML report in a real browser: headless Chromium driven by Playwright.

Each test writes a report, opens the file in Debian's ``chromium`` (Playwright's
``executable_path``; Playwright's own browser download is never used), visits every
view and checks it shows the profile's data: the operator table's rows are
``key_averages()``'s rows, clicking a column header sorts, the flame graph zooms on
click, the timeline hovers and zooms, modules and memory show what was recorded. Every
page must log no console error, throw no exception and request nothing but its own file.

A screenshot of each view is saved under ``$OPSCOPE_TEST_ARTIFACTS/report/`` when that
variable is set, else in pytest's temporary folder (``<basetemp>/report-screenshots*/``,
e.g. /tmp/pytest-of-$USER/pytest-current/report-screenshots0/), as
``<report>-<view>.png``.

Needs ``chromium`` (or ``$OPSCOPE_CHROMIUM``) and ``pip install playwright``; skips
with that message otherwise.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from opscope.analysis.aggregate import key_averages
from opscope.report import write_report
from opscope.report.data import report_data
from report_sessions import large_report, training_profile

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]
VIEWS = ("overview", "operators", "modules", "flame", "timeline", "memory", "recommendations")


def find_chromium():
    env = os.environ.get("OPSCOPE_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium not found (apt-get install -y chromium, or set OPSCOPE_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright not installed (pip install playwright; no browser download "
                    "needed, the system chromium is used)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    env = os.environ.get("OPSCOPE_TEST_ARTIFACTS")
    if env:
        folder = Path(env) / "report"
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return tmp_path_factory.mktemp("report-screenshots")


class ReportPage:
    """One report opened in a tab, with every console error, exception and request kept."""

    def __init__(self, browser, path: Path, artifacts: Path, label: str):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors, self.requests = [], []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "assert") else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"exception: {e}"))
        url = Path(path).resolve().as_uri()

        def route(r):
            if r.request.url != url:
                self.requests.append(r.request.url)
                return r.abort()
            return r.continue_()

        self.page.route("**/*", route)
        self.page.goto(url)
        self.page.wait_for_function("window.opscopeReport && window.opscopeReport.ready")
        self.artifacts, self.label = artifacts, label

    def show(self, view: str) -> None:
        self.page.click(f'#tabs button[data-view="{view}"]')
        self.page.wait_for_selector(f"#view-{view}.active")
        self.page.screenshot(path=str(self.artifacts / f"{self.label}-{view}.png"))

    def js(self, expression: str):
        return self.page.evaluate(expression)

    def rows(self, selector: str, columns):
        """Text of the given cells of each row under ``selector``."""
        return self.page.eval_on_selector_all(
            selector, "(rows, cols) => rows.map(r => cols.map(c => r.cells[c].textContent))",
            list(columns))

    def check_clean(self) -> None:
        assert self.errors == []
        assert self.requests == []
        self.page.close()


def texts(page: ReportPage, selector: str) -> list:
    return page.page.eval_on_selector_all(selector, "nodes => nodes.map(n => n.textContent)")


def header_index(page: ReportPage, key: str) -> int:
    return page.js(f"[...document.querySelectorAll('#op-table th')]"
                   f".findIndex(th => th.dataset.key === {key!r})")


def check_operators(page: ReportPage, expected_rows) -> None:
    """The table's rows are ``key_averages`` rows, by self time; sorting and searching work."""
    page.show("operators")
    calls = header_index(page, "calls")
    got = page.rows("#op-table tbody tr", [0, calls])
    assert sorted((n, int(c)) for n, c in got) == sorted((r.key, r.count) for r in expected_rows)
    shown = {r["name"]: r["self_us"] for r in page.js("opscopeReport.data.operators.rows")}
    assert [shown[n] for n, _ in got] == sorted(shown.values(), reverse=True)

    page.page.click('#op-table th[data-key="calls"]')
    counts = [int(c) for _, c in page.rows("#op-table tbody tr", [0, calls])]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    assert page.js("document.querySelector('#op-table th[data-key=calls]')"
                   ".getAttribute('aria-sort')") == "descending"
    page.page.click('#op-table th[data-key="calls"]')
    counts = [int(c) for _, c in page.rows("#op-table tbody tr", [0, calls])]
    assert counts == sorted(counts)
    page.page.click('#op-table th[data-key="name"]')
    names = [n for n, in page.rows("#op-table tbody tr", [0])]
    assert names == sorted(names) and sorted(names) == sorted(r.key for r in expected_rows)

    page.page.fill("#op-search", "aten::add")
    shown = [n for n, in page.rows("#op-table tbody tr", [0])]
    assert sorted(shown) == sorted(r.key for r in expected_rows if "aten::add" in r.key.lower())
    page.page.fill("#op-search", "")


def check_flame_zoom(page: ReportPage) -> None:
    page.show("flame")
    # below the first frame that splits: its widest child, narrower than the whole width
    first = page.js("(() => { const f = opscopeReport.flame; let n = f.nodes[0];"
                    " while (n.children.length === 1) n = f.nodes[n.children[0]];"
                    " return f.nodes[n.children[0]].name; })()")
    canvas = page.js("(() => { const r = document.getElementById('flame-canvas')"
                     ".getBoundingClientRect(); return {x: r.left, w: r.width}; })()")
    width = canvas["w"]
    box = page.js(f"opscopeReport.flame.boxOf({first!r})")
    assert box["w"] < width * 0.99, "pick a frame that does not already fill the width"
    page.page.mouse.click(box["x"] + box["w"] / 2, box["y"] + box["h"] / 2)
    assert page.js("opscopeReport.flame.focusName()") == first
    zoomed = page.js(f"opscopeReport.flame.boxOf({first!r})")
    assert zoomed["w"] == pytest.approx(width, abs=2)
    assert zoomed["x"] == pytest.approx(canvas["x"], abs=1)
    crumbs = texts(page, "#flame-crumbs button")
    assert crumbs[0] == "all" and crumbs[-1] == first  # the path from the root
    page.page.screenshot(path=str(page.artifacts / f"{page.label}-flame-zoomed.png"))
    page.page.click("#flame-crumbs button >> nth=0")
    assert page.js("opscopeReport.flame.focusName()") == "all"


def check_timeline(page: ReportPage, threads: int, event_name: str) -> None:
    page.show("timeline")
    assert page.js("opscopeReport.timeline.lanes.length") == threads
    box = page.js(f"opscopeReport.timeline.boxOf({event_name!r})")
    assert box is not None
    page.page.mouse.move(box["x"] + max(1, min(box["w"] / 2, 20)), box["y"] + box["h"] / 2)
    assert page.js("!document.getElementById('tooltip').hidden")
    assert event_name in page.js("document.getElementById('tooltip').textContent")
    before = page.js("opscopeReport.timeline.view()")
    page.page.mouse.wheel(0, -300)
    page.page.wait_for_timeout(50)
    after = page.js("opscopeReport.timeline.view()")
    assert after[1] - after[0] < before[1] - before[0]
    assert page.js("opscopeReport.timeline.drawn()") > 0


def test_every_view_shows_a_training_profile(browser, artifacts, tmp_path):
    prof = training_profile(steps=4, record_shapes=True, with_modules=True, with_flops=True)
    session = prof.session
    path = tmp_path / "train.html"
    prof.export_report(str(path))
    page = ReportPage(browser, path, artifacts, "train")
    data = report_data(session)

    page.show("overview")
    bars = page.page.eval_on_selector_all("#step-chart .step-bar",
                                   "bars => bars.map(g => g.dataset.step)")
    assert bars == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    top = page.rows("#top-ops tbody tr", [0])
    assert [n for n, in top] == [r["name"] for r in data["overview"]["top_ops"]]
    assert page.rows("#top-modules tbody tr", [0])  # with_modules: modules listed

    check_operators(page, prof.key_averages())
    page.page.click("#op-table tbody tr >> text=aten::addmm")
    detail = page.js("document.getElementById('op-detail').textContent")
    assert "Input shapes" in detail and "[[" in detail and "aten::linear" in detail

    page.show("modules")
    module_names = [n.lstrip("▾▸ ") for n, in page.rows("#module-table tbody tr", [0])]
    assert module_names == [n["name"] for n in data["modules"]["nodes"]]
    assert any("Linear" in n for n in module_names)

    check_flame_zoom(page)
    check_timeline(page, threads=data["meta"]["threads"], event_name="ProfilerStep#1")

    page.show("memory")
    assert "Memory: not recorded" in page.js("document.getElementById('view-memory').textContent")
    page.show("recommendations")
    shown = texts(page, "#view-recommendations h3")
    assert shown == [r["title"] for r in data["recommendations"]]
    page.check_clean()


def test_a_torch_profiler_trace_renders(browser, artifacts, tmp_path):
    """A trace written by the real torch.profiler, loaded by opscope.analysis.build.load_session."""
    torch_profiler = pytest.importorskip("torch.profiler")
    from opscope.analysis.build import load_session
    from workloads import mlp_step_fn

    step = mlp_step_fn()
    folder = tmp_path / "tb"
    with torch_profiler.profile(record_shapes=True, profile_memory=True,
                                schedule=torch_profiler.schedule(wait=0, warmup=1, active=2,
                                                                 repeat=1),
                                on_trace_ready=torch_profiler.tensorboard_trace_handler(
                                    str(folder))) as prof:
        for _ in range(3):
            step()
            prof.step()
    session = load_session(folder)
    path = tmp_path / "torch.html"
    write_report(session, path)
    page = ReportPage(browser, path, artifacts, "torch")
    page.show("overview")
    bars = page.page.eval_on_selector_all("#step-chart .step-bar",
                                   "bars => bars.map(g => g.dataset.step)")
    assert bars == ["ProfilerStep#1", "ProfilerStep#2"]
    expected = key_averages(session.table)
    assert {"aten::addmm", "aten::mm", "Optimizer.step#SGD.step"} <= {r.key for r in expected}
    check_operators(page, expected)
    check_flame_zoom(page)
    check_timeline(page, threads=report_data(session)["meta"]["threads"],
                   event_name="ProfilerStep#1")
    page.show("memory")
    peak = page.js("document.getElementById('memory-peak').textContent")
    assert "peak at" in peak and "B" in peak
    for view in ("modules", "recommendations"):
        page.show(view)
    page.check_clean()


def test_a_million_event_report_opens_and_stays_responsive(browser, artifacts):
    path, session = large_report()
    page = ReportPage(browser, Path(path), artifacts, "million")
    for view in VIEWS:
        page.show(view)
    page.show("timeline")
    info = page.js("document.getElementById('timeline-info').textContent")
    assert f"of {len(session.table):,} events" in info
    assert "left out" in page.js("document.getElementById('timeline-decimated').textContent")
    drawn = page.js("opscopeReport.timeline.drawn()")
    for _ in range(8):  # zoom in around the middle, then pan: each redraw completes
        page.page.mouse.move(640, 300)
        page.page.mouse.wheel(0, -400)
    page.page.keyboard.press("d")
    page.page.wait_for_timeout(50)
    view = page.js("opscopeReport.timeline.view()")
    assert view[1] - view[0] < page.js("opscopeReport.data.timeline.window_ns") / 4
    assert page.js("opscopeReport.timeline.drawn()") > 0 and drawn > 0
    page.page.screenshot(path=str(artifacts / "million-timeline-zoomed.png"))
    page.show("operators")
    check_operators(page, key_averages(session.table))
    page.check_clean()


def test_an_empty_profile_renders_every_view(browser, artifacts, tmp_path):
    from opscope.model.events import EventTable
    from opscope.model.records import RawSession
    from opscope.model.session import ProfileSession

    path = tmp_path / "empty.html"
    write_report(ProfileSession(EventTable.from_raw(RawSession.empty())), path)
    page = ReportPage(browser, path, artifacts, "empty")
    for view in VIEWS:
        page.show(view)
    assert "No events were recorded" in page.js(
        "document.getElementById('view-overview').textContent")
    assert page.rows("#op-table tbody tr", [0]) == []
    page.check_clean()


def test_a_black_box_dump_opens_at_its_reason_with_the_slow_step_op_by_op(
        browser, artifacts, tmp_path):
    import time

    import torch

    import opscope
    from opscope.analysis.build import load_session
    from opscope.report import write_report

    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opscope.blackbox(dir=str(tmp_path), seconds=30):
        for step in range(10):
            model(torch.randn(4, 16)).sum().backward()
            if step == 8:
                with torch.profiler.record_function("injected_stall"):
                    time.sleep(0.3)
            opt.step()
            opt.zero_grad()
            time.sleep(0.01)
    (dump,) = tmp_path.glob("*.blackbox.slow_step.*")
    path = tmp_path / "dump.html"
    write_report(load_session(str(dump)), str(path))
    page = ReportPage(browser, path, artifacts, "black-box")
    page.page.wait_for_selector("#view-black_box.active")  # it opens at the reason
    assert page.js("document.getElementById('black-box-reason').textContent") == \
        "Written for: slow_step"
    assert "mostly injected_stall" in page.js(
        "document.getElementById('black-box-accounts').textContent")
    rows = page.rows("#black-box-steps tbody tr", [0, 4, 5])
    assert rows[0] == ["injected_stall", "1", "0"]
    assert ["aten::addmm", "1", "1"] in rows  # op by op: the same ops in both steps
    page.show("operators")  # the other views still work
    page.check_clean()
