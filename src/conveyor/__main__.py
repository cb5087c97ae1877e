"""Entry point of the ``conveyor`` command; says what to install when the CLI extra is missing."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from conveyor.cli import cli
    except ImportError as exc:
        sys.stderr.write(
            f"the conveyor command needs its extra: pip install 'conveyor[cli]' ({exc})\n"
        )
        raise SystemExit(2) from None
    cli()


if __name__ == "__main__":
    main()
