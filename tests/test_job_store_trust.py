"""The job's c10d store is no command channel for whoever reaches it (issue 28, findings 1-5).

Each test runs a real c10d ``TCPStore`` on 127.0.0.1. The ranks are opscope's own
store threads (``JobRequests``, ``ClockSync``) driven one poll at a time on their own
client connections; the "outsider" is one more client of the same store writing the
keys opscope reads. Nothing here asserts a duration.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
import warnings

import pytest

from opscope.collect.job import clock_sync, store as job_store
from opscope.collect.job.store import JobStore, key
from opscope.on_demand import control
from opscope.on_demand.agent import OnDemandAgent
from opscope.on_demand.job import JobRequests
from opscope.step_tracker import StepTracker

WORLD = 2
YEARS_56_NS = 56 * 365 * 24 * 3600 * 10**9
REQUESTS = key("on_demand", "requests")


@pytest.fixture
def server():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=10))


def client(server):
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", server.port, is_master=False,
                    timeout=datetime.timedelta(seconds=10))


@pytest.fixture
def job(monkeypatch, tmp_path):
    """Two ranks of one job (as far as opscope can tell), a job folder, a control folder."""
    monkeypatch.setattr(job_store, "job_ranks", lambda: (0, WORLD))
    monkeypatch.setenv(control.CONTROL_DIR_ENV, str(tmp_path / "control"))
    monkeypatch.setenv("OPSCOPE_ON_DEMAND_OUTPUT", str(tmp_path / "job"))
    monkeypatch.setattr(job_store, "_warned", set())
    return tmp_path / "job"


class Rank:
    """One rank's on-demand agent and its store side, polled by hand (no thread)."""

    def __init__(self, server, rank: int, world: int = WORLD):
        self.agent = OnDemandAgent(pid=os.getpid())
        self.requests = JobRequests(self.agent)
        self.requests._stop.set()  # the test polls; the thread ends at once
        self.requests._thread.join(10)
        self.agent.job = self.requests
        self.store = JobStore(client(server), rank, world, cloned=True)
        self.requests._opened = self.store
        self.poll()

    def poll(self) -> None:
        self.requests._tick()

    def post(self, **request) -> dict:
        """Post a trigger request the way a rank of the job does."""
        full = {**control.new_request(request.pop("steps", 3), "/ignored"), **request}
        self.requests._post_request(self.store, full)
        return full

    def armed(self):
        return [dict(r) for r in self.agent._armed]


def plant(outsider, request) -> None:
    """What an outsider does: count one more request and write its text."""
    n = outsider.add(REQUESTS, 1)
    outsider.set(key("on_demand", "request", n), request if isinstance(request, (str, bytes))
                 else json.dumps(request))


def outsider_request(job, **change) -> dict:
    """A request as an outsider writes it (with the job's own folder, which opscope ignores)."""
    return {"id": "0badc0de", "steps": 3, "first_step": StepTracker.current_step() + 5,
            "origin": 0, "output_dir": str(job), "options": {}, "gzip": False, "job": True,
            **change}


# -- 1: a request never chooses a path; options are bounded ---------------------------------
def test_a_request_from_the_store_never_chooses_the_folder(server, job, tmp_path):
    rank0, rank1 = Rank(server, 0), Rank(server, 1)
    outsider = client(server)
    elsewhere = str(tmp_path / "outsider")
    plant(outsider, outsider_request(job, output_dir=elsewhere, options={
        "record_shapes": True, "profile_memory": True, "with_stack": True,
        "with_flops": True, "with_modules": True}))
    rank0.poll()
    rank1.poll()
    for rank in (rank0, rank1):
        [armed] = rank.armed()
        assert armed["output_dir"] == str(job)  # the job's own folder, never the request's


@pytest.mark.parametrize("options", [{"evil": True}, {"with_stack": "yes"}, {"with_stack": 1},
                                     ["with_stack"]])
def test_unknown_or_odd_options_drop_the_request_with_one_line_on_rank0(server, job, options):
    rank0, rank1 = Rank(server, 0), Rank(server, 1)
    plant(client(server), outsider_request(job, options=options))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rank0.poll()
        rank1.poll()
    assert rank0.armed() == [] and rank1.armed() == []
    assert len(caught) == 1 and "dropped a job request" in str(caught[0].message)


# -- 2: bounded windows; a pending request never locks triggers out ---------------------------
@pytest.mark.parametrize("change", [{"steps": 10**9},
                                    {"first_step": 10**15}])
def test_an_unbounded_window_is_dropped(server, job, change):
    rank1 = Rank(server, 1)
    plant(client(server), outsider_request(job, **change))
    rank1.poll()
    assert rank1.armed() == []


def test_a_newer_trigger_replaces_a_pending_request_that_never_started(server, job):
    rank0, rank1 = Rank(server, 0), Rank(server, 1)
    plant(client(server), outsider_request(job, first_step=StepTracker.current_step() + 900))
    rank1.poll()
    assert [r["id"] for r in rank1.armed()] == ["0badc0de"]
    legit = rank0.post()
    rank1.poll()
    assert [r["id"] for r in rank1.armed()] == [legit["id"]]


