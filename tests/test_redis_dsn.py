"""Redis DSNs that cannot be right are refused before any connection, saying why."""

from __future__ import annotations

import pytest

from conveyor import App
from conveyor.errors import ConfigurationError


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("redis://localhost:notaport/0", "port is not a number"),
        ("redis://localhost:6379/abc", "database 'abc' is not a number"),
        ("rediss://localhost:6379/1/2", "database '1/2' is not a number"),
        ("unix://", "needs the socket's path"),
    ],
)
def test_a_malformed_redis_dsn_is_refused(dsn: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        App(dsn).stats()
