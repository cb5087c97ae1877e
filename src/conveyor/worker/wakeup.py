"""The latch that wakes a worker's control loop, and what pulls it.

A wake that arrives while the loop is busy is kept (latched) until the loop
next waits, so it is never lost; several wakes in a row collapse into one.
"""

from __future__ import annotations

import builtins
import threading
import time


class Wakeup:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._flag = False
        #: Why the latch was pulled since the last wait (for the loop's decisions).
        self.reasons: builtins.set[str] = builtins.set()

    def set(self, reason: str = "wake") -> None:
        with self._cond:
            self._flag = True
            self.reasons.add(reason)
            self._cond.notify_all()

    def pull(self, reason: str) -> None:
        """``set``, unless the latch is already pulled: the hot path of handlers returning.

        Safe without the lock: the loop clears the flag before it reads the
        inboxes, so whatever was put there before this look is seen.
        """
        if not self._flag:
            self.set(reason)

    def wait(self, timeout: float | None) -> builtins.set[str]:
        """Wait until pulled or ``timeout`` passes; return the reasons (empty on timeout)."""
        with self._cond:
            if not self._flag and (timeout is None or timeout > 0):
                deadline = None if timeout is None else time.monotonic() + timeout
                while not self._flag:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cond.wait(left)
            reasons, self.reasons = self.reasons, builtins.set()
            self._flag = False
            return reasons
