"""Load a Chrome trace JSON file in a real trace viewer, headless, and read back what it parsed.

The viewer is Catapult's trace viewer: the code behind the legacy ``chrome://tracing``
page, as PyTorch's TensorBoard plugin ships it (``torch_tb_profiler/static/
trace_viewer_full.html``, one vulcanized HTML file). Chromium itself no longer ships it:
in Chromium 156 ``chrome://tracing`` is only a name in ``chrome://chrome-urls`` and fails
with ``net::ERR_FAILED`` even with internal debugging pages enabled, and no resource pak
holds the viewer's ``tr.*`` code. The viewer is a Polymer 1 app built for Web Components
v0 (HTML Imports, Custom Elements v0), which Chromium removed, so the page loads the
``webcomponents.js`` 0.7.24 polyfill first, exactly as ``trace_embedding.html`` in the
same plugin does (there from a CDN; here from the npm package ``webcomponents.js``).

How it runs, with nothing but the standard library:

* ``Chromium`` starts ``chromium --headless`` with ``--remote-debugging-pipe`` and speaks
  the DevTools protocol over file descriptors 3 and 4 (NUL-terminated JSON messages), so
  no port and no websocket client are needed.
* ``TraceViewer`` serves a small harness page, the polyfill, the viewer and the trace on
  a loopback HTTP server, opens the page, waits for ``WebComponentsReady`` and, per trace,
  fetches the file's bytes in the page and imports them the way the viewer's "Load" button
  does: ``new tr.importer.Import(new tr.Model()).importTraces([text])``. It then shows the
  model in a ``tr-ui-timeline-view`` (so the UI must accept it too) and returns a
  ``ViewerResult``: processes, threads, the slices per thread (titles in start order),
  the flow events with the slices they bind to, instant events, the viewer's import
  warnings and any exception or console error the page raised.

Finding the pieces (each can be set by an environment variable):

* ``OPSCOPE_CHROMIUM``: the browser; else ``chromium``, ``chromium-browser``,
  ``google-chrome`` on PATH (Debian: ``apt-get install -y chromium``).
* ``OPSCOPE_TRACE_VIEWER_HTML``: ``trace_viewer_full.html``; else the installed
  ``torch_tb_profiler`` package's copy (``pip install --no-deps torch-tb-profiler==0.4.3``;
  the package is never imported).
* ``OPSCOPE_WEBCOMPONENTS_JS``: ``webcomponents.min.js``; else the npm package
  ``webcomponents.js`` under ``npm root -g`` (``npm install -g webcomponents.js@0.7.24``).

``missing_viewer_parts()`` names what is not found, for a clean ``pytest.skip``.

Checking: ``expected_from_trace(doc)`` works out from the JSON alone what the viewer must
show (per thread: slice titles in order with nesting depth; names; which slices each flow
joins; global instants), following the viewer's own nesting and flow-binding rules, and
``compare_with_trace(doc, result)`` lists every difference plus every error and warning
the viewer reported. To test that a broken file is caught, compare the viewer's result
for the broken file with the expectation from the intended document.

Note (a property of the viewer, not of the driver): with ``displayTimeUnit: "ms"``, as
torch and opscope write it, the viewer nests slices comparing times rounded to whole
microseconds, so sibling ops less than 1 us apart are drawn as parent and child.

Example::

    with TraceViewer() as viewer:
        result = viewer.load("trace.json")
        problems = compare_with_trace(json.load(open("trace.json")), result)
    result.import_warnings, result.slice_counts(), result.flows, result.track_headings
"""

from __future__ import annotations

import collections
import dataclasses
import fcntl
import functools
import http.server
import importlib.util
import json
import math
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Counter, Dict, List, Optional, Tuple

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Flags for a sandbox-less machine with no network: no first-run UI, no background fetches.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio",
)


# --------------------------------------------------------------------------- finding parts

