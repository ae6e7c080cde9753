"""Smoke test of bench/: every script runs with --quick and prints its table.

The scripts run concurrently in subprocesses (one module-scoped fixture), then each test
checks one script's exit status, markdown table and JSON keys. Nothing here looks at a
time, size or ratio: the figures of a --quick run mean nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

# script -> (column header every table has, first cells of rows that must be present)
EXPECTED = {
    "overhead.py": ("| workload | config |",
                    [f"| {w} | {c} |" for w in ("tiny_ops", "mlp", "transformer", "convnet")
                     for c in ("default", "record_shapes", "all_on")]),
    "postprocess.py": ("| config | output |",
                       ["| default | table |", "| default | trace |",
                        "| record_shapes | table |", "| record_shapes | trace |",
                        "events (subprocess) | total |"]),
    "trace_size.py": ("| config | torch events |", ["| default |", "| record_shapes |"]),
    "collector_memory.py": ("| config | events |", ["| default |", "| record_shapes |"]),
    "record_function_idle.py": ("| record_function |",
                                ["| torch |", "| opscope |", "| empty loop (baseline) |"]),
    "feature_costs.py": ("| variant | iterations |",
                         ["| opscope alloc +memory |", "| opscope deep add +stack |"]),
    "ranks_scale.py": ("| command | ranks |",
                       ["| opscope ranks --json |", "| opscope merge |", "| opscope report |"]),
    "ten_million.py": ("| config | events |",
                       ["| default | 2,000 |", "| default | 20,000 |", "| record_shapes |"]),
    "ranks_thousand.py": ("| verb | command |",
                          ["| ranks DIR |", "| merge |", "| convert |", "| ranks STORE |"]),
    "black_box_cost.py": ("| workload | reps |",
                          ["| transformer |", "| convnet |", "| tiny_ops |"]),
    # valgrind's callgrind; without it the script prints an empty table
    "instructions.py": ("| workload | row |",
                        ["| tiny_ops | opscope default |", "| mlp | empty observer |"]
                        if shutil.which("valgrind") else []),
}


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    """Run every script with --quick at once; {script: (returncode, stdout, stderr, json)}."""
    folder = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, OPSCOPE_QUIET_BUILD="1")
    procs = {}
    for script in EXPECTED:
        out = folder / (script + ".json")
        procs[script] = (out, subprocess.Popen(
            [sys.executable, str(BENCH / script), "--quick", "--json", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=BENCH.parent))
    results = {}
    for script, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        data = json.loads(out.read_text()) if out.exists() else None
        results[script] = (proc.returncode, stdout, stderr, data)
    return results


@pytest.mark.parametrize("script", list(EXPECTED))
def test_quick_run_prints_table(quick_runs, script):
    code, stdout, stderr, data = quick_runs[script]
    assert code == 0, f"{script} --quick failed:\n{stderr[-3000:]}"
    header, rows = EXPECTED[script]
    assert header in stdout
    for row in rows:
        assert row in stdout, f"{script}: no row starting {row!r} in:\n{stdout}"
    assert "Machine: " in stdout and "cores; torch " in stdout
    assert "Reproduce: `python bench/" in stdout
    assert data is not None
    for key in ("title", "command", "machine", "columns", "rows", "targets", "raw"):
        assert key in data, f"{script} --json has no {key!r}"
    assert {"cpu", "cores", "torch", "python"} <= set(data["machine"])
    assert data["quick"] is True
    assert all(len(row) == len(data["columns"]) for row in data["rows"])
    assert all({"target", "measured", "met"} <= set(t) for t in data["targets"])


def test_run_all_renders_document(quick_runs, tmp_path):
    """run_all.py --from-json renders BENCHMARKS.md from the scripts' saved results."""
    results = [quick_runs[s][3] for s in EXPECTED]
    assert all(r is not None for r in results)
    folder = tmp_path / "results"
    folder.mkdir()
    for script, r in zip(EXPECTED, results):
        (folder / (script + ".json")).write_text(json.dumps(r))
    out = tmp_path / "BENCHMARKS.md"
    proc = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--from-json",
                           str(folder), "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = out.read_text()
    assert doc.startswith("# opscope benchmarks")
    assert "Generated with --quick" in doc
    assert "## Targets\n" in doc and "issue" not in doc.lower()  # sections by subject
    for subject in ("## Recording cost", "## After the run", "## Many ranks"):
        assert subject in doc
    for r in results:
        assert f"### {r['title']}" in doc
    n_targets = sum(len(r["targets"]) for r in results)
    statuses = ("| met |", "| **not met** |", "| not comparable |")
    assert sum(doc.count(s) for s in statuses) == n_targets
