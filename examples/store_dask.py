"""Per-op self CPU time of an opscope store, computed by Dask on a local cluster.

A store is a plain Parquet dataset (``events/rank=R/window=W/part-0.parquet``), so Dask
reads it as it is. ``op_self_times`` groups the events as ``key_averages()`` does: by
name, with every ``ProfilerStep#N`` as ``ProfilerStep*``, user ranges (scope 7) apart
from ops. A store holds no utility op (``aten::is_leaf``, ...): they were left out
before it was written. tests/test_store_dask.py runs this file; docs/store.md shows it.

Run it: ``python examples/store_dask.py STORE``.
"""

import os
import sys

import dask.dataframe as dd
from dask.distributed import Client, LocalCluster


def op_self_times(store, workers=2):
    """{(name, is user range): self CPU time in us} over every rank and window of ``store``."""
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster):
        events = dd.read_parquet(os.path.join(store, "events"),
                                 columns=["name", "scope", "self_ns"])
        name = events["name"].astype(str)
        events = events.assign(
            key=name.where(~name.str.startswith("ProfilerStep#"), "ProfilerStep*"),
            user=events["scope"] == 7)
        totals = events.groupby(["key", "user"])["self_ns"].sum().compute()
    return {(key, bool(user)): int(ns) / 1000.0 for (key, user), ns in totals.items()}


if __name__ == "__main__":
    found = op_self_times(sys.argv[1])
    for (key, user), us in sorted(found.items(), key=lambda kv: -kv[1])[:20]:
        print(f"{us:14.3f} us  {key}{'  (user range)' if user else ''}")
