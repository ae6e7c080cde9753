"""What a newcomer trips on in the CLI (issue 27): each test fails without its fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TIMEOUT_S = 300
TRAIN = """\
import sys
import torch

steps = int(sys.argv[1])
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def cli(*args: str, cwd: Path, env: dict = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "OPSCOPE_COLLECTOR"}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "opscope", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def table_rows(stdout: str) -> list:
    """Row names of the printed key_averages table."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["Name"])
    rows = []
    for line in lines[header + 2:]:
        if line.startswith("---"):
            break
        rows.append(line.split("  ")[0].strip() or line.split()[0])
    return rows


# -- item 4: a schedule ending between two windows -------------------------------------

def test_run_ending_between_windows_prints_the_last_complete_window(tmp_path):
    """1,1,3 over 6 steps: steps 2-4 are recorded, step 6 warms up when the script ends."""
    write(tmp_path, "train.py", TRAIN)
    result = cli("run", "-o", "out", "--schedule", "1,1,3", "train.py", "6", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "opscope: table of steps 2-4 (complete window)"
    rows = table_rows(result.stdout)
    assert "ProfilerStep*" in rows and "aten::addmm" in rows


def test_run_prefers_the_complete_window_to_the_partial_one(tmp_path):
    """0,0,2 over 3 steps: steps 0-1 whole, steps 2-3 cut by the end (written as partial)."""
    write(tmp_path, "train.py", TRAIN)
    result = cli("run", "-o", "out", "--schedule", "0,0,2", "train.py", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "opscope: table of steps 0-1 (complete window)"
    assert "train.step3.partial.pt.trace.json" in result.stderr


def test_run_labels_a_partial_window_when_it_is_the_only_one(tmp_path):
    write(tmp_path, "train.py", TRAIN)
    result = cli("run", "-o", "out", "--schedule", "0,1,5", "train.py", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "opscope: table of steps 1-3 (partial window: the program ended during step 3)")
    assert "aten::addmm" in table_rows(result.stdout)


def test_run_without_schedule_labels_the_whole_run(tmp_path):
    write(tmp_path, "train.py", TRAIN)
    result = cli("run", "-o", "out", "train.py", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "opscope: table of the whole run"
