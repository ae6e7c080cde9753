"""The report of a real training run, checked in headless Chromium (issue 18's report points).

A small transformer block trains for ``STEPS`` steps under ``opscope.profile`` with
every option and no schedule. The page must show one step per ``optimizer.step()``,
backward split by op kind (the parts add up to backward), only rules at or above
their 5% threshold (largest saving first), the operator table sorted by self time
with every column inside a 1400 px window, torch's plumbing frames folded in the
call sites and the flame graph (a checkbox shows them), and time labels under the
memory chart.

Screenshots of each view go where ``tests/test_report_browser.py`` puts them
(``$OPSCOPE_TEST_ARTIFACTS/report/`` or pytest's temporary folder), named
``transformer-<view>.png``.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import opscope
from opscope.analysis.frames import is_plumbing
from opscope.cli.demo import TinyBlock
from opscope.report.data import report_data
from opscope.report.recommendations import MATERIAL_SHARE
from test_report_browser import ReportPage, artifacts, browser, header_index  # noqa: F401

STEPS = 6
ALL_OPTIONS = dict(record_shapes=True, profile_memory=True, with_stack=True, with_flops=True,
                   with_modules=True)


@pytest.fixture(scope="module")
def transformer_profile():
    torch.manual_seed(0)
    model = TinyBlock()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(8, 16, 64), torch.randint(0, 10, (8,))
    with opscope.profile(**ALL_OPTIONS) as prof:
        for _ in range(STEPS):
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return prof


@pytest.fixture(scope="module")
def transformer_page(browser, artifacts, transformer_profile, tmp_path_factory):  # noqa: F811
    path = tmp_path_factory.mktemp("transformer") / "transformer.html"
    transformer_profile.export_report(str(path))
    page = ReportPage(browser, path, artifacts, "transformer")
    page.page.set_viewport_size({"width": 1400, "height": 900})
    yield page, report_data(transformer_profile.session)
    page.check_clean()


def test_steps_are_the_optimizer_steps(transformer_page):
    page, data = transformer_page
    page.show("overview")
    bars = page.page.eval_on_selector_all("#step-chart .step-bar", "b => b.map(g => g.dataset.step)")
    assert len(bars) == STEPS == data["overview"]["spread"]["count"]
    card = page.js("document.querySelector('.cards .card').textContent")
    assert card.startswith(str(STEPS)) and "optimizer.step()" in card


def test_backward_breakdown_sums_to_backward(transformer_page):
    page, _ = transformer_page
    page.show("overview")
    backward = page.js("Number(document.querySelector('#category-table tr[data-category=backward]')"
                       ".dataset.us)")
    parts = page.page.eval_on_selector_all("#category-table tr[data-backward-part]",
                                           "rows => rows.map(r => [r.dataset.backwardPart, "
                                           "Number(r.dataset.us)])")
    assert backward > 0 and sum(us for _, us in parts) == pytest.approx(backward, rel=1e-3)
    assert "matmul/conv" in dict(parts)  # MmBackward0 / AddmmBackward0 are matmuls


def test_no_rule_fires_under_its_threshold(transformer_page):
    page, data = transformer_page
    page.show("recommendations")
    step_total = sum(s["dur_us"] for s in data["overview"]["steps"])
    recs = data["recommendations"]
    assert all(r["saving_us"] >= MATERIAL_SHARE * step_total for r in recs)
    ranked = [(r["severity"] == "info", -r["saving_us"]) for r in recs]
    assert ranked == sorted(ranked)
    shown = page.page.eval_on_selector_all("#view-recommendations [data-rule]",
                                           "n => n.map(x => x.dataset.rule)")
    assert shown == [r["id"] for r in recs]
    if not recs:
        assert page.js("!!document.getElementById('no-recommendations')")
    else:
        assert all("5.0%" in " ".join(r["evidence"]) for r in recs)


def test_operator_table_sorted_and_fits(transformer_page):
    page, data = transformer_page
    page.show("operators")
    names = [r[0] for r in page.rows("#op-table tbody tr", [0])]
    expected = [r["name"] for r in sorted(data["operators"]["rows"], key=lambda r: -r["self_us"])]
    assert names == expected
    assert page.js("document.querySelector('#op-table th[data-key=self_us]')"
                   ".getAttribute('aria-sort')") == "descending"
    keys = page.js("[...document.querySelectorAll('#op-table th')].map(th => th.dataset.key)")
    assert {"shapes", "flops", "cpu_mem", "self_cpu_mem"} <= set(keys)
    right = page.js("Math.max(...[...document.querySelectorAll('#op-table th')]"
                    ".map(th => th.getBoundingClientRect().right))")
    assert right <= page.js("document.documentElement.clientWidth")
    # no fixed-height box: the table is as tall as its rows
    box = page.js("(() => { const w = document.querySelector('#op-table').parentElement;"
                  " return [w.clientHeight, w.scrollHeight]; })()")
    assert box[0] >= box[1]
    assert header_index(page, "self_us") > 0


def test_call_sites_and_flame_fold_torch_frames(transformer_page):
    page, _ = transformer_page
    page.show("operators")
    page.page.click("#op-table tbody tr >> text=aten::addmm")
    sites = page.js("[...document.querySelectorAll('#op-detail tr.site pre')].map(p => p.textContent)")
    assert sites and not any(is_plumbing(f) for s in sites for f in s.split("\n"))
    assert "test_report_real_browser.py" in sites[0] or "demo.py" in sites[0].split("\n")[0]
    page.page.check("#op-torch-frames")
    unfolded = page.js("[...document.querySelectorAll('#op-detail tr.site pre')]"
                       ".map(p => p.textContent)")
    assert any(is_plumbing(f) for s in unfolded for f in s.split("\n"))
    page.page.screenshot(path=str(page.artifacts / "transformer-operators-detail.png"))
    page.page.uncheck("#op-torch-frames")

    page.show("flame")
    names = page.js("opscopeReport.flame.nodes.map(n => n.name)")
    assert not any(is_plumbing(n) for n in names)
    page.page.check("#flame-torch-frames")
    assert any(is_plumbing(n) for n in page.js("opscopeReport.flame.nodes.map(n => n.name)"))
    page.page.screenshot(path=str(page.artifacts / "transformer-flame-torch-frames.png"))
    page.page.uncheck("#flame-torch-frames")


def test_memory_axis_has_time_labels(transformer_page):
    page, _ = transformer_page
    page.show("memory")
    labels = page.page.eval_on_selector_all("#memory-chart .time-tick", "n => n.map(x => x.textContent)")
    assert len(labels) >= 3 and all(re.fullmatch(r"-?[\d.]+(us|ms|s)", t) for t in labels)


def test_every_view_has_data(transformer_page):
    page, _ = transformer_page
    for view in ("overview", "operators", "modules", "flame", "timeline", "memory",
                 "recommendations"):
        page.show(view)
        text = page.js(f"document.getElementById('view-{view}').textContent")
        assert "not recorded" not in text, view
