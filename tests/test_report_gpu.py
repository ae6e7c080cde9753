"""The report's GPU view in a real browser, on torch.profiler's own trace from an H200.

The trace (``torch_traces/torch-2.11.0-cu130-h200.trace.json.gz``) is torch's
recording of ../shared/gpu/check_cuda.py's workload; opscope links its kernels
to their ops on load. The view must show the busy share, the idle gaps and the
top kernels with the ops that launched them, with no console error.
"""

from __future__ import annotations

from pathlib import Path

from opscope.analysis.build import load_session
from opscope.report import write_report
from opscope.report.data import report_data
from opscope.report.kernels import kernel_view
from test_report_browser import ReportPage, artifacts, browser  # noqa: F401  (fixtures)

TRACE = Path(__file__).parent / "torch_traces" / "torch-2.11.0-cu130-h200.trace.json.gz"


def test_kernel_view_data():
    session = load_session(str(TRACE))
    view = kernel_view(session)
    assert view["events"] == 348 and view["unowned"] == 15  # the graph replay's
    assert 0 < view["busy_share"] < 1 and view["busy_us"] <= view["device_us"] + 1e-6
    top = view["kernels"][0]
    assert top["us"] == max(k["us"] for k in view["kernels"])
    gemm = next(k for k in view["kernels"] if "sgemm" in k["name"] or "gemm" in k["name"])
    assert {op for op, _ in gemm["launched_by"]} & {"aten::mm", "aten::addmm",
                                                      "(outside any op)"}
    assert sum(g["us"] for g in view["gaps"]) <= view["window_us"] - view["busy_us"] + 1e-3


def test_the_gpu_view_renders(browser, artifacts, tmp_path):  # noqa: F811
    session = load_session(str(TRACE))
    path = tmp_path / "gpu.html"
    write_report(session, path)
    page = ReportPage(browser, path, artifacts, "gpu")
    page.show("kernels")
    data = report_data(session)["kernels"]
    names = [n for n, in page.rows("#kernel-table tbody tr", [0])]
    assert names == [k["name"] for k in data["kernels"]]
    cards = page.page.eval_on_selector_all("#gpu-cards .card b", "n => n.map(x => x.textContent)")
    assert cards[0] == f"{100 * data['busy_us'] / data['window_us']:.2f}%"
    assert len(page.rows("#gpu-gaps tbody tr", [0])) == len(data["gaps"])
    page.show("overview")
    busy = page.js("document.getElementById('gpu-busy-card').textContent")
    assert busy.startswith(cards[0]) and "GPU busy" in busy
    for view in ("operators", "timeline"):
        page.show(view)
    page.check_clean()


def test_a_cpu_profile_says_the_gpu_was_not_recorded(browser, artifacts, tmp_path):  # noqa: F811
    from report_sessions import training_profile

    prof = training_profile(steps=2)
    path = tmp_path / "cpu.html"
    prof.export_report(str(path))
    page = ReportPage(browser, path, artifacts, "cpu-gpu")
    page.show("kernels")
    assert "GPU: not recorded" in page.js("document.getElementById('view-kernels').textContent")
    page.check_clean()


def test_the_timeline_has_the_gpu_streams_under_the_threads(browser, artifacts, tmp_path):  # noqa: F811
    session = load_session(str(TRACE))
    lanes = report_data(session)["timeline"]["lanes"]
    assert [lane["thread"] for lane in lanes if lane.get("device")] == ["GPU 0 stream 7"]
    assert not lanes[0].get("device") and lanes[-1].get("device")  # threads first
    assert lanes[-1]["events"] == len(session.device)
    path = tmp_path / "gpu-timeline.html"
    write_report(session, path)
    page = ReportPage(browser, path, artifacts, "gpu-timeline")
    page.show("timeline")
    labels = page.js("decodeLanes(opscopeReport.data.timeline).map(laneLabel)")
    assert labels[-1] == "GPU 0 stream 7"
    page.check_clean()
