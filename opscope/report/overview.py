"""The Overview's data: each step's time per category, the steps' spread, top ops.

The numbers are ``opscope.analysis.steps.step_breakdown`` (one row per
``ProfilerStep#N`` range, else per optimizer step, else the whole session as one
pseudo-step); this module rounds them into the page's rows (``assets/overview.js``;
``overview_view`` adds the top ops and picks at most ``MAX_STEPS_DRAWN`` steps).
``backward`` holds the backward time per step split by op kind; its parts add up
to the ``backward`` category.

Example::

    >>> from opscope.analysis.build import build_session
    >>> from opscope.model.records import RawSession, records_from_rows
    >>> def ev(start_us, end_us, name_id, scope=0):
    ...     return (start_us * 1000, end_us * 1000, -1, name_id, 0, 0, 1, 0xFFFFFFFF, scope, 0, 0)
    >>> rows = [ev(0, 100, 0, 7), ev(10, 40, 1), ev(50, 90, 2, 7), ev(60, 70, 3)]
    >>> names = ["ProfilerStep#1", "aten::mm", "Optimizer.step#SGD.step", "aten::add_"]
    >>> o = step_overview(build_session(RawSession(records_from_rows(rows), [], [1], names,
    ...                                            0, 100_000, 0)))
    >>> step = o["steps"][0]
    >>> {c: v for c, v in zip(o["categories"], step["parts"]) if v}
    {'matmul/conv': 30.0, 'optimizer': 40.0, 'idle': 30.0}
    >>> o["step_source"], o["backward"]["totals"][-1]
    ('ProfilerStep', 0.0)
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from opscope.analysis.categories import BACKWARD_PART_NAMES, CATEGORY_NAMES
from opscope.analysis.steps import spread, step_breakdown
from opscope.model.session import ProfileSession

MAX_STEPS_DRAWN = 2000
TOP_N = 10


def overview_view(inputs) -> Dict[str, Any]:
    """The Overview as the page gets it (``opscope.report.views.ViewInputs``): the steps
    (at most ``MAX_STEPS_DRAWN`` of them, evenly picked; ``steps_shown`` says how many),
    and the ``TOP_N`` ops by self time, the collectives' backend ranges among them."""
    overview = dict(inputs.shared(step_overview))  # the Recommendations read every step
    # ops, and the collectives' backend ranges: on a DDP rank they are most of the time
    overview["top_ops"] = sorted((r for r in inputs.view("operators")["rows"]
                                  if not r["user"] or r["communication"]),
                                 key=lambda r: -r["self_us"])[:TOP_N]
    steps = overview["steps"]
    overview["steps_shown"] = min(len(steps), MAX_STEPS_DRAWN)
    if len(steps) > MAX_STEPS_DRAWN:
        pick = np.linspace(0, len(steps) - 1, MAX_STEPS_DRAWN).round().astype(int)
        overview["steps"] = [steps[k] for k in pick.tolist()]
    return overview


def step_overview(session: ProfileSession) -> Dict[str, Any]:
    """Per step: name, start and duration (us) and the time per category (us)."""
    b = step_breakdown(session)
    out_steps = [_step(name, start, dur, parts) for name, start, dur, parts
                 in zip(b.names, b.start_ns, b.dur_ns, b.parts_us)]
    ncat = len(CATEGORY_NAMES)
    totals = np.sum([s["parts"] for s in out_steps], axis=0) if out_steps else np.zeros(ncat)
    return {"categories": list(CATEGORY_NAMES), "steps": out_steps,
            "totals": [round(float(v), 3) for v in totals],
            "spread": spread([s["dur_us"] for s in out_steps]),
            "has_steps": b.has_steps, "step_source": b.source,
            "backward": {"parts": list(BACKWARD_PART_NAMES),
                         "totals": [round(float(v), 3) for v in b.backward_us.sum(axis=0)]}}


def _step(name: str, start_ns: int, dur_ns: int, parts: np.ndarray) -> Dict[str, Any]:
    return {"name": name, "start_us": round(int(start_ns) / 1000.0, 3),
            "dur_us": round(int(dur_ns) / 1000.0, 3),
            "parts": np.round(parts, 3).tolist()}
