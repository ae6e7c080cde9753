"""A session's facts besides its rows, as the JSON text of the ``sessions`` table's ``extras``.

The events, inputs, stacks and memory tables hold the rows; ``extras`` holds
the rest that an exact round trip needs: the thread ids, thread names, marks,
modules and module calls, memory sightings, the ``python_function``
records a session hides from its rows but kept in its tree
(``python_functions == "hidden"``), and the rows and bytes of the window's files
(``parts``: ``opscope.store.parts``). :func:`session_extras` writes it,
:func:`read_extras` checks its types and returns the parts.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> text = session_extras(build_session(RawSession.empty()))
    >>> read_extras(text)["thread_ids"]
    []
"""

from __future__ import annotations

import json
from dataclasses import fields
from operator import attrgetter
from typing import Any, Dict, List, Optional

import numpy as np

from opscope.model.memory import SIGHTING_DTYPE
from opscope.model.modules import ModuleCall, ModuleInfo
from opscope.model.records import FLAG_PYTHON_FUNCTION, RECORD_DTYPE
from opscope.model.session import ProfileSession
from opscope.store.folder import Footer
from opscope.store.parts import parts_doc, recorded_parts
from opscope.store.schema import StoreError, load_json

# a hidden record: its record index, name and RECORD_DTYPE fields (session clock)
HIDDEN_FIELDS = ("start_ns", "end_ns", "seq_nr", "thread_index", "fwd_thread_id",
                 "rf_thread_id", "scope", "flags")


def hidden_records(session: ProfileSession) -> List[list]:
    """``[record, name, *HIDDEN_FIELDS]`` of each raw record the session hides."""
    raw = session.table.raw
    if raw is None or session.python_functions != "hidden" or not len(raw.records):
        return []
    mine = np.zeros(len(raw.records), dtype=bool)
    mine[session.table.record[session.table.record >= 0]] = True
    hidden = np.flatnonzero(~mine & ((raw.records["flags"] & FLAG_PYTHON_FUNCTION) != 0))
    rec = raw.records[hidden]
    columns = [hidden.tolist(), [raw.names[i] for i in rec["name_id"].tolist()]]
    columns += [rec[name].tolist() for name in HIDDEN_FIELDS]
    return [list(row) for row in zip(*columns)]


def _as_dicts(items: Any, cls: type) -> List[Dict[str, Any]]:
    """Each of ``items`` (instances of the flat dataclass ``cls``) as a dict of its fields,
    as ``dataclasses.asdict`` gives it, 30 times faster (one call per module forward).

    >>> _as_dicts([ModuleCall("m", 1, 2, 3)], ModuleCall)
    [{'name': 'm', 'os_tid': 1, 'seq_begin': 2, 'seq_end': 3}]
    """
    names = tuple(f.name for f in fields(cls))
    values = attrgetter(*names)
    return [dict(zip(names, values(item))) for item in items]


def session_extras(session: ProfileSession, parts: Optional[Dict[str, Footer]] = None) -> str:
    """The JSON text of everything but rows that rebuilding ``session`` needs, and the
    footers of the window's files (``parts``: table -> Footer, see ``opscope.store.parts``)."""
    sightings = session.memory_sightings
    doc: Dict[str, Any] = {
        "thread_ids": [int(t) for t in session.table.thread_ids.tolist()],
        "thread_names": [[int(k), str(v)] for k, v in session.thread_names.items()],
        "marks": [[int(t), int(tid), str(msg)] for t, tid, msg in session.marks],
        "modules": None if session.modules is None else list(session.modules.values()),
        "module_calls": list(session.module_calls),
        "memory_sightings": None if sightings is None else
        [[int(v) for v in row] for row in sightings.tolist()],
        "has_stacks": session.stacks is not None,
        "hidden_records": hidden_records(session),
    }
    if parts:
        doc["parts"] = parts_doc(parts)
    return _compact_json(doc)


def _compact_json(doc: Dict[str, Any]) -> str:
    """``json.dumps(doc, separators=(",", ":"))``, the module dataclasses as dicts of their
    fields: msgspec's text where it is the same (pure ASCII), 7 times faster at a million
    module calls; json's otherwise (non-ASCII, which json escapes; what msgspec refuses).

    >>> _compact_json({"module_calls": [ModuleCall("m", 1, 2, 3)], "n": None})
    '{"module_calls":[{"name":"m","os_tid":1,"seq_begin":2,"seq_end":3}],"n":null}'
    """
    try:
        import msgspec

        text = msgspec.json.encode(doc)
        if text.isascii():
            return text.decode("ascii")
    except Exception:  # noqa: BLE001  (msgspec absent, or a value it refuses: json's way)
        pass
    slow = dict(doc)
    for key, cls in (("modules", ModuleInfo), ("module_calls", ModuleCall)):
        if slow.get(key) is not None:
            slow[key] = _as_dicts(slow[key], cls)
    return json.dumps(slow, separators=(",", ":"))


def _list(doc: dict, key: str, where: str) -> list:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise StoreError(f"{where}: extras.{key} is not a list")
    return value


def read_extras(text: str, where: str = "store") -> Dict[str, Any]:
    """The parts of an ``extras`` text, typed; StoreError naming ``where`` when malformed."""
    try:
        doc = load_json(text or "{}")
        if not isinstance(doc, dict):
            raise TypeError("not an object")
        modules = doc.get("modules")
        sightings = doc.get("memory_sightings")
        hidden = _list(doc, "hidden_records", where)
        records = np.zeros(len(hidden), RECORD_DTYPE)
        out = {
            "thread_ids": [int(t) for t in _list(doc, "thread_ids", where)],
            "thread_names": {int(k): str(v) for k, v in _list(doc, "thread_names", where)},
            "marks": [(int(t), int(tid), str(m)) for t, tid, m in _list(doc, "marks", where)],
            "modules": None if modules is None else
            {m["name"]: ModuleInfo(**m) for m in modules},
            "module_calls": [ModuleCall(**c) for c in _list(doc, "module_calls", where)],
            "memory_sightings": None if sightings is None else
            np.array([tuple(r) for r in sightings], dtype=SIGHTING_DTYPE),
            "has_stacks": bool(doc.get("has_stacks")),
            "hidden_index": [int(r[0]) for r in hidden],
            "hidden_names": [str(r[1]) for r in hidden],
            "parts": recorded_parts(doc.get("parts"), where),
        }
        for i, name in enumerate(HIDDEN_FIELDS):
            records[name] = [int(r[2 + i]) for r in hidden]
        out["hidden_records"] = records
        return out
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise StoreError(f"{where}: malformed sessions.extras ({exc})") from None
