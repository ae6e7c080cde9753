"""A black box dump: the ring's windows as one trace, named for the script, reason and time.

``dump_path(folder, reason)`` is
``FOLDER/<script>.blackbox.<reason>.<unix_ms>.pt.trace.json.gz``.
``write_dump(windows, path, facts)`` joins the windows, keeps what ended
within the black box's ``seconds`` of the dump, builds the session and
writes it as a Chrome trace that every verb reads, with the reason, the
window and the facts of the moment under the metadata key
``opscopeBlackBox``. A ``slow_step`` dump also names the ops that account
for the slow step (``opscope.analysis.step_difference``) in the facts.

Example::

    >>> import os
    >>> os.path.basename(dump_path("out", "manual", unix_ns=1_700_000_000_123_456_789,
    ...                            script="train.py"))
    'train.blackbox.manual.1700000000123.pt.trace.json.gz'
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional

from opscope.analysis.build import build_session
from opscope.analysis.step_difference import step_difference
from opscope.export.chrome_trace import write_chrome_trace
from opscope.model.raw_join import join_raw, records_since
from opscope.model.records import RawSession

BLACKBOX_KEY = "opscopeBlackBox"
REASONS = ("exception", "signal", "slow_step", "stall", "trigger", "manual", "fatal")


def script_name(argv0: Optional[str] = None) -> str:
    """The running script's name without ``.py`` (``python`` when there is none).

    >>> script_name("/jobs/train.py"), script_name(""), script_name("-c")
    ('train', 'python', 'python')
    """
    argv0 = (sys.argv[0] if sys.argv else "") if argv0 is None else argv0
    base = os.path.basename(argv0)
    base = base[:-3] if base.endswith(".py") else base
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", base).lstrip(".")
    return base if base and base != "-c" else "python"


def dump_path(folder: str, reason: str, unix_ns: Optional[int] = None,
              script: Optional[str] = None) -> str:
    """Where a dump for ``reason`` made now goes."""
    unix_ms = (time.time_ns() if unix_ns is None else unix_ns) // 1_000_000
    return os.path.join(folder, f"{script_name(script)}.blackbox.{reason}.{unix_ms}"
                                f".pt.trace.json.gz")


def write_dump(windows: List[RawSession], path: str, facts: Dict[str, Any],
               options: Dict[str, bool], seconds: float) -> str:
    """Write ``windows`` (the ring, oldest first) as one trace at ``path``; returns it.

    ``facts`` has the ``reason`` and what the trigger knew; ``dump_ns`` (the
    monotonic clock of the dump) bounds the trace to ``seconds`` before it;
    ``metadata`` in it (str -> JSON text) goes into the trace's metadata.
    """
    facts = dict(facts)
    extra_metadata = facts.pop("metadata", None) or {}
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    raw = join_raw(windows)
    dump_ns = int(facts.get("dump_ns", raw.stop_ns))
    raw = records_since(raw, dump_ns - int(seconds * 1e9))
    facts = dict(facts, window_unix_ns=[raw.start_ns + raw.epoch_offset_ns,
                                        raw.stop_ns + raw.epoch_offset_ns],
                 ops=int(len(raw.records)))
    session = build_session(raw, options=options)
    if facts.get("slow_step") and facts.get("typical_step"):
        facts["slow_ops"] = step_difference(session.table, tuple(facts["slow_step"]),
                                            tuple(facts["typical_step"]))
        for name in ("slow_step", "typical_step"):  # on the trace's clock, for the report
            facts[f"{name}_unix_ns"] = [t + raw.epoch_offset_ns for t in facts[name]]
    metadata = dict(session.metadata, **extra_metadata)
    metadata[BLACKBOX_KEY] = json.dumps(facts, separators=(",", ":"))
    session = dataclasses.replace(session, metadata=metadata, _derived={})
    return write_chrome_trace(session, path)
