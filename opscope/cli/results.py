"""What a verb does with a profile: write each finished window's files, print the table.

``OUTPUTS`` lists the files every verb writes per recorded window (the trace);
``REPORT`` is the HTML report, which a verb adds with
``WindowWriter(..., outputs=OUTPUTS + [REPORT])``. Each names its format in
the registry of output formats (``opscope.outputs.FORMATS``) and is
written with ``prof.export(path, format=...)``.

Example::

    >>> [(o.format, o.suffix) for o in OUTPUTS + [REPORT]]
    [('chrome_trace', '.pt.trace.json'), ('report', '.html')]
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, List, NamedTuple, Optional

from opscope.cli.progress import progress
from opscope.cli.terminal import write_text

if TYPE_CHECKING:
    from opscope.api.session_profile import SessionProfile


class Output(NamedTuple):
    """One file written per recorded window: what it is, its format, suffix and hint.

    ``format`` is a name in ``opscope.outputs.FORMATS``; ``suffix``
    ends with one of that format's extensions.
    """

    kind: str
    format: str
    suffix: str
    hint: str = ""

    def write(self, prof: Any, path: str) -> None:
        """Write this output of ``prof``'s last window to ``path``."""
        prof.export(path, format=self.format)


OUTPUTS: List[Output] = [
    Output("trace", "chrome_trace", ".pt.trace.json",
           "open it in chrome://tracing, or load it in Holistic Trace Analysis"),
]
# The HTML report: ``opscope demo`` always writes it, ``opscope run`` with --report.
REPORT = Output("report", "report", ".html", "open it in a browser")


class WindowWriter:
    """An ``on_trace_ready`` handler writing ``OUTPUTS`` for each finished window.

    Files are named ``<stem><suffix>``, or ``<stem>.step<N><suffix>`` with
    ``by_step`` (N: the window's last step, so repeated windows never collide). A
    window cut short by the end of the program (written at ``prof.stop()``, in
    the middle of step N) is ``<stem>.step<N>.partial<suffix>``.
    Write errors are kept in ``errors`` rather than raised into the profiled
    program. Set ``stopping`` before calling ``prof.stop()``, so the step
    number is the one in progress rather than the one just begun.

    >>> w = WindowWriter("/tmp", "out", "train", by_step=True)
    >>> w.file_name(7, OUTPUTS[0])
    'train.step7.pt.trace.json'
    >>> w.stopping = True; w.file_name(10, OUTPUTS[0])
    'train.step10.partial.pt.trace.json'
    """

    def __init__(self, folder: str, shown_folder: str, stem: str, *, by_step: bool,
                 outputs: Optional[List[Output]] = None):
        self.folder = folder
        self.outputs = list(OUTPUTS if outputs is None else outputs)
        self.shown_folder = shown_folder
        self.stem = stem
        self.by_step = by_step
        self.stopping = False
        self.written: List[str] = []   # one line per file, for the summary
        self.errors: List[str] = []
        self.last_complete: "Optional[SessionProfile]" = None  # the newest whole window
        self.last_partial: "Optional[SessionProfile]" = None   # one cut short by the stop

    def file_name(self, step: int, output: Output) -> str:
        """The file name of ``output`` for the window ending at ``step``."""
        base = f"{self.stem}.step{step}" if self.by_step else self.stem
        if self.by_step and self.stopping:
            base += ".partial"  # the program ended inside step N: not a whole window
        return base + output.suffix

    def shown_window(self) -> "Optional[SessionProfile]":
        """The window whose table a verb prints: the last complete one, else the partial."""
        return self.last_complete or self.last_partial

    def __call__(self, prof: Any) -> None:
        step = prof.step_num if self.stopping else prof.step_num - 1
        self._keep(prof.session, step)
        for output in self.outputs:
            name = self.file_name(step, output)
            try:
                with progress(f"writing {name}"):
                    output.write(prof, os.path.join(self.folder, name))
            except Exception as exc:  # never into the profiled program: kept for the summary
                self.errors.append(f"cannot write {output.kind} {name!r} in "
                                   f"{self.shown_folder!r} "
                                   f"({getattr(exc, 'strerror', None) or exc})")
                continue
            shown = os.path.join(self.shown_folder, name)
            self.written.append(f"wrote {output.kind} {shown}"
                                + (f" ({output.hint})" if output.hint else ""))


    def _keep(self, session: Any, step: int) -> None:
        """Keep the window just finished (a reference: a session is never edited)."""
        from opscope.api.session_profile import SessionProfile

        partial = self.by_step and self.stopping
        label = window_label(session, step, partial=partial)
        kept = SessionProfile(session, label)
        if partial:
            self.last_partial = kept
        else:
            self.last_complete, self.last_partial = kept, None


def window_label(session: Any, step: int, *, partial: bool) -> str:
    """What a printed table covers: ``steps 2-4 (complete window)``, or ``the whole run``.

    The window's steps are the ``ProfilerStep#N`` ranges it recorded, up to
    ``step`` (its last); a window without them (no schedule) is the whole run.

    >>> from opscope.model.events import EventTable
    >>> from opscope.model.records import RawSession
    >>> from opscope.model.session import ProfileSession
    >>> empty = ProfileSession(EventTable.from_raw(RawSession.empty()))
    >>> window_label(empty, 0, partial=False)
    'the whole run'
    """
    from opscope.analysis.facts import step_ranges
    from opscope.model.torch_names import PROFILER_STEP

    numbers = []
    for row in step_ranges(session):
        name = session.table.name(int(row))
        tail = name.rpartition("#")[2]
        if name.startswith(PROFILER_STEP) and tail.isdigit():
            numbers.append(int(tail))
    if not numbers:
        return "the whole run"
    first, last = min(numbers), max(numbers + [step])
    steps = f"step {last}" if first == last else f"steps {first}-{last}"
    if partial:
        return f"{steps} (partial window: the program ended during step {last})"
    return f"{steps} (complete window)"


def print_table(prof: Any, *, sort: str, row_limit: int, label: Optional[str] = None) -> bool:
    """Print ``key_averages().table(...)`` of ``prof`` on stdout; False if it has none.

    ``label`` (the window the table covers) is printed as a line above it.
    """
    try:
        prof.session
    except RuntimeError:
        return False
    with progress("analysing"):
        text = prof.key_averages().table(sort_by=sort, row_limit=row_limit)
    if label:
        text = f"opscope: table of {label}\n{text}"
    write_text(text if text.endswith("\n") else text + "\n")  # range names escaped
    return True


def print_summary(writer: WindowWriter, who: str = "opscope: ") -> None:
    """One stderr line per file written, then one per write error, each starting with ``who``.

    Under torchrun ``who`` names the rank (``"opscope: rank 1: "``).
    """
    for line in writer.written:
        write_text(f"{who}{line}\n", sys.stderr)
    for line in writer.errors:
        write_text(f"{who}error: {line}\n", sys.stderr)
    if not writer.written and not writer.errors:
        write_text(f"{who}no trace written: no recording window was completed\n", sys.stderr)
