"""The README's set-up commands and CI's script must agree, and CI must fail when it should."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"
DEMO_COMMAND = "pip install -c constraints.txt -e . && opscope demo"
TEST_COMMAND = ("pip install -c constraints.txt -e '.[test]' && "
                "python -m pytest -q -n auto --dist loadfile")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def first_code_block(text: str) -> tuple:
    """(line number of the opening fence, non-empty lines inside the first ``` block)."""
    lines = text.splitlines()
    opening = next(i for i, line in enumerate(lines) if line.startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return opening, [line for line in lines[opening + 1:closing] if line.strip()]


def test_readme_begins_with_the_two_setup_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert lines[0] == "# opscope"
    opening, commands = first_code_block(text)
    # the title, one sentence, then the commands
    prose = [line for line in lines[1:opening] if line.strip()]
    assert len(prose) == 1 and prose[0].endswith("."), prose
    assert commands == [DEMO_COMMAND, TEST_COMMAND]


def test_ci_run_is_strict_bash_and_executable():
    text = CI_RUN.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert CI_RUN.stat().st_mode & stat.S_IXUSR


def test_ci_run_runs_the_readme_commands():
    result = subprocess.run(["bash", str(CI_RUN), "--print"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    demo_install, demo, install, tests = result.stdout.splitlines()
    first, second = first_code_block(README.read_text())[1]
    assert f"{demo_install} && opscope demo" == first
    assert f"{install} && {tests}" == second
    assert demo.startswith("opscope demo -o ")


def _fake_repo(tmp_path: Path, tests_command: str) -> tuple:
    """A copy of .ci/run in a repo whose README runs ``tests_command``, with a fake opscope."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(CI_RUN, repo / ".ci" / "run")
    (repo / "README.md").write_text(
        "# fake\n\nOne sentence.\n\n```\necho demo > demo-installed.txt && opscope demo\n"
        f"echo installing > installed.txt && {tests_command}\n```\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "opscope"
    # `opscope demo -o DIR` writes a minimal valid trace
    fake.write_text('#!/usr/bin/env bash\necho "{}" > "$3/demo.pt.trace.json"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               OPSCOPE_CI_SKIP_VIEWER_TOOLS="1", OPSCOPE_CI_SKIP_HTA="1",
               OPSCOPE_CI_VENV_OPTIONS="--without-pip")  # it installs nothing
    env.pop("VIRTUAL_ENV", None)
    return repo, env


@pytest.mark.parametrize("tests_command, expected", [
    ("python -c 'import sys; sys.exit(0)'", 0),
    ("python -c 'import sys; sys.exit(1)'", 1),
    ("python -c 'import sys; sys.exit(5)'", 1),  # pytest: no tests collected
])
def test_ci_run_status_follows_the_tests(tmp_path, tests_command, expected):
    repo, env = _fake_repo(tmp_path, tests_command)
    result = subprocess.run(["bash", ".ci/run"], cwd=repo, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == expected, result.stdout + result.stderr
    assert (repo / "demo-installed.txt").is_file()  # the first command's install ran
    assert (repo / "installed.txt").is_file()  # the install part ran
    assert "+ opscope demo -o " in result.stdout
    if tests_command.endswith("exit(5)'"):
        assert "no tests" in result.stderr


def test_ci_run_runs_the_commands_in_a_fresh_venv(tmp_path):
    """CI proves what a newcomer runs: both installs, the demo and the tests inside a new
    virtualenv (not the interpreter CI was started with), removed afterwards."""
    check = ("python -c 'import json, os, sys; json.dump([sys.prefix, sys.base_prefix, "
             "os.environ.get(\"VIRTUAL_ENV\")], open(\"prefix.json\", \"w\"))'")
    repo, env = _fake_repo(tmp_path, check)
    readme = (repo / "README.md").read_text()
    (repo / "README.md").write_text(readme.replace("echo demo > demo-installed.txt",
                                                   "echo $VIRTUAL_ENV > demo-installed.txt"))
    result = subprocess.run(["bash", ".ci/run"], cwd=repo, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    prefix, base_prefix, virtual_env = json.loads((repo / "prefix.json").read_text())
    assert prefix != base_prefix and prefix == virtual_env
    assert Path(prefix).name == "venv" and Path(prefix).parent.name.startswith("opscope-ci.")
    assert (repo / "demo-installed.txt").read_text().strip() == prefix
    assert not Path(prefix).exists()


def test_ci_run_fails_when_demo_writes_no_trace(tmp_path):
    repo, env = _fake_repo(tmp_path, "true")
    (tmp_path / "bin" / "opscope").write_text("#!/usr/bin/env bash\nexit 0\n")
    result = subprocess.run(["bash", ".ci/run"], cwd=repo, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert "demo.pt.trace.json" in result.stderr


def test_ci_run_installs_the_viewer_tools_before_the_tests():
    text = CI_RUN.read_text()
    assert text.index("install_viewer_tools\n") < text.index('echo "+ $tests_part"')
    for tool in ("chromium", "torch-tb-profiler==0.4.3", "webcomponents.js@0.7.24"):
        assert tool in text
