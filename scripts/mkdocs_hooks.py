"""MkDocs hooks (mkdocs.yml `hooks:`): the repository's own pages join the site.

The Markdown files at the root of the repository that the guides link to
(BENCHMARKS.md, CHANGELOG.md) become pages of the site, so they are written
once and read in both places. Their links are written for a reader of the
repository, as are the guides' links to them and to the source:

- a guide's ``../BENCHMARKS.md`` becomes the site's ``BENCHMARKS.md``;
- a root page's ``docs/dashboard.md`` becomes ``dashboard.md``;
- a guide's link to a source file (``[`job.py`](../src/conveyor/job.py)``)
  keeps its text: the site does not serve the source.

Every other link is left to MkDocs, which checks it (``mkdocs build --strict``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
ROOT_PAGES = ("BENCHMARKS.md", "CHANGELOG.md")

_TO_ROOT_PAGE = re.compile(r"\]\(\.\./(" + "|".join(map(re.escape, ROOT_PAGES)) + r")")
_TO_SOURCE = re.compile(r"\[([^\]]+)\]\(\.\./(?:src|tests|benchmarks|scripts)/[^)]*\)")
_TO_DOCS = re.compile(r"\]\(docs/")


def on_files(files: Files, config: Any) -> Files:
    for name in ROOT_PAGES:
        files.append(File.generated(config, name, abs_src_path=str(ROOT / name)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri in ROOT_PAGES:
        return _TO_DOCS.sub("](", markdown)
    markdown = _TO_ROOT_PAGE.sub(r"](\1", markdown)
    return _TO_SOURCE.sub(r"\1", markdown)
