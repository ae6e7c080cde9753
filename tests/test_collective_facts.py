"""Every collective's group, number, sizes and dtype, by default (issue 31, point 1).

One real 2-rank gloo job (``tests/ranks_workloads/ddp_train.py`` under torchrun, plain
``opscope.profile()``: no record_shapes, no with_stack, no environment variable): a
DDP model's gradient allreduce and a loss allreduce on the default group, an
all_gather on a second group each step, and on the last step rank 1's loss
allreduce smaller than rank 0's (the job then fails on its short process-group
timeout, with its traces written); each step also sends point to point both ways
(``send``/``recv``, ``isend``/``irecv``), which torch's flight recorder does not keep on gloo. torch.profiler writes no ``record_param_comms``
on gloo (torch 2.13), so its own counts are compared on a synthetic NCCL-style trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opscope.analysis.ranks.facts import load_ranks
from opscope.analysis.ranks.analyse import analyse_ranks
from opscope.cli.main import main as cli_main
from opscope.model.collective_facts import CollectiveFacts
from test_ranks import STEPS, ranks_json, run_job

SMALL_STEP = STEPS - 1


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("groups")
    done = run_job(folder, 2, "--plain", "--second-group", "--p2p", "--small-rank", "1",
                   "--small-step", str(SMALL_STEP), "--timeout-s", "4", expect_ok=False)
    assert sorted(p.name for p in folder.glob("*.pt.trace.json")) == [
        "train.rank0.pt.trace.json", "train.rank1.pt.trace.json"], done.stderr[-3000:]
    return folder


def issued_per_group(folder: Path, rank: int) -> dict:
    return json.loads((folder / f"groups.rank{rank}.txt").read_text())


def test_per_group_numbers_are_what_the_job_issued(job, capsys):
    doc = ranks_json(job, capsys)
    by_group = {}
    for c in doc["collectives"]:
        by_group.setdefault(c["pg"], []).append(c)
    issued = issued_per_group(job, 0)
    assert issued == issued_per_group(job, 1) == {"0": 2 * STEPS, "1": STEPS}
    assert {pg: len(cs) for pg, cs in by_group.items()} == issued
    assert [c["kind"] for c in by_group["1"]] == ["allgather"] * STEPS
    assert [c["kind"] for c in by_group["0"]] == ["allreduce"] * 2 * STEPS
    for cs in by_group.values():  # torch's numbers: consecutive within each group
        assert [c["seq"] for c in cs] == list(range(cs[0]["seq"], cs[0]["seq"] + len(cs)))
        assert all(sorted(c["ranks"]) == ["0", "1"] for c in cs)
    gathers = by_group["1"][0]["ranks"]["0"]
    assert (gathers["in_nelems"], gathers["out_nelems"], gathers["dtype"]) == (6, 12, "Float")
    assert by_group["1"][0]["bytes"] == 24  # no record_shapes: from the element count


def test_a_smaller_allreduce_is_named_at_its_own_number(job, capsys):
    doc = ranks_json(job, capsys)
    loss = [c for c in doc["collectives"] if c["pg"] == "0"][2 * SMALL_STEP + 1]
    assert len(doc["desync"]) == 1
    d = doc["desync"][0]
    assert (d["pg"], d["seq"]) == ("0", loss["seq"])
    assert d["ranks"] == {"0": "allreduce", "1": "allreduce"}
    assert d["in_nelems"] == {"0": 4, "1": 2} and d["bytes"] == {"0": 16, "1": 8}
    assert d["dtypes"] == {"0": "Float", "1": "Float"}
    # each rank's Python call site, with no with_stack and no torch._inductor imported
    assert set(d["call_sites"]) == {"0", "1"}
    for site in d["call_sites"].values():
        assert "ddp_train.py(" in site and site.endswith(": counted_all_reduce"), site
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(["ranks", str(job)])
    assert "rank 1: allreduce (8 B, 2 -> 2 elements, Float)" in capsys.readouterr().out


def p2p_events(folder: Path, rank: int, name: str) -> list:
    doc = json.loads((folder / f"train.rank{rank}.pt.trace.json").read_text())
    return [e["args"] for e in doc["traceEvents"] if e.get("name") == name]


def test_point_to_point_ops_carry_group_number_sizes_and_peer(job):
    sends = {r: p2p_events(job, r, "c10d::send") for r in (0, 1)}
    recvs = {r: p2p_events(job, r, "c10d::recv_") for r in (0, 1)}
    assert [len(sends[r]) for r in (0, 1)] == [len(recvs[r]) for r in (0, 1)] == [STEPS] * 2
    fields = ("Process Group Name", "Process Group Ranks", "In msg nelems", "dtype")
    assert {tuple(a[k] for k in fields) + (a["Dst Rank"],) for a in sends[0]} == {
        ("0", "[0, 1]", 5, "Float", 1)}
    assert {tuple(a[k] for k in fields) + (a["Src Rank"],) for a in recvs[1]} == {
        ("0", "[0, 1]", 5, "Float", 0)}
    assert {tuple(a[k] for k in fields) + (a["Dst Rank"],) for a in sends[1]} == {
        ("0", "[0, 1]", 3, "Double", 0)}
    assert {tuple(a[k] for k in fields) + (a["Src Rank"],) for a in recvs[0]} == {
        ("0", "[0, 1]", 3, "Double", 1)}
    # torch's group number: a send and its receive have the same on both ranks
    assert [a["Seq"] for a in sends[0]] == [a["Seq"] for a in recvs[1]]
    assert [a["Seq"] for a in sends[1]] == [a["Seq"] for a in recvs[0]]
    assert all(a["Seq"] > 0 for a in sends[0] + sends[1])
    assert all(a["Collective Call Site"].endswith(": point_to_point")
               for a in sends[0] + recvs[0] + sends[1] + recvs[1])


def test_trace_events_carry_torchs_args(job):
    doc = json.loads((job / "train.rank1.pt.trace.json").read_text())
    gathers = [e for e in doc["traceEvents"] if e.get("name") == "c10d::allgather_"]
    assert len(gathers) == STEPS
    args = gathers[0]["args"]
    assert {k: args[k] for k in ("Process Group Name", "Process Group Ranks", "Group size",
                                 "In msg nelems", "Out msg nelems", "dtype")} == {
        "Process Group Name": "1", "Process Group Ranks": "[0, 1]", "Group size": 2,
        "In msg nelems": 6, "Out msg nelems": 12, "dtype": "Float"}
    assert [e["args"]["Seq"] for e in gathers] == list(
        range(args["Seq"], args["Seq"] + STEPS))
    plain = [e for e in doc["traceEvents"] if e.get("name") == "aten::repeat"]
    assert plain and not any("Seq" in e["args"] for e in plain)  # other ops: nothing


def test_the_store_holds_the_facts(job, tmp_path, capsys):
    pytest.importorskip("duckdb")
    from opscope.store.connect import connect

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["convert", str(job), "-o", str(tmp_path / "s")])
    assert exit_info.value.code == 0
    con = connect(str(tmp_path / "s"))
    rows = con.execute("SELECT DISTINCT pg, pg_desc, pg_ranks, in_nelems, out_nelems, dtype "
                       "FROM collectives WHERE kind = 'allgather'").fetchall()
    assert rows == [("1", "undefined", "[0, 1]", 6, 12, "Float")]
    p2p = con.execute("SELECT kind, fr_pg, count(*), count(DISTINCT fr_seq), min(in_nelems) "
                      "FROM collectives WHERE kind IN ('send', 'recv') "
                      "GROUP BY kind, fr_pg ORDER BY kind").fetchall()
    assert p2p == [("recv", "0", 2 * STEPS, 2 * STEPS, 3), ("send", "0", 2 * STEPS, 2 * STEPS, 3)]
    assert ranks_json(tmp_path / "s", capsys)["desync"] == ranks_json(job, capsys)["desync"]


def rank_trace(rank: int, small: bool) -> dict:
    """A torch.profiler NCCL-style trace: each dispatcher op holds a record_param_comms
    whose args carry its facts (two groups; rank 1's third allreduce is smaller)."""
    events, ts = [], 100.0
    plan = [("allreduce_", "0", 1, 8), ("allgather_", "1", 1, 4), ("allreduce_", "0", 2, 8),
            ("allreduce_", "0", 3, 2 if small else 8), ("allgather_", "1", 2, 4)]
    for name, pg, seq, n in plan:
        events.append({"ph": "X", "cat": "cpu_op", "name": "c10d::" + name, "pid": 1,
                       "tid": 1, "ts": ts, "dur": 20.0, "args": {}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1,
                       "tid": 1, "ts": ts + 5, "dur": 10.0, "args": {
                           "Collective name": name.rstrip("_"), "dtype": "Float",
                           "In msg nelems": n, "Out msg nelems": n * (2 if pg == "1" else 1),
                           "Group size": 2, "Process Group Name": pg,
                           "Process Group Description": "default_pg" if pg == "0" else "dp",
                           "Process Group Ranks": "[0, 1]", "Rank": rank, "Seq": seq}})
        ts += 100
    info = {"backend": "nccl", "rank": rank, "world_size": 2,
            "pg_config": [{"pg_name": "0", "ranks": [0, 1]}, {"pg_name": "1", "ranks": [0, 1]}]}
    return {"distributedInfo": info, "traceEvents": events}


def test_torch_profilers_record_param_comms_args_key_the_match(tmp_path):
    for rank in (0, 1):
        path = tmp_path / f"nccl.rank{rank}.pt.trace.json"
        path.write_text(json.dumps(rank_trace(rank, small=rank == 1)))
    result = analyse_ranks(load_ranks(str(tmp_path)))
    keys = [(c.pg, c.seq, c.kind) for c in result.collectives]
    assert keys == [("0", 1, "allreduce"), ("0", 2, "allreduce"), ("0", 3, "allreduce"),
                    ("1", 1, "allgather"), ("1", 2, "allgather")]  # torch's own counts
    (d,) = result.desync
    assert (d.pg, d.seq, d.in_nelems, d.bytes) == ("0", 3, {0: 8, 1: 2}, {0: 32, 1: 8})


def test_a_trace_without_facts_keeps_the_ordinal_rule(tmp_path):
    for rank in (0, 1):
        doc = rank_trace(rank, small=False)
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e["name"] != "record_param_comms"]
        (tmp_path / f"t.rank{rank}.pt.trace.json").write_text(json.dumps(doc))
    result = analyse_ranks(load_ranks(str(tmp_path)))
    assert [(c.pg, c.seq) for c in result.collectives] == [("0", s) for s in range(5)]


