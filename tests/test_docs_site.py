"""The documentation site covers what it must: the public API, every example, every page.

`make docs` (run by `make test`) builds the site with ``mkdocs build --strict``,
which fails on a broken link, anchor or reference and on a page missing from
the nav; these tests check what a build cannot know is missing.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import conveyor

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"

_DIRECTIVE = re.compile(r"^::: (\S+)", re.M)
_MEMBER = re.compile(r"^\s+- (\w+)$", re.M)


def documented() -> set[str]:
    """Dotted paths the API reference renders: each ``::: path`` and its listed members."""
    found: set[str] = set()
    for page in REFERENCE.glob("*.md"):
        for section in re.split(r"(?=^::: )", page.read_text(), flags=re.M):
            directive = _DIRECTIVE.match(section)
            if directive is None:
                continue
            path = directive.group(1)
            found.add(path)
            found.update(f"{path}.{member}" for member in _MEMBER.findall(section))
    return found


def test_the_reference_renders_every_public_name() -> None:
    shown = documented()
    for name in conveyor.__all__:
        if name == "__version__":
            continue
        value = getattr(conveyor, name)
        home = f"{value.__module__}.{value.__qualname__}"
        assert f"conveyor.{name}" in shown or home in shown, f"{name} is not in docs/reference"


def test_the_reference_renders_the_testing_helpers_and_the_worker() -> None:
    shown = documented()
    assert "conveyor.testing" in shown
    assert "conveyor.worker.Worker" in shown
    for path in shown:  # every directive names something that exists
        module, _, attribute = path.rpartition(".")
        try:
            importlib.import_module(path)
        except ImportError:
            assert hasattr(importlib.import_module(module), attribute), path


def test_the_examples_page_shows_every_example() -> None:
    page = (DOCS / "examples.md").read_text()
    shown = set(re.findall(r'--8<-- "examples/(\w+)\.py"', page))
    assert shown == {path.stem for path in (ROOT / "examples").glob("*.py")}


def test_every_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert f" {page.relative_to(DOCS)}" in config, f"{page} is not in mkdocs.yml's nav"


def test_the_readme_keeps_the_commands_ci_and_contributors_run() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in ("make test ", "make test-fast ", "make demo "):
        assert re.search(rf"^{re.escape(command)}", readme, re.M), command
    for link in re.findall(r"\]\(((?:docs|examples)/[^)#]*)", readme):
        assert (ROOT / link).exists(), link
