"""The SQL store only answers about the store (issue 28, findings 9 to 15).

A store may come from someone else: its content and its path names are not trusted,
while the SQL is the user's own. These tests build every store they read in tmp_path:
SQL sees only the store's files (no other file, no network, no setting turned back),
a folder name with glob characters reads only its own files, a Parquet footer that
declares more rows than the store holds is refused, deeply nested JSON is one line,
an append keeps the earlier windows' collectives, two writers lose no window, a window
is visible only when whole, and a killed convert's temp folder goes with the next one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from opscope.cli import main as cli_main  # noqa: E402
from opscope.store import StoreError, connect  # noqa: E402
from opscope.store.convert import convert  # noqa: E402

from test_store_convert import rank_trace  # noqa: E402


def collectives_per_window(store) -> list:
    return connect(store).sql('SELECT "window", count(*) FROM collectives GROUP BY ALL '
                              'ORDER BY ALL').fetchall()


def test_an_append_keeps_the_earlier_windows_collectives(tmp_path):
    rank_trace(str(tmp_path / "a.rank0.json"), 0, 1, t0=1000.0)
    rank_trace(str(tmp_path / "b.rank0.json"), 0, 1, t0=900_000.0)
    convert([str(tmp_path / "a.rank0.json")], str(tmp_path / "store"))
    assert collectives_per_window(tmp_path / "store") == [(0, 3)]
    convert([str(tmp_path / "b.rank0.json")], str(tmp_path / "store"))
    assert collectives_per_window(tmp_path / "store") == [(0, 3), (1, 3)]


def tiny_store(path) -> str:
    """A store of one rank, two small windows (no torch run: a synthetic session)."""
    from opscope.analysis.build import build_session
    from opscope.model.records import NO_INPUTS, SCOPE_USER, RawSession, records_from_rows
    from opscope.store.write import StoreWriter

    rows = [(0, 100, -1, 0, 0, 0, 1, NO_INPUTS, SCOPE_USER, 0, 0),
            (10, 60, -1, 1, 0, 0, 1, NO_INPUTS, 0, 0, 0),
            (60, 90, -1, 2, 0, 0, 1, NO_INPUTS, 0, 0, 0)]
    with StoreWriter(path) as writer:
        for k in range(2):
            raw = RawSession(records_from_rows(rows), [], [7],
                             ["ProfilerStep#1", "aten::mm", "aten::add"], 0, 100, k * 1000)
            writer.write_window(build_session(raw))
    return str(path)


def run_verb(capsys, *argv) -> tuple:
    """(exit status, stdout, stderr) of ``opscope ARGV`` run in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli_main.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return info.value.code, out, err


def set_sessions_field(store: str, field: str, text: str) -> None:
    """Put ``text`` into ``field`` of every sessions row of ``store``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for w in (0, 1):
        path = os.path.join(store, "sessions", "rank=0", f"window={w}", "part-0.parquet")
        table = pq.read_table(path)
        i = table.schema.get_field_index(field)
        pq.write_table(table.set_column(i, table.schema.field(i), pa.array([text])), path)


DEEP = "[" * 200_000 + "]" * 200_000


@pytest.mark.parametrize("field", ["marker", "extras", "metadata", "options", "rank_facts"])
def test_deeply_nested_json_is_one_line_in_every_verb(field, tmp_path, capsys):
    store = tiny_store(tmp_path / "store")
    if field == "marker":
        (tmp_path / "store" / "opscope-store.json").write_text(DEEP[:30_000] + DEEP[-30_000:])
    else:
        set_sessions_field(store, field, DEEP)
    for verb in (["query", store, "SELECT count(*) FROM events"], ["table", store],
                 ["report", store, "-o", tmp_path / "r.html"], ["ranks", store]):
        status, _, err = run_verb(capsys, *verb)
        assert "Traceback" not in err and "RecursionError" not in err
        assert status == 0 or (status == 2 and err.count("\n") == 1), (verb[0], err)


# ``opscope convert`` in a child that stops (sleeps) right after writing ``table`` of
# ``window``: the test kills it there, as a crash or kill -9 in the middle would
PAUSED_CONVERT = """\
import sys, time
from opscope.store import write
real = write.StoreWriter.write_files
def write_files(self, table, files, rank, window=None):
    real(self, table, files, rank, window)
    if (table, window) == (sys.argv[1], int(sys.argv[2])):
        print("paused", flush=True)
        time.sleep(600)
