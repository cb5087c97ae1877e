"""How a background duty that failed waits before it tries again: one policy for all.

Every duty that talks to the store on its own rhythm (the worker's claim and
cancel checks, lease renewal, the completer, ``consume``, maintenance, the
listeners' reconnects) meets the same trouble: a database that restarts, a
file locked by another process, a server that is briefly away. They all
answer it the same way:

- pauses grow (doubling from ``first``) up to a ``ceiling``, so an outage is
  never met with a hot loop, and a blip costs only a short wait;
- the first failure is logged with its traceback, later ones at most once per
  ``LOG_EVERY`` seconds with a count, and the recovery once, so a long outage
  does not flood the log;
- a success resets the pauses.

Nothing here sleeps: the duty asks for the pause and waits on its own event,
so that a stop request still ends the wait at once.
"""

from __future__ import annotations

import logging
import time

#: Least time between two log lines about the same duty's failures (seconds).
LOG_EVERY = 30.0


class DutyBackoff:
    """The failures of one duty and the pause before its next try."""

    __slots__ = (
        "_logged_at", "_silenced", "ceiling", "failures", "first", "log", "name", "retry_at",
    )  # fmt: skip

    def __init__(
        self, name: str, log: logging.Logger, *, first: float = 0.05, ceiling: float = 5.0
    ) -> None:
        if not 0 < first <= ceiling:
            raise ValueError("a backoff needs 0 < first <= ceiling")
        self.name = name
        self.log = log
        self.first = first
        self.ceiling = ceiling
        self.failures = 0
        #: Monotonic time before which the duty should not try again.
        self.retry_at = 0.0
        self._logged_at = -LOG_EVERY
        self._silenced = 0

    def ready(self, now: float) -> bool:
        return now >= self.retry_at

    def pause(self) -> float:
        """The pause after the current number of failures (``first`` before any)."""
        if self.failures <= 0:
            return self.first
        # Capped exponent: 2**1000 would be a float overflow, not a long pause.
        return min(self.first * 2.0 ** min(self.failures - 1, 60), self.ceiling)

    def failed(self, exc: BaseException, now: float | None = None) -> float:
        """Count a failure, log it if its turn has come; the pause before the next try."""
        now = time.monotonic() if now is None else now
        self.failures += 1
        pause = self.pause()
        self.retry_at = now + pause
        if self.failures == 1 or now - self._logged_at >= LOG_EVERY:
            more = f" ({self._silenced} more failure(s) not logged)" if self._silenced else ""
            self.log.warning(
                "%s failed (attempt %d, retrying in %.2fs)%s: %s",
                self.name, self.failures, pause, more, exc,
                exc_info=self.failures == 1,
            )  # fmt: skip
            self._logged_at = now
            self._silenced = 0
        else:
            self._silenced += 1
        return pause

    def succeeded(self) -> None:
        """The duty worked: say so if it had been failing, and reset the pauses."""
        if self.failures:
            self.log.info("%s works again after %d failure(s)", self.name, self.failures)
        self.failures = 0
        self.retry_at = 0.0
        self._silenced = 0
        self._logged_at = -LOG_EVERY
