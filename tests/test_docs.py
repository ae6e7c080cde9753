"""The documentation runs: README.md and docs/*.md (issue 34, item 1).

The convention, as docs/README.md states it:

- Every fenced block names its language. ```python and ```sh blocks run, unless the
  line before the block is ``<!-- not run: why -->``; ```text, ```json and ```sql blocks
  are shown, not run (the ```sql blocks of docs/store.md are the store's example queries,
  which tests/test_store_query.py runs). README.md's first block (the set-up commands) is
  run by ``.ci/run`` instead.
- A page's blocks run in order, in one namespace, in a fresh folder: the namespace starts
  from docs/README.md's prelude block (``model``, ``optimizer``, ``x``, ``train_step``...),
  and the folder holds the small saved traces and stores the examples name (``trace.json``,
  ``./log``, ``job.store``...), recorded once per module.
- An ```sh block holds ``opscope`` commands, one a line (``#`` starts a comment); each is
  run in this process and must exit with status 0.

Also: README.md is at most 300 lines, every relative link of README.md and docs/*.md points
to a file that exists (and a heading of it, for ``#anchor``), and docs/cli.md lists every
option of every verb.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md"] + sorted(DOCS.glob("*.md"))
RUN_LANGUAGES = ("python", "sh")
SHOWN_LANGUAGES = ("text", "json", "sql")
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
PRELUDE_MARK = "<!-- prelude -->"


class Block(NamedTuple):
    """One fenced block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: str  # the non-empty line before the fence


