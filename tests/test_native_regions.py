"""Where the native observer writes: 2 MiB regions, kept between sessions.

A fresh page costs a fault the first time it is written, which on a VM cost
more than the rest of an op's record (observer.cpp, RegionPool). A stopped
session's regions are kept, up to a bound, so the next session writes its
records and inputs into pages already there.
"""

from __future__ import annotations

import resource

import pytest
import torch

import opscope

RECORD_SLOT_BYTES = 56  # a 48-byte record and torch's context beside it


def native():
    from opscope.collect.native_build import load_native

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
