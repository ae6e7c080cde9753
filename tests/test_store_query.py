"""``opscope query`` and the store's views on real stores: a training run's, and a torchrun job's.

The two-rank job is tests/ranks_workloads/ddp_train.py under torchrun on gloo (as in
tests/test_ranks.py), rank 1 sleeping before each backward; its per-rank traces are written
into one store. Every example query of docs/store.md (``opscope.store.examples``) runs on these
stores, and the straggler query names the sleeping rank. Durations are never asserted.
"""

from __future__ import annotations

import builtins
import csv
import io
import json
import re
from pathlib import Path

import pytest
import torch

import opscope
from opscope.analysis.ranks.facts import load_ranks
from opscope.analysis.ranks.analyse import analyse_ranks
from opscope.cli.main import main as cli_main
from opscope.store import connect
from opscope.store.connect import VIEWS
from opscope.store.examples import EXAMPLE_QUERIES
from opscope.store.write import StoreWriter
from test_ranks import run_job

STORE_DOC = Path(__file__).resolve().parent.parent / "docs" / "store.md"


def query(capsys, *argv) -> tuple:
    """(exit status, stdout, stderr) of ``opscope query ...`` run in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli_main(["query", *map(str, argv)])
    out, err = capsys.readouterr()
    return info.value.code, out, err


@pytest.fixture(scope="module")
def training_store(tmp_path_factory):
    """One rank, two windows of a small model with modules, memory, shapes and stacks."""
    store = tmp_path_factory.mktemp("training") / "store"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=1, repeat=2),
                         on_trace_ready=opscope.store_handler(str(store)), record_shapes=True,
                         profile_memory=True, with_stack=True, with_modules=True) as prof:
        for _ in range(4):
            model(torch.randn(5, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    return store


@pytest.fixture(scope="module")
def job_store(tmp_path_factory):
    """(store, rank traces folder) of a 2-rank DDP job, rank 1 the straggler."""
    folder = tmp_path_factory.mktemp("job")
    run_job(folder, 2, "--sleep-rank", "1", "--sleep-ms", "200")
    store = folder / "store"
    with StoreWriter(store) as writer:
        facts = load_ranks(folder, visit=lambda rank, path, s: writer.write_window(s, rank=rank))
        for f in facts:
            writer.write_collectives(f.rank, f)
    return store, folder


def test_every_view_answers_with_its_columns(training_store):
    con = connect(training_store)
    for view in VIEWS:
        columns = [c[0] for c in con.sql(f'DESCRIBE "{view}"').fetchall()]
        assert "rank" in columns, view
    assert con.sql("SELECT count(*) FROM sessions").fetchall() == [(2,)]


@pytest.mark.parametrize("name", sorted(EXAMPLE_QUERIES))
def test_readme_examples_run_on_both_stores(name, training_store, job_store, capsys):
    for store in (training_store, job_store[0]):
        status, out, err = query(capsys, store, EXAMPLE_QUERIES[name], "--format", "json")
        assert status == 0, err
        rows = json.loads(out)
        assert isinstance(rows, list)
        needs = {"straggler per step": job_store[0], "memory peak per category": training_store,
                 "per-module time": training_store}
        if needs.get(name, store) == store:
            assert rows, (name, store)


def test_straggler_per_step_names_the_sleeping_rank(job_store, capsys):
    store, folder = job_store
    status, out, _ = query(capsys, store, EXAMPLE_QUERIES["straggler per step"], "--format",
                           "json")
    rows = json.loads(out)
    assert status == 0 and len(rows) >= 3
    assert all(r["straggler"] == 1 for r in rows)
    analysis = analyse_ranks(load_ranks(folder))
    assert [s.rank for s in analysis.stragglers][:1] == [1]


def test_collective_ranks_match_the_ranks_analysis(job_store):
    store, folder = job_store
    analysis = analyse_ranks(load_ranks(folder))
    con = connect(store)
    matched = con.sql("SELECT count(DISTINCT (pg, seq)) FROM collective_ranks "
                      "WHERE ranks = 2").fetchall()[0][0]
    assert matched == len(analysis.collectives)
    waits = dict(con.sql("SELECT rank, sum(wait_ns) FROM collective_ranks GROUP BY rank")
                 .fetchall())
    assert waits[0] > waits[1]  # rank 0 waits for the straggler


def test_formats_table_csv_json(training_store, capsys):
    sql = "SELECT name, count(*) AS n FROM events GROUP BY name ORDER BY n DESC, name LIMIT 5"
    status, table, _ = query(capsys, training_store, sql)
    assert status == 0
    lines = table.splitlines()
    assert re.fullmatch(r"name +n", lines[0]) and set(lines[1]) == {"-", " "}
    assert len(lines) == 7 and all(len(line) <= len(lines[1]) for line in lines)
    status, text, _ = query(capsys, training_store, sql, "--format", "csv")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["name", "n"] and len(rows) == 6
    status, text, _ = query(capsys, training_store, sql, "--format", "json")
    doc = json.loads(text)
    assert [r["name"] for r in doc] == [r[0] for r in rows[1:]]
    assert [str(r["n"]) for r in doc] == [r[1] for r in rows[1:]]


def test_bad_input_exits_2_with_one_line(training_store, tmp_path, capsys):
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("x")
    cases = [(training_store, "SELEC 1", "query failed"),
             (training_store, "SELECT nope FROM events", "query failed"),
             (tmp_path / "missing", "SELECT 1", "no such folder"),
             (tmp_path / "trace.json", "SELECT 1", "not an opscope store"),
             (tmp_path / "folder", "SELECT 1", "not an opscope store")]
    for store, sql, words in cases:
        status, out, err = query(capsys, store, sql)
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and words in err and err.startswith("opscope: error:")
    status, _, err = query(capsys, training_store, "SELECT 1", "--format", "xml")
    assert status == 2 and err.count("\n") == 1
    status, _, err = query(capsys, training_store, "SELECT 1", "--memory-limit", "lots")
    assert status == 2 and err.count("\n") == 1 and "memory_limit 'lots'" in err
    status, out, _ = query(capsys, training_store, "SELECT 1 AS one", "--memory-limit", "200MB")
    assert status == 0 and out.split() == ["one", "---", "1"]


def test_a_corrupt_file_is_one_line(tmp_path, capsys):
    with opscope.profile() as prof:
        torch.ones(2).add(1)
    prof.export_store(str(tmp_path / "s"))
    (tmp_path / "s" / "stacks" / "rank=0" / "window=0" / "part-0.parquet").write_bytes(b"junk")
    status, _, err = query(capsys, tmp_path / "s", "SELECT count(*) FROM events")
    assert status == 2 and err.count("\n") == 1 and "'stacks'" in err


def test_without_duckdb_the_install_line(training_store, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_duckdb(name, *args, **kwargs):
        if name.split(".")[0] == "duckdb":
            raise ImportError("No module named 'duckdb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_duckdb)
    status, _, err = query(capsys, training_store, "SELECT 1")
    assert status == 2 and "pip install 'opscope[store]'" in err and err.count("\n") == 1


def test_store_doc_sql_blocks_are_the_tested_examples():
    """docs/store.md shows each of EXAMPLE_QUERIES, and only those, in its ```sql blocks
    (so every query it shows is run by the test above)."""
    text = STORE_DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    assert sorted(b.strip() for b in blocks) == sorted(q.strip() for q in EXAMPLE_QUERIES.values())


HANDLER_JOB = """\
import sys, time, torch, torch.distributed as dist, opscope
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with opscope.profile(record_shapes=True, on_trace_ready=opscope.store_handler(sys.argv[1]),
                     schedule=opscope.schedule(wait=0, warmup=1, active=2, repeat=2)) as prof:
    for _ in range(6):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
time.sleep(0.1)  # gloo's workers drop the last tensors first (pytorch #190489)
dist.destroy_process_group()
"""


def test_store_handler_under_torchrun_one_store_for_every_rank(tmp_path):
    import os
    import sys

    from subprocesses import run_in_group
    from test_ranks import REPO, free_port

    script = tmp_path / "job.py"
    script.write_text(HANDLER_JOB)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    done = run_in_group([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                         "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                         str(script), str(tmp_path / "store")],
                        timeout=240, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "store_handler" not in done.stderr.replace(str(tmp_path), "")  # the test's own path
    from opscope.store import windows

    assert windows(tmp_path / "store") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    con = connect(tmp_path / "store")
    per_window = con.sql('SELECT rank, "window", count(*) FROM collectives GROUP BY ALL '
                         'ORDER BY ALL').fetchall()
    assert [(r, w) for r, w, _ in per_window] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert con.sql("SELECT count(*) FROM collective_ranks WHERE ranks <> 2").fetchall() == [(0,)]
    kinds = con.sql("SELECT DISTINCT kind FROM steps").fetchall()
    assert kinds == [("profiler_step",)]
