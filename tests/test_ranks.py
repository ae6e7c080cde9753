"""Multi-rank analysis (``opscope ranks``) and merging (``opscope merge``) on real torchrun jobs.

Each job is ``tests/ranks_workloads/ddp_train.py`` under ``torch.distributed.run`` on gloo:
a small DDP model trained for a few steps, each rank profiling itself and writing
``train.rank<R>.pt.trace.json`` and the number of collectives it issued. Jobs are shared by
module-scoped fixtures. Durations are never asserted except the issue's tolerance for a
straggler's lateness (and the waits it causes): within 25% of the sleep.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from opscope.analysis.build import load_session
from opscope.analysis.collectives import CollectiveCall
from opscope.analysis.ranks.facts import rank_facts, session_rank
from opscope.load.ranks import trace_paths
from opscope.analysis.ranks.analyse import analyse_ranks
from opscope.analysis.ranks.facts import RankFacts
from opscope.cli.main import main as cli_main
from subprocesses import run_in_group

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "ranks_workloads" / "ddp_train.py"
STEPS = 4
SLEEP_MS = 200.0
TOLERANCE = 0.25
DESYNC_STEP = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(folder: Path, world: int, *args: str, expect_ok: bool = True):
    """Run the DDP workload on ``world`` ranks writing into ``folder``; the finished process."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(SCRIPT), str(folder), "--steps", str(STEPS), *args]
    done = run_in_group(cmd, timeout=240, env=env, cwd=str(folder))
    if expect_ok:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def ranks_json(folder, capsys) -> dict:
    """``opscope ranks FOLDER --json``, run in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["ranks", str(folder), "--json"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    return json.loads(out)


def issued(folder: Path, world: int):
    return [int((folder / f"counts.rank{r}.txt").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """2 ranks, opscope, rank 1 sleeps before each backward."""
    folder = tmp_path_factory.mktemp("two_ranks")
    run_job(folder, 2, "--sleep-rank", "1", "--sleep-ms", str(SLEEP_MS))
    return folder


@pytest.fixture(scope="module")
def two_ranks_torch(tmp_path_factory):
    """The same job under torch.profiler."""
    folder = tmp_path_factory.mktemp("two_ranks_torch")
    run_job(folder, 2, "--sleep-rank", "1", "--sleep-ms", str(SLEEP_MS), "--profiler", "torch")
    return folder


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """4 ranks, opscope, rank 2 sleeps before each backward."""
    folder = tmp_path_factory.mktemp("four_ranks")
    run_job(folder, 4, "--sleep-rank", "2", "--sleep-ms", str(SLEEP_MS))
    return folder


@pytest.fixture(scope="module")
def desync_job(tmp_path_factory):
    """2 ranks; at step DESYNC_STEP rank 1 issues a broadcast rank 0 never issues."""
    folder = tmp_path_factory.mktemp("desync")
    done = run_job(folder, 2, "--desync-rank", "1", "--desync-step", str(DESYNC_STEP),
                   "--timeout-s", "4", expect_ok=False)
    return folder, done


JOBS = {"two_ranks": (2, 1), "four_ranks": (4, 2)}  # fixture -> (world size, sleeping rank)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_matched_collectives_are_the_ones_issued(job, request, capsys):
    folder = request.getfixturevalue(job)
    world, _ = JOBS[job]
    doc = ranks_json(folder, capsys)
    counts = issued(folder, world)
    assert doc["world_size"] == world
    assert counts == [counts[0]] * world and counts[0] == 2 * STEPS
    assert len(doc["collectives"]) == counts[0]
    first = doc["collectives"][0]["seq"]  # torch's number in the group (flight recorder)
    for seq, c in enumerate(doc["collectives"], first):
        assert (c["pg"], c["seq"], c["kind"]) == ("0", seq, "allreduce")
        assert sorted(c["ranks"]) == [str(r) for r in range(world)]
    # DDP's gradient bucket (Linear(32, 32): 32 * 32 + 32 floats), then the loss
    assert [c["bytes"] for c in doc["collectives"][:2]] == [(32 * 32 + 32) * 4, 4]
    assert [r["rank"] for r in doc["ranks"]] == list(range(world))
    assert all(r["steps"] == STEPS for r in doc["ranks"])
    assert doc["desync"] == []


@pytest.mark.parametrize("job", ["two_ranks", "two_ranks_torch", "four_ranks"])
def test_a_lean_load_gives_each_trace_the_facts_of_a_full_load(job, request):
    """``opscope ranks`` reads only the collectives' args (a lean load); every rank trace of
    opscope's and of torch.profiler's jobs gives the same facts as when it is read whole."""
    folder = request.getfixturevalue(job)
    for path in trace_paths(str(folder)):
        full, lean = load_session(path), load_session(path, lean=True)
        rank = session_rank(full, path)
        assert session_rank(lean, path) == rank
        facts = rank_facts(full, path, rank)
        assert rank_facts(lean, path, rank) == facts
        assert facts.calls and all(c.nbytes for c in facts.calls if c.kind != "barrier")
        assert len(lean.table) == len(full.table)
        signed = [(s >= 0).sum() for s in (full.table.input_signatures()[0],
                                           lean.table.input_signatures()[0])]
        assert signed[0] > signed[1] > 0  # the lean load skipped the other ops' inputs


def assert_straggler(doc, sleeper):
    stragglers = doc["stragglers"]
    assert stragglers and stragglers[0]["rank"] == sleeper, stragglers
    assert stragglers[0]["late_count"] >= STEPS - 1
    # the injected sleep, not lost and not counted twice; above it by up to half (the mean
    # includes the first step, where a busy host can start 4 ranks' profilers apart)
    lateness = stragglers[0]["mean_lateness_ms"]
    assert (1 - TOLERANCE) * SLEEP_MS <= lateness <= 1.5 * SLEEP_MS, stragglers


@pytest.mark.parametrize("job", sorted(JOBS))
def test_straggler_is_found_and_the_others_wait_for_it(job, request, capsys):
    folder = request.getfixturevalue(job)
    world, sleeper = JOBS[job]
    doc = ranks_json(folder, capsys)
    assert_straggler(doc, sleeper)
    # at each gradient allreduce the sleeper arrives last and the others wait for it (from
    # the second step: the first also carries each rank's profiler start, which a busy host
    # can delay past the sleep; the fresh-clone CI run saw rank 1 last there once)
    gradients = doc["collectives"][::2]
    assert len(gradients) == STEPS
    for c in gradients[1:]:
        ranks = c["ranks"]
        assert max(ranks, key=lambda r: ranks[r]["start_ms"]) == str(sleeper)
        assert ranks[str(sleeper)]["wait_ms"] < min(
            a["wait_ms"] for r, a in ranks.items() if r != str(sleeper))
    waits = collections.defaultdict(list)
    for c in gradients[1:]:  # the first step also carries the profiler's start
        for r, a in c["ranks"].items():
            waits[r].append(a["wait_ms"])
    for r, values in waits.items():
        if r != str(sleeper):
            mean = sum(values) / len(values)
            assert abs(mean - SLEEP_MS) <= TOLERANCE * SLEEP_MS, (r, values)
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    assert all(by_rank[r]["wait_ms"] > by_rank[sleeper]["wait_ms"]
               for r in range(world) if r != sleeper)


def test_torch_profiler_traces_give_the_same_stragglers(two_ranks, two_ranks_torch, capsys):
    ours, theirs = ranks_json(two_ranks, capsys), ranks_json(two_ranks_torch, capsys)
    assert_straggler(theirs, 1)
    assert [s["rank"] for s in theirs["stragglers"]][:1] == \
        [s["rank"] for s in ours["stragglers"]][:1]
    assert len(theirs["collectives"]) == len(ours["collectives"]) == 2 * STEPS


def test_desync_names_the_first_differing_collective(desync_job, capsys):
    folder, done = desync_job
    assert done.returncode != 0  # the job failed on the process group's timeout
    assert sorted(p.name for p in folder.glob("*.pt.trace.json")) == [
        "train.rank0.pt.trace.json", "train.rank1.pt.trace.json"]
    doc = ranks_json(folder, capsys)
    assert len(doc["desync"]) == 1
    desync = doc["desync"][0]
    # two collectives per step before it: DDP's gradient allreduce and the loss allreduce
    first = doc["collectives"][0]["seq"]  # torch's number in the group (flight recorder)
    assert (desync["pg"], desync["seq"] - first) == ("0", 2 * DESYNC_STEP)
    assert desync["ranks"] == {"0": "allreduce", "1": "broadcast"}
    assert desync["bytes"]["1"] == 3 * 4
    assert "ddp_train.py" in desync["call_sites"]["1"]
    assert desync["call_sites"]["1"].endswith("train_step")


def test_text_report_has_every_section(two_ranks, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["ranks", str(two_ranks), "--limit", "3"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert out.startswith("World size 2\n")
    for heading in ("mean step ms", "Collectives (top 3 of 8 by wait", "Stragglers (",
                    "Desync: none"):
        assert heading in out, out


@pytest.fixture(scope="module")
def merged(two_ranks, tmp_path_factory):
    folder = tmp_path_factory.mktemp("merged")
    out = folder / "merged.pt.trace.json"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["merge", str(two_ranks), "-o", str(out)])
    assert exit_info.value.code == 0
    return out


def x_events(path):
    return [e for e in json.loads(Path(path).read_text())["traceEvents"] if e["ph"] == "X"]


def test_merge_has_one_process_per_rank(two_ranks, merged):
    doc = json.loads(merged.read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    per_rank = collections.Counter(e["pid"] for e in x_events(merged))
    assert per_rank == {r: len(x_events(two_ranks / f"train.rank{r}.pt.trace.json"))
                        for r in (0, 1)}
    # on one clock: each gradient allreduce overlaps on both ranks
    spans = collections.defaultdict(list)
    for e in x_events(merged):
        if e["name"] == "gloo:all_reduce":
            spans[e["pid"]].append((e["ts"], e["ts"] + e["dur"]))
    assert len(spans[0]) == len(spans[1]) == 2 * STEPS
    for (a0, a1), (b0, b1) in zip(sorted(spans[0]), sorted(spans[1])):
        assert a0 < b1 and b0 < a1
    # the merged trace names no rank: 'opscope ranks' and 'merge' skip it in the folder
    assert "rank" not in doc["distributedInfo"]


def test_merge_loads_in_the_trace_viewer(merged):
    from viewer_driver import TraceViewer, missing_viewer_parts

    missing = missing_viewer_parts()
    if missing:
        pytest.skip("trace viewer not installed: " + "; ".join(missing))
    with TraceViewer() as viewer:
        result = viewer.load(merged)
    assert result.ok, result.problems()
    assert sorted(p["name"] for p in result.processes) == ["rank 0", "rank 1"]
    assert result.slice_counts() == dict(collections.Counter(
        (e["pid"], e["tid"]) for e in x_events(merged)))


def test_merge_loads_in_holistic_trace_analysis(merged, tmp_path):
    hta = pytest.importorskip("hta.trace_analysis",
                              reason="HolisticTraceAnalysis (and psutil) not importable")
    folder = tmp_path / "hta"
    folder.mkdir()
    (folder / merged.name).write_bytes(merged.read_bytes())
    analysis = hta.TraceAnalysis(trace_dir=str(folder))
    (rank,) = analysis.t.get_ranks()
    df = analysis.t.get_trace(rank)
    assert sorted(df["pid"].unique().tolist()) == [0, 1]
    symbols = analysis.t.symbol_table.get_sym_table()
    names = collections.Counter(symbols[i] for i in df["name"])
    assert names["gloo:all_reduce"] == names["c10d::allreduce_"] == 2 * 2 * STEPS


def cli_error(argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("opscope: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("verb", ["ranks", "merge"])
def test_cli_errors_are_one_line(verb, tmp_path, capsys):
    assert "no such file or folder" in cli_error([verb, str(tmp_path / "nope")], capsys)
    assert "no .json or .json.gz traces" in cli_error([verb, str(tmp_path)], capsys)
    (tmp_path / "t.pt.trace.json").write_text(json.dumps({"traceEvents": []}))
    assert "no trace names its rank" in cli_error([verb, str(tmp_path)], capsys)
    (tmp_path / "train.rank0.pt.trace.json").write_text('{"traceEvents": [')
    assert "train.rank0.pt.trace.json" in cli_error([verb, str(tmp_path)], capsys)


def call(kind, nbytes, arrival, duration):
    return CollectiveCall(kind, nbytes, arrival, arrival + duration, duration)


def test_synthetic_desync_when_a_rank_issues_none():
    ms = 10 ** 6
    a = RankFacts(0, calls=[call("allreduce", 8, 0, ms), call("barrier", 0, 5 * ms, ms)])
    b = RankFacts(1, calls=[call("allreduce", 8, 0, ms)])
    result = analyse_ranks([a, b])
    assert len(result.collectives) == 2
    (d,) = result.desync
    assert (d.pg, d.seq, d.ranks) == ("0", 1, {0: "barrier", 1: None})


def test_synthetic_point_to_point_is_not_matched_and_noise_names_no_straggler():
    ms = 10 ** 6
    a = RankFacts(0, calls=[call("send", 8, 0, ms), call("allreduce", 8, 10 * ms, 2 * ms)])
    b = RankFacts(1, calls=[call("allreduce", 8, 10 * ms + ms // 2, ms)])
    result = analyse_ranks([a, b])
    assert [(c.seq, c.kind) for c in result.collectives] == [(0, "allreduce")]
    assert result.desync == [] and result.stragglers == []
    ranks = result.collectives[0].ranks
    assert (ranks[0].wait_ms, ranks[0].transfer_ms, ranks[1].wait_ms) == (1.0, 1.0, 0.0)


def test_clock_offset_moves_a_rank_in_the_analysis_and_the_merge(two_ranks, tmp_path, capsys):
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    for r in (0, 1):
        doc = json.loads((two_ranks / f"train.rank{r}.pt.trace.json").read_text())
        if r == 1:
            doc["opscopeClockOffsetNs"] = 10 ** 9  # rank 1's clock is 1 s behind rank 0's
        (shifted / f"train.rank{r}.pt.trace.json").write_text(json.dumps(doc))
    before, after = ranks_json(two_ranks, capsys), ranks_json(shifted, capsys)
    for old, new in zip(before["collectives"], after["collectives"]):
        gap = [c["ranks"]["1"]["start_ms"] - c["ranks"]["0"]["start_ms"] for c in (old, new)]
        assert abs(gap[1] - gap[0] - 1000) < 0.01, gap
    with pytest.raises(SystemExit):
        cli_main(["merge", str(shifted), "-o", str(tmp_path / "a.json")])
    with pytest.raises(SystemExit):
        cli_main(["merge", str(two_ranks), "-o", str(tmp_path / "b.json")])

    def first_allreduce(path, pid):
        return min(e["ts"] for e in x_events(path)
                   if e["pid"] == pid and e["name"] == "gloo:all_reduce")

    gaps = [first_allreduce(tmp_path / n, 1) - first_allreduce(tmp_path / n, 0)
            for n in ("b.json", "a.json")]
    assert abs(gaps[1] - gaps[0] - 10 ** 6) < 0.01, gaps


def test_a_rank_without_a_trace_is_named(two_ranks, tmp_path, capsys):
    doc = json.loads((two_ranks / "train.rank0.pt.trace.json").read_text())
    doc["distributedInfo"]["world_size"] = 3
    (tmp_path / "train.rank0.pt.trace.json").write_text(json.dumps(doc))
    assert ranks_json(tmp_path, capsys)["missing_ranks"] == [1, 2]
