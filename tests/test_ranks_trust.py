"""Many ranks from one folder: runs kept apart, times and rank numbers bounded (issue 28: 16, 17, 11).

The rank traces here are synthetic (written by the test): four steps of a
matmul and a gloo all-reduce, with ``distributedInfo`` and each event's
``pid`` as torch.profiler writes them. ``opscope ranks`` and ``opscope
report`` run in this process, or in a subprocess (timeout: the group is
killed) under a cap on its address space for the rank-number checks.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

import pytest

from opscope.analysis.ranks.checks import MAX_RANKS
from opscope.load.ranks import RankTraceError
from opscope.analysis.ranks.analyse import analyse_ranks
from opscope.analysis.ranks.facts import RankFacts
from opscope.cli.main import main as cli_main
from subprocesses import run_in_group

START_US = 1_700_000_000_000_000  # 2023, in Unix microseconds
MEMORY_CAP = 700 * 2 ** 20  # address space: a 2-rank ranks/report run needs under 500 MB
TIMEOUT_S = 120


def rank_trace(path, rank, *, pid, world=2, start_us=START_US, steps=4, offset=None):
    """A rank's trace: ``steps`` ProfilerSteps, each with a matmul and a gloo all-reduce."""
    events = []
    for step in range(steps):
        t = start_us + step * 1000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid,
             "tid": 1, "ts": t, "dur": 990},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": 1,
             "ts": t + 1, "dur": 100},
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": 1,
             "ts": t + 200, "dur": 5},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid,
             "tid": 2, "ts": t + 201, "dur": 300}]
    info = {"backend": "gloo", "rank": rank}
    if world is not None:
        info["world_size"] = world
    doc = {"schemaVersion": 1, "distributedInfo": info, "traceEvents": events}
    if offset is not None:
        doc["opscopeClockOffsetNs"] = offset
    path.write_text(json.dumps(doc))
    return str(path)


def opscope_cli(*args, cwd):
    """``opscope ARGS`` in this process, in ``cwd``: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with pytest.raises(SystemExit) as exit_info:
                cli_main([str(a) for a in args])
    finally:
        os.chdir(here)
    return exit_info.value.code, out.getvalue(), err.getvalue()


# Runs each command in one capped subprocess, in turn: (status, stdout, stderr) of each
CAP_LINE = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP},) * 2)\n"
_CAPPED = CAP_LINE + """
import contextlib, io, json, sys
from opscope.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            status = exc.code
        except MemoryError:
            status = 'MemoryError'
    results.append([status, out.getvalue()[-3000:], err.getvalue()[-3000:]])
sys.__stdout__.write(json.dumps(results))
"""


def capped_cli(commands, cwd):
    """``opscope`` commands in one subprocess whose address space is capped at MEMORY_CAP."""
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_COLLECTOR"}
    proc = run_in_group([sys.executable, "-c", _CAPPED, json.dumps(commands)], cwd=cwd, env=env,
                        timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [tuple(r) for r in json.loads(proc.stdout)]


def assert_one_line_exit_2(result, *words):
    status, _, err = result
    lines = err.splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("opscope: error: "), \
        (status, err[-2000:])
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- 16: a folder mixing runs ------------------------------------------------------------

def test_rank_0_of_two_runs_in_one_folder_is_refused_naming_both_files(tmp_path):
    rank_trace(tmp_path / "monday.rank0.pt.trace.json", 0, pid=100)
    rank_trace(tmp_path / "tuesday.rank0.pt.trace.json", 0, pid=200, start_us=START_US + 10 ** 11)
    assert_one_line_exit_2(opscope_cli("ranks", ".", cwd=tmp_path), "monday.rank0.pt.trace.json",
                           "tuesday.rank0.pt.trace.json", "two runs", "pid 100", "pid 200")


def test_a_job_folder_mixing_two_runs_is_refused_by_ranks_report_and_merge(tmp_path):
    for rank in (0, 1):
        rank_trace(tmp_path / f"a.rank{rank}.pt.trace.json", rank, pid=100 + rank)
        rank_trace(tmp_path / f"b.rank{rank}.pt.trace.json", rank, pid=200 + rank,
                   start_us=START_US + 10 ** 11)
    for argv in (["ranks", "."], ["report", "."], ["merge", ".", "-o", "m.json"]):
        assert_one_line_exit_2(opscope_cli(*argv, cwd=tmp_path), "a.rank0.pt.trace.json",
                               "b.rank0.pt.trace.json", "two runs")
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "ranks.html").exists()


def test_ranks_that_disagree_on_the_world_size_are_refused(tmp_path):
    rank_trace(tmp_path / "t.rank0.pt.trace.json", 0, pid=100, world=2)
    rank_trace(tmp_path / "t.rank1.pt.trace.json", 1, pid=101, world=4)
    assert_one_line_exit_2(opscope_cli("ranks", ".", cwd=tmp_path), "t.rank0.pt.trace.json",
                           "t.rank1.pt.trace.json", "world size 2 and 4")


def test_windows_of_one_run_still_add_up(tmp_path):
    """The control: two windows of each rank's one process are one run (8 steps a rank)."""
    for rank in (0, 1):
        for window in (0, 1):
            rank_trace(tmp_path / f"t.rank{rank}.w{window}.pt.trace.json", rank, pid=100 + rank,
                       start_us=START_US + window * 10 ** 6)
    status, out, err = opscope_cli("ranks", ".", "--json", cwd=tmp_path)
    assert status == 0, err
    assert [r["steps"] for r in json.loads(out)["ranks"]] == [8, 8]