write.StoreWriter.write_files = write_files
from opscope.cli.main import main
sys.exit(main(sys.argv[3:]))
"""


def kill_convert_after(table: str, window: int, *argv) -> None:
    """Run ``opscope convert ARGV``, SIGKILL its process group once ``table`` of
    ``window`` is written (never asserting how long that takes)."""
    import select

    proc = subprocess.Popen([sys.executable, "-c", PAUSED_CONVERT, table, str(window),
                             "convert", *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 240)
        line = proc.stdout.readline() if ready else ""
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    assert line == "paused\n", err[-2000:]
    assert proc.returncode == -signal.SIGKILL


def test_a_window_killed_half_written_is_not_in_the_views(tmp_path):
    from opscope.store import windows

    rank_trace(str(tmp_path / "a.rank0.json"), 0, 1, t0=1000.0)
    rank_trace(str(tmp_path / "b.rank0.json"), 0, 1, t0=900_000.0)
    store = tmp_path / "store"
    convert([str(tmp_path / "a.rank0.json")], str(store))
    before = connect(store).sql('SELECT "window", count(*) FROM events GROUP BY ALL').fetchall()
    kill_convert_after("events", 1, tmp_path / "b.rank0.json", "-o", store)
    assert (store / "events" / "rank=0" / "window=1" / "part-0.parquet").is_file()
    assert windows(store) == [(0, 0)]
    con = connect(store)
    for view in ("events", "inputs", "stacks", "memory", "ops", "steps"):
        assert con.sql(f'SELECT DISTINCT "window" FROM {view}').fetchall() in ([], [(0,)])
    assert con.sql('SELECT "window", count(*) FROM events GROUP BY ALL').fetchall() == before
    convert([str(tmp_path / "b.rank0.json")], str(store))  # the next append writes it whole
    assert windows(store) == [(0, 0), (0, 1)]
    assert collectives_per_window(store) == [(0, 3), (1, 3)]


def test_the_next_convert_removes_a_killed_converts_temp_folder(tmp_path):
    rank_trace(str(tmp_path / "a.rank0.json"), 0, 1)
    kill_convert_after("events", 0, tmp_path / "a.rank0.json", "-o", tmp_path / "new.store")
    left = [n for n in os.listdir(tmp_path) if n.startswith(".new.store.convert-")]
    assert len(left) == 1 and not (tmp_path / "new.store").exists()
    mine = tmp_path / ".new.store.convert-elsewhere-1-abcdefgh"  # another host's: kept
    mine.mkdir()
    link = tmp_path / f".new.store.convert-{left[0].split('-')[1]}-999999999-link"
    link.symlink_to(mine)  # a symlink named like one: not followed, kept
    convert([str(tmp_path / "a.rank0.json")], str(tmp_path / "new.store"))
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".new.store")) == \
        sorted([mine.name, link.name])
    assert (tmp_path / "new.store" / "opscope-store.json").is_file()


@pytest.fixture(scope="module")
def store_and_files(tmp_path_factory):
    """(a store, a folder beside it holding a secret file and a database path)."""
    folder = tmp_path_factory.mktemp("sql")
    (folder / "secret.csv").write_text("word\nswordfish\n")
    return tiny_store(folder / "store"), folder


def outside_sql(folder) -> dict:
    """SQL reaching past the store: what each should do when files are allowed."""
    return {
        "read_csv": f"SELECT word FROM read_csv('{folder}/secret.csv')",
        "read_text": f"SELECT content FROM read_text('{folder}/secret.csv')",
        "copy": f"COPY (SELECT 42 AS x) TO '{folder}/copied.csv'",
        "attach": f"ATTACH '{folder}/other.duckdb' AS other",
        "url": "SELECT * FROM read_parquet('https://127.0.0.1:1/x.parquet')",
        "install": "INSTALL httpfs",
        "load": "LOAD httpfs",
        "a file of the store's folder": f"SELECT * FROM read_text('{folder}/store/"
                                        f"opscope-store.json')",
    }


def test_sql_sees_only_the_store_by_default(store_and_files, capsys):
    store, folder = store_and_files
    for what, sql in outside_sql(folder).items():
        status, out, err = run_verb(capsys, "query", store, sql)
        assert status == 2 and err.count("\n") == 1 and "swordfish" not in out + err, what
    assert not (folder / "copied.csv").exists() and not (folder / "other.duckdb").exists()
    for setting in ("enable_external_access = true", "allowed_paths = ['/']",
                    "autoload_known_extensions = true", "lock_configuration = false"):
        status, _, err = run_verb(capsys, "query", store, f"SET {setting}")
        assert status == 2 and "locked" in err, setting
    status, out, _ = run_verb(capsys, "query", store, "SELECT count(*) AS n FROM ops")
    assert status == 0 and out.split()[-1] == "6"
    con = connect(store)
    with pytest.raises(Exception, match="Permission"):
        con.sql(outside_sql(folder)["read_csv"]).fetchall()
    settings = dict(con.sql("SELECT name, value FROM duckdb_settings() WHERE name IN "
                            "('autoinstall_known_extensions', 'autoload_known_extensions', "
                            "'enable_external_access', 'lock_configuration')").fetchall())
    assert settings == {"autoinstall_known_extensions": "false", "enable_external_access":
                        "false", "autoload_known_extensions": "false",
                        "lock_configuration": "true"}


def test_allow_files_opens_files_but_not_the_network(store_and_files, capsys):
    store, folder = store_and_files
    status, out, _ = run_verb(capsys, "query", store, outside_sql(folder)["read_csv"],
                              "--allow-files")
    assert status == 0 and "swordfish" in out
    status, _, _ = run_verb(capsys, "query", store, outside_sql(folder)["copy"],
                            "--allow-files")
    assert status == 0 and (folder / "copied.csv").read_text().split() == ["x", "42"]
    con = connect(store, allow_files=True)
    assert con.sql("SELECT current_setting('autoload_known_extensions'), "
                   "current_setting('autoinstall_known_extensions')").fetchall() == \
        [(False, False)]
    with pytest.raises(Exception, match="locked"):
        con.sql("SET autoinstall_known_extensions = true")


def test_an_old_duckdb_without_allowed_paths_is_one_line(store_and_files, monkeypatch,
                                                         capsys):
    import duckdb

    from opscope.store import sandbox

    real = sandbox.lock_down

    def old_duckdb(con, files, store, *, allow_files):
        class Old:  # DuckDB 1.1: allowed_paths is an unknown setting
            def execute(self, sql):
                if sql.startswith("SET allowed_paths"):
                    raise duckdb.CatalogException('unrecognized configuration parameter '
                                                  '"allowed_paths"')
                return con.execute(sql)
        return real(Old(), files, store, allow_files=allow_files)

    monkeypatch.setattr(sys.modules["opscope.store.connect"], "lock_down", old_duckdb)
    store, _ = store_and_files
    status, _, err = run_verb(capsys, "query", store, "SELECT 1")
    assert status == 2 and err.count("\n") == 1 and "duckdb>=1.2" in err
    status, out, _ = run_verb(capsys, "query", store, "SELECT 1 AS one", "--allow-files")
    assert status == 0 and out.split()[-1] == "1"


@pytest.mark.parametrize("name,other", [("job*.store", "jobA.store"),
                                        ("run[1].store", "run1.store"),
                                        ("all?.store", "allx.store")])
def test_a_store_named_with_glob_characters_reads_only_itself(name, other, tmp_path, capsys):
    tiny_store(tmp_path / other)
    store = tiny_store(tmp_path / name)
    with open(os.path.join(store, "sessions", "rank=0", "window=0", "part-0.parquet"),
              "rb") as f:
        assert f.read(4) == b"PAR1"
    for extra in ([], ["--allow-files"]):
        status, out, err = run_verb(capsys, "query", store,
                                    "SELECT count(*) AS n FROM events", *extra)
        assert status == 0 and out.split()[-1] == "6", err
        status, out, _ = run_verb(capsys, "query", store, "SELECT count(*) AS n FROM sessions",
                                  *extra)
        assert status == 0 and out.split()[-1] == "2"


# a training process appending 5 windows to one store with store_handler, each table
# write made slower, so that two of them, started together, write their windows at once
HANDLER_WRITER = """\
import os, sys, time, torch, opscope
from opscope.store import write
real = write.StoreWriter.write_part
def slow(self, *args, **kwargs):
    real(self, *args, **kwargs)
    time.sleep(0.05)
