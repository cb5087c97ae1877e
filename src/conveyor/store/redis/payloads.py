"""RedisStore's PayloadStore (store/payloads.py): jobs' values read by page, rewritten."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from conveyor.store.payloads import PayloadChange, StoredPayload
from conveyor.store.redis.base import RedisBase

_T = TypeVar("_T")
#: Values per run of payload_rewrite.lua: one script call holds the server for its
#: length, so a long page is written in runs.
_REWRITE_RUN = 200


class RedisPayloads(RedisBase):
    """A mixin of RedisStore."""

    def payload_page(self, after_id: int, limit: int) -> tuple[list[StoredPayload], int | None]:
        """Ids are given out in order by INCRBY on ``ids``: the page is the next
        ``limit`` of them, the ones deleted since left out."""
        newest = int(self._do(lambda: self._client.get(self._k("ids"))) or 0)
        ids = range(after_id + 1, min(after_id + limit, newest) + 1)
        if not ids:
            return [], None

        def read() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hmget(self._k("job", str(job_id)), "args", "kwargs", "result")
                pipe.hgetall(self._k("steps", str(job_id)))
            return list(pipe.execute())

        replies = self._do(read)
        page = []
        for n, job_id in enumerate(ids):
            (args, kwargs, result), steps = replies[2 * n], replies[2 * n + 1]
            if args is None or kwargs is None:
                continue  # deleted (or a hash without its payload, which no one can run)
            pairs = tuple(
                (str(name), json.loads(entry)[0]) for name, entry in sorted(steps.items())
            )
            page.append(StoredPayload(job_id, args, kwargs, result, pairs))
        return page, (ids[-1] if ids[-1] < newest else None)

    def payload_rewrite(self, changes: Sequence[PayloadChange]) -> int:
        written = 0
        for start in range(0, len(changes), _REWRITE_RUN):
            argv: list[Any] = []
            for c in changes[start : start + _REWRITE_RUN]:
                argv += [str(c.id), c.field, c.old, c.new, c.step or ""]
            written += int(self._run("payload_rewrite", *argv))
        return written
