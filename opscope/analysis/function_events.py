"""Build torch-compatible FunctionEvent objects from a session, on demand.

Only ``profile.events()`` needs per-event objects; tables and traces work on
the columns directly.

Example::

    >>> from opscope.model.records import RawSession
    >>> from opscope.analysis.build import build_session
    >>> function_events(build_session(RawSession.empty()))
    []
"""

from __future__ import annotations

import ast
from typing import Any, List, Optional

from opscope.analysis.aggregate import display_name
from opscope.analysis.modules import module_hierarchy
from opscope.model.function_event import FunctionEvent
from opscope.model.records import SCOPE_USER
from opscope.model.session import ProfileSession


def function_events(session: ProfileSession) -> List[FunctionEvent]:
    """One FunctionEvent per event, sorted by start, with parents and children linked."""
    t = session.table
    base = t.base_ns
    names = t.symbols.names
    # torch.profiler records shapes under with_flops too, and shows them
    with_shapes = session.options.get("record_shapes", False) or \
        session.options.get("with_flops", False)
    flops = session.flops.tolist() if session.flops is not None else None
    stacks = session.stacks
    name_id = t.name_id.tolist()
    start = t.start_ns.tolist()
    end = t.end_ns.tolist()
    rf_thread = t.rf_thread_id.tolist()
    fwd_thread = t.fwd_thread_id.tolist()
    seq = t.seq_nr.tolist()
    scope = t.scope.tolist()
    self_ns = t.self_ns.tolist()
    is_async = t.is_async.tolist()
    parent = t.parent.tolist()
    sig, decoded = t.input_signatures() if with_shapes else (None, [])
    sig_l = sig.tolist() if sig is not None else []
    values = [[concrete_value(text) for text in rec.concrete] for rec in decoded]
    hierarchy = module_hierarchy(session) if session.modules else None
    fused = session.fused_modules
    zeros = [0] * len(t)
    mem = {k: v.tolist() for k, v in (session.event_memory or {}).items()}
    cpu_mem = mem.get("cpu_memory_usage", zeros)
    self_cpu_mem = mem.get("self_cpu_memory_usage", zeros)
    dev_mem = mem.get("device_memory_usage", zeros)
    self_dev_mem = mem.get("self_device_memory_usage", zeros)
    out: List[FunctionEvent] = []
    for i in range(len(t)):
        raw_name = names[name_id[i]]
        shapes = dtypes = concrete = None
        if with_shapes and sig_l[i] >= 0:
            rec = decoded[sig_l[i]]
            shapes, dtypes, concrete = rec.shapes, rec.types, list(values[sig_l[i]])
        out.append(FunctionEvent(
            id=i + 1,
            name=display_name(raw_name),
            trace_name=raw_name,
            thread=rf_thread[i],
            fwd_thread=fwd_thread[i],
            start_us=(start[i] - base) / 1000.0,
            end_us=(end[i] - base) / 1000.0,
            input_shapes=shapes,
            input_dtypes=dtypes,
            concrete_inputs=concrete,
            stack=list(stacks[i] or []) if stacks is not None else [],
            scope=scope[i],
            sequence_nr=seq[i],
            is_async=is_async[i],
            is_user_annotation=scope[i] == SCOPE_USER,
            self_cpu_time_total=self_ns[i] / 1000.0,
            cpu_memory_usage=cpu_mem[i],
            self_cpu_memory_usage=self_cpu_mem[i],
            device_memory_usage=dev_mem[i],
            self_device_memory_usage=self_dev_mem[i],
            flops=flops[i] if flops is not None else None,
            module_hierarchy=hierarchy[i] if hierarchy is not None else "",
            fused_modules=fused.get(i),
        ))
    for i, p in enumerate(parent):
        if p >= 0:
            out[i].cpu_parent = out[p]
            out[p].cpu_children.append(out[i])
    if session.device is not None:
        _add_device(session, out)
    return out


def _add_device(session: ProfileSession, out: List[FunctionEvent]) -> None:
    """Device times on the ops, each op's ``kernels``, and the device events themselves."""
    from opscope.analysis.device import device_function_events, session_device_times

    own, total = session_device_times(session)
    for ev, o, t in zip(out, own.tolist(), total.tolist()):
        ev.set_device_time(o / 1000.0, t / 1000.0)
    device = session.device
    kernels = device_function_events(session, len(out) + 1)
    for ev, owner in zip(kernels, device.owner_row.tolist()):
        if owner >= 0:
            out[owner].kernels.append((ev.name, ev.device_index, ev.device_time_total))
    out.extend(kernels)


def concrete_value(text: str) -> Optional[Any]:
    """A recorded ``Concrete Inputs`` entry as torch's FunctionEvent gives it.

    None for a tensor or an input without a value, else the bool, int, float
    or int list.

    >>> [concrete_value(t) for t in ("", "True", "7", "0.5", "[4, 1]", "mean")]
    [None, True, 7, 0.5, [4, 1], 'mean']
    """
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, (int, float, list)) else text
