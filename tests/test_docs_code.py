"""The ```python blocks of the documentation run, so that the prose and the code cannot drift.

Each page's blocks run in order, in one namespace, as a reader would type them,
in a subprocess of their own whose working directory is a fresh temporary
folder (``sqlite:///jobs.db`` is a new file there; ``CONVEYOR_DSN`` names
another). A failure names the page and the line of the block, and the
traceback points into the page itself.

A page marked ``<!-- docs-test: pytest -->`` holds a test module: its blocks
are joined into one file that pytest runs, and every test in it must pass.

A block that cannot run on its own is marked on the line before it with
``<!-- docs-test: skip REASON -->``, REASON one of ``SKIP_REASONS`` below (the
list of why blocks are left out). Blocks that include an example
(``--8<-- "examples/..."``) are run as programs by tests/test_examples.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda path: str(path.relative_to(ROOT)),
)

#: Why a block is not run: every skip marker names one of these.
SKIP_REASONS = {
    "postgres": "enqueues in a psycopg transaction: needs a PostgreSQL server of the reader's",
    "spark": "needs a Spark session and a store of the reader's; "
    "examples/spark_pipeline.py runs the same calls (tests/test_examples.py)",
    "server": "connects to a server of the reader's (Redis, a PostgreSQL the dashboard serves)",
}

#: Pages whose blocks must all run: the guides a reader copies from first.
MUST_RUN = (
    "README.md",
    "docs/index.md",
    "docs/getting-started.md",
    "docs/tasks.md",
    "docs/handlers.md",
    "docs/workers.md",
    "docs/periodic.md",
    "docs/groups-and-limits.md",
    "docs/testing.md",
    "docs/operating.md",
)

_FENCE = re.compile(r"^\s*(`{3,})(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_INCLUDE = re.compile(r"^\s*--8<--")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the first line of code, counting from 1
    code: str
    skip: str | None  # a reason of SKIP_REASONS, "example", or None: runs


def read_blocks(path: Path) -> tuple[list[Block], list[str]]:
    """The page's python blocks, and its page-wide markers (``pytest``)."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    page_markers: list[str] = []
    marker: str | None = None
    index = 0
    while index < len(lines):
        text = lines[index]
        found = _MARKER.match(text)
        if found:
            if found.group(1) == "pytest":
                page_markers.append("pytest")
            else:
                marker = found.group(1)
            index += 1
            continue
        fence = _FENCE.match(text)
        if fence is None:
            if text.strip():
                assert marker is None, f"{page}:{index + 1}: a docs-test marker not before a block"
            index += 1
            continue
        backticks, language = fence.groups()
        end = index + 1
        while lines[end].strip() != backticks:
            end += 1
        if language == "python":
            code = textwrap.dedent("\n".join(lines[index + 1 : end]))
            skip = None
            if marker is not None:
                assert marker.startswith("skip "), f"{page}:{index + 1}: unknown marker {marker!r}"
                skip = marker.removeprefix("skip ").strip()
            elif any(_INCLUDE.match(line) for line in code.splitlines()):
                skip = "example"
            blocks.append(Block(page, index + 2, code, skip))
        else:
            assert marker is None, f"{page}:{index + 1}: a docs-test marker before {language!r}"
        marker = None
        index = end + 1
    return blocks, page_markers


ALL = {str(path.relative_to(ROOT)): read_blocks(path) for path in PAGES}
RUNNABLE = sorted(page for page, (blocks, _) in ALL.items() if any(not b.skip for b in blocks))

# Runs each block in order in one namespace; the blank lines put each block's
# code at its own line of the page, so a traceback names the page's line.
_RUNNER = """
import json, sys, traceback
blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for page, line, code in blocks:
    try:
        exec(compile("\\n" * (line - 1) + code, page, "exec"), namespace)
    except BaseException:
        print(f"the block at {page}:{line} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def test_every_skip_names_a_reason_and_the_guides_run_whole() -> None:
    used = {block.skip for blocks, _ in ALL.values() for block in blocks}
    assert set(SKIP_REASONS) <= used, f"reasons no block gives: {set(SKIP_REASONS) - used}"
    for page, (blocks, _) in ALL.items():
        for block in blocks:
            if block.skip is not None and block.skip != "example":
                assert block.skip in SKIP_REASONS, f"{page}:{block.line}: skip {block.skip!r}"
            if page in MUST_RUN:
                assert block.skip in (None, "postgres"), f"{page}:{block.line} must run"
    for page in MUST_RUN:
        assert page in RUNNABLE, f"{page} has no block that runs"
    runnable = sum(1 for blocks, _ in ALL.values() for block in blocks if block.skip is None)
    # The guides run whole; a fall below this means code turned into skipped blocks.
    assert runnable >= 45, runnable


@pytest.mark.parametrize("page", RUNNABLE)
def test_the_blocks_of_a_page_run(page: str, tmp_path: Path) -> None:
    blocks, markers = ALL[page]
    runnable = [block for block in blocks if block.skip is None]
    env = {**os.environ, "CONVEYOR_DSN": f"sqlite:///{tmp_path / 'from-env.db'}"}
    if "pytest" in markers:
        module = tmp_path / "test_page.py"
        module.write_text("\n\n".join(block.code for block in runnable) + "\n")
        tests = sum(len(re.findall(r"^def test_", block.code, re.M)) for block in runnable)
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module.name],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"{page}'s tests failed:\n{result.stdout}{result.stderr}"
        assert f"{tests} passed" in result.stdout, result.stdout
        return
    result = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps([[str(ROOT / b.page), b.line, b.code] for b in runnable]),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
