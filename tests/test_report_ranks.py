"""The job report (``opscope report DIR`` on per-rank traces): its data and its Ranks view.

The job is ``tests/ranks_workloads/ddp_train.py`` under a real 2-rank torchrun on gloo
(``test_ranks.run_job``), rank 1 sleeping before each backward: the report's embedded data
holds the step-time heat map (ranks x steps), the collectives, the straggler named; in
headless Chromium (``test_report_browser``'s fixtures; skipped without chromium or
Playwright) the Ranks view renders without console errors, with one heat-map row and one
timeline lane group per rank. A desync is checked on small hand-written rank traces.
No duration is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opscope.cli.main import main as cli_main
from opscope.report.page import JOB_SCRIPTS, SCRIPTS, render_html
from opscope.report.data import job_report_data
from test_ranks import STEPS, run_job
from test_report_browser import ReportPage, artifacts, browser  # noqa: F401 (fixtures)

SLEEPER = 1


def page_data(path: Path) -> dict:
    text = Path(path).read_text()
    start = text.index('<script id="opscope-data" type="application/json">')
    body = text[text.index(">", start) + 1:text.index("</script>", start)]
    return json.loads(body)


def report(capsys, *args: str) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 0, err
    return err


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """2 ranks, opscope, rank SLEEPER sleeps 200 ms before each backward."""
    folder = tmp_path_factory.mktemp("job")
    run_job(folder, 2, "--sleep-rank", str(SLEEPER), "--sleep-ms", "200")
    return folder


@pytest.fixture(scope="module")
def job_report(job):
    """``opscope report DIR`` with no -o: DIR/ranks.html."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", str(job)])
    assert exit_info.value.code == 0
    return job / "ranks.html"


def test_job_report_data_has_heatmap_collectives_and_straggler(job_report):
    data = page_data(job_report)
    ranks = data["ranks"]
    heat = ranks["heatmap"]
    assert heat["ranks"] == [0, 1] and heat["steps"] == list(range(STEPS))
    assert len(heat["ms"]) == 2 and all(len(row) == STEPS for row in heat["ms"])
    assert all(v is not None and v > 0 for row in heat["ms"] for v in row)
    coll = ranks["collectives"]
    assert coll["ranks"] == [0, 1] and coll["total"] == len(coll["rows"]) == 2 * STEPS
    seqs = sorted(r["seq"] for r in coll["rows"])  # torch's numbers (its flight recorder)
    assert seqs == list(range(seqs[0], seqs[0] + 2 * STEPS))
    waits = [r["max_wait_ms"] for r in coll["rows"]]
    assert waits == sorted(waits, reverse=True)  # longest wait first
    for row in coll["rows"]:
        assert row["kind"] == "allreduce" and row["pg"] == "0"
        assert all(v is not None for k in ("start_ms", "wait_ms", "transfer_ms") for v in row[k])
    # the gradient allreduces: the sleeper arrives last, and the other rank waits
    gradients = [r for r in coll["rows"] if (r["seq"] - seqs[0]) % 2 == 0]
    assert all(r["last_rank"] == SLEEPER for r in gradients)
    assert ranks["stragglers"][0]["rank"] == SLEEPER
    assert ranks["desync"] == [] and ranks["world_size"] == 2
    assert [r["rank"] for r in ranks["summary"]] == [0, 1]
    assert data["meta"]["shown_rank"] == 0
    assert data["meta"]["shown_file"] == "train.rank0.pt.trace.json"


def test_job_timeline_has_a_lane_group_per_rank_on_one_clock(job_report):
    tl = page_data(job_report)["ranks"]["timeline"]
    assert [g["rank"] for g in tl["groups"]] == [0, 1]
    assert all(g["lanes"] and g["offset_ns"] >= 0 for g in tl["groups"])
    assert min(g["offset_ns"] for g in tl["groups"]) == 0
    assert tl["shown"] <= tl["cap"] and tl["total"] == sum(g["total"] for g in tl["groups"])
    gloo = tl["names"].index("gloo:all_reduce")
    for g in tl["groups"]:  # each rank's backend ranges, named through the shared table
        assert any(gloo in lane["name"] for lane in g["lanes"])


def test_cap_is_shared_among_the_ranks(job):
    data = job_report_data(sorted(str(p) for p in job.glob("*.pt.trace.json")),
                           timeline_cap=50)
    tl = data["ranks"]["timeline"]
    assert tl["cap"] == 50 and all(g["shown"] <= 25 for g in tl["groups"])
    assert tl["shown"] < tl["total"]


def test_a_single_trace_report_is_unchanged(job, tmp_path, capsys):
    """One rank's trace (a file, or a folder of one rank) gives the single-trace report."""
    one = tmp_path / "one"
    one.mkdir()
    (one / "train.rank0.pt.trace.json").write_bytes(
        (job / "train.rank0.pt.trace.json").read_bytes())
    report(capsys, str(one))
    assert not (one / "ranks.html").exists()
    data = page_data(one / "train.rank0.html")
    assert "ranks" not in data and "shown_rank" not in data["meta"]
    page = (one / "train.rank0.html").read_text()
    assert "addRanksTab" not in page and 'data-view="ranks"' not in page
    assert "addRanksTab" in render_html({"meta": {}, "ranks": {}})
    assert JOB_SCRIPTS[-1] == SCRIPTS[-1] == "views.js"


