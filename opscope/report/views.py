"""The registry of the report's views: a view is one module and one ``View`` in ``REGISTRY``.

An entry holds the view's ``key`` (its item in the page's data, and ``VIEWS.<key>`` in the
page's scripts), its ``data`` function (``ViewInputs`` to JSON-able data, or None where the
view has nothing to show), its ``scripts`` (in ``assets/``, or in ``folder``), where those go
in the page (``script_order``, lower first) and whether only a job's report has it
(``job_only``: the Ranks view, whose data is computed from the job rather than one session).

``opscope.report.data.report_data`` computes the views in registry order, which is the
data's key order (after ``meta``); ``opscope.report.page.render_html`` pastes ``core.js``
(the shared helpers and the tab switcher), then the scripts of the views the data shows (a
job-only view's where its key is in the data) by ``script_order``, a script shared by
several views once. ``views.js`` holds the Modules, Memory and Recommendations views and
comes last.

Adding a view: write its module (a function from a session, or from ``ViewInputs``, to
its data), its script (``VIEWS.<key> = function (section) {...}``, adding its own tab
button and ``<section id="view-<key>">`` as ``compiled.js`` does, so report.html is not
edited), and one ``View`` here; ``register`` adds one at run time.

Example::

    >>> [v.key for v in REGISTRY][:4]
    ['overview', 'operators', 'modules', 'compiled']
    >>> view("ranks").scripts, view("ranks").job_only
    (('ranks.js', 'ranks_timeline.js'), True)
    >>> [name for _, name in page_scripts({})][-2:]
    ['black_box.js', 'views.js']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Optional, Tuple

from opscope.model.session import ProfileSession
from opscope.report.black_box import black_box_view
from opscope.report.compiled import compiled_view
from opscope.report.flame import flame_tree
from opscope.report.kernels import kernel_view
from opscope.report.memory import memory_timeline
from opscope.report.modules import module_view
from opscope.report.operators import operator_rows
from opscope.report.overview import overview_view
from opscope.report.ranks import ranks_view
from opscope.report.recommendations import recommendations_view
from opscope.report.timeline import TIMELINE_CAP, timeline_view

DEFAULT_SCRIPT_ORDER = 100  # a new view's scripts: after the others, before views.js
LAST = 1000  # views.js


class ViewInputs:
    """What the views' data is computed from: the session shown, the page's options, the
    job's reading for a job-only view (``opscope.report.ranks.JobReading``; None for one
    trace), and the other views' data (``view``), each computed once."""

    def __init__(self, session: ProfileSession, *, timeline_cap: int = TIMELINE_CAP,
                 job: Any = None):
        self.session = session
        self.timeline_cap = timeline_cap
        self.job = job
        self._views: Dict[str, Any] = {}
        self._shared: Dict[Callable, Any] = {}

    def view(self, key: str) -> Any:
        """The data of the registered view ``key``, computed on the first call."""
        if key not in self._views:
            self._views[key] = view(key).data(self)
        return self._views[key]

    def shared(self, fn: Callable[[ProfileSession], Any]) -> Any:
        """``fn(session)``, computed once for all the views that ask (the whole step
        overview: the Overview shows it decimated, the Recommendations read every step)."""
        if fn not in self._shared:
            self._shared[fn] = fn(self.session)
        return self._shared[fn]


@dataclass(frozen=True)
class View:
    """One view of the report (see the module's docstring)."""

    key: str
    data: Callable[[ViewInputs], Any]
    scripts: Tuple[str, ...] = ()
    script_order: int = DEFAULT_SCRIPT_ORDER
    job_only: bool = False
    folder: Optional[str] = None  # where ``scripts`` are; None: opscope/report/assets


def of_session(fn: Callable[[ProfileSession], Any]) -> Callable[[ViewInputs], Any]:
    """A view's ``data`` function from ``fn(session)``.

    >>> of_session(flame_tree).__name__
    'flame_tree'
    """
    def data(inputs: ViewInputs) -> Any:
        return fn(inputs.session)

    data.__name__ = data.__qualname__ = fn.__name__
    return data


REGISTRY: List[View] = [
    View("overview", overview_view, ("overview.js",), 10),
    View("operators", of_session(operator_rows), ("operators.js",), 20),
    View("modules", of_session(module_view), ("views.js",), LAST),
    View("compiled", of_session(compiled_view), ("compiled.js",), 60),
    View("flame", of_session(flame_tree), ("flame.js",), 30),
    View("timeline", timeline_view, ("timeline.js",), 40),
    View("memory", of_session(memory_timeline), ("views.js",), LAST),
    View("kernels", of_session(kernel_view), ("kernels.js",), 50),
    View("recommendations", recommendations_view, ("views.js",), LAST),
    View("black_box", of_session(black_box_view), ("black_box.js",), 70),
    View("ranks", ranks_view, ("ranks.js", "ranks_timeline.js"), 80, job_only=True),
]


def view(key: str) -> View:
    """The registered view ``key``; KeyError naming it when there is none."""
    for entry in REGISTRY:
        if entry.key == key:
            return entry
    raise KeyError(f"no report view {key!r}")


def register(entry: View) -> View:
    """Add ``entry`` after the registered views; ValueError when its key is taken."""
    if entry.key == "meta" or any(v.key == entry.key for v in REGISTRY):
        raise ValueError(f"a report view {entry.key!r} is already registered")
    REGISTRY.append(entry)
    return entry


def unregister(key: str) -> None:
    """Remove the registered view ``key`` (a test's, or a plugin's)."""
    REGISTRY.remove(view(key))


def page_scripts(keys: Collection[str]) -> List[Tuple[View, str]]:
    """(view, script name) in page order for a page whose data has ``keys``: every view's
    scripts but a job-only view's whose key is not there, each script once."""
    shown = [v for v in REGISTRY if not v.job_only or v.key in keys]
    found: Dict[Tuple[Optional[str], str], View] = {}
    for entry in sorted(shown, key=lambda v: v.script_order):
        for name in entry.scripts:
            found.setdefault((entry.folder, name), entry)
    return [(entry, name) for (_, name), entry in found.items()]
