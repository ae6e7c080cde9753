"""Several RawSessions of one process as one: ``join_raw(raws)``; ``records_since(raw, t)``.

The black box (``opscope.blackbox``) records in consecutive windows and
writes the last few as one trace. Each window's collector numbers its own
threads, names, stacks and inputs, so joining renumbers them: threads by OS
thread id, names by text, stack ids and input offsets by the windows before.
``records_since`` keeps a window's records that end at or after a time (and
its allocations made then), renumbering what is keyed by record index.

Example::

    >>> import numpy as np
    >>> from opscope.model.records import RECORD_DTYPE, RawSession
    >>> def window(name, tid, start):
    ...     recs = np.zeros(1, RECORD_DTYPE)
    ...     recs["start_ns"], recs["end_ns"] = start, start + 5
    ...     return RawSession(recs, [np.zeros(0, np.int64)], [tid], [name], start, start + 9, 0)
    >>> joined = join_raw([window("aten::add", 7, 0), window("aten::mul", 8, 10)])
    >>> [joined.names[i] for i in joined.records["name_id"]], joined.thread_ids
    (['aten::add', 'aten::mul'], [7, 8])
    >>> len(records_since(joined, 12).records)
    1
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import numpy as np

from opscope.model.records import FLAG_UNFINISHED, NO_INPUTS, NO_STACK, RawSession


def join_raw(raws: Sequence[RawSession]) -> RawSession:
    """One RawSession holding every record of ``raws`` (windows in time order).

    The metadata, options and process are the last window's, updated over the
    earlier ones'; ``start_ns`` is the first's, ``stop_ns`` the last's.
    """
    raws = [r for r in raws if r is not None]
    if len(raws) == 1:
        return raws[0]
    if not raws:
        return RawSession.empty()
    names: Dict[str, int] = {}
    tids: Dict[int, int] = {}
    records, memory, stack_ids, calls, marks = [], [], [], [], []
    inputs: Dict[int, List[np.ndarray]] = {}
    input_words: Dict[int, int] = {}
    stack_table: List[List[str]] = []
    metadata: dict = {}
    thread_names: Dict[int, str] = {}
    modules: Optional[dict] = None
    sites: Optional[dict] = None
    fused: dict = {}
    facts: dict = {}
    sightings = []
    any_stacks = any(r.stack_ids is not None for r in raws)
    offset = 0
    for raw in raws:
        name_map = np.array([names.setdefault(n, len(names)) for n in raw.names] or [0],
                            np.int32)
        thread_map = np.array([tids.setdefault(t, len(tids)) for t in raw.thread_ids] or [0],
                              np.int32)
        recs = raw.records.copy()
        recs["name_id"] = name_map[recs["name_id"]]
        recs["thread_index"] = thread_map[recs["thread_index"]]
        for index, blob in enumerate(raw.inputs):
            thread = int(thread_map[index])
            mine = recs["thread_index"] == thread
            shift = input_words.get(thread, 0)
            has_inputs = mine & (recs["input_offset"] != NO_INPUTS)
            recs["input_offset"][has_inputs] += np.uint32(shift)
            inputs.setdefault(thread, []).append(blob)
            input_words[thread] = shift + len(blob)
        records.append(recs)
        if len(raw.memory):
            mem = raw.memory.copy()
            mem["thread_index"] = thread_map[mem["thread_index"]]
            memory.append(mem)
        if any_stacks:
            ids = (raw.stack_ids.astype(np.int64) if raw.stack_ids is not None
                   else np.full(len(recs), NO_STACK, np.int64))
            ids = np.where(ids == NO_STACK, NO_STACK, ids + len(stack_table))
            stack_ids.append(ids)
            stack_table.extend(raw.stack_table or [])
        calls.extend(raw.module_calls)
        marks.extend(raw.marks)
        metadata.update(raw.metadata)
        thread_names.update(raw.thread_names)
        if raw.modules is not None:
            modules = {**(modules or {}), **raw.modules}
        if raw.compiled_sites is not None:
            sites = {**(sites or {}), **raw.compiled_sites}
        fused.update({i + offset: v for i, v in raw.fused_modules.items()})
        facts.update({i + offset: v for i, v in raw.collective_facts.items()})
        if raw.memory_sightings is not None:
            sightings.append(raw.memory_sightings)
        offset += len(recs)
    last = raws[-1]
    empty = np.zeros(0, np.int64)
    return dataclasses.replace(
        last, records=np.concatenate(records), names=list(names),
        thread_ids=list(tids),
        inputs=[np.concatenate(inputs.get(t, [empty])) for t in range(len(tids))],
        start_ns=raws[0].start_ns, memory=(np.concatenate(memory) if memory else last.memory[:0]),
        stack_ids=np.concatenate(stack_ids) if any_stacks else None,
        stack_table=stack_table if any_stacks else None,
        marks=marks, module_calls=calls, metadata=metadata, thread_names=thread_names,
        modules=modules, compiled_sites=sites, fused_modules=fused, collective_facts=facts,
        memory_sightings=np.concatenate(sightings) if sightings else None)


def records_since(raw: RawSession, since_ns: int) -> RawSession:
    """``raw`` without the records that ended before ``since_ns`` (nor allocations made
    before it); ``start_ns`` becomes ``since_ns`` when later. An op still open at the
    window's stop (FLAG_UNFINISHED) is kept."""
    recs = raw.records
    keep = (recs["end_ns"] >= since_ns) | ((recs["flags"] & FLAG_UNFINISHED) != 0)
    if keep.all():
        return raw
    new_index = np.cumsum(keep) - 1

    def renumbered(by_index: dict) -> dict:
        return {int(new_index[i]): v for i, v in by_index.items() if keep[i]}

    memory = raw.memory[raw.memory["time_ns"] >= since_ns] if len(raw.memory) else raw.memory
    return dataclasses.replace(
        raw, records=recs[keep], memory=memory,
        stack_ids=None if raw.stack_ids is None else raw.stack_ids[keep],
        start_ns=max(raw.start_ns, since_ns),
        marks=[m for m in raw.marks if m[0] >= since_ns],
        fused_modules=renumbered(raw.fused_modules),
        collective_facts=renumbered(raw.collective_facts))


def raw_bytes(raw: RawSession) -> int:
    """About the memory ``raw`` holds: its arrays' bytes (records, inputs, allocations,
    stack ids) plus 100 bytes per stack frame text."""
    total = raw.records.nbytes + raw.memory.nbytes + sum(b.nbytes for b in raw.inputs)
    if raw.stack_ids is not None:
        total += raw.stack_ids.nbytes + 100 * sum(len(s) for s in raw.stack_table or [])
    return int(total)