def find_chromium() -> Optional[str]:
    """Path of a Chromium/Chrome executable, or None."""
    env = os.environ.get("OPSCOPE_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def find_trace_viewer_html() -> Optional[Path]:
    """Path of Catapult's ``trace_viewer_full.html``, or None."""
    env = os.environ.get("OPSCOPE_TRACE_VIEWER_HTML")
    if env:
        return Path(env) if Path(env).is_file() else None
    try:
        spec = importlib.util.find_spec("torch_tb_profiler")  # does not import it
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            candidate = Path(base) / "static" / "trace_viewer_full.html"
            if candidate.is_file():
                return candidate
    return None


@functools.lru_cache(maxsize=1)
def _npm_global_root() -> Optional[str]:
    npm = shutil.which("npm")
    if not npm:
        return None
    try:
        out = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def find_webcomponents_js() -> Optional[Path]:
    """Path of the Web Components v0 polyfill ``webcomponents.min.js`` (0.7.x), or None."""
    env = os.environ.get("OPSCOPE_WEBCOMPONENTS_JS")
    if env:
        return Path(env) if Path(env).is_file() else None
    roots = ["/usr/local/lib/node_modules", "/usr/lib/node_modules"]
    npm_root = _npm_global_root()
    if npm_root:
        roots.insert(0, npm_root)
    for root in roots:
        candidate = Path(root) / "webcomponents.js" / "webcomponents.min.js"
        if candidate.is_file():
            return candidate
    return None


def missing_viewer_parts() -> List[str]:
    """What ``TraceViewer`` needs and cannot find, each with how to install it."""
    missing = []
    if find_chromium() is None:
        missing.append("chromium (apt-get install -y chromium, or set OPSCOPE_CHROMIUM)")
    if find_trace_viewer_html() is None:
        missing.append("Catapult trace_viewer_full.html (pip install --no-deps "
                       "torch-tb-profiler==0.4.3, or set OPSCOPE_TRACE_VIEWER_HTML)")
    if find_webcomponents_js() is None:
        missing.append("webcomponents.js 0.7 polyfill (npm install -g webcomponents.js@0.7.24, "
                       "or set OPSCOPE_WEBCOMPONENTS_JS)")
    return missing


# --------------------------------------------------------------------------- DevTools protocol

class ChromiumError(RuntimeError):
    """The browser died, timed out, or a DevTools call failed."""


class Chromium:
    """Headless Chromium driven over ``--remote-debugging-pipe`` (fd 3 in, fd 4 out)."""

    def __init__(self, executable: Optional[str] = None, timeout: float = 60.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise ChromiumError("no chromium executable found")
        self.timeout = timeout
        self.profile_dir = tempfile.mkdtemp(prefix="opscope-chromium-")
        # Our two pipes' child ends go to fds >= 10 first so that placing them at 3 and 4
        # in the child cannot overwrite one with the other. Every fd Python opens is
        # close-on-exec, so the child keeps only 3 and 4 (dup2 clears that flag).
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        child_in = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def wire_fds():  # in the child, before exec: fd 3 reads commands, fd 4 writes replies
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile_dir}",
                 "--remote-debugging-pipe", "about:blank"],
                close_fds=False, preexec_fn=wire_fds,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr)
        finally:
            os.close(child_in)
            os.close(child_out)
        self._out, self._in = to_child_w, from_child_r
        self._buffer = b""
        self._next_id = 0
        self.events: List[Dict[str, Any]] = []  # every event message received, in order
        try:
            self.version = self.call("Browser.getVersion")
        except BaseException:
            self.close()
            raise

    def call(self, method: str, params: Optional[Dict[str, Any]] = None,
             session_id: Optional[str] = None, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Send one command and return its ``result``; events seen meanwhile go to ``events``."""
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session_id:
            message["sessionId"] = session_id
        try:
            os.write(self._out, json.dumps(message).encode() + b"\0")
        except OSError as err:
            raise ChromiumError(
                f"{method}: browser pipe closed ({err}){self._stderr_tail()}") from err
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._receive(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ChromiumError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def _receive(self, deadline: float, method: str) -> Dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChromiumError(f"{method}: no reply in {self.timeout:.0f}s")
            ready, _, _ = select.select([self._in], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise ChromiumError(f"{method}: browser exited{self._stderr_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        return "; stderr: " + text[-2000:] if text else ""

    def open_page(self, url: str) -> str:
        """Open ``url`` in a new tab; return the DevTools session id attached to it."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        self.call("Runtime.enable", session_id=session)
        self.call("Page.enable", session_id=session)
        nav = self.call("Page.navigate", {"url": url}, session_id=session)
        if nav.get("errorText"):
            raise ChromiumError(f"navigating to {url}: {nav['errorText']}")
        return session

    def evaluate(self, session: str, expression: str, timeout: Optional[float] = None) -> Any:
        """Evaluate JS in the page (awaiting a promise); return its JSON value or raise."""
        result = self.call("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True,
        }, session_id=session, timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise ChromiumError(f"page raised: {text}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close", timeout=10)
                except ChromiumError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for fd in (self._out, self._in):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._stderr.close()
            shutil.rmtree(self.profile_dir, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- the viewer page

HARNESS_HTML = r"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>opscope trace viewer harness</title>
<script>window.__hideTraceViewerPolyfillWarning = true; window.__viewerReady = false;</script>
<script src="/webcomponents.min.js"></script>
<link rel="import" href="/trace_viewer_full.html"
      onerror="window.__viewerLoadError = 'trace_viewer_full.html did not load'">
<style>html, body { margin: 0; width: 100%; height: 100%; }
#trace-viewer { width: 100%; height: 100%; }</style>
<script>
'use strict';
document.addEventListener('WebComponentsReady', () => { window.__viewerReady = true; });

// Import one trace the way the viewer's Load button does, show it, describe the model.
window.__loadTrace = async function (url) {
  // Like the Load button: gzip bytes go to the viewer's gzip importer, text to the JSON one.
  const bytes = new Uint8Array(await (await fetch(url)).arrayBuffer());
  let text;
  try {
    text = (bytes[0] === 0x1f && bytes[1] === 0x8b) ? bytes.buffer
      : new TextDecoder('utf-8', {fatal: true}).decode(bytes);
  } catch (err) {
    return {importError: 'not UTF-8: ' + err, renderError: null, processes: [], flows: [],

            globalInstantEvents: [], importWarnings: [], bytes: bytes.length};
  }
  const model = new tr.Model();
  const options = new tr.importer.ImportOptions();
  let importError = null;
  try {
    new tr.importer.Import(model, options).importTraces([text]);
  } catch (err) {
    importError = String(err && err.stack || err);
  }
  let renderError = null;
  if (importError === null) {
    try {
      let viewer = document.getElementById('trace-viewer');
      if (viewer) viewer.remove();
      const container = document.createElement('track-view-container');
      container.id = 'track_view_container';
      viewer = document.createElement('tr-ui-timeline-view');
      viewer.track_view_container = container;
      Polymer.dom(viewer).appendChild(container);
      viewer.id = 'trace-viewer';
      viewer.globalMode = true;
      Polymer.dom(document.body).appendChild(viewer);
      viewer.model = model;
      viewer.viewTitle = url;
    } catch (err) {
      renderError = String(err && err.stack || err);
    }
  }
  const processes = model.getAllProcesses().map(p => ({
    pid: p.pid, name: p.name === undefined ? null : p.name, labels: p.labels || [],
    threads: Object.values(p.threads).map(t => ({
      tid: t.tid, name: t.name === undefined ? null : t.name,
      slices: t.sliceGroup.slices.map(s => s.title),
      categories: t.sliceGroup.slices.map(s => s.category),
      topLevel: t.sliceGroup.topLevelSlices.length,
      depths: t.sliceGroup.slices.map(s => {
        let depth = 0;
        for (let q = s.parentSlice; q; q = q.parentSlice) depth++;
        return depth;
      }),
    })),
    instantEvents: (p.instantEvents || []).map(e => e.title),
  }));
  const flows = model.flowEvents.map(f => ({
    category: f.category, title: f.title, id: f.id,
    start: f.startSlice ? f.startSlice.title : null,
    end: f.endSlice ? f.endSlice.title : null,
  }));
  return {
    importError, renderError, processes, flows,
    globalInstantEvents: model.instantEvents.map(e => e.title),
    importWarnings: model.importWarnings.map(w => ({type: w.type, message: w.message})),
    bytes: bytes.length,
  };
};

// Titles of the tracks the timeline view drew (once it has rendered).
window.__trackHeadings = function () {
  const viewer = document.getElementById('trace-viewer');
  if (!viewer || !viewer.trackView) return [];
  return Array.prototype.slice.call(viewer.trackView.querySelectorAll('tr-ui-b-heading'))
      .map(h => h.heading).filter(h => h);
};
</script>
</head><body></body></html>
"""


@dataclasses.dataclass
class ViewerResult:
    """What the viewer made of one trace file (the page's model, as plain data)."""

    import_error: Optional[str]
    render_error: Optional[str]
    processes: List[Dict[str, Any]]
    flows: List[Dict[str, Any]]
    global_instant_events: List[str]
    import_warnings: List[Dict[str, str]]
    page_errors: List[str]
    track_headings: List[str]  # track titles the rendered timeline shows (thread names)

    @property
    def ok(self) -> bool:
        """Imported and rendered with no warning and no page error."""
        return (self.import_error is None and self.render_error is None
                and not self.import_warnings and not self.page_errors)

    def threads(self) -> Dict[Tuple[Any, Any], Dict[str, Any]]:
        """(pid, tid) -> the thread's description."""
        return {(p["pid"], t["tid"]): t for p in self.processes for t in p["threads"]}

    def slice_titles_by_thread(self) -> Dict[Tuple[Any, Any], List[str]]:
        """(pid, tid) -> titles of the thread's slices, in the viewer's (start) order."""
        return {key: list(t["slices"]) for key, t in self.threads().items()}

    def slice_counts(self) -> Dict[Tuple[Any, Any], int]:
        """(pid, tid) -> number of slices the viewer made on that thread."""
        return {key: len(t["slices"]) for key, t in self.threads().items()}

    def problems(self) -> List[str]:
        """Every error and warning, one line each (empty when ``ok``)."""
        out = []
        if self.import_error:
            out.append(f"import error: {self.import_error}")
        if self.render_error:
            out.append(f"render error: {self.render_error}")
        out += [f"import warning {w['type']}: {w['message']}" for w in self.import_warnings]
        out += [f"page error: {e}" for e in self.page_errors]
        return out


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves the harness files and the registered trace files (GET only)."""

    def do_GET(self):  # noqa: N802 (http.server API)
        route = self.server.routes.get(self.path.split("?", 1)[0])  # type: ignore[attr-defined]
        if route is None:
            self.send_error(404)
            return
        path, content_type = route
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # keep test output clean
        pass


class TraceViewer:
    """Catapult's trace viewer in headless Chromium; ``load(path)`` imports one trace."""

    def __init__(self, chromium: Optional[str] = None, viewer_html: Optional[Path] = None,
                 webcomponents_js: Optional[Path] = None, timeout: float = 120.0):
        viewer_html = viewer_html or find_trace_viewer_html()
        webcomponents_js = webcomponents_js or find_webcomponents_js()
        missing = missing_viewer_parts() if not (viewer_html and webcomponents_js) else []
        if missing:
            raise ChromiumError("missing: " + "; ".join(missing))
        self.timeout = timeout
        self._dir = tempfile.mkdtemp(prefix="opscope-viewer-")
        harness = Path(self._dir) / "index.html"
        harness.write_text(HARNESS_HTML, encoding="utf-8")
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.routes = {  # type: ignore[attr-defined]
            "/index.html": (harness, "text/html; charset=utf-8"),
            "/webcomponents.min.js": (Path(webcomponents_js), "text/javascript; charset=utf-8"),
            "/trace_viewer_full.html": (Path(viewer_html), "text/html; charset=utf-8"),
        }
        self._count = 0
        self.browser: Optional[Chromium] = None
        self._thread: Optional[threading.Thread] = None
        try:
            # the browser is started (forked) before the server thread exists
            self.browser = Chromium(chromium, timeout=timeout)
            self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
            self._thread.start()
            self.session = self.browser.open_page(f"{self.base_url}/index.html")
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            state = self.browser.evaluate(
                self.session, "[window.__viewerReady, window.__viewerLoadError || null,"
                " typeof tr !== 'undefined' && !!(tr.importer && tr.Model)]")
            if state[1]:
                raise ChromiumError(state[1])
            if state[0] and state[2]:
                return
            time.sleep(0.1)
        raise ChromiumError(f"trace viewer not ready after {self.timeout:.0f}s; "
                            f"page errors: {self._page_errors(0)}")

    def _page_errors(self, since: int) -> List[str]:
        errors = []
        for event in self.browser.events[since:]:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                errors.append(details.get("exception", {}).get("description")
                              or details.get("text", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                       for a in params.get("args", [])))
        return errors

    def load(self, path: os.PathLike) -> ViewerResult:
        """Import the trace file at ``path`` (bytes as written) and describe the result."""
        self._count += 1
        route = f"/trace/{self._count}.json"
        self._server.routes[route] = (Path(path), "application/json")  # type: ignore[attr-defined]
        since = len(self.browser.events)
        raw = self.browser.evaluate(self.session, f"window.__loadTrace({json.dumps(route)})",
                                    timeout=self.timeout)
        # let the timeline view finish its first rendering before reading errors
        self.browser.evaluate(self.session,
                              "new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")
        headings = self.browser.evaluate(self.session, "window.__trackHeadings()")
        return ViewerResult(
            import_error=raw["importError"], render_error=raw["renderError"],
            processes=raw["processes"], flows=raw["flows"],
            global_instant_events=raw["globalInstantEvents"],
            import_warnings=raw["importWarnings"], page_errors=self._page_errors(since),
            track_headings=headings)

    def screenshot(self, path: os.PathLike) -> None:
        """Save a PNG of the page as it is now (for looking at a failure)."""
        import base64
        data = self.browser.call("Page.captureScreenshot", {"format": "png"},
                                 session_id=self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        if self.browser is not None:
            self.browser.close()
            self.browser = None
        if self._thread is not None:
            self._server.shutdown()
            self._thread = None
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "TraceViewer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- expectations

@dataclasses.dataclass
class Expected:
    """What Catapult's viewer must make of a trace, worked out from the JSON alone.

    Only structure, never durations: which threads hold which slices in which order at
    which nesting depth, thread and process names, which slices each flow arrow joins,
    and the global instant events.
    """

    slices: Dict[Tuple[Any, Any], List[Tuple[str, int]]]  # (pid, tid) -> [(name, depth)]
    thread_names: Dict[Tuple[Any, Any], Optional[str]]
    process_names: Dict[Any, Optional[str]]
    process_labels: Dict[Any, List[str]]
    flows: Dict[Any, Tuple[Optional[str], Optional[str]]]  # id -> (start slice, end slice)
    global_instants: Counter

    def slice_counts(self) -> Dict[Tuple[Any, Any], int]:
        return {key: len(rows) for key, rows in self.slices.items()}


@dataclasses.dataclass
class _Node:
    name: str
    start: float  # model time (ms), as the viewer holds it
    end: float
    depth: int = 0
    children: List["_Node"] = dataclasses.field(default_factory=list)


def _js_round(x: float) -> int:
    return math.floor(x + 0.5)  # Math.round: halves go up


def _nest(items: List[Tuple[float, float, int, str]], unit: str
          ) -> Tuple[List[_Node], List[_Node]]:
    """(top-level nodes, all nodes in order) as the viewer's SliceGroup.createSubSlices
    builds them: sort by start (then file order), then put each slice under the nearest
    open ancestor that bounds it, comparing times rounded to the display unit
    (``displayTimeUnit`` "ms", torch's and opscope's: whole us; "ns": whole ns). So two
    sibling ops less than a microsecond apart show as parent and child, as in torch's
    own traces; the expectation follows the viewer there."""
    scale = 1e6 if unit == "ns" else 1e3

    def less(a: float, b: float) -> bool:
        return _js_round(a * scale) < _js_round(b * scale)

    def bounds(parent: _Node, child: _Node) -> bool:
        return not less(child.start, parent.start) and not less(parent.end, child.end)

    nodes = [_Node(name, start, end) for start, end, _, name in
             sorted(items, key=lambda it: (it[0], it[2]))]
    top: List[_Node] = []
    parents: Dict[int, Optional[_Node]] = {}
    current: Optional[_Node] = None
    for node in nodes:
        while current is not None and not bounds(current, node):
            current = parents[id(current)]
        parents[id(node)] = current
        if current is None:
            top.append(node)
        else:
            node.depth = current.depth + 1
            current.children.append(node)
        current = node
    return top, nodes


def _slice_at(top: List[_Node], t: float) -> Optional[_Node]:
    """The viewer's findSliceAtTs: descend through closed intervals sorted by start."""
    found, level = None, top
    while level:
        candidates = [n for n in level if n.start <= t]
        if not candidates or t > candidates[-1].end:
            break
        found = candidates[-1]
        level = found.children
    return found


def expected_from_trace(doc: Dict[str, Any]) -> Expected:
    """Work out ``Expected`` from a parsed trace document (``{"traceEvents": [...]}``).

    Follows the viewer's own rules, in its float arithmetic (model time is ``ts / 1000``
    ms): X events nest per (pid, tid) as ``_nest`` says; a flow's ``s`` binds to the
    deepest slice whose closed interval holds its ``ts``, an ``f`` with ``bp: "e"``
    likewise, an ``f`` without it to the first slice starting after its ``ts``; an
    unpaired ``s`` or ``f`` makes no arrow. Only global instant events are handled
    (``ValueError`` for other thread-scoped phases, which opscope does not write).
    """
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    unit = doc.get("displayTimeUnit", "ms") if isinstance(doc, dict) else "ms"
    by_thread: Dict[Tuple[Any, Any], List[Tuple[float, float, int, str]]] = {}
    thread_names: Dict[Tuple[Any, Any], Optional[str]] = {}
    process_names: Dict[Any, Optional[str]] = {}
    process_labels: Dict[Any, List[str]] = {}
    flow_ends: Dict[Any, Dict[str, Dict[str, Any]]] = {}
    global_instants: Counter = collections.Counter()
    for index, e in enumerate(events):
        ph = e.get("ph")
        if ph == "X":
            start = e["ts"] / 1000
            by_thread.setdefault((e["pid"], e["tid"]), []).append(
                (start, start + e.get("dur", 0) / 1000, index, e["name"]))
        elif ph == "M":
            if e["name"] == "thread_name":
                thread_names[(e["pid"], e["tid"])] = e["args"]["name"]
            elif e["name"] == "process_name":
                process_names[e["pid"]] = e["args"]["name"]
            elif e["name"] == "process_labels":
                process_labels[e["pid"]] = e["args"]["labels"].split(",")
        elif ph in ("s", "f"):
            flow_ends.setdefault(e["id"], {})[ph] = e
        elif ph in ("i", "I") and e.get("s") == "g":
            global_instants[e["name"]] += 1
        else:
            raise ValueError(f"expected_from_trace does not handle this event: {e}")

    slices: Dict[Tuple[Any, Any], List[Tuple[str, int]]] = {}
    trees: Dict[Tuple[Any, Any], Tuple[List[_Node], List[_Node]]] = {}
    for key, items in by_thread.items():
        trees[key] = _nest(items, unit)
        slices[key] = [(n.name, n.depth) for n in trees[key][1]]

    def start_slice(e) -> Optional[str]:
        node = _slice_at(trees.get((e["pid"], e["tid"]), ([], []))[0], e["ts"] / 1000)
        return node.name if node else None

    def end_slice(e) -> Optional[str]:
        if e.get("bp") == "e":
            return start_slice(e)
        t = e["ts"] / 1000
        later = [n for n in trees.get((e["pid"], e["tid"]), ([], []))[1] if n.start > t]
        return later[0].name if later else None

    flows = {flow_id: (start_slice(ends["s"]), end_slice(ends["f"]))
             for flow_id, ends in flow_ends.items() if set(ends) == {"s", "f"}}
    return Expected(slices, {k: thread_names.get(k) for k in slices}, process_names,
                    process_labels, flows, global_instants)


def compare_with_trace(doc: Dict[str, Any], result: ViewerResult) -> List[str]:
    """Every way the viewer's model differs from ``expected_from_trace(doc)``, plus every
    error and warning the viewer reported (``result.problems()``); empty when it matches."""
    want = expected_from_trace(doc)
    out = list(result.problems())
    got_threads = result.threads()
    if set(got_threads) != set(want.slices):
        out.append(f"threads: viewer has {sorted(map(repr, got_threads))}, "
                   f"trace has {sorted(map(repr, want.slices))}")
    for key, rows in want.slices.items():
        thread = got_threads.get(key)
        if thread is None:
            continue
        got = list(zip(thread["slices"], thread["depths"]))
        if got != rows:
            first = next((i for i, (a, b) in enumerate(zip(got, rows)) if a != b),
                         min(len(got), len(rows)))
            out.append(f"thread {key!r}: viewer has {len(got)} slices, trace {len(rows)} X "
                       f"events; first difference at #{first}: viewer "
                       f"{got[first:first + 3]!r}, trace {rows[first:first + 3]!r}")
        if thread["name"] != want.thread_names[key]:
            out.append(f"thread {key!r}: viewer names it {thread['name']!r}, "
                       f"trace {want.thread_names[key]!r}")
    for process in result.processes:
        pid = process["pid"]
        if pid in want.process_names and process["name"] != want.process_names[pid]:
            out.append(f"process {pid!r}: viewer names it {process['name']!r}, "
                       f"trace {want.process_names[pid]!r}")
        if pid in want.process_labels and process["labels"] != want.process_labels[pid]:
            out.append(f"process {pid!r}: viewer labels {process['labels']!r}, "
                       f"trace {want.process_labels[pid]!r}")
    got_flows = {f["id"]: f for f in result.flows}
    if len(result.flows) != len(want.flows) or set(got_flows) != set(want.flows):
        out.append(f"flows: viewer made {len(result.flows)} (ids {sorted(got_flows)}), "
                   f"trace pairs {len(want.flows)} (ids {sorted(want.flows)})")
    for flow_id, (start, end) in want.flows.items():
        flow = got_flows.get(flow_id)
        if flow is not None and (flow["start"], flow["end"]) != (start, end):
            out.append(f"flow {flow_id!r}: viewer joins {flow['start']!r} -> {flow['end']!r}, "
                       f"trace means {start!r} -> {end!r}")
    got_instants = collections.Counter(result.global_instant_events)
    if got_instants != want.global_instants:
        out.append(f"global instant events: viewer {dict(got_instants)}, "
                   f"trace {dict(want.global_instants)}")
    return out
