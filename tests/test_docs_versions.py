"""What --help and the docs say of the stores and the schema version is what the code has."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from click.testing import CliRunner

from conveyor.cli import REDIS_LAYOUT, SCHEMA_VERSION, cli
from conveyor.store.redis.store import LAYOUT_VERSION

DOCS = Path(__file__).resolve().parent.parent / "docs"


def migrations(package: str) -> int:
    folder = resources.files(package).joinpath("migrations")
    return len([f for f in folder.iterdir() if re.match(r"^\d{3}_\w+\.sql$", f.name)])


def test_the_documented_schema_version_is_the_migrations_folders() -> None:
    latest = migrations("conveyor.store.sqlite")
    assert latest == migrations("conveyor.store.postgres") == SCHEMA_VERSION
    assert REDIS_LAYOUT == LAYOUT_VERSION
    found = []
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        for match in re.finditer(r'"schema_version": (\d+)|schema (?:at )?version (\d+)', text):
            number = int(match.group(1) or match.group(2))
            found.append((doc.name, number))
            assert number in (latest, LAYOUT_VERSION), (doc.name, match.group(0))
    assert ("dashboard.md", latest) in found and ("cli.md", latest) in found


def test_help_names_every_store_and_the_schema_version() -> None:
    shown = " ".join(CliRunner().invoke(cli, ["--help"]).stdout.split())
    for store in ("SQLite", "PostgreSQL", "Redis"):
        assert store in shown
    assert f"Schema version {SCHEMA_VERSION}" in shown
    for command in (["stats"], ["jobs", "list"], ["enqueue"], ["dashboard"]):
        text = " ".join(CliRunner().invoke(cli, [*command, "--help"]).stdout.split())
        assert "sqlite:///" in text and "postgresql://" in text and "redis://" in text, command
