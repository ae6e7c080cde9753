"""The verbs read stores: ``opscope table/diff/ranks/report STORE`` equal the same verbs on
the traces the store was made from.

The oracle is the verb's own output on the trace (or the folder of rank traces): a store
is written from the loaded traces with ``StoreWriter`` (as ``opscope convert`` does), and
the text or JSON must be the same character for character. The aggregations run in
DuckDB (``opscope.store.aggregate_sql``, ``ranks_sql``). Multi-rank jobs are the
multi-rank tests' real torchrun + gloo jobs (``test_ranks.run_job``) and small synthetic
rank traces. Output checks call the CLI in-process; errors must be one line, exit 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import opscope  # noqa: E402
from opscope.analysis.build import load_session  # noqa: E402
from opscope.analysis.ranks.facts import session_rank  # noqa: E402
from opscope.load.ranks import trace_paths  # noqa: E402
from opscope.cli.main import main as cli_main  # noqa: E402
from opscope.store.write import StoreWriter  # noqa: E402

from test_ranks import run_job  # noqa: E402
from workloads import mlp_step_fn, torch_profiler_trace  # noqa: E402

ALL_OPTIONS = dict(record_shapes=True, with_stack=True, profile_memory=True, with_flops=True,
                   with_modules=True)


def run_cli(capsys, *args: str):
    """``opscope ARGS`` in-process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli_main(list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def assert_one_line_error(result, *words: str) -> None:
    code, out, err = result
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opscope: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


def write_store(store: Path, traces) -> Path:
    """A store of the traces, each its rank's next window (rank 0 when it names none)."""
    with StoreWriter(str(store)) as writer:
        for path in traces:
            session = load_session(str(path))
            rank = session_rank(session, str(path))
            writer.write_window(session, rank=0 if rank is None else rank)
    return store


def profile_trace(path: Path, steps: int = 2, **options) -> Path:
    step = mlp_step_fn()
    step()
    with opscope.profile(**options) as prof:
        for _ in range(steps):
            step()
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A trace of MLP steps with every option on, and its store."""
    folder = tmp_path_factory.mktemp("store_mlp")
    trace = profile_trace(folder / "mlp.pt.trace.json", **ALL_OPTIONS)
    return trace, write_store(folder / "mlp.store", [trace])


# -- table ------------------------------------------------------------------------------

TABLE_ARGS = [
    [], ["--limit", "-1"], ["--sort", "cpu_time_total", "--limit", "7"], ["--sort", "count"],
    ["--sort", "flops"], ["--sort", "self_cpu_memory_usage", "--limit", "-1"],
    ["--sort", "cpu_memory_usage"], ["--group-by", "shape", "--limit", "-1"],
    ["--group-by", "stack:1"], ["--group-by", "stack:4", "--sort", "count"],
    ["--group-by", "module"], ["--group-by", "module", "--sort", "self_cpu_time_total"],
]


@pytest.mark.parametrize("args", TABLE_ARGS, ids=" ".join)
def test_table_of_a_store_is_the_traces(mlp, capsys, args):
    trace, store = mlp
    code, expected, err = run_cli(capsys, "table", str(trace), *args)
    assert code == 0, err
    code, out, err = run_cli(capsys, "table", str(store), *args)
    assert code == 0, err
    assert out == expected


@pytest.mark.parametrize("options", [{}, dict(record_shapes=True), dict(profile_memory=True),
                                     dict(with_flops=True), dict(with_stack=True)],
                         ids=lambda o: ",".join(o) or "none")
def test_table_equal_for_each_option(tmp_path, capsys, options):
    trace = profile_trace(tmp_path / "t.json", steps=1, **options)
    store = write_store(tmp_path / "s", [trace])
    for args in ([], ["--limit", "-1", "--sort", "cpu_time_total"]):
        assert run_cli(capsys, "table", str(store), *args) == \
            run_cli(capsys, "table", str(trace), *args)


def test_torch_profiler_trace_in_a_store(tmp_path, capsys):
    path = tmp_path / "torch.json"
    torch_profiler_trace(path)
    store = write_store(tmp_path / "s", [path])
    args = ["--limit", "-1", "--sort", "cpu_time_total"]
    assert run_cli(capsys, "table", str(store), *args) == \
        run_cli(capsys, "table", str(path), *args)


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    """Rank 0 with two windows (1 and 3 steps); rank 1 with one (2 steps)."""
    folder = tmp_path_factory.mktemp("store_windows")
    traces = [profile_trace(folder / "w0.json", steps=1),
              profile_trace(folder / "w1.json", steps=3),
              profile_trace(folder / "r1.rank1.json", steps=2)]
    return traces, write_store(folder / "s", traces)


def step_calls(text: str) -> int:
    """The '# of Calls' of the optimizer step's row (one per train step)."""
    (row,) = [line.split() for line in text.splitlines()
              if line.split()[:1] == ["Optimizer.step#SGD.step"]]
    return int(row[-1])


def test_store_windows_default_rank_window_and_all(windows, capsys):
    (w0, w1, r1), store = windows
    table = lambda *args: run_cli(capsys, "table", *args)  # noqa: E731
    # default: the lowest rank's newest window, as a trace folder's newest trace
    assert table(str(store)) == table(str(w1))
    assert table(str(store), "--window", "0") == table(str(w0))
    assert table(str(store), "--rank", "1") == table(str(r1))
    assert table(str(store), "--rank", "1", "--window", "0") == table(str(r1))
    # all: the windows added up
    code, out, _ = table(str(store), "--window", "all", "--limit", "-1")
    assert code == 0 and step_calls(out) == 1 + 3
    code, out, _ = table(str(store), "--rank", "all", "--window", "all", "--limit", "-1")
    assert code == 0 and step_calls(out) == 1 + 3 + 2
    code, out, _ = table(str(store), "--rank", "all", "--limit", "-1")  # each rank's newest
    assert code == 0 and step_calls(out) == 3 + 2


@pytest.mark.parametrize("args, words", [
    (["--rank", "7"], ["no rank 7", "its ranks: 0, 1"]),
    (["--window", "9"], ["no window 9"]),
    (["--rank", "x"], ["--rank", "'x'"]),
    (["--window", "-1"], ["--window"]),
    (["--window", "all", "--group-by", "module"], ["--group-by", "one window"]),
    (["--group-by", "shape"], ["no input shapes", "rank 0, window 1"]),
    (["--group-by", "stack:2"], ["no Python stacks"]),
    (["--sort", "flops"], ["--sort", "no FLOPs"]),
    (["--sort", "self_cpu_memory_usage"], ["--sort", "no memory"]),
])
def test_store_table_errors_are_one_line(windows, capsys, args, words):
    _, store = windows
    assert_one_line_error(run_cli(capsys, "table", str(store), *args), *words)


def test_window_options_need_a_store(windows, capsys):
    (w0, _, _), _ = windows
    assert_one_line_error(run_cli(capsys, "table", str(w0), "--rank", "0"),
                          "--rank", "not a store")


def test_a_damaged_store_is_one_line(windows, tmp_path, capsys):
    import shutil

    _, store = windows
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    part = copy / "events" / "rank=0" / "window=1" / "part-0.parquet"
    part.write_bytes(b"PAR1 not parquet at all PAR1")
    assert_one_line_error(run_cli(capsys, "table", str(copy)), str(copy))
    assert_one_line_error(run_cli(capsys, "ranks", str(copy)), str(copy))


def test_without_duckdb_the_error_says_how_to_install(windows, capsys, monkeypatch):
    _, store = windows
    monkeypatch.setitem(sys.modules, "duckdb", None)
    assert_one_line_error(run_cli(capsys, "table", str(store)), "pip install 'opscope[store]'")


# -- diff -------------------------------------------------------------------------------

def test_diff_of_stores_is_the_diff_of_their_traces(tmp_path, capsys):
    traces = [profile_trace(tmp_path / f"t{k}.json", steps=k + 1, with_modules=True)
              for k in range(2)]
    stores = [write_store(tmp_path / f"s{k}", [t]) for k, t in enumerate(traces)]
    names = {f"{s} (rank 0, window 0 ({t.name}))": str(t) for s, t in zip(stores, traces)}

    def diff(a, b):
        code, out, err = run_cli(capsys, "diff", str(a), str(b), "--limit", "-1")
        assert code == 0, err
        for store_name, trace_name in names.items():
            out = out.replace(store_name, trace_name)
        return out

    expected = diff(*traces)
    assert "Modules" in expected or "module" in expected.lower()
    assert diff(*stores) == expected
    assert diff(traces[0], stores[1]) == expected
    assert diff(stores[0], traces[1]) == expected


# -- ranks and report -------------------------------------------------------------------

@pytest.fixture(scope="module", params=["opscope", "torch"])
def job(request, tmp_path_factory):
    """The multi-rank tests' job (2 ranks, rank 1 sleeps) and its store."""
    folder = tmp_path_factory.mktemp(f"store_job_{request.param}")
    run_job(folder / "traces", 2, "--sleep-rank", "1", "--sleep-ms", "200",
            *(["--profiler", "torch"] if request.param == "torch" else []))
    traces = folder / "traces"
    return traces, write_store(folder / "job.store", trace_paths(str(traces)))


def test_ranks_json_of_a_store_is_the_folders(job, capsys):
    traces, store = job
    code, expected, err = run_cli(capsys, "ranks", str(traces), "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "ranks", str(store), "--json")
    assert code == 0, err
    assert out == expected
    doc = json.loads(out)
    assert doc["world_size"] == 2 and doc["collectives"] and doc["stragglers"][0]["rank"] == 1


def test_ranks_text_of_a_store_is_the_folders(job, capsys):
    traces, store = job
    assert run_cli(capsys, "ranks", str(store), "--limit", "-1") == \
        run_cli(capsys, "ranks", str(traces), "--limit", "-1")


def named_lanes(timeline: dict) -> dict:
    """A timeline's data with each lane's name ids replaced by the names.

    A session read back from a store may intern its names in another order (a torch
    trace's hidden python_function records come last), so ids differ, names do not.
    """
    names = timeline.pop("names")
    for group in timeline.get("groups", [timeline]):
        for lane in group["lanes"]:
            lane["name"] = [names[k] for k in lane["name"]]
    return timeline


def same_report(data: dict) -> dict:
    data["timeline"] = named_lanes(data["timeline"])
    if "ranks" in data:
        data["ranks"]["timeline"] = named_lanes(data["ranks"]["timeline"])
    return data


def test_job_report_of_a_store_is_the_folders(job):
    from opscope.report.data import job_data, job_report_data
    from opscope.store import connect
    from opscope.store.ranks_sql import load_store_job

    traces, store = job
    paths = trace_paths(str(traces))
    expected = job_report_data(paths, title="t")
    con = connect(str(store))
    found = job_data(lambda visit: load_store_job(str(store), con, visit), len(paths),
                     title="t")
    assert same_report(found) == same_report(expected)


def test_report_cli_on_a_store(job, tmp_path, capsys):
    traces, store = job
    code, _, err = run_cli(capsys, "report", str(store))
    assert code == 0 and "job.store.html" in err
    page = (store.parent / "job.store.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '"ranks"' in page
    code, _, err = run_cli(capsys, "report", str(store), "--rank", "1", "-o", str(tmp_path))
    assert code == 0 and (tmp_path / "job.store.html").exists()
    assert_one_line_error(run_cli(capsys, "report", str(store), "--window", "all",
                                  "--rank", "all"), "one window")


def test_single_window_report_is_the_traces(mlp, tmp_path):
    from opscope.report.data import report_data
    from opscope.store import load_store_session

    trace, store = mlp
    expected = report_data(load_session(str(trace)), title="t")
    assert same_report(report_data(load_store_session(str(store)), title="t")) == \
        same_report(expected)


def rank_trace(folder: Path, name: str, rank: int, start_us: int, collectives) -> Path:
    """A small torch-format rank trace: one step at ``start_us``, then ``collectives``."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1,
               "tid": 1, "ts": start_us, "dur": 1000}]
    ranges = {"allreduce": "gloo:all_reduce", "broadcast": "gloo:broadcast"}
    for k, (kind, floats) in enumerate(collectives):
        ts = start_us + 100 + 200 * k
        events.append({"ph": "X", "cat": "cpu_op", "name": f"c10d::{kind}_", "pid": 1,
                       "tid": 1, "ts": ts, "dur": 5})
        events.append({"ph": "X", "cat": "user_annotation", "name": ranges[kind], "pid": 1,
                       "tid": 2, "ts": ts + 6 + 20 * rank, "dur": 50 - 20 * rank,
                       "args": {"Input type": ["float"], "Input Dims": [[floats]]}})
    doc = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
           "baseTimeNanoseconds": 10 ** 18, "traceEvents": events}
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


def test_ranks_of_a_store_with_windows_and_a_desync(tmp_path, capsys):
    folder = tmp_path / "traces"
    folder.mkdir()
    for rank in range(2):
        rank_trace(folder, f"t.rank{rank}.step0.json", rank, 0, [("allreduce", 8)])
        late = [("allreduce", 8)] + ([("broadcast", 3)] if rank else []) + [("allreduce", 8)]
        rank_trace(folder, f"t.rank{rank}.step1.json", rank, 5000, late)
    store = write_store(tmp_path / "s", trace_paths(str(folder)))
    code, expected, _ = run_cli(capsys, "ranks", str(folder), "--json")
    assert code == 0
    assert run_cli(capsys, "ranks", str(store), "--json") == (0, expected, "")
    doc = json.loads(expected)
    assert [r["steps"] for r in doc["ranks"]] == [2, 2]
    (desync,) = doc["desync"]
    assert (desync["seq"], desync["ranks"]) == (2, {"0": "allreduce", "1": "broadcast"})


def test_ranks_of_a_store_without_ranks_is_one_line(tmp_path, capsys):
    store = tmp_path / "s"
    StoreWriter(str(store)).close()
    assert_one_line_error(run_cli(capsys, "ranks", str(store)), str(store))
    assert_one_line_error(run_cli(capsys, "report", str(store)), str(store))


def test_a_folder_that_is_not_a_store(tmp_path, capsys):
    os.makedirs(tmp_path / "empty")
    assert_one_line_error(run_cli(capsys, "table", str(tmp_path / "empty")), "empty")
