"""Prose that stays true: every document the code, tests and docs cite is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where citations are looked for: the code, the tests, the docs and the top-level prose.
SOURCES = ["src", "tests", "docs", "benchmarks", "examples", "README.md", "BENCHMARKS.md"]
SUFFIXES = {".py", ".md", ".sql", ".lua", ".html", ".toml", ".txt", ".yml"}
#: A file name ending in .md, not part of a web address.
CITED = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w.-]+\.md)\b")


def texts() -> list[Path]:
    found: list[Path] = []
    for name in SOURCES:
        path = ROOT / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += [p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    # The benchmarks' Node packages (npm install) are not the project's prose.
    return [p for p in found if "node_modules" not in p.parts]


def exists(cited: str, where: Path) -> bool:
    candidates = [ROOT / cited, where.parent / cited, ROOT / "docs" / cited]
    return any(c.is_file() for c in candidates)


def test_every_cited_markdown_file_exists() -> None:
    missing = []
    for path in texts():
        for line_number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "://" in line and ".md" in line.split("://", 1)[1]:
                continue  # a web address
            for cited in CITED.findall(line):
                if not exists(cited, path):
                    missing.append(f"{path.relative_to(ROOT)}:{line_number}: {cited}")
    assert missing == [], "cited documents that are not in the repository:\n" + "\n".join(missing)


def test_the_package_names_all_three_stores() -> None:
    import conveyor

    for text in (conveyor.__doc__ or "", (ROOT / "pyproject.toml").read_text()):
        assert "Redis" in text and "PostgreSQL" in text and "SQLite" in text
