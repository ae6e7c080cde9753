"""The report's view registry (``opscope.report.views``): a view is one module and one entry.

A throwaway view registered by a fixture (a module-level function and one ``View``) lands
in the page's data under its key and its script in the page, with no other edit; every
registered view's scripts exist, and every script in ``assets/`` belongs to a view. In
headless Chromium (``test_report_browser``'s fixtures; skipped without it) the throwaway
view's tab opens its view.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from opscope.analysis.build import build_session
from opscope.model.records import RawSession
from opscope.report.data import report_data
from opscope.report.page import CORE, JOB_SCRIPTS, SCRIPTS, render_html, script_names
from opscope.report.views import REGISTRY, View, of_session, register, unregister, view

from test_report_browser import ReportPage, artifacts, browser  # noqa: F401 (fixtures)

# a view's script adds its own tab and section (as compiled.js does): report.html is not edited
PROBE_JS = """(function addProbeTab() {
  document.getElementById("tabs").append(el("button", { "data-view": "probe", text: "Probe" }));
  document.querySelector("main").append(el("section", { id: "view-probe", class: "view" }));
})();
VIEWS.probe = function (section) {
  section.append(el("p", { id: "probe", text: `${DATA.probe.events} events` }));
};
"""


def probe_view(session):
    """The throwaway view's data: the session's event count."""
    return {"events": len(session.table)}


def page_data(page: str) -> dict:
    start = page.index('<script id="opscope-data" type="application/json">')
    return json.loads(page[page.index(">", start) + 1:page.index("</script>", start)])


@pytest.fixture
def probe(tmp_path):
    """A view "probe" (script probe.js in tmp_path), registered for the test only."""
    (tmp_path / "probe.js").write_text(PROBE_JS)
    entry = register(View("probe", of_session(probe_view), ("probe.js",), folder=str(tmp_path)))
    yield entry
    unregister("probe")


@pytest.fixture
def job_probe(tmp_path):
    """A job-only view "job_probe", registered for the test only."""
    (tmp_path / "job_probe.js").write_text("VIEWS.job_probe = function (section) {};\n")
    entry = register(View("job_probe", of_session(probe_view), ("job_probe.js",),
                          job_only=True, folder=str(tmp_path)))
    yield entry
    unregister("job_probe")


def test_a_registered_view_lands_in_the_data_and_the_page(probe):
    data = report_data(build_session(RawSession.empty()))
    assert list(data)[-1] == "probe" and data["probe"] == {"events": 0}
    page = render_html(data)
    assert page_data(page)["probe"] == {"events": 0}
    assert page.count(PROBE_JS) == 1
    # after the other views' scripts, before views.js (which stays last)
    assert page.index(PROBE_JS) > page.index("VIEWS.black_box =")
    assert page.index(PROBE_JS) < page.index("VIEWS.modules =")
    assert script_names(()) == SCRIPTS[:-1] + ("probe.js", "views.js")


def test_a_view_is_gone_once_unregistered(tmp_path):
    (tmp_path / "probe.js").write_text(PROBE_JS)
    register(View("probe", of_session(probe_view), ("probe.js",), folder=str(tmp_path)))
    with pytest.raises(ValueError, match="probe"):
        register(View("probe", of_session(probe_view)))
    unregister("probe")
    assert "probe" not in report_data(build_session(RawSession.empty()))
    assert PROBE_JS not in render_html({"meta": {}})
    with pytest.raises(KeyError, match="probe"):
        view("probe")


def test_a_job_only_view_is_in_a_page_only_with_its_data(job_probe):
    session = build_session(RawSession.empty())
    assert "job_probe" not in report_data(session)
    assert "job_probe" not in render_html({"meta": {}})
    assert "VIEWS.job_probe" in render_html({"meta": {}, "job_probe": {}})


def test_the_pages_scripts_are_the_registered_views_core_first_views_js_last():
    assert SCRIPTS[0] == JOB_SCRIPTS[0] == CORE
    assert SCRIPTS[-1] == JOB_SCRIPTS[-1] == "views.js"
    assert set(JOB_SCRIPTS) - set(SCRIPTS) == {"ranks.js", "ranks_timeline.js"}
    data = report_data(build_session(RawSession.empty()))
    assert list(data) == ["meta"] + [v.key for v in REGISTRY if not v.job_only]


def test_every_views_script_exists_and_every_asset_script_belongs_to_a_view():
    assets = resources.files("opscope.report").joinpath("assets")
    on_disk = {p.name for p in assets.iterdir() if p.name.endswith(".js")}
    registered = {name for v in REGISTRY if v.folder is None for name in v.scripts}
    assert registered <= on_disk, registered - on_disk
    assert on_disk - registered == {CORE}
    keys = [v.key for v in REGISTRY]
    assert len(keys) == len(set(keys)) and "meta" not in keys
    for entry in REGISTRY:  # each view's script defines its VIEWS.<key>
        text = "\n".join(assets.joinpath(name).read_text("utf-8") for name in entry.scripts)
        assert f"VIEWS.{entry.key} = " in text, entry.key


def test_a_registered_view_opens_in_a_browser(probe, browser, artifacts,  # noqa: F811
                                              tmp_path):
    path = tmp_path / "probe.html"
    path.write_text(render_html(report_data(build_session(RawSession.empty()))))
    page = ReportPage(browser, path, artifacts, "probe")
    page.show("probe")
    assert page.js("document.getElementById('probe').textContent") == "0 events"
    page.show("overview")
    page.check_clean()