def test_facts_from_args_refuse_wrong_types():
    assert CollectiveFacts.from_args({"Process Group Name": 3, "Seq": "x"}) is None
    facts = CollectiveFacts.from_args({"Process Group Name": "0", "Seq": -1,
                                       "Process Group Ranks": "[0, oops]", "dtype": 4})
    assert facts == CollectiveFacts("0")


def test_the_recorders_entries_become_rows_and_bad_ones_are_skipped(monkeypatch):
    from opscope.collect.job import flight_recorder

    good = {"time_created_ns": 50, "process_group": ("2", "tp"), "is_p2p": False,
            "collective_seq_id": 7, "p2p_seq_id": 0, "profiling_name": "nccl:all_reduce",
            "input_sizes": [[2, 3]], "output_sizes": [[2, 3]], "input_dtypes": ["BFloat16"],
            "frames": [{"name": "all_reduce", "filename": "/x/torch/distributed/c10d.py",
                        "line": 9}, {"name": "step", "filename": "/job/train.py", "line": 12}]}
    early = dict(good, time_created_ns=5)  # before the window
    broken = dict(good, process_group=None)
    p2p = dict(good, is_p2p=True, p2p_seq_id=4, profiling_name="nccl:send")
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.setattr(flight_recorder, "_dump",
                        lambda: {"entries": [early, broken, good, p2p, "junk"]})
    assert flight_recorder.flight_recorder_rows(10) == [
        ["2", 7, "nccl:all_reduce", 50, "tp", 6, 6, "BFloat16", "/job/train.py(12): step",
         False],
        ["2", 4, "nccl:send", 50, "tp", 6, 6, "BFloat16", "/job/train.py(12): step", True]]
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")  # the user turned it off: not read
    assert flight_recorder.flight_recorder_rows(10) is None

    def fails():
        raise RuntimeError("no recorder")

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")
    monkeypatch.setattr(flight_recorder, "_dump", fails)
    assert flight_recorder.flight_recorder_rows(10) is None  # never raises into the job
