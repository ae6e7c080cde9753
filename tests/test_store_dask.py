"""The Dask example of docs/store.md (``examples/store_dask.py``): per-op self CPU times of
a store, computed by ``dask.dataframe.read_parquet`` on a ``dask.distributed`` LocalCluster with 2
workers (threads: ``processes=False``, light on a small machine), equal ``key_averages()``'s
self CPU totals on the same store. Skipped without dask, pyarrow or duckdb.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("dask.dataframe")
pytest.importorskip("dask.distributed")
pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

import opscope  # noqa: E402
from opscope.analysis.aggregate import session_key_averages  # noqa: E402
from opscope.store import load_store_session  # noqa: E402
from opscope.store.write import StoreWriter  # noqa: E402

from subprocesses import run_in_group  # noqa: E402
from workloads import mlp_step_fn  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
import store_dask  # noqa: E402

# dask's own parquet reader calls a pandas API that pandas 3 deprecates
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")


def totals(rows, into: dict) -> dict:
    """Add ``key_averages`` rows' self CPU time (us) into ``into`` by (key, user range)."""
    for row in rows:
        key = (row.key, row.is_user_annotation)
        into[key] = into.get(key, 0.0) + row.self_cpu_time_total
    return into


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two windows of a schedule (2 steps each, ProfilerStep ranges) and the live
    profile's key_averages self times, summed."""
    path = str(tmp_path_factory.mktemp("dask") / "job.store")
    step = mlp_step_fn()
    step()
    expected: dict = {}

    with StoreWriter(path) as writer:
        def ready(prof):  # one window per schedule cycle
            writer.write_window(prof.session)
            totals(prof.key_averages(), expected)

        with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=2, repeat=2),
                             on_trace_ready=ready) as prof:
            for _ in range(6):
                step()
                prof.step()
    return path, expected


def dask_self_times(path: str) -> dict:
    """``op_self_times`` in a child process, so Dask's threads (its offload pool outlives
    the cluster) never run inside this test process while later tests profile it."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[2]); import store_dask; "
            "print(json.dumps([[k, u, v] for (k, u), v in "
            "store_dask.op_self_times(sys.argv[1], workers=2).items()]))")
    done = run_in_group([sys.executable, "-c", code, path, str(REPO / "examples")],
                        timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return {(key, user): us for key, user, us in json.loads(done.stdout.splitlines()[-1])}


def test_dask_self_times_equal_key_averages(store):
    path, expected = store
    found = dask_self_times(path)
    assert ("ProfilerStep*", True) in found and ("aten::addmm", False) in found
    assert set(found) == set(expected)
    # integer ns summed by Dask vs doubles summed by key_averages: equal to the ns
    assert {k: round(v, 3) for k, v in found.items()} == \
        {k: round(v, 3) for k, v in expected.items()}
    stored: dict = {}
    for window in (0, 1):
        totals(session_key_averages(load_store_session(path, 0, window)), stored)
    assert {k: round(v, 3) for k, v in stored.items()} == \
        {k: round(v, 3) for k, v in found.items()}


def test_the_store_doc_shows_the_example():
    doc = (REPO / "docs" / "store.md").read_text()
    assert inspect.getsource(store_dask.op_self_times) in doc
