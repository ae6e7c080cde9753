"""``opscope diff A B``: per-op and per-module deltas between two traces.

Real profiles for the behaviour the issue asks for (a trace against itself
shows no change; an added matmul is the top regression); synthetic sessions
with fixed times for the classification and the exact text.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pytest
import torch

import opscope
from opscope.analysis.diff import diff_sessions
from opscope.export.diff_html import write_diff_html
from opscope.export.diff_text import format_diff
from opscope.export.chrome_trace import write_chrome_trace

from synthetic import Op, SCOPE_USER, make_session
from test_cli import assert_usage_error, opscope_cli
from test_cli_table import run_cli
from workloads import mlp_step_fn

MATMUL_SIZE = 1024  # tens of ms: far above the tiny MLP step and any scheduling stall in it


def _profile(tmp_path, name: str, *, added_matmul: bool, **options) -> str:
    step = mlp_step_fn()
    big = torch.randn(MATMUL_SIZE, MATMUL_SIZE)

    def work():
        step()
        if added_matmul:
            torch.matmul(big, big)

    work()  # warm-up outside the profile
    with opscope.profile(**options) as prof:
        for _ in range(2):
            work()
    path = str(tmp_path / name)
    prof.export_chrome_trace(path)
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diff")
    return {"base": _profile(folder, "base.pt.trace.json", added_matmul=False, with_modules=True),
            "matmul": _profile(folder, "matmul.pt.trace.json.gz", added_matmul=True,
                               with_modules=True)}


def _first_op_row(text: str) -> str:
    lines = text.splitlines()
    start = lines.index("Ops, by absolute change of self CPU time:")
    return lines[start + 4]  # title, rule, header, rule, first row


# -- real profiles --------------------------------------------------------------------------

def test_trace_against_itself_shows_no_change(traces, tmp_path, capsys):
    from opscope.analysis.build import load_session

    session = load_session(traces["base"])
    diff = diff_sessions(session, session)
    assert diff.unchanged and not diff.regressions and not diff.improvements
    assert {r.status for r in diff.ops + diff.modules} == {"unchanged"}
    assert diff.modules  # both sides recorded modules

    page = tmp_path / "same.html"
    code, out, err = run_cli(capsys, "diff", traces["base"], traces["base"], "-o", str(page))
    assert code == 0, err
    assert "No change: both traces have the same ops, calls and times." in out
    assert "0 regressions, 0 improvements" in out
    assert f"wrote diff {page}" in err
    text = page.read_text()
    assert "No change" in text and 'class="regression"' not in text


def test_added_matmul_is_the_top_regression(traces, tmp_path, capsys):
    page = tmp_path / "diff.html"
    code, out, err = run_cli(capsys, "diff", traces["base"], traces["matmul"], "-o", str(page),
                             "--limit", "-1")
    assert code == 0, err
    first = _first_op_row(out)
    assert first.split()[0] == "aten::mm" and first.endswith("REGRESSION"), out
    matmul = next(line for line in out.splitlines() if line.startswith("aten::matmul "))
    assert matmul.split()[4] == "new" and matmul.endswith("new")  # Self %, Change
    assert "Modules (forward + backward)" in out and "MLP > head (Linear)" in out

    rows = re.findall(r"<tr( class=\"(\w+)\")?><td class=\"name\" data-v=\"([^\"]*)\"",
                      page.read_text())
    assert rows[0][1:] == ("regression", "aten::mm")
    assert "aten::matmul" in {html.unescape(name) for _, _, name in rows}


def test_added_matmul_counts(traces):
    from opscope.analysis.build import load_session

    diff = diff_sessions(load_session(traces["base"]), load_session(traces["matmul"]))
    top = diff.regressions[0]
    assert diff.steps == (2, 2)  # both sides have 2 optimizer steps: compared per step
    assert top.key == "aten::mm" and top.delta_calls == 1 and top.presence == "both"
    matmul = next(r for r in diff.ops if r.key == "aten::matmul")
    assert matmul.calls == (0, 1) and matmul.presence == "new"
    assert diff.ops[0] is top  # sorted by absolute change of self time


# -- synthetic sessions: classification and exact text ---------------------------------------

def _sessions():
    a = make_session([
        Op("step", 0, 400, scope=SCOPE_USER),
        Op("aten::mm", 10, 110), Op("aten::add", 120, 170), Op("aten::add", 180, 230),
        Op("aten::relu", 240, 250), Op("aten::gone", 260, 300),
    ])
    b = make_session([
        Op("step", 0, 600, scope=SCOPE_USER),
        Op("aten::mm", 10, 310), Op("aten::add", 320, 370), Op("aten::add", 380, 430),
        Op("aten::relu", 440, 449.5), Op("aten::new", 450, 490),
    ])
    return a, b


def test_classification_and_order():
    a, b = _sessions()
    diff = diff_sessions(a, b)
    got = [(r.key, r.status, r.presence, r.delta_self, r.delta_calls) for r in diff.ops]
    assert got == [
        ("aten::mm", "regression", "both", 200.0, 0),
        ("aten::gone", "improvement", "gone", -40.0, -1),  # ties: |total change|, calls, name
        ("aten::new", "regression", "new", 40.0, 1),
        ("step", "", "both", 0.5, 0),  # self 150 -> 150.5us: under 1% of the total, noise
        ("aten::relu", "", "both", -0.5, 0),  # 5%: under the 10% threshold
        ("aten::add", "unchanged", "both", 0.0, 0),
    ]
    assert diff.self_total_us == (400.0, 600.0)
    strict = diff_sessions(a, b, threshold_pct=1.0, noise_pct=0.0)
    assert next(r for r in strict.ops if r.key == "aten::relu").status == "improvement"


def test_text_is_exact():
    a, b = _sessions()
    text = format_diff(diff_sessions(a, b), names=("a.json", "b.json"), row_limit=3)
    expected = """\