def test_a_window_past_its_byte_limit_stops_early_marked_partial(job, monkeypatch, tmp_path):
    from opscope.on_demand import window_limit
    from workloads import mlp_step_fn

    monkeypatch.setattr(window_limit, "MAX_WINDOW_BYTES", 0)
    monkeypatch.setattr(job_store, "job_ranks", lambda: None)
    agent = OnDemandAgent(pid=os.getpid())
    request = control.new_request(10**6, str(tmp_path / "out"))
    agent.arm(request)
    step = mlp_step_fn()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 4):
            step()
            agent.on_step(StepTracker.current_step() + n)
        agent.on_exit()
    assert agent.state == "idle"
    result = control.take_result(agent.pid, request["id"])
    assert result["status"] == "ok" and "byte limit" in result["note"], result
    assert result["steps"] == 1
    doc = json.loads(open(result["trace"]).read())
    assert doc["onDemand"]["partial"] is True and "byte limit" in doc["onDemand"]["ended_by"]
    assert sum("byte limit" in str(w.message) for w in caught) == 1


# -- 3: junk and counter jumps never stop the serving ----------------------------------------
@pytest.mark.parametrize("junk", ["junk\x1b[2J", "-5", " 7", "9" * 40],
                         ids=["text", "negative", "blank", "huge"])
def test_a_junk_counter_does_not_stop_later_triggers(server, job, junk):
    rank0, rank1 = Rank(server, 0), Rank(server, 1)
    client(server).set(REQUESTS, junk)
    rank1.poll()  # the junk is skipped, the store connection kept
    legit = rank0.post()
    rank1.poll()
    assert [r["id"] for r in rank1.armed()] == [legit["id"]]


def test_a_counter_jump_does_not_stop_later_triggers(server, job):
    rank0, rank1 = Rank(server, 0), Rank(server, 1)
    client(server).add(REQUESTS, 10**12)
    rank1.poll()
    legit = rank0.post()
    rank1.poll()
    assert [r["id"] for r in rank1.armed()] == [legit["id"]]


@pytest.mark.parametrize("text", ["{", "[" * 60000, '"a string"', '{"id": NaN}', b"\xff{\x00"],
                         ids=["cut", "deep", "string", "nan", "bytes"])
def test_junk_request_texts_are_skipped_and_serving_goes_on(server, job, text):
    rank0, rank1 = Rank(server, 0), Rank(server, 1)
    plant(client(server), text)
    rank1.poll()
    legit = rank0.post()
    rank1.poll()
    assert [r["id"] for r in rank1.armed()] == [legit["id"]]


# -- 4: clock offsets come only from the ranks' own measurement -------------------------------
def plant_pongs(outsider, value_ns, count: int = 64) -> None:
    for n in range(1, count + 1):
        outsider.set(key("clock", "pong", n), str(value_ns))


@pytest.mark.parametrize("planted", [YEARS_56_NS, 5 * 10**9, "junk"])
def test_planted_clock_answers_are_refused_and_reported(server, job, planted):
    outsider = client(server)
    value = planted if isinstance(planted, str) else time.time_ns() + planted
    plant_pongs(outsider, value)
    sync = clock_sync.ClockSync("on", 1)
    offset = sync._measure(JobStore(client(server), 1, WORLD, cloned=True))
    assert offset is None
    assert sync.problem  # reported: Recording writes it as one warning line


def test_rank0s_own_answers_give_a_small_offset(server, job, monkeypatch):
    monkeypatch.setattr(clock_sync._Answered, "value", 0)
    rank0 = clock_sync.ClockSync("on", 0)
    rank0._store = JobStore(client(server), 0, WORLD, cloned=True)
    thread = threading.Thread(target=rank0._run)
    thread.start()
    try:
        sync = clock_sync.ClockSync("on", 1)
        offset = sync._measure(JobStore(client(server), 1, WORLD, cloned=True))
    finally:
        rank0.cancel()
        thread.join(10)
    assert offset is not None and abs(offset) < 10**9, sync.problem


# -- 5: the trigger prints only escaped text and only this job's traces -----------------------
def test_forged_answers_print_escaped_and_list_only_the_jobs_traces(server, job, capsys,
                                                                    tmp_path):
    from opscope.cli import trigger

    world = 4
    origin = Rank(server, 0, world)
    legit = origin.post(steps=2)
    job.mkdir(parents=True)
    own = job / f"host_{os.getpid()}.rank0.1.pt.trace.json"
    own.write_text("{}")
    stray = tmp_path / "host_9.rank1.1.pt.trace.json"
    stray.write_text("{}")
    link = job / "host_9.rank3.2.pt.trace.json"
    link.symlink_to(own)
    posted = {**legit, "first_step": 1, "origin": 0, "job": True, "rank": 0}
    origin.requests.answer(posted, {"status": "ok", "trace": str(own), "steps": 2})
    outsider = client(server)
    forged = {1: {"status": "ok", "trace": str(stray)},
              2: {"status": "error", "message": "\x1b]0;owned\x07 \x1b[2J"},
              3: {"status": "ok", "trace": str(link)}}
    for rank, answer in forged.items():
        outsider.set(key("on_demand", "answer", legit["id"], rank), json.dumps(answer))
    origin.requests._gather(origin.store)
    result = control.take_result(os.getpid(), legit["id"])
    trigger._report(os.getpid(), result)
    out, err = capsys.readouterr()
    assert out.split() == [str(own)]
    for raw in ("\x1b", "\x07"):
        assert raw not in out and raw not in err
    assert "\\x1b" in err
