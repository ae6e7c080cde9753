"""The job report's timeline counts ranks, not windows (issue 27, item 9).

Two ranks profiled in two windows each give four lane groups; the page must say
"2 ranks, 4 windows", not "4 rank(s)".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opscope.report.ranks import _LaneCollector
from synthetic import SCOPE_USER, Op, make_session

ASSETS = Path(__file__).resolve().parent.parent / "opscope" / "report" / "assets"


def test_lane_groups_are_windows_and_ranks_are_counted():
    lanes = _LaneCollector(100)
    for rank in (0, 1):
        for step in (1, 2):
            session = make_session([Op(f"ProfilerStep#{step}", step * 1000, step * 1000 + 500,
                                       scope=SCOPE_USER), Op("aten::mm", step * 1000 + 10,
                                                              step * 1000 + 20)])
            lanes(rank, f"rank{rank}.step{step}.json", session)
    merged = lanes.merged(0)
    assert (len(merged["groups"]), merged["ranks"]) == (4, 2)


def rank_count(tl: dict) -> str:
    """Run the page's own rankCount() in node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not found")
    source = (ASSETS / "ranks_timeline.js").read_text()
    func = re.search(r"^function rankCount\(tl\) \{.*?^\}", source, re.S | re.M).group(0)
    out = subprocess.run([node, "-e", f"{func}\nconsole.log(rankCount({json.dumps(tl)}))"],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_the_page_says_ranks_and_windows():
    four = {"ranks": 2, "groups": [{}] * 4}
    assert rank_count(four) == "2 ranks, 4 windows"
    assert rank_count({"ranks": 2, "groups": [{}] * 2}) == "2 ranks"
    assert rank_count({"ranks": 1, "groups": [{}]}) == "1 rank"
