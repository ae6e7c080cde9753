"""``opscope convert``: traces into a store, one at a time, in bounded memory.

Synthetic rank traces in torch.profiler's format (steps, ops with inputs, an
allreduce per step with a worker-thread range, rank 1 arriving late) are
converted; the store must hold each trace's session (as ``load_session``
builds it) as one window of its rank, windows in time order, the rank's
collectives keyed, and DuckDB must name the late rank. ``--jobs 2`` writes
the same store. Bad input exits 2 with one line and leaves nothing behind;
memory does not grow with the number of ranks.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from opscope.analysis.build import load_session  # noqa: E402
from opscope.analysis.ranks.facts import load_ranks  # noqa: E402
from opscope.cli import convert as convert_verb  # noqa: E402
from opscope.cli import main as cli_main  # noqa: E402
from opscope.store import StoreError, connect  # noqa: E402
from opscope.store.convert import convert  # noqa: E402

from memory_peak import traced_peak  # noqa: E402

LATE_RANK = 1
_X = ('{"ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d, "ts": %.3f, '
      '"dur": %.3f, "args": {"External id": 1%s}}')
_DIMS = ', "Input Dims": [[4, 8], [8]], "Input type": ["float", "float"]'


def rank_trace(path: str, rank: int, world: int, steps: int = 3, ops: int = 20,
               t0: float = 1000.0) -> None:
    """One rank's trace: ``steps`` ProfilerSteps of ``ops`` ops and one allreduce each."""
    pid, main, worker = 100 + rank, 100 + rank, 900 + rank
    events = []
    step_us = ops * 10 + 400
    for k in range(steps):
        start = t0 + k * step_us
        events.append(_X % ("user_annotation", f"ProfilerStep#{k}", pid, main, start,
                            step_us - 1, ""))
        for i in range(ops):
            events.append(_X % ("cpu_op", ("aten::mm", "aten::add")[i % 2], pid, main,
                                start + 5 + 10 * i, 5, _DIMS))
        arrive = start + ops * 10 + 20 + (150 if rank == LATE_RANK else 0)
        end = start + ops * 10 + 20 + 150 + 100
        events.append(_X % ("cpu_op", "c10d::allreduce_", pid, main, arrive, 3, ""))
        events.append(_X % ("user_annotation", "gloo:all_reduce", pid, worker, arrive + 1,
                            end - arrive - 1, ""))
    info = {"backend": "gloo", "rank": rank, "world_size": world,
            "pg_config": [{"pg_name": "0", "ranks": list(range(world))}]}
    with open(path, "w") as f:
        f.write(json.dumps({"schemaVersion": 1, "distributedInfo": info,
                            "baseTimeNanoseconds": 1_790_000_000_000_000_000})[:-1])
        f.write(', "traceEvents": [\n' + ",\n".join(events) + "\n]}\n")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A folder of 4 rank traces."""
    folder = tmp_path_factory.mktemp("job")
    for rank in range(4):
        rank_trace(str(folder / f"train.rank{rank}.pt.trace.json"), rank, 4)
    return str(folder)


def run_cli(capsys, *argv: str, monkeypatch=None):
    """``opscope ARGV`` in-process (convert registered where cli/main does not list it)."""
    if convert_verb not in cli_main.VERBS:
        monkeypatch.setattr(cli_main, "VERBS", cli_main.VERBS + (convert_verb,))
    with pytest.raises(SystemExit) as info:
        cli_main.main(list(argv))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_each_trace_becomes_one_window_of_its_rank(job, tmp_path):
    store = str(tmp_path / "s")
    result = convert([job], store)
    assert result.ranks == [0, 1, 2, 3] and result.windows == 4
    con = connect(store)
    counts = dict(con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall())
    for rank in range(4):
        session = load_session(os.path.join(job, f"train.rank{rank}.pt.trace.json"))
        assert counts[rank] == len(session.table)
    names = con.execute("SELECT DISTINCT name FROM events ORDER BY name").fetchall()
    assert ("aten::mm",) in names and ("ProfilerStep#0",) in names
    assert con.execute('SELECT count(*) FROM sessions WHERE "window" = 0').fetchone()[0] == 4
    assert os.listdir(tmp_path) == ["s"]  # no temp folder left


def test_collectives_are_keyed_and_name_the_late_rank(job, tmp_path):
    store = str(tmp_path / "s")
    convert([job], store)
    con = connect(store)
    calls = sum(len(f.calls) for f in load_ranks(job))
    assert con.execute("SELECT count(*) FROM collectives").fetchone()[0] == calls
    late = con.execute("SELECT rank FROM collective_ranks GROUP BY rank "
                   "ORDER BY avg(late_ns) DESC LIMIT 1").fetchone()[0]
    assert late == LATE_RANK


def test_jobs_write_the_same_store(job, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    convert([job], one)
    assert convert([job], two, jobs=2).ranks == [0, 1, 2, 3]
    sql = ("SELECT rank, \"window\", name, start_ns, end_ns, self_ns, input_id FROM events "
           "ORDER BY ALL")
    assert connect(one).execute(sql).fetchall() == connect(two).execute(sql).fetchall()
    sql = "SELECT rank, pg, seq, arrival_ns FROM collectives ORDER BY ALL"
    assert connect(one).execute(sql).fetchall() == connect(two).execute(sql).fetchall()


def test_with_jobs_this_process_converts_ranks_too(tmp_path):
    """``--jobs 2``: this process takes ranks as the worker does (from a queue it had filled,
    its ``get_nowait`` once found none while a worker held the queue's lock, and 1,024
    ranks ran on one core)."""
    folder = tmp_path / "traces"
    folder.mkdir()
    for rank in range(8):
        rank_trace(str(folder / f"t.rank{rank}.json"), rank, 8)
    here = []  # the traces this process converted (``done`` is called here only)
    result = convert([str(folder)], str(tmp_path / "s"), jobs=2, done=here.append)
    assert result.ranks == list(range(8))
    assert 1 <= len(here) <= 8 and len(set(here)) == len(here)


def test_a_ranks_windows_are_in_time_order_not_name_order(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    rank_trace(str(folder / "b.rank0.json"), 0, 1, t0=1000.0)  # earlier, later name
    rank_trace(str(folder / "a.rank0.json"), 0, 1, t0=900_000.0)
    store = str(tmp_path / "s")
    convert([str(folder)], store)
    rows = connect(store).execute('SELECT "window", window_name FROM sessions '
                              'ORDER BY "window"').fetchall()
    assert rows == [(0, "b.rank0.json"), (1, "a.rank0.json")]


def test_an_existing_store_gets_more_windows(job, tmp_path):
    store = str(tmp_path / "s")
    one = os.path.join(job, "train.rank0.pt.trace.json")
    convert([one], store)
    convert([one], store)
    assert connect(store).execute('SELECT DISTINCT "window" FROM sessions ORDER BY 1'
                              ).fetchall() == [(0,), (1,)]


def test_cli_converts_and_summarises(job, tmp_path, capsys, monkeypatch):
    store = str(tmp_path / "s")
    code, out, err = run_cli(capsys, "convert", job, "-o", store, monkeypatch=monkeypatch)
    assert code == 0 and out == ""
    assert "4 window(s) of 4 rank(s)" in err


@pytest.mark.parametrize("case", ["file", "folder", "missing", "bad_trace", "jobs"])
def test_bad_input_is_one_line_and_exit_2(job, tmp_path, capsys, monkeypatch, case):
    out = str(tmp_path / "out")
    inputs = [job]
    extra = []
    if case == "file":
        open(out, "w").close()
    elif case == "folder":
        os.makedirs(os.path.join(out, "mine"))
    elif case == "missing":
        inputs = [str(tmp_path / "nothing.json")]
    elif case == "bad_trace":
        bad = tmp_path / "bad.rank0.json"
        bad.write_text('{"traceEvents": [{"ph": "X", "ts": "soon"')
        inputs = [str(bad)]
    else:
        extra = ["--jobs", "0"]
    code, _, err = run_cli(capsys, "convert", *inputs, "-o", out, *extra,
                           monkeypatch=monkeypatch)
    assert code == 2
    assert err.startswith("opscope: error: ") and err.count("\n") == 1
    if case in ("missing", "bad_trace"):
        assert not os.path.exists(out)
        assert [n for n in os.listdir(tmp_path) if n.startswith(".out")] == []
    if case == "folder":
        assert os.listdir(out) == ["mine"]


def test_a_symlinked_destination_is_refused(job, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    with pytest.raises(StoreError, match="symlink"):
        convert([job], str(tmp_path / "link"))


def test_memory_does_not_grow_with_the_number_of_ranks(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for rank in range(6):
        rank_trace(str(folder / f"t.rank{rank}.json"), rank, 6, steps=10, ops=300)
    paths = sorted(str(p) for p in folder.iterdir())
    convert(paths[:1], str(tmp_path / "warm"))  # imports and caches outside the measurement
    one = traced_peak(lambda: convert(paths[:1], str(tmp_path / "one")))
    six = traced_peak(lambda: convert(paths, str(tmp_path / "six")))
    assert six < 1.5 * one
