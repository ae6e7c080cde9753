"""A finished session with the results API of a live profile, and ``opscope.load``.

``SessionProfile(session)`` answers what a stopped ``opscope.profile`` answers
(``key_averages()``, ``events()``, ``module_table()``, ``memory_summary()``,
``export_chrome_trace()`` and the other exports), for a session kept from a
live window or read back from a file. ``table()`` is ``key_averages().table()``.
``load(path_or_store, rank=None, window=None)`` (``opscope.load``) reads a saved
trace, a trace folder's newest trace, or one window of a store.

Example::

    >>> import os, tempfile, torch, opscope
    >>> with opscope.profile() as prof:
    ...     _ = torch.ones(2) * 2
    >>> path = os.path.join(tempfile.mkdtemp(), "t.pt.trace.json")
    >>> prof.export_chrome_trace(path)
    >>> loaded = opscope.load(path)
    >>> "aten::mul" in loaded.table(row_limit=5)
    True
"""

from __future__ import annotations

import os
from typing import Optional

from opscope.model.session import OPTION_NAMES, ProfileSession
from opscope.api.results import ProfileResults


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


def load(path_or_store: "str | os.PathLike[str]", rank: Optional[int] = None,
         window: Optional[int] = None, *, max_bytes: Optional[int] = None) -> SessionProfile:
    """Read a saved profile back, with a live profile's results API (``opscope.load``).

    ``path_or_store`` is a trace (``.json`` or ``.json.gz``, written by opscope
    or torch.profiler), a folder of traces (its newest), or an opscope store:
    ``rank`` (default: the lowest) and ``window`` (default: that rank's newest)
    choose one of its windows, numbered as ``opscope query`` shows them. A
    trace raises ``opscope.load.TraceLoadError`` naming what is wrong with it;
    a store ``opscope.store.StoreError``. ``max_bytes`` caps a trace's size
    (default: ``OPSCOPE_MAX_TRACE_BYTES``, else 4 GiB).

    >>> load("/no/such/trace.json")
    Traceback (most recent call last):
    ...
    opscope.load.trace_file.TraceLoadError: trace '/no/such/trace.json': no such file or folder
    """
    from opscope.arguments import check_int, check_path

    path = check_path("opscope.load", "path_or_store", path_or_store)
    for name, value in (("rank", rank), ("window", window)):
        if value is not None:
            check_int("opscope.load", name, value, minimum=0)
    if os.path.isfile(os.path.join(path, STORE_MARKER)):
        return _load_store_window(path, rank, window)
    if rank is not None or window is not None:
        raise ValueError(f"opscope.load: rank and window choose a store's windows; {path!r} "
                         f"is a trace or a trace folder (name the rank's trace file instead)")
    from opscope.analysis.build import load_session

    session = load_session(path, max_bytes=max_bytes)
    return SessionProfile(session, f"trace {session.source_path!r}")


STORE_MARKER = "opscope-store.json"  # opscope.store.schema.MARKER, without importing pyarrow


def _load_store_window(store: str, rank: Optional[int], window: Optional[int]
                       ) -> SessionProfile:
    from opscope.store import StoreError, load_store_session, windows

    found = windows(store)
    if not found:
        raise StoreError(f"store {store!r} has no windows")
    if rank is None:
        rank = min(r for r, _ in found)
    mine = [w for r, w in found if r == rank]
    if not mine:
        raise StoreError(f"store {store!r} has no rank {rank} (its ranks: "
                         f"{', '.join(map(str, sorted({r for r, _ in found})))})")
    if window is None:
        window = max(mine)
    elif window not in mine:
        raise StoreError(f"store {store!r} has no window {window} of rank {rank} (its "
                         f"windows: {', '.join(map(str, mine))})")
    session = load_store_session(store, rank, window)
    return SessionProfile(session, f"store {store!r}, rank {rank}, window {window}")
