"""The black box in this process: its ring's bounds, joined windows that agree with
torch.profiler, a profile beside it, a failing dump, the rate limit, fork, the step rules,
the job posts and the crash file's checks. Real processes are in test_black_box_jobs.py.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import warnings

import numpy as np
import pytest
import torch

import opscope
from opscope.black_box import registry as box_module
from opscope.black_box.job import parse_post
from opscope.black_box.ring import Ring
from opscope.black_box.triggers import StepWatch
from opscope.load import TraceLoadError, read_trace
from opscope.load.raw_black_box import MAGIC, _HEADER, read_raw_black_box
from opscope.model.raw_join import join_raw
from opscope.model.records import RECORD_DTYPE, RawSession
from subprocesses import fill_disk

STEPS = 4


def make_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, opt):
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()


def trace_counts(path) -> collections.Counter:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return collections.Counter(e["name"] for e in doc["traceEvents"]
                               if e.get("ph") == "X" and e.get("cat") in ("cpu_op",
                                                                          "user_annotation"))


def window(start: int, n: int, tid: int = 1, names=("aten::add",)) -> RawSession:
    recs = np.zeros(n, RECORD_DTYPE)
    recs["start_ns"] = np.arange(start, start + n)
    recs["end_ns"] = recs["start_ns"] + 1
    return RawSession(recs, [np.zeros(0, np.int64)], [tid], list(names), start, start + n, 0)


@pytest.fixture
def no_black_box():
    yield
    running = box_module.active()
    if running is not None:
        running.stop()
    assert box_module.active() is None


def test_the_ring_holds_both_bounds_whatever_comes():
    rng = np.random.default_rng(0)
    ring = Ring(seconds=1.0, max_bytes=48 * 1000)
    now = 0
    for _ in range(200):
        n = int(rng.integers(1, 700))
        ring.add(window(now, n), now_ns=now + n, live_bytes=int(rng.integers(0, 48 * 300)))
        now += n + int(rng.integers(0, 3 * 10 ** 8))
        assert ring.bytes <= 48 * 1000
        assert all(w.stop_ns >= now - n - 10 ** 9 - 3 * 10 ** 8 for w in ring.windows())
        assert ring.bytes == sum(w.records.nbytes for w in ring.windows())


def test_joined_windows_renumber_threads_and_names():
    a = window(0, 2, tid=7, names=("aten::add",))
    b = window(10, 3, tid=8, names=("aten::mul", "aten::add"))
    b.records["name_id"] = [0, 1, 0]
    joined = join_raw([a, b])
    assert joined.thread_ids == [7, 8]
    assert [joined.names[i] for i in joined.records["name_id"]] == [
        "aten::add", "aten::add", "aten::mul", "aten::add", "aten::mul"]
    assert joined.records["thread_index"].tolist() == [0, 0, 1, 1, 1]


def test_a_black_box_over_rotations_agrees_with_torch_profiler(tmp_path, no_black_box):
    model, opt = make_model()
    train_step(model, opt)  # lazy initialisations happen before either records
    with torch.profiler.profile() as reference:
        for _ in range(STEPS):
            train_step(model, opt)
    expected = collections.Counter({e.key: e.count for e in reference.key_averages()})
    with opscope.blackbox(dir=str(tmp_path), seconds=60) as box:
        for _ in range(STEPS):  # a window per step: every join counts
            train_step(model, opt)
            box._rotate()
        path = box.dump(wait=True)
    got = trace_counts(path)
    assert {k: got[k] for k in expected} == dict(expected)
    facts = json.loads(json.dumps(read_trace(path).metadata))  # the trace reads back
    assert json.loads(facts["opscopeBlackBox"])["reason"] == "manual"


def test_a_profile_beside_the_black_box_loses_nothing_on_either_side(tmp_path, no_black_box):
    x = torch.ones(4)
    with opscope.blackbox(dir=str(tmp_path), seconds=60) as box:
        for _ in range(30):
            torch.add(x, x)
        with opscope.profile() as prof:
            for _ in range(20):
                torch.mul(x, x)
        for _ in range(10):
            torch.sub(x, x)
        path = box.dump(wait=True)
    profiled = {e.key: e.count for e in prof.key_averages()}
    assert profiled.get("aten::mul") == 20 and "aten::add" not in profiled
    counts = trace_counts(path)
    assert (counts["aten::add"], counts["aten::mul"], counts["aten::sub"]) == (30, 20, 10)


def test_a_dump_that_cannot_be_written_is_one_warning_and_the_job_goes_on(tmp_path,
                                                                         no_black_box):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with opscope.blackbox(dir=str(blocker / "dumps"), seconds=10) as box:
        torch.ones(3).add_(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert box.dump(wait=True) is None
        lines = [str(w.message) for w in caught]
        assert len(lines) == 1 and "black box dump not written (manual)" in lines[0], lines
        assert "\n" not in lines[0]
        assert torch.ones(2).sum().item() == 2  # the job goes on, still recorded
        assert box.running


def test_dumps_are_rate_limited(tmp_path, no_black_box):
    with opscope.blackbox(dir=str(tmp_path), seconds=10) as box:
        assert box.dump() is not None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert box.dump() is None
    assert "skipped" in str(caught[0].message)
    assert len(list(tmp_path.glob("*.blackbox.manual.*"))) == 1


def test_a_forked_child_has_no_black_box(tmp_path, no_black_box):
    with opscope.blackbox(dir=str(tmp_path), seconds=10) as box:
        pid = os.fork()
        if pid == 0:  # the child: no black box, nothing written, its ops unrecorded
            ok = box_module.active() is None and box.dump(wait=True) is None
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert box_module.active() is box
    assert list(tmp_path.glob("*.blackbox.*.pt.trace.json.gz")) == []


def test_a_second_black_box_is_refused_while_one_runs(tmp_path, no_black_box):
    with opscope.blackbox(dir=str(tmp_path)):
        with pytest.raises(RuntimeError, match="another black box runs"):
            opscope.blackbox(dir=str(tmp_path)).start()


@pytest.mark.parametrize("kwargs, word", [({"seconds": 0}, "seconds"),
                                          ({"max_mb": -1}, "max_mb"),
                                          ({"slow_step": 1.0}, "slow_step"),
                                          ({"dir": ""}, "dir")])
def test_bad_arguments_name_themselves(kwargs, word):
    with pytest.raises(ValueError, match=word):
        opscope.blackbox(**kwargs)


def fake_clock(times):
    it = iter(times)
    return lambda: next(it)


def test_a_slow_step_fires_once_a_minute_and_a_stall_once_per_stall():
    second = 10 ** 9
    times = [k * second for k in range(8)] + [20 * second, 30 * second, 100 * second]
    watch = StepWatch(slow_step=3.0, clock=fake_clock(times))
    fired = [watch.on_step() for _ in range(8)]
    assert fired == [None] * 8
    assert watch.on_step() is not None  # 13 s after 1 s steps (20 - 7)
    assert watch.on_step() is None  # slow again, but within the minute
    assert watch.on_step() is not None  # a minute later
    stall = StepWatch(slow_step=3.0, clock=fake_clock(
        [k * second for k in range(8)] + [12 * second, 18 * second, 19 * second]))
    for _ in range(8):
        stall.on_step()
    assert stall.stalled() is None  # 5 s without a step: under 10 s
    assert stall.stalled()["waited_ns"] == 11 * second  # 11 s: a stall
    assert stall.stalled() is None  # said once per stall


def test_job_posts_from_anyone_are_checked():
    good = {"origin": 1, "reason": "signal", "unix_ns": 1}
    assert parse_post(json.dumps(good), world_size=2) == good
    for bad in ({**good, "origin": True}, {**good, "reason": "rm -rf"}, {**good, "x": 1},
                {**good, "unix_ns": -1}, [1, 2], "x" * 300):
        assert parse_post(json.dumps(bad), world_size=2) is None
    assert parse_post("{not json", world_size=2) is None


def test_a_cut_or_forged_crash_file_is_one_error_naming_it(tmp_path):
    path = tmp_path / "x.blackbox.fatal.1.raw"
    header = _HEADER.pack(MAGIC, 1, 11, 0, 0)
    for body in (MAGIC + b"\0", header + b"\2\0\0\0\0\0\0\0" + (10 ** 9).to_bytes(8, "little"),
                 _HEADER.pack(MAGIC, 9, 11, 0, 0)):
        path.write_bytes(body)
        with pytest.raises(TraceLoadError, match="x.blackbox.fatal.1.raw"):
            read_raw_black_box(str(path))


IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def small_mount(tmp_path):
    """A 64 KiB tmpfs (root only; skipped elsewhere), unmounted afterwards."""
    import subprocess

    if not IS_ROOT:
        pytest.skip("a full disk or a read-only mount needs root (a 64 KiB tmpfs)")
    folder = tmp_path / "mount"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs",
                           str(folder)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=60)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_full_disk_or_a_read_only_folder_is_one_warning_per_dump(small_mount, fault,
                                                                   no_black_box):
    import subprocess

    with opscope.blackbox(dir=str(small_mount), seconds=10) as box:
        if fault == "full":
            fill_disk(small_mount)
            expected = "No space left on device"
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True,
                           timeout=60)
            expected = "Read-only file system"
        for _ in range(200):
            torch.ones(8).add_(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert box.dump(wait=True) is None
        lines = [str(w.message) for w in caught]
        assert len(lines) == 1 and expected in lines[0] and "\n" not in lines[0], lines
        assert box.running and torch.ones(2).sum().item() == 2  # the job goes on
    assert not [p for p in small_mount.iterdir() if ".blackbox." in p.name]  # no half file


def test_follow_fork_starts_a_black_box_of_its_own_in_the_child(tmp_path, no_black_box):
    import time

    with opscope.blackbox(dir=str(tmp_path), seconds=10, follow_fork=True) as box:
        pid = os.fork()
        if pid == 0:  # the child: a new black box, its own ring, its own dump
            code = 3
            try:
                deadline = time.monotonic() + 30
                while box_module.active() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                child = box_module.active()
                if child is not None and child is not box:
                    torch.ones(5).mul_(3)
                    path = child.dump(wait=True)
                    code = 0 if path and "aten::mul_" in trace_counts(path) else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert box_module.active() is box
    (dump,) = tmp_path.glob("*.blackbox.manual.*")
    assert trace_counts(dump)["aten::mul_"] == 1  # only the child's op: its ring was empty
