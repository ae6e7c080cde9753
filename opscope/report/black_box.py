"""The Black box view's data: why a black box dump was written, and for a slow step, the
slow step beside a median step of the ring, op by op.

A dump's trace carries the moment's facts under the metadata key
``opscopeBlackBox`` (``opscope.black_box.dump``). The view shows the reason
and those facts; for ``slow_step`` it adds the two steps' rows
(``opscope.analysis.step_difference.step_rows``: calls and self time in
each, largest growth first) and the ops that account for the difference.
None for any other trace: the page then has no Black box tab, and it opens
at this tab when it has one (``assets/black_box.js``).

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession
    >>> black_box_view(build_session(RawSession.empty())) is None
    True
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

from opscope.analysis.step_difference import step_rows
from opscope.model.session import ProfileSession

KEY = "opscopeBlackBox"
MAX_ROWS = 200
ACCOUNTS_FOR = 0.8  # the ops named: the fewest whose growth covers this share of the step's


def black_box_view(session: ProfileSession) -> Optional[Dict[str, Any]]:
    """The reason, the facts, and for a slow step its rows beside a median step; or None."""
    try:
        facts = json.loads(session.metadata.get(KEY, "null"))
    except (TypeError, ValueError):
        return None
    if not isinstance(facts, dict) or not isinstance(facts.get("reason"), str):
        return None
    view: Dict[str, Any] = {"reason": facts["reason"], "facts": {
        k: v for k, v in facts.items() if isinstance(v, (str, int, float)) and k != "reason"}}
    windows = [facts.get(name) for name in ("slow_step_unix_ns", "typical_step_unix_ns")]
    if all(_window(w) for w in windows):
        offset = int(session.epoch_offset_ns)
        slow, typical = [(int(w[0]) - offset, int(w[1]) - offset) for w in windows]
        rows = step_rows(session.table, slow, typical)
        view["steps"] = {"slow_us": (slow[1] - slow[0]) / 1e3,
                         "typical_us": (typical[1] - typical[0]) / 1e3,
                         "rule": str(facts.get("rule", "")), "rows": rows[:MAX_ROWS],
                         "accounts": _accounts(rows, (slow[1] - slow[0]) - (typical[1] -
                                                                              typical[0]))}
    return view


def _window(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
            and value[0] <= value[1])


def _accounts(rows, extra_ns: int):
    """The fewest op names whose growth covers ACCOUNTS_FOR of the step's extra time."""
    named, covered = [], 0.0
    for row in rows:
        if row["extra_us"] <= 0 or covered >= ACCOUNTS_FOR * extra_ns / 1e3:
            break
        named.append(row["name"])
        covered += row["extra_us"]
    return named