def blocks(page: Path) -> List[Block]:
    """Every fenced block of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, k = [], 0
    while k < len(lines):
        if lines[k].startswith("```"):
            end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
            before = next((lines[j] for j in range(k - 1, -1, -1) if lines[j].strip()), "")
            found.append(Block(page, k + 1, lines[k][3:].strip(),
                               "\n".join(lines[k + 1:end]) + "\n", before.strip()))
            k = end
        k += 1
    return found


def runs(block: Block) -> bool:
    """Whether the convention runs ``block``."""
    if block.page.name == "README.md" and block.page.parent == REPO \
            and block == blocks(block.page)[0]:
        return False  # the set-up commands: .ci/run runs them
    return block.language in RUN_LANGUAGES and not NOT_RUN.fullmatch(block.marker) \
        and block.marker != PRELUDE_MARK


def prelude() -> str:
    """docs/README.md's prelude block: the names every page's python blocks start from."""
    marked = [b for b in blocks(DOCS / "README.md") if b.marker == PRELUDE_MARK]
    assert len(marked) == 1, "docs/README.md needs one python block after <!-- prelude -->"
    return marked[0].text


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """A folder with the saved traces and stores the examples name, recorded once."""
    import torch

    import opscope

    root = tmp_path_factory.mktemp("docs_seeds")
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with opscope.profile(schedule=opscope.schedule(wait=0, warmup=1, active=2),
                         record_shapes=True, with_modules=True, with_stack=True) as prof:
        for _ in range(3):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    trace = root / "trace.json"
    prof.export_chrome_trace(str(trace))
    for name in ("out/train.pt.trace.json", "log/host_1.pt.trace.json", "before.pt.trace.json",
                 "after.pt.trace.json", "a.pt.trace.json", "job_traces/train.rank0.pt.trace.json",
                 "job_traces/train.rank1.pt.trace.json"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(trace, root / name)
    prof.export_chrome_trace(str(root / "b.pt.trace.json.gz"))
    if _importable("duckdb") and _importable("pyarrow"):
        from opscope.store.write import StoreWriter

        for store, ranks in (("job.store", 4), ("before.store", 1)):
            with StoreWriter(str(root / store)) as writer:
                for rank in range(ranks):
                    writer.write_window(prof.session, rank=rank)
    return root


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def run_sh(block: Block) -> None:
    """Run each ``opscope`` command of an ```sh block in this process."""
    from opscope.cli.main import main

    for offset, line in enumerate(block.text.splitlines(), start=1):
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        where = f"{label(block.page)}:{block.line + offset}"
        assert argv[0] == "opscope", f"{where}: not an opscope command: {line!r}"
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                status = main(argv[1:])
            except SystemExit as stop:
                status = stop.code
        assert status in (0, None), f"{where}: exit status {status}: {out.getvalue()[-2000:]}"


def label(page: Path) -> str:
    """The page's path from the repository, or its name."""
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else page.name


def run_page(page: Path, folder: Path) -> int:
    """Run the page's runnable blocks in order in ``folder``; how many ran."""
    namespace: Dict[str, object] = {"__name__": "__docs__"}
    exec(compile(prelude(), "docs/README.md:prelude", "exec"), namespace)
    ran = 0
    for block in filter(runs, blocks(page)):
        if block.language == "python":
            code = compile(block.text, f"{label(page)}:{block.line + 1}", "exec")
            exec(code, namespace)
        else:
            run_sh(block)
        ran += 1
    return ran


RUNNABLE = [p for p in PAGES if any(runs(b) for b in blocks(p))]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(REPO)))
def test_every_block_meant_to_run_runs(page, seeds, tmp_path, monkeypatch):
    if any("store" in b.text for b in blocks(page) if runs(b)):
        pytest.importorskip("duckdb")
        pytest.importorskip("pyarrow")
    if any("dask" in b.text for b in blocks(page) if runs(b)):
        pytest.importorskip("dask.distributed")
    shutil.copytree(seeds, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    try:
        assert run_page(page, tmp_path) > 0
    finally:
        if "torch._dynamo" in sys.modules:  # a compiled example: leave no graph behind
            sys.modules["torch._dynamo"].reset()


def test_every_block_names_its_language_and_every_not_run_says_why():
    for page in PAGES:
        for block in blocks(page):
            where = f"{page.relative_to(REPO)}:{block.line}"
            if page.name == "README.md" and block == blocks(page)[0]:
                continue
            assert block.language in RUN_LANGUAGES + SHOWN_LANGUAGES, \
                f"{where}: a block's language must be one of {RUN_LANGUAGES + SHOWN_LANGUAGES}"
            if block.marker.startswith("<!-- not run"):
                assert NOT_RUN.fullmatch(block.marker), f"{where}: '<!-- not run: why -->'"


def test_readme_is_at_most_300_lines():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move text into docs/"


def anchors(page: Path) -> set:
    """GitHub's anchors for the headings of ``page``."""
    found = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_relative_link_points_to_a_file_and_heading():
    link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in link.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            where = f"{page.relative_to(REPO)}: link {target}"
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{where}: no such file"
            if anchor:
                assert anchor in anchors(file), f"{where}: no such heading"


def test_cli_reference_lists_every_option_of_every_verb():
    from opscope.cli.main import build_parser

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for verb, sub in verbs.choices.items():
        section = re.search(rf"^### `opscope {verb}`$(.*?)(?=^#|\Z)", text, flags=re.S | re.M)
        assert section, f"docs/cli.md has no '### `opscope {verb}`' section"
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in section.group(1) or f", {option}" in \
                        section.group(1), f"docs/cli.md: opscope {verb} {option} is missing"


def test_the_docs_index_lists_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not link {page.name}"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "(docs/README.md)" in readme


def test_a_failing_block_fails(tmp_path):
    """The runner is no rubber stamp: a python block that raises, an sh command that
    fails, and a link to nothing are each caught."""
    page = tmp_path / "page.md"
    page.write_text("```python\nraise ValueError('broken')\n```\n")
    with pytest.raises(ValueError, match="broken"):
        run_page(page, tmp_path)
    page.write_text("```sh\nopscope table no-such-trace.json\n```\n")
    with pytest.raises(AssertionError, match="exit status 2"):
        run_page(page, tmp_path)
    page.write_text("<!-- not run: shown only -->\n```python\nraise ValueError\n```\n")
    assert run_page(page, tmp_path) == 0
