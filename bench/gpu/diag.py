"""After ../shared/gpu/check_cuda.py: torch's and opscope's traces side by side, and more.

``python bench/gpu/diag.py CHECK_OUT_DIR`` (bench/gpu/run.sh runs it) prints, per trace
category, the names and counts that differ; the device memory peak of both timelines as
the largest row sum (torch's ``[times, sizes]`` layout: a row per time, a column per
category); then a live opscope session against its own trace read back, its report's GPU
view and a store round trip. ``$CHECK`` is the check's path (default .gpu/check_cuda.py).
"""
import collections
import json
import os
import sys

out = sys.argv[1]
def load(k):
    return json.load(open(f"{out}/{k}.pt.trace.json"))["traceEvents"]
T, S = load("torch"), load("opscope")  # the events of torch's and opscope's traces
def cats(ev):
    return collections.Counter(e.get("cat") for e in ev if e.get("ph") == "X")
print("cats torch  ", dict(cats(T)))
print("cats opscope", dict(cats(S)))
for cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver"):
    a = collections.Counter(e["name"] for e in T if e.get("ph") == "X" and e.get("cat") == cat)
    b = collections.Counter(e["name"] for e in S if e.get("ph") == "X" and e.get("cat") == cat)
    diff = {k: (a[k], b[k]) for k in set(a) | set(b) if a[k] != b[k]}
    print(cat, "names torch", len(a), "opscope", len(b), "differ", len(diff))
    for k, v in list(sorted(diff.items()))[:12]:
        print("   ", v, k[:150])
k = [e for e in S if e.get("ph") == "X" and e.get("cat") == "kernel"]
print("opscope kernels with External id 0:", sum(1 for e in k if e["args"].get("External id") == 0), "of", len(k))
print("sample opscope kernel", k[:1])
print("sample torch kernel", [e for e in T if e.get("cat") == "kernel"][:1])
print("sample torch runtime", [e for e in T if e.get("cat") == "cuda_runtime"][:2])
print("sample opscope runtime", [e for e in S if e.get("cat") == "cuda_runtime"][:2])
print("torch meta", [e for e in T if e.get("ph") == "M"][:12])

# device memory: torch's [times, sizes] rows hold one column per category, so the
# peak is the largest row sum (check_cuda's formula indexes the rows by time)
import opscope  # noqa: E402  (imported only now: the lines above need no opscope)
sys.argv = [sys.argv[0], "--out", out + "/mem", "--steps", "1"]
# reuse the workload without running the checks: exec the file up to the checks
src = open(os.environ.get("CHECK", ".gpu/check_cuda.py")).read().split("check(\"kernel names")[0]
ns = {"__name__": "cc"}
exec(compile(src, "check_cuda_workload", "exec"), ns)
peaks = {}
for kind in ("torch", "opscope"):
    p, _, _ = ns["record"](kind, f"{out}/{kind}-mem2.pt.trace.json", profile_memory=True,
                           record_shapes=True, with_stack=True)
    path = f"{out}/{kind}-mem2.json"
    p.export_memory_timeline(path, device="cuda:0")
    times, sizes = json.load(open(path))
    peaks[kind] = (max((sum(row) for row in sizes), default=0), len(times),
                   len(sizes[0]) if sizes else 0)
    if kind == "opscope":
        print(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=8))
print("device memory peak (max row sum), rows, columns:", peaks)

# the live session against its own trace read back, the report's GPU view and the store
from opscope.analysis.build import load_session  # noqa: E402
from opscope.report.data import report_data  # noqa: E402
p = opscope.profile(activities=ns["ACTS_O"], with_stack=True, with_modules=True)
with p:
    for _ in range(2):
        ns["step"]()
live = p._session
p.export_chrome_trace(f"{out}/live.pt.trace.json")
back = load_session(f"{out}/live.pt.trace.json")
same = back.device.owner_row.tolist() == live.device.owner_row.tolist()
names = [back.table.name(r) if r >= 0 else None for r in back.device.owner_row.tolist()] == \
    [live.table.name(r) if r >= 0 else None for r in live.device.owner_row.tolist()]
print("trace read back: device events", len(live.device), len(back.device),
      "same owner rows", same, "same owner names", names)
k = report_data(live)["kernels"]
print("report GPU view: busy %.1f%%, %d events, %d unowned, modules %s" % (
    100 * k["busy_share"], k["events"], k["unowned"], k["modules"][:3]))
try:
    from opscope.store.write import StoreWriter
    from opscope.store.read import load_store_session
    with StoreWriter(f"{out}/store") as w:
        w.write_window(live)
    st = load_store_session(f"{out}/store")
    print("store round trip: same owners", st.device.owner_row.tolist() == live.device.owner_row.tolist())
except Exception as e:
    print("store:", type(e).__name__, e)
print(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=5))
