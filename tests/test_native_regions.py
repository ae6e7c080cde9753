"""Where the native observer writes: 2 MiB regions, kept between sessions.

A fresh page costs a fault the first time it is written, which on a VM cost
more than the rest of an op's record (observer/records.h, RegionPool). A stopped
session's regions are kept, up to a bound, so the next session writes its
records and inputs into pages already there.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opscope
from subprocesses import run_in_group

REPO = Path(__file__).resolve().parents[1]

RECORD_SLOT_BYTES = 56  # a 48-byte record and torch's context beside it


def native():
    from opscope.collect.native.build import load_native

    return load_native()


def thread_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


@pytest.mark.parametrize("record_shapes", [False, True])
def test_a_second_session_writes_into_pages_already_there(native_only, record_shapes):
    x = torch.ones(2)
    ops = 12_000  # 60k records (x.add(1) is five ops) in two regions, inputs in three

    def session() -> tuple[int, int]:
        with opscope.profile(record_shapes=record_shapes) as prof:
            before = thread_faults()
            for _ in range(ops):
                x.add(1)
            faults = thread_faults() - before
        return faults, len(prof.events())

    session()
    faults, records = session()
    record_pages = records * RECORD_SLOT_BYTES // 4096
    assert records > native().region_bytes // RECORD_SLOT_BYTES  # more than one region
    # writing the records into fresh 4 KiB pages faults once per page (over 1,300 here)
    assert faults < record_pages // 20, (faults, record_pages)


def test_regions_kept_between_sessions_are_bounded(native_only):
    ext = native()
    x = torch.ones(2)
    per_region = ext.region_bytes // RECORD_SLOT_BYTES
    held_before = ext.held_record_bytes()  # chunks of earlier sessions' still-open ranges
    with opscope.profile() as prof:
        for _ in range((ext.pooled_regions_max + 2) * per_region // 5 + 1):
            x.add(1)
    assert len(prof.events()) > (ext.pooled_regions_max + 2) * per_region
    assert ext.held_record_bytes() == held_before  # every region of this session let go
    assert ext.pooled_region_bytes() == ext.pooled_regions_max * ext.region_bytes
    with opscope.profile() as prof:  # takes its region from those kept
        x.add(1)
    assert ext.pooled_region_bytes() == ext.pooled_regions_max * ext.region_bytes
    assert [e.name for e in prof.events()].count("aten::add") == 1


def test_a_range_open_at_stop_lets_its_region_go_once_it_ends(native_only):
    ext = native()
    x = torch.ones(2)
    held_before = ext.held_record_bytes()
    rf = opscope.record_function("open across the stop")
    with opscope.profile():
        rf.__enter__()
        x.add(1)
    assert ext.held_record_bytes() == held_before + ext.region_bytes  # its late end lands there
    rf.__exit__(None, None, None)
    with opscope.profile() as prof:  # this stop frees what the last one kept
        x.add(1)
    assert ext.held_record_bytes() == held_before
    assert [e.name for e in prof.events()].count("aten::add") == 1


MEMORY_RUNS_OUT = """
    import json, resource, warnings
    import torch, opscope
    from opscope.collect.native.build import load_native

    ext = load_native()
    per_region = ext.region_bytes // {slot_bytes}
    x = torch.ones(2)
    with opscope.profile({options}):  # leaves its regions for the next session
        x.add(1)
    size = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize")))
    limit = resource.getrlimit(resource.RLIMIT_AS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opscope.profile({options}) as prof:
            # no new mapping from here: the next region cannot be had
            resource.setrlimit(resource.RLIMIT_AS, ((size << 10) + (1 << 20), limit[1]))
            y = x
            for _ in range(per_region // 4):  # x.add(1) is five records: more than a region
                y = y.add(1)
            resource.setrlimit(resource.RLIMIT_AS, limit)  # what stop() copies needs memory
    adds = [e for e in prof.events() if e.name == "aten::add"]
    with opscope.profile() as after:  # and recording goes on
        x.mul(2)
    print(json.dumps({{
        "result": float(y[0]), "expected": 1.0 + per_region // 4,
        "records": sum(1 for e in prof.events() if e.name != "[memory]"),
        "per_region": per_region,
        "with_inputs": sum(1 for e in adds if e.input_shapes == [[2], [], []]),
        "adds": len(adds),
        "warnings": [str(w.message) for w in caught if "opscope" in str(w.message)],
        "after": [e.name for e in after.events()],
    }}))
"""


@pytest.mark.parametrize("options", ["", "record_shapes=True",
                                     "record_shapes=True, with_stack=True, profile_memory=True"])
def test_memory_running_out_while_recording_drops_ops_not_the_job(options):
    """No new region can be mapped (the address space is capped mid-session): ops past the
    first region are left out, stop() still returns what was recorded, one warning says so,
    and the job's own results are right. Before, stop() waited forever on the op whose
    chunk allocation threw."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OPSCOPE_COLLECTOR="native")
    source = textwrap.dedent(MEMORY_RUNS_OUT).format(options=options,
                                                     slot_bytes=RECORD_SLOT_BYTES)
    proc = run_in_group([sys.executable, "-c", source], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"] == out["expected"]
    assert out["records"] == out["per_region"]  # one region's worth, whole
    assert len(out["warnings"]) == 1 and "memory ran out" in out["warnings"][0]
    if options == "record_shapes=True":  # the inputs' region filled first: later ops kept
        assert 0 < out["with_inputs"] < out["adds"]
    assert "aten::mul" in out["after"]
