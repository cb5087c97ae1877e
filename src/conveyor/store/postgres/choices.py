"""The DSN settings libpq takes from a fixed list, checked before the first connection.

libpq refuses a wrong one (``sslmode=bogus``) at each connection attempt with
an error no different in kind from an outage's, so the pool would retry it for
the whole connect timeout and report the server unreachable. A mistake in the
DSN is a configuration error, and is said at once, naming the values allowed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from conveyor.errors import ConfigurationError

#: Each setting, the environment variable libpq reads when the DSN has none, and
#: the values libpq accepts (compared as libpq does: exactly, case included).
CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sslmode": (
        "PGSSLMODE",
        ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    ),
    "gssencmode": ("PGGSSENCMODE", ("disable", "prefer", "require")),
    "channel_binding": ("PGCHANNELBINDING", ("disable", "prefer", "require")),
    "target_session_attrs": (
        "PGTARGETSESSIONATTRS",
        ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    ),
    "load_balance_hosts": ("PGLOADBALANCEHOSTS", ("disable", "random")),
    "sslcertmode": ("PGSSLCERTMODE", ("disable", "allow", "require")),
    "sslnegotiation": ("PGSSLNEGOTIATION", ("postgres", "direct")),
}


def check_choices(info: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> None:
    """Refuse a setting of the parsed DSN ``info`` (or of the environment) libpq would refuse."""
    for name, (variable, allowed) in CHOICES.items():
        value, source = info.get(name), f"{name}= in the PostgreSQL DSN"
        if value is None and environ.get(variable):
            value, source = environ[variable], f"${variable}"
        if value is not None and value not in allowed:
            raise ConfigurationError(
                f"{source} is {value!r}; it must be one of {', '.join(allowed)}"
            )
