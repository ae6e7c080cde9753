"""profile_memory: per-op attribution, [memory] events, categories to the byte, exports."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import opscope
from opscope.analysis.build import build_session
from opscope.analysis.memory_summary import held_over_time
from opscope.model.memory import (ACTIVATION, AUTOGRAD_DETAIL, CATEGORY_NAMES, GRADIENT, INPUT,
                                  OPTIMIZER_STATE, PARAMETER)
from opscope.model.records import MEMORY_DTYPE, RawSession, records_from_rows

from viewer_driver import Chromium, find_chromium

pytestmark = pytest.mark.usefixtures("native_only")
FEATURES, BATCH = 1024, 8


def nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


@pytest.fixture(scope="module")
def linear_run():
    """Linear(1024, 1024) + SGD with momentum, two steps profiled from a fresh model."""
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, FEATURES)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(BATCH, FEATURES)
    import os
    os.environ["OPSCOPE_COLLECTOR"] = "native"
    try:
        with opscope.profile(profile_memory=True) as prof:
            for _ in range(2):
                opt.zero_grad(set_to_none=True)
                model(x).pow(2).mean().backward()
                opt.step()
    finally:
        del os.environ["OPSCOPE_COLLECTOR"]
    return prof, model, opt, x


def held_at(session, t_ns):
    times, held = held_over_time(session)
    k = int(np.searchsorted(times, t_ns, side="right")) - 1
    return held[k]


def first_event(session, name):
    table = session.table
    names = table.symbols.names
    for i in range(len(table)):
        if names[int(table.name_id[i])] == name:
            return i
    raise AssertionError(f"no {name} event")


def saved_activation_bytes(model, x) -> int:
    """Bytes of the tensors autograd saves for one forward, minus parameters and the input."""
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = nbytes(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).pow(2).mean()
    known = {p.untyped_storage().data_ptr() for p in model.parameters()}
    known.add(x.untyped_storage().data_ptr())
    return sum(b for ptr, b in saved.items() if ptr not in known)


def test_parameter_bytes_exact_throughout(linear_run):
    prof, model, _, _ = linear_run
    _, held = held_over_time(prof.session)
    expected = nbytes(model.weight) + nbytes(model.bias)
    assert expected == (FEATURES * FEATURES + FEATURES) * 4
    assert set(held[:, PARAMETER].tolist()) == {expected}


def test_after_first_step_optimizer_state_and_gradients_exact(linear_run):
    prof, model, opt, _ = linear_run
    session = prof.session
    step = first_event(session, "Optimizer.step#SGD.step")
    at = held_at(session, int(session.table.end_ns[step]))
    momentum = sum(nbytes(s["momentum_buffer"]) for s in opt.state.values())
    grads = sum(nbytes(p.grad) for p in model.parameters())
    assert momentum == grads == (FEATURES * FEATURES + FEATURES) * 4
    assert at[OPTIMIZER_STATE] == momentum
    assert at[GRADIENT] == grads
    assert at[INPUT] == BATCH * FEATURES * 4


def test_activation_bytes_equal_saved_tensors(linear_run):
    prof, model, _, x = linear_run
    session = prof.session
    table = session.table
    backward = np.flatnonzero(table.scope == 1)  # the first backward node
    at = held_at(session, int(table.start_ns[backward[0]]))
    expected = saved_activation_bytes(model, x)
    assert expected == BATCH * FEATURES * 4  # the linear output, saved by pow
    assert at[ACTIVATION] == expected


def test_every_category_documented_and_autograd_detail_seen(linear_run):
    prof, _, _, _ = linear_run
    _, held = held_over_time(prof.session)
    assert held[:, AUTOGRAD_DETAIL].max() > 0  # gradients of activations in backward
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    for name in CATEGORY_NAMES:
        assert f"`{name}`" in guide, f"docs/guide.md does not document category {name}"


def test_self_memory_sums_to_net_allocated(linear_run):
    prof, _, _, _ = linear_run
    session = prof.session
    mem = session.memory
    net = int(mem["bytes"].sum())
    # the allocator's own running total agrees
    assert net == int(mem["total_allocated"][-1] - (mem["total_allocated"][0] - mem["bytes"][0]))
    rows = prof.key_averages()
    assert sum(r.self_cpu_memory_usage for r in rows) == net
    assert sum(e.self_cpu_memory_usage for e in prof.events()) == net
    table = rows.table(sort_by="self_cpu_memory_usage", row_limit=5)
    assert "CPU Mem" in table and "Self CPU Mem" in table


def test_memory_instant_events_in_trace(linear_run, tmp_path):
    prof, _, _, _ = linear_run
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    mem = [e for e in events if e.get("name") == "[memory]"]
    assert len(mem) == len(prof.session.memory)
    assert all(e["ph"] == "i" and e["s"] == "t" and e["cat"] == "cpu_instant_event" for e in mem)
    assert list(mem[0]["args"])[:6] == ["Total Reserved", "Total Allocated", "Bytes",
                                        "Device Id", "Device Type", "Addr"]
    assert sum(e["args"]["Bytes"] for e in mem) == int(prof.session.memory["bytes"].sum())
    assert not [e for e in events if e.get("name") == "[memory]" and e["ph"] == "X"]


def synthetic_session():
    """One op [0, 10 us] that allocates 512 B; 256 B allocated and the 512 B freed outside."""
    records = records_from_rows([(0, 10_000, -1, 0, 0, 1, 1, 0xFFFFFFFF, 0, 0, 0)])
    memory = np.zeros(3, MEMORY_DTYPE)
    memory["time_ns"] = [5_000, 20_000, 30_000]
    memory["addr"] = [4096, 8192, 4096]
    memory["bytes"] = [512, 256, -512]
    memory["total_allocated"] = [512, 768, 256]
    memory["device_index"] = -1
    raw = RawSession(records=records, inputs=[], thread_ids=[77], names=["aten::empty"],
                     start_ns=0, stop_ns=40_000, epoch_offset_ns=0, memory=memory)
    return build_session(raw, options={"profile_memory": True})


def test_top_level_memory_events_synthetic():
    from opscope.analysis.aggregate import key_averages

    session = synthetic_session()
    rows = {r.key: r for r in key_averages(session.table, memory=session.event_memory)}
    assert rows["aten::empty"].self_cpu_memory_usage == 512
    assert rows["[memory]"].count == 2
    assert rows["[memory]"].self_cpu_memory_usage == rows["[memory]"].cpu_memory_usage == -256
    assert sum(r.self_cpu_memory_usage for r in rows.values()) == 256


def test_memory_table_golden():
    from opscope.analysis.aggregate import key_averages
    from opscope.export.table import format_table

    session = synthetic_session()
    text = format_table(key_averages(session.table, memory=session.event_memory),
                        profile_memory=True, sort_by="self_cpu_memory_usage")
    lines = [line.strip() for line in text.splitlines()]
    assert lines[1].split()[-4:] == ["Mem", "Self", "CPU", "Mem"] or "Self CPU Mem" in lines[1]
    row = next(line for line in lines if line.startswith("aten::empty"))
    assert row.split()[-5:-1] == ["512", "B", "512", "B"]
    row = next(line for line in lines if line.startswith("[memory]"))
    assert row.split()[-5:-1] == ["-256", "B", "-256", "B"]


def test_same_per_op_memory_as_torch_profiler():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(16, 64)

    def step():  # grads kept (set_to_none=False): no window frees another window's blocks
        opt.zero_grad(set_to_none=False)
        model(x).pow(2).mean().backward()
        opt.step()

    step()

    def per_op(rows):
        return {r.key: (r.self_cpu_memory_usage, r.cpu_memory_usage, r.count) for r in rows}

    with opscope.profile(profile_memory=True) as ours:
        step()
    with torch.profiler.profile(profile_memory=True) as theirs:
        step()
    assert per_op(ours.key_averages()) == per_op(theirs.key_averages())


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_timeline_json_layout(linear_run, tmp_path, suffix):
    prof, model, _, _ = linear_run
    path = tmp_path / f"mem{suffix}"
    prof.export_memory_timeline(str(path), device="cpu")
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(path, "rt") as f:
        times, sizes = json.load(f)
    assert len(times) == len(sizes) > 10
    assert times == sorted(times) and times[0] > 1.6e15  # Unix microseconds
    assert all(len(row) == 9 and row[0] == 0 for row in sizes)
    assert {row[1 + PARAMETER] for row in sizes} == {nbytes(model.weight) + nbytes(model.bias)}


def test_timeline_raw_layout(linear_run, tmp_path):
    prof, _, _, _ = linear_run
    path = tmp_path / "mem.raw.json.gz"
    prof.export_memory_timeline(str(path))
    rows = json.load(gzip.open(path, "rt"))
    assert rows and all(len(r) == 4 for r in rows)
    assert {r[1] for r in rows} <= {1, 2, 4}
    creates = sum(r[2] for r in rows if r[1] in (1, 2))
    destroys = -sum(r[2] for r in rows if r[1] == 4)
    assert creates > destroys > 0


def test_timeline_needs_profile_memory(tmp_path):
    with opscope.profile() as prof:
        torch.ones(4) + 1
    with pytest.raises(ValueError, match="profile_memory=True"):
        prof.export_memory_timeline(str(tmp_path / "x.json"))


def test_timeline_bad_device(linear_run, tmp_path):
    prof, _, _, _ = linear_run
    with pytest.raises(ValueError, match="device"):
        prof.export_memory_timeline(str(tmp_path / "x.json"), device="tpu")


def test_memory_summary(linear_run):
    prof, _, _, _ = linear_run
    text = prof.memory_summary()
    assert text.startswith("Peak memory held:")
    assert "Largest self allocations:" in text and "aten::mm" in text


@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed")
def test_timeline_html_renders_in_chromium(linear_run, tmp_path):
    prof, _, _, _ = linear_run
    path = tmp_path / "mem.html"
    prof.export_memory_timeline(str(path))
    text = path.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text
    assert "Memory (MiB)" in text  # ~12 MiB peak, labelled as binary units
    with Chromium() as browser:
        session = browser.open_page(path.as_uri())
        browser.call("Log.enable", session_id=session)
        deadline = time.monotonic() + 30
        while browser.evaluate(session, "document.readyState") != "complete":
            assert time.monotonic() < deadline, "page did not load"
            time.sleep(0.05)
        shown = browser.evaluate(session, "[...document.querySelectorAll('polygon.layer')]"
                                          ".map(p => p.dataset.category)")
        legend = browser.evaluate(session, "document.querySelector('ul.legend').innerText")
        box = browser.evaluate(session, "JSON.stringify(document.getElementById('plot')"
                                        ".getBoundingClientRect())")
    assert {"PARAMETER", "OPTIMIZER_STATE", "GRADIENT", "ACTIVATION", "INPUT"} <= set(shown)
    for name in CATEGORY_NAMES:
        assert name in legend
    assert json.loads(box)["width"] > 500
    errors = [e for e in browser.events
              if e["method"] == "Runtime.exceptionThrown"
              or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
              or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert errors == []


def _sighted_by_rule(blocks, sightings):
    """The sighting rule of memory_timeline._add_sighted, one sighting at a time."""
    from opscope.analysis.memory_timeline import ALIVE

    key = list(zip(blocks.device_type.tolist(), blocks.addr.tolist()))
    hit, created, extra = [], {}, []
    for s in sightings:
        k = (int(s["device_type"]), int(s["addr"]))
        ts = int(s["time_ns"])
        mine = [(int(blocks.t_alloc[i]), i) for i in range(len(key)) if key[i] == k]
        before = [b for b in mine if b[0] <= ts]
        if before:
            i = max(before)[1]
            free = int(blocks.t_free[i])
            hit.append(i if free == ALIVE or free >= ts else -1)
        elif k in created:
            hit.append(created[k])
        elif s["bytes"] < 0:
            hit.append(-1)
        else:
            later = [b[0] for b in mine if b[0] > ts]
            created[k] = len(key) + len(extra)
            extra.append((k[1], int(s["bytes"]), min(later) if later else ALIVE))
            hit.append(created[k])
    return hit, extra


def test_sightings_find_their_blocks_as_the_rule_says():
    from opscope.analysis.memory_timeline import _add_sighted, pair_blocks
    from opscope.model.memory import SIGHTING_DTYPE

    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(0, 60))
        mem = np.zeros(n, MEMORY_DTYPE)
        mem["time_ns"] = rng.integers(0, 50, n)
        mem["addr"] = rng.integers(1, 6, n) * 64
        mem["bytes"] = rng.choice([-256, 256, 512, -512], n)
        mem["device_type"] = rng.integers(0, 2, n)
        blocks = pair_blocks(mem)
        m = int(rng.integers(0, 40))
        sightings = np.zeros(m, SIGHTING_DTYPE)
        sightings["time_ns"] = np.sort(rng.integers(0, 55, m))
        sightings["addr"] = rng.integers(1, 8, m) * 64
        sightings["bytes"] = rng.choice([-1, 256], m)
        sightings["device_type"] = rng.integers(0, 2, m)
        out, hit = _add_sighted(blocks, sightings)
        want_hit, extra = _sighted_by_rule(blocks, sightings)
        assert hit.tolist() == want_hit, trial
        assert len(out) == len(blocks) + len(extra)
        assert list(zip(out.addr[len(blocks):].tolist(), out.nbytes[len(blocks):].tolist(),
                        out.t_free[len(blocks):].tolist())) == extra, trial


@pytest.mark.parametrize("in_time_order", [True, False])
def test_blocks_pair_the_same_whatever_the_sort(in_time_order):
    """pair_blocks sorts by (device, address) alone when the records are in time order:
    the same blocks as sorting by (device, address, time, record) on random records."""
    from opscope.analysis.memory_timeline import pair_blocks

    rng = np.random.default_rng(3)
    n = 5000
    memory = np.zeros(n, MEMORY_DTYPE)
    memory["time_ns"] = np.sort(rng.integers(0, 2000, n))  # ties included
    if not in_time_order:
        memory["time_ns"] = rng.permutation(memory["time_ns"])
    memory["addr"] = rng.integers(0, 40, n) * 64
    memory["bytes"] = rng.choice([-1, 1], n) * rng.integers(1, 100, n)
    memory["device_type"] = rng.integers(0, 2, n)
    got = pair_blocks(memory)
    key = ((memory["device_type"].astype(np.int64) << 56)
           | memory["addr"].astype(np.int64))
    order = np.lexsort((np.arange(n), memory["time_ns"], key))
    pairs, k = set(), 0
    while k < n:  # an allocation and the free right after it, same device and address
        r = order[k]
        nxt = order[k + 1] if k + 1 < n else None
        if memory["bytes"][r] > 0 and nxt is not None and key[nxt] == key[r] \
                and memory["bytes"][nxt] < 0:
            pairs.add((int(r), int(nxt)))
        k += 1
    mine = {(int(a), int(f)) for a, f in zip(got.alloc_record, got.free_record)
            if a >= 0 and f >= 0}
    assert mine == pairs and len(pairs) > 100
    assert int((got.alloc_record >= 0).sum()) == int((memory["bytes"] > 0).sum())
