"""A finished session with the results API of a live profile.

``SessionProfile(session)`` answers what a stopped ``opscope.profile`` answers
(``key_averages()``, ``events()``, ``module_table()``, ``memory_summary()``,
``export_chrome_trace()`` and the other exports), for a session kept from a
live window or loaded from a trace or a store (``opscope.load``). ``table()``
is ``key_averages().table()``.

Example::

    >>> import torch, opscope
    >>> with opscope.profile() as prof:
    ...     _ = torch.ones(2) * 2
    >>> kept = SessionProfile(prof.session)
    >>> "aten::mul" in kept.table(row_limit=5)
    True
"""

from __future__ import annotations

from typing import Optional

from opscope.model.session import OPTION_NAMES, ProfileSession
from opscope.profiler_results import ProfileResults


class SessionProfile(ProfileResults):
    """The results of one recorded window, read from its session; nothing records."""

    def __init__(self, session: ProfileSession, label: Optional[str] = None):
        if not isinstance(session, ProfileSession):
            raise TypeError(f"SessionProfile: expected a ProfileSession, "
                            f"got {type(session).__name__}")
        self._session = session
        self._events = None
        self._recording = False
        self.label = label  # what the window is, e.g. "rank 0, window 1 (step4)"
        for name in OPTION_NAMES:  # record_shapes, profile_memory, ...: as it was recorded
            setattr(self, name, bool(session.options.get(name, False)))

    def table(self, sort_by: Optional[str] = "self_cpu_time_total", row_limit: int = 100,
              **options) -> str:
        """``key_averages().table(sort_by=..., row_limit=..., ...)``."""
        return self.key_averages().table(sort_by=sort_by, row_limit=row_limit, **options)

    def __repr__(self) -> str:
        where = self.label or self._session.source_path or "a recorded window"
        return f"<opscope.SessionProfile of {where}: {len(self._session.table)} events>"
