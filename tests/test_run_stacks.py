"""Recorded stacks hold the user's frames, not opscope's runner nor runpy's (issue 27, 14);
the flame graph draws user ranges over the frames inside them, not under a frame.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opscope.report.flame import flame_paths
from synthetic import SCOPE_USER, Op, make_session

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """\
import torch
m = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    with torch.profiler.record_function("train_step"):
        m(torch.randn(16, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("collector", ["native", "python"])
def test_opscope_run_stacks_end_at_the_script(tmp_path, collector):
    (tmp_path / "train.py").write_text(SCRIPT)
    env = dict(os.environ, OPSCOPE_COLLECTOR=collector, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "opscope", "run", "--stack", "-o", "out",
                           "--schedule", "0,0,2,1", "train.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (trace,) = (tmp_path / "out").glob("*.json")
    stacks = [e["args"]["Call stack"].rstrip(";").split(";")
              for e in json.loads(trace.read_text())["traceEvents"]
              if "Call stack" in e.get("args", {})]
    assert stacks
    frames = {f for s in stacks for f in s}
    assert not [f for f in frames if "runpy" in f or "opscope" in f], sorted(frames)[:20]
    assert all(s[-1].startswith("train.py(") and s[-1].endswith("<module>")
               for s in stacks), stacks[:3]
    # optimizer.step()'s ops: their stacks end at the script's line, not in step_hook.py
    step_ops = [s for s in stacks if any(f.endswith("): wrapper") and "optimizer.py" in f
                                         for f in s)]
    assert step_ops and all(s[-1] == "train.py(7): <module>" for s in step_ops)


def test_flame_draws_ranges_first_and_never_under_their_opener():
    session = make_session([
        Op("ProfilerStep#1", 0, 100, scope=SCOPE_USER,
           stack=["opt.py(2): step", "t.py(9): <module>"]),
        Op("train_step", 1, 90, scope=SCOPE_USER, stack=["t.py(5): train", "t.py(9): <module>"]),
        Op("aten::mm", 10, 30, stack=["m.py(3): forward", "t.py(6): train", "t.py(9): <module>"]),
    ])
    paths = flame_paths(session)
    assert paths == {
        "ProfilerStep#1": 11_000,
        "ProfilerStep#1;train_step": 69_000,
        "ProfilerStep#1;train_step;t.py(6):_train;m.py(3):_forward;aten::mm": 20_000,
    }
