"""Pub/sub: the Redis store's scripts tell waiting workers about new jobs, cancels and ends.

The scripts PUBLISH on ``<prefix>jobs`` (payload: a queue with new ready
work: an enqueue, a retry, a release, a resume, a finish that frees a group or
a limit), ``<prefix>cancel`` (payload: a job id whose cancel was requested)
and ``<prefix>done`` (payload: the ids of the jobs a script ended, joined
by commas). One listener thread per
subscriber holds its own connection. Messages published while it is
disconnected are lost, so after every (re)subscribe it reports "reconnected":
workers then look at everything again instead of trusting that nothing
happened, and their fallback poll stays behind it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import redis

from conveyor.pacing import DutyBackoff
from conveyor.store.protocols import ChangeCallback

log = logging.getLogger("conveyor.redis")

CHANNELS = ("jobs", "cancel", "done")
#: How long one wait for messages lasts before checking whether to stop.
_WAIT = 0.5
_MAX_BACKOFF = 5.0


class RedisListener:
    def __init__(self, client: Any, prefix: str, on_change: ChangeCallback) -> None:
        self._client = client
        self._prefix = prefix
        self._on_change = on_change
        self._stop = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-redis-sub", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = DutyBackoff("Redis subscription", log, first=0.1, ceiling=_MAX_BACKOFF)
        channels = {self._prefix + name: name for name in CHANNELS}
        while not self._stop.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(*channels)
                self.connected.set()
                # Whatever was published before SUBSCRIBE took effect is lost.
                self._on_change("reconnected", "")
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=_WAIT)
                    if message is not None and message.get("type") == "message":
                        name = channels.get(str(message["channel"]), "any")
                        self._on_change(name, str(message["data"]))
                    # Reset only once a subscription has lasted (see the PostgreSQL listener).
                    backoff.succeeded()
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                if not self._stop.is_set():
                    self._stop.wait(backoff.failed(exc))
            finally:
                self.connected.clear()
                with contextlib.suppress(redis.RedisError, OSError):
                    pubsub.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