A: a.json
B: b.json
Self CPU time total: 400.000us -> 600.000us (+200.000us, +50.0%)
2 regressions, 1 improvement (threshold: 10% of the op's self time and 1% of the total)

Ops, by absolute change of self CPU time:
----------  ----------  ----------  -----------  -------  -----------  -----------  ------------  -------  -------  ------------  ----------------
Name        Self CPU A  Self CPU B  Self change   Self %  CPU total A  CPU total B  Total change  Calls A  Calls B  Calls change  Change
----------  ----------  ----------  -----------  -------  -----------  -----------  ------------  -------  -------  ------------  ----------------
aten::mm     100.000us   300.000us   +200.000us  +200.0%    100.000us    300.000us    +200.000us        1        1             0  REGRESSION
aten::gone    40.000us     0.000us    -40.000us     gone     40.000us      0.000us     -40.000us        1        0            -1  improved (gone)
aten::new      0.000us    40.000us    +40.000us      new      0.000us     40.000us     +40.000us        0        1            +1  REGRESSION (new)
----------  ----------  ----------  -----------  -------  -----------  -----------  ------------  -------  -------  ------------  ----------------
(3 more rows; --limit -1 shows all)"""
    assert text == expected


def test_modules_only_when_both_sides_have_them(traces):
    from opscope.analysis.build import load_session

    with_modules = load_session(traces["base"])
    a, _ = _sessions()
    assert diff_sessions(with_modules, a).modules == []
    paths = [r.key for r in diff_sessions(with_modules, with_modules).modules]
    assert paths[0] == "MLP" and "MLP > body (Sequential) > body.0 (Linear)" in paths


def test_html_is_self_contained_and_sorts_in_a_browser(tmp_path):
    """Opened in headless Chromium: no console error, no request, a click sorts."""
    playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs chromium (Debian's chromium package)")
    a, b = _sessions()
    page_path = write_diff_html(diff_sessions(a, b), str(tmp_path / "d.html"))
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            problems = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: problems.append(r.url)
                    if not r.url.startswith("file:") else None)
            page.goto(f"file://{os.path.abspath(page_path)}")
            first = lambda: page.inner_text("#ops tbody tr:first-child td.name")  # noqa: E731
            assert first() == "aten::mm"
            page.click("#ops th:nth-child(11)")  # Calls A, largest first
            assert first() == "aten::add"
            page.click("#ops th:nth-child(11)")  # again: smallest first
            assert first() == "aten::new"
            page.click("#ops th:nth-child(1)")  # Name, Z to A
            assert first() == "step"
            page.screenshot(path=str(tmp_path / "diff.png"))
        finally:
            browser.close()
    assert problems == []


# -- errors -----------------------------------------------------------------------------------

def test_missing_second_trace_is_one_line_exit_2(traces, tmp_path):
    result = opscope_cli(None, "diff", traces["base"], "nope.json", cwd=tmp_path)
    assert_usage_error(result, "nope.json", "no such file")
    assert result.stdout == ""


@pytest.mark.parametrize("output, words", [
    ("no/such/folder/d.html", ["-o/--output", "does not exist"]),
    (".", ["-o/--output", "is a folder"]),
])
def test_bad_output_is_one_line_error(traces, tmp_path, capsys, monkeypatch, output, words):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "diff", traces["base"], traces["base"], "-o", output)
    assert out == ""
    assert_usage_error(subprocess.CompletedProcess([], code, out, err), *words)


def test_synthetic_traces_through_the_cli(tmp_path, capsys):
    a, b = _sessions()
    paths = [write_chrome_trace(s, str(tmp_path / f"{n}.json")) for n, s in (("a", a), ("b", b))]
    code, out, _ = run_cli(capsys, "diff", *paths, "--limit", "3")
    assert code == 0
    assert out.endswith(format_diff(diff_sessions(a, b), names=tuple(paths), row_limit=3) + "\n")


def test_help(capsys):
    code, out, _ = run_cli(capsys, "diff", "--help")
    assert code == 0 and out.startswith("usage: opscope diff")
    assert "-o FILE" in out and "--threshold" in out
