"""docs/architecture.md's map against the tree and the import contracts: a module
added, moved or removed without the map, or a layer reordered in one place and
not the other, fails here."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "conveyor"
DOC = ROOT / "docs" / "architecture.md"
#: Folders named as a whole: their files are data, not modules of the map.
WHOLE = {"migrations", "templates", "static", "scripts", "__pycache__"}


def block_after(heading: str) -> str:
    text = DOC.read_text()
    start = text.index(heading)
    fence = text.index("```", start)
    return text[fence + 3 : text.index("```", fence + 3)]


def map_entries() -> list[tuple[str, str]]:
    """(first column, whole entry text) of the map's entries under src/conveyor/."""
    entries: list[tuple[str, str]] = []
    inside = False
    for line in block_after("## Where things are").splitlines():
        if line.startswith("src/conveyor/"):
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            break  # tests/, benchmarks/...: outside the package
        match = re.match(r"^  (\S+)\s{2,}(.*)$", line)
        if inside and match:
            entries.append((match.group(1), match.group(2)))
        elif inside and line.strip() and entries:
            first, text = entries[-1]
            entries[-1] = (first, f"{text} {line.strip()}")
    return entries


def package_files() -> list[Path]:
    found = []
    for path in PACKAGE.rglob("*"):
        relative = path.relative_to(PACKAGE)
        if path.is_dir() or WHOLE & set(relative.parts[:-1]) or path.name == "__init__.py":
            continue
        if path.suffix in (".py", ".sql", ".lua"):
            found.append(relative)
    return found


def test_every_module_is_on_the_map_under_its_folder() -> None:
    named: dict[str, set[str]] = {}
    for first, text in map_entries():
        folder = first if first.endswith("/") else ""
        names = set(re.findall(r"[\w.]+\.(?:py|sql|lua)\b", f"{first} {text}"))
        names |= {f"{word}/" for word in re.findall(r"(\w+)/", text)}
        named.setdefault(folder, set()).update(names)
    missing = []
    for relative in package_files():
        folder = "" if len(relative.parts) == 1 else "/".join(relative.parts[:-1]) + "/"
        if relative.name not in named.get(folder, set()):
            missing.append(str(relative))
    assert not missing, f"modules missing from docs/architecture.md's map: {missing}"
    for folder in {p for p in PACKAGE.rglob("*") if p.is_dir() and p.name in WHOLE}:
        if folder.name == "__pycache__":
            continue
        parent = folder.parent.relative_to(PACKAGE).as_posix() + "/"
        assert f"{folder.name}/" in named.get(parent, set()), f"{parent}{folder.name}/ not named"


def test_every_path_on_the_map_exists() -> None:
    entries = map_entries()
    assert len(entries) > 20
    for first, _ in entries:
        assert (PACKAGE / first).exists(), f"docs/architecture.md names {first}, not in the tree"
    for folder in {p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}:
        assert any(first == f"{folder.name}/" for first, _ in entries), f"{folder.name}/"


def test_the_layers_block_follows_the_import_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    lines = [line for line in block_after("## The layers").splitlines() if line.strip()]
    assert len(lines) == len(layers), "one line of the block per layer of the contract"
    for layer, line in zip(layers, lines, strict=True):
        described = line.split("   ")[0].split()
        for module in (m.strip() for m in layer.split("|")):
            name = module.removeprefix("conveyor.")
            assert f"{name}/" in described or f"{name}.py" in described, (module, line)


def test_the_dashboard_and_the_cli_never_reach_for_the_store() -> None:
    """They go through the App (the facade), so a capability check cannot be skipped."""
    offenders = []
    for folder in ("web", "cli"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "store"
                    and isinstance(node.value, ast.Name | ast.Attribute)
                    and (getattr(node.value, "id", None) or getattr(node.value, "attr", ""))
                    in ("app", "_app")
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"app.store used outside the App: {offenders}"


def test_the_app_stays_a_facade() -> None:
    """Each App method checks and delegates; the rules live in the modules it calls."""
    lines = (PACKAGE / "app.py").read_text().count("\n")
    assert lines <= 1400, f"app.py has {lines} lines: move what is not the facade out"