write.StoreWriter.write_part = slow
store, go = sys.argv[1], sys.argv[2]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=1, repeat=5),
                     on_trace_ready=opscope.store_handler(store)) as prof:
    for _ in range(10):
        torch.ones(4).add(1)
        prof.step()
"""


def test_two_processes_appending_to_one_store_lose_no_window(tmp_path):
    import select

    from opscope.store import windows

    store, go = tmp_path / "store", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", HANDLER_WRITER, str(store), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(2)]
    try:
        for proc in procs:  # both have imported torch: start them at once
            ready, _, _ = select.select([proc.stdout], [], [], 240)
            assert ready and proc.stdout.readline() == "ready\n"
        go.touch()
        results = [proc.communicate(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0 and "store_handler" not in err, err[-2000:]
    assert windows(store) == [(0, w) for w in range(10)]
    per_process = connect(store).sql("SELECT process_id, count(*) FROM sessions "
                                     "GROUP BY ALL").fetchall()
    assert sorted(n for _, n in per_process) == [5, 5]
    assert {pid for pid, _ in per_process} == {proc.pid for proc in procs}


def test_a_planted_lock_symlink_is_refused_not_followed(tmp_path):
    store = tiny_store(tmp_path / "store")
    target = tmp_path / "victim.txt"
    target.write_text("keep")
    os.symlink(target, os.path.join(store, ".opscope-write-rank0.lock"))
    with pytest.raises(StoreError, match="lock"):
        tiny_store(store)
    assert target.read_text() == "keep" and os.stat(target).st_mode & 0o777 != 0o600


def test_a_row_bomb_is_refused_before_it_is_read(tmp_path, monkeypatch, capsys):
    """A file declaring more rows than a window may hold (OPSCOPE_MAX_TRACE_BYTES // 256;
    1 MiB here, so 4,096 rows) is refused by every verb before a row is read."""
    import numpy as np
    import pyarrow.parquet as pq

    store = tiny_store(tmp_path / "store")
    path = os.path.join(store, "events", "rank=0", "window=1", "part-0.parquet")
    events = pq.read_table(path)
    pq.write_table(events.take(np.zeros(100_000, dtype=np.int64)), path)
    assert os.path.getsize(path) < 100_000  # a few bytes a row: the bomb
    monkeypatch.setenv("OPSCOPE_MAX_TRACE_BYTES", "1M")
    for verb in (["query", store, "SELECT count(*) FROM events"], ["table", store],
                 ["report", store, "-o", tmp_path / "r.html"], ["ranks", store]):
        status, _, err = run_verb(capsys, *verb)
        assert status == 2 and err.count("\n") == 1, (verb[0], err)
        assert "declares 100,000 rows, more than the 4,096" in err
    with pytest.raises(StoreError, match="declares"):
        connect(store)
    monkeypatch.delenv("OPSCOPE_MAX_TRACE_BYTES")  # within the bounds, but not the record
    status, _, err = run_verb(capsys, "query", store, "SELECT count(*) AS n FROM events")
    assert status == 2 and err.count("\n") == 1, err
    assert "declares 100,000 rows; the window's sessions row records 3" in err
