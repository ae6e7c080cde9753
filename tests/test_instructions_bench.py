"""bench/instructions.py and bench/trace_identity.py, on synthetic inputs (no valgrind run).

The figures of a real run are checked nowhere: instruction counts belong in BENCHMARKS.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import instructions  # noqa: E402
import trace_identity  # noqa: E402


def test_rows_subtract_each_floor_and_compare_with_before():
    ops = {"tiny_ops": 100}
    counts = {(row, "tiny_ops"): 1000 * 100 for row in instructions.ROWS}
    counts[("empty observer", "tiny_ops")] = 1100 * 100
    counts[("opscope default", "tiny_ops")] = 1150 * 100
    rows = instructions.table_rows(counts, ops, list(instructions.ROWS))
    by_row = {r[1]: r for r in rows}
    assert by_row["no profiler"][5] is None  # no floor
    assert by_row["empty observer"][5] == 100
    assert by_row["opscope default"][4] == "empty observer"
    assert by_row["opscope default"][5] == 50
    before = instructions.BEFORE["excess"]["tiny_ops/opscope default"]
    assert by_row["opscope default"][6] == before
    targets = instructions.targets(rows, "python bench/instructions.py")
    default = [t for t in targets if "opscope default" in t["target"]]
    assert len(default) == 1 and default[0]["met"] == (50 <= before / 3)


@pytest.mark.parametrize("raw, short", [
    ("???:(anonymous namespace)::on_end(at::RecordFunction const&) [/x/opscope_observer.so]",
     "on_end(at::RecordFunction const&)"),
    ("./malloc/./malloc/malloc.c:_int_free [/usr/lib/libc.so.6]", "_int_free"),
    ("???:c10::IValue::toInt() const", "c10::IValue::toInt() const"),
    ("???:std::unique_ptr<at::ObserverContext, std::default_delete<at::ObserverContext> > "
     "(anonymous namespace)::on_start_fast<false>(at::RecordFunction const&)",
     "on_start_fast<false>(at::RecordFunction const&)"),
])
def test_function_names_are_shortened(raw, short):
    assert instructions._short(raw) == short


def test_trace_normalisation_keeps_what_is_recorded():
    trace = {"traceName": "/tmp/a.json", "trace_id": "AB", "baseTimeNanoseconds": 5,
             "traceEvents": [
                 {"ph": "X", "name": "aten::add", "pid": 4242, "tid": 4243, "ts": 1.5,
                  "dur": 2.0, "args": {"Input Dims": [[2], [2]]}},
                 {"ph": "i", "name": "[memory]", "pid": 4242, "tid": 4243, "ts": 3.0,
                  "args": {"Addr": 777, "Bytes": 8}},
                 {"ph": "i", "name": "[memory]", "pid": 4242, "tid": 4243, "ts": 4.0,
                  "args": {"Addr": 777, "Bytes": -8}},
                 {"ph": "i", "name": "[memory]", "pid": 4242, "tid": 4243, "ts": 5.0,
                  "args": {"Addr": 999, "Bytes": -4}}]}
    out = trace_identity.normalise(trace)
    first, alloc, free, unknown = out["traceEvents"]
    assert (first["ts"], first["dur"], first["pid"], first["tid"]) == (0, 0, 0, 0)
    assert first["args"] == {"Input Dims": [[2], [2]]}
    assert alloc["args"]["Addr"] == free["args"]["Addr"] == 1
    assert unknown["args"]["Addr"] == "allocated before"
    assert out["baseTimeNanoseconds"] == 0 and out["traceName"] == "traceName"


def test_each_row_takes_its_median_region_over_heap_shifts():
    labels = [["opscope default", "mlp", k] for k in range(5)] + [["no profiler", "mlp", 0]]
    dumps = [f"d{k}" for k in range(6)]
    counts, chosen, spread = instructions.median_regions(labels, dumps, [50, 90, 10, 70, 30, 7])
    assert counts == {("opscope default", "mlp"): 50, ("no profiler", "mlp"): 7}
    assert chosen[("opscope default", "mlp")] == "d0"
    assert spread[("opscope default", "mlp")] == [10, 30, 50, 70, 90]


def test_heap_shifts_differ_and_the_first_moves_nothing():
    assert instructions.heap_pad(0) == []
    sizes = [sorted(len(b) for b in instructions.heap_pad(k)) for k in (1, 2, 3)]
    assert sizes[0] != sizes[1] != sizes[2]
    assert max(sizes[2]) > 512 >= min(sizes[2])  # malloc's sizes and pymalloc's


def test_the_child_runs_in_this_interpreters_environment():
    """In a virtualenv the child must keep the venv (its torch), not start the base
    interpreter that the venv's python symlinks to."""
    import subprocess

    code = "import sys; print(sys.prefix)"
    done = subprocess.run([instructions.child_python(), "-c", code], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == sys.prefix
