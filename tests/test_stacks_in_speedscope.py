"""export_stacks output opens in speedscope (the npm package, in headless Chromium).

speedscope's own page imports the file from ``#profileURL=``, as its "Open" button would,
and titles the tab with the profile. flamegraph.pl is a Perl script on GitHub only (no
package registry has it); lines are checked against its input rule instead.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

import pytest
import torch

import opscope
from viewer_driver import Chromium, find_chromium

# flamegraph.pl reads each line with: my ($stack, $samples) = (/^(.*)\s+?(\d+(?:\.\d*)?)$/)
FLAMEGRAPH_PL_LINE = re.compile(r"^(.*)\s+?(\d+(?:\.\d*)?)$")


def find_speedscope() -> Optional[Path]:
    npm = shutil.which("npm")
    if npm is None:
        return None
    root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True).stdout.strip()
    index = Path(root) / "speedscope" / "dist" / "release" / "index.html"
    return index if index.is_file() else None


def nested_call_for_speedscope(x):
    return torch.relu(torch.nn.functional.linear(x, torch.ones(8, 8)))


@pytest.fixture(scope="module")
def stacks_file(tmp_path_factory):
    import os
    os.environ["OPSCOPE_COLLECTOR"] = "native"
    try:
        with opscope.profile(with_stack=True) as prof:
            for _ in range(20):
                nested_call_for_speedscope(torch.randn(4, 8))
    finally:
        del os.environ["OPSCOPE_COLLECTOR"]
    path = tmp_path_factory.mktemp("stacks") / "opscope.stacks"
    prof.export_stacks(str(path))
    return path


def test_lines_follow_flamegraph_pl_input_rule(stacks_file):
    lines = stacks_file.read_text().splitlines()
    assert lines
    for line in lines:
        m = FLAMEGRAPH_PL_LINE.match(line)
        assert m, line
        frames = m.group(1).split(";")
        assert all(frames) and " " not in m.group(1)
    assert any("nested_call_for_speedscope" in line for line in lines)


@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed")
@pytest.mark.skipif(find_speedscope() is None,
                    reason="speedscope not installed (npm install -g speedscope@1.25.0)")
def test_speedscope_imports_the_file(stacks_file):
    release = find_speedscope().parent
    serve = shutil.copytree(release, stacks_file.parent / "site")
    shutil.copy(stacks_file, serve / "opscope.stacks")
    handler = functools.partial(_QuietHandler, directory=str(serve))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = (f"http://127.0.0.1:{server.server_port}/index.html"
               "#profileURL=/opscope.stacks&title=opscope-stacks")
        with Chromium() as browser:
            session = browser.open_page(url)
            deadline = time.monotonic() + 60
            title = ""
            while time.monotonic() < deadline:
                title = browser.evaluate(session, "document.title") or ""
                if "opscope-stacks" in title:
                    break
                time.sleep(0.1)
            body = browser.evaluate(session, "document.body.innerText")
        assert "opscope-stacks" in title, f"speedscope did not load the profile: {body[:300]}"
        assert "Something went wrong" not in body and "Unrecognized format" not in body
    finally:
        server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
