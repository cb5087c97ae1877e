"""The code blocks of the middleware and observability pages run, as written, in order.

Each page's ``python`` blocks run one after the other in one namespace (a
block may use what an earlier one defined), in a fresh directory; their own
``assert`` lines are what they check. Apps they open are closed, middleware
they install is taken out and logging is put back afterwards.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from conveyor import App, middleware

DOCS = Path(__file__).parent.parent / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text())


@pytest.mark.parametrize("page", ["middleware.md", "observability.md"])
def test_the_examples_of_a_page_run(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = blocks(page)
    assert len(code) >= 3, f"{page} has lost its examples"
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    namespace: dict[str, Any] = {"__name__": f"docs_{page.split('.')[0]}"}
    apps: list[App] = []
    try:
        for number, block in enumerate(code, 1):
            exec(compile(block, f"{page}, block {number}", "exec"), namespace)
            apps += [v for v in namespace.values() if isinstance(v, App) and v not in apps]
    finally:
        for app in apps:
            app.close()
        from conveyor.otel import ConveyorInstrumentor

        if ConveyorInstrumentor().is_instrumented_by_opentelemetry:
            ConveyorInstrumentor().uninstrument()
        for installed in middleware.installed():
            middleware.uninstall(installed)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