def test_output_into_a_folder_and_title(job, tmp_path, capsys):
    err = report(capsys, str(job), "-o", str(tmp_path), "--title", "my job")
    assert f"wrote report {tmp_path / 'ranks.html'}" in err
    assert page_data(tmp_path / "ranks.html")["meta"]["title"] == "my job"
    report(capsys, str(job), "-o", str(tmp_path / "j.html"))
    assert "ranks" in page_data(tmp_path / "j.html")


def write_rank_trace(folder: Path, rank: int, collectives) -> None:
    """A small torch-format rank trace: one step, then ``collectives`` [(kind, floats)]."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1,
               "tid": 1, "ts": 0, "dur": 1000}]
    range_names = {"allreduce": "gloo:all_reduce", "broadcast": "gloo:broadcast"}
    for k, (kind, floats) in enumerate(collectives):
        ts = 100 + 200 * k
        events.append({"ph": "X", "cat": "cpu_op", "name": f"c10d::{kind}_", "pid": 1,
                       "tid": 1, "ts": ts, "dur": 5})
        events.append({"ph": "X", "cat": "user_annotation", "name": range_names[kind],
                       "pid": 1, "tid": 2, "ts": ts + 6, "dur": 50,
                       "args": {"Input type": ["float"], "Input Dims": [[floats]]}})
    doc = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
           "baseTimeNanoseconds": 10 ** 18, "traceEvents": events}
    (folder / f"t.rank{rank}.pt.trace.json").write_text(json.dumps(doc))


@pytest.fixture
def desync_report(tmp_path, capsys):
    write_rank_trace(tmp_path, 0, [("allreduce", 8), ("allreduce", 8)])
    write_rank_trace(tmp_path, 1, [("allreduce", 8), ("broadcast", 3), ("allreduce", 8)])
    report(capsys, str(tmp_path))
    return tmp_path / "ranks.html"


def test_desync_is_in_the_report(desync_report):
    (d,) = page_data(desync_report)["ranks"]["desync"]
    assert (d["pg"], d["seq"], d["ranks"]) == ("0", 1, {"0": "allreduce", "1": "broadcast"})
    assert d["bytes"]["1"] == 12


def test_ranks_view_in_a_browser(browser, artifacts, job_report):  # noqa: F811
    page = ReportPage(browser, job_report, artifacts, "ranks")
    assert page.js("opscopeReport.current") == "ranks"  # a job's report opens on Ranks
    page.show("ranks")
    assert page.js("document.querySelectorAll('#rank-heatmap tbody tr').length") == 2
    assert page.page.eval_on_selector_all("#rank-heatmap tbody tr",
                                          "rows => rows.map(r => r.dataset.rank)") == ["0", "1"]
    assert page.js("document.querySelectorAll('#rank-heatmap tbody tr:first-child td')"
                   ".length") == STEPS
    assert page.js("opscopeReport.ranksTimeline.groups.map(g => g.rank)") == [0, 1]
    assert page.js("opscopeReport.ranksTimeline.drawn()") > 0
    assert page.page.eval_on_selector_all("#rank-stragglers li",
                                          "li => li.map(x => x.dataset.rank)")[0] == str(SLEEPER)
    rows = page.js("document.querySelectorAll('#collective-table tbody tr').length")
    assert rows == 2 * STEPS
    page.page.click('#collective-table th[data-key="seq"]')
    seqs = page.page.eval_on_selector_all("#collective-table tbody tr",
                                          "rows => rows.map(r => +r.cells[1].textContent)")
    assert seqs == sorted(seqs, reverse=True)
    page.page.click("#collective-table tbody tr >> nth=0")
    assert page.js("document.querySelectorAll('#collective-detail tbody tr').length") == 2
    assert "rank 0" in page.js("document.getElementById('ranks-note').textContent")
    for view in ("overview", "operators", "timeline", "recommendations"):
        page.show(view)  # the other views (rank 0's session) render too
    page.check_clean()


def test_desync_in_a_browser(browser, artifacts, desync_report):  # noqa: F811
    page = ReportPage(browser, desync_report, artifacts, "desync")
    page.show("ranks")
    text = page.js("document.getElementById('rank-desync').textContent")
    assert "collective #1" in text and "broadcast" in text and "allreduce" in text
    page.check_clean()


def test_job_report_errors_are_one_line(desync_report, tmp_path, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", str(desync_report.parent), "-o", str(tmp_path / "nope" / "r.html")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("opscope: error: ") and str(tmp_path / "nope") in err
    (desync_report.parent / "t.rank1.pt.trace.json").write_text('{"traceEvents": [')
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", str(desync_report.parent)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "t.rank1.pt.trace.json" in err, err
