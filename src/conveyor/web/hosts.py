"""Which addresses keep the dashboard on this machine (no web dependencies here)."""

from __future__ import annotations

import ipaddress

#: Host names a loopback-only dashboard answers to.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the dashboard on this machine."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