# -- 17: times that overflow -------------------------------------------------------------

@pytest.mark.parametrize("offset", [2 ** 63 - 1, -2 ** 63, 2 ** 62])
def test_a_huge_clock_offset_is_one_line_exit_2_in_ranks_and_report(tmp_path, offset):
    rank_trace(tmp_path / "t.rank0.pt.trace.json", 0, pid=100)
    rank_trace(tmp_path / "t.rank1.pt.trace.json", 1, pid=101, offset=offset)
    for verb in ("ranks", "report"):
        assert_one_line_exit_2(opscope_cli(verb, ".", cwd=tmp_path), "t.rank1.pt.trace.json",
                               "clock offset", str(offset))


def test_facts_with_times_out_of_range_are_refused_by_the_analysis():
    """Facts from any source (a store's rows included) are checked before any int64 array."""
    far = RankFacts(1, ["s.json"], 2, start_ns=0, end_ns=2 ** 63 + 5)
    with pytest.raises(RankTraceError, match="'s.json': its aligned times are out of range"):
        analyse_ranks([RankFacts(0, ["r.json"], 2, start_ns=0, end_ns=10), far])


# -- 11: rank numbers never size memory --------------------------------------------------

BIG_RANKS = {  # folder -> (file, rank in distributedInfo (None: in the name only), world, words)
    "rank_in_info": ("t.json", 2_000_000_000, None, "rank 2000000000 is over"),
    "rank_in_name": ("t.rank2000000000.pt.trace.json", None, None, "rank 2000000000 is over"),
    "rank_past_world": ("t.json", 2_000_000_000, 2, "rank 2000000000 is not below its world "
                                                     "size 2"),
    "huge_world": ("t.json", 1, 2_000_000_000, "world size 2000000000 is outside"),
}


def _big_rank_folder(folder, name, rank, world):
    folder.mkdir()
    rank_trace(folder / "t.rank0.pt.trace.json", 0, pid=100, world=world)
    rank_trace(folder / name, 0 if rank is None else rank, pid=101, world=world)
    if rank is None:  # the rank comes from the file name only
        doc = json.loads((folder / name).read_text())
        del doc["distributedInfo"]
        (folder / name).write_text(json.dumps(doc))


def test_rank_numbers_never_size_memory_under_a_cap(tmp_path):
    """Ranks of 2,000,000,000 are refused in one line by ranks and report under a 700 MB
    address space (before: both went to 3 GB); the largest world analysed, two ranks of
    MAX_RANKS, fits it, its missing ranks in one short line."""
    commands = []
    for folder, (name, rank, world, _) in BIG_RANKS.items():
        _big_rank_folder(tmp_path / folder, name, rank, world)
        commands += [["ranks", folder], ["report", folder, "-o", f"{folder}.html"]]
    (tmp_path / "largest").mkdir()
    for rank in (0, 1):
        rank_trace(tmp_path / "largest" / f"t.rank{rank}.pt.trace.json", rank, pid=100 + rank,
                   world=MAX_RANKS)
    results = capped_cli(commands + [["ranks", "largest"]], tmp_path)
    for k, (name, _, _, words) in enumerate(BIG_RANKS.values()):
        for result in results[2 * k:2 * k + 2]:
            assert_one_line_exit_2(result, name, words)
    status, out, err = results[-1]
    assert status == 0, err
    assert f"No trace of rank 2-{MAX_RANKS - 1}\n" in out


def test_rank_facts_past_the_bounds_are_refused_by_the_analysis(tmp_path):
    """A store's facts are not read through load_ranks: the analysis checks them too (in a
    capped subprocess: before the fix, this built a list of 2,000,000,000 missing ranks)."""
    code = ("from opscope.analysis.ranks.analyse import analyse_ranks\n"
            "from opscope.analysis.ranks.facts import RankFacts\n"
            "from opscope.load.ranks import RankTraceError\n"
            "try:\n"
            "    analyse_ranks([RankFacts(0), RankFacts(2_000_000_000)])\n"
            "except RankTraceError as exc:\n"
            "    print(exc)\n")
    proc = run_in_group([sys.executable, "-c", CAP_LINE + code], cwd=tmp_path,
                        timeout=TIMEOUT_S)
    assert proc.returncode == 0 and "rank 2000000000 is over" in proc.stdout, proc.stderr[-2000:]


# -- reading goes through opscope.load ---------------------------------------------------

def test_report_of_a_job_folder_holding_a_fifo_names_it_without_hanging(tmp_path):
    for rank in (0, 1):
        rank_trace(tmp_path / f"t.rank{rank}.pt.trace.json", rank, pid=100 + rank)
    os.mkfifo(tmp_path / "z.pt.trace.json")  # no rank in its name: its head would be peeked
    (result,) = capped_cli([["report", "."]], tmp_path)  # a subprocess: a hang is killed
    assert_one_line_exit_2(result, "z.pt.trace.json", "FIFO")


def test_a_json_that_is_no_trace_in_a_job_folder_is_one_line_on_every_core(tmp_path):
    # read by forked workers (--jobs 2): the worker's TraceLoadError reaches the caller whole
    # (it did not unpickle: the pool's result thread died and ranks waited forever)
    for rank in (0, 1):
        rank_trace(tmp_path / f"t.rank{rank}.pt.trace.json", rank, pid=100 + rank)
    (tmp_path / "notes.json").write_text(json.dumps({"lr": 0.1}))
    (result,) = capped_cli([["ranks", ".", "--jobs", "2"]], tmp_path)
    assert_one_line_exit_2(result, "notes.json")
