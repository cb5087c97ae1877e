"""OutcomeStore on Redis: finished jobs whose outcome is not processed yet."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from conveyor.store.redis.base import _ts
from conveyor.store.redis.core import CoreMixin


class OutcomesMixin(CoreMixin):
    """Outcome readers' listing and compare-and-set mark (``OutcomeStore``)."""

    def job_unprocessed(
        self, queue: str | None, states: Sequence[str], since: datetime, limit: int
    ) -> list[int]:
        wanted = set(states)
        found: list[int] = []
        offset, chunk = 0, max(limit, 500)
        while len(found) < limit:
            # The finished index, oldest finish first, a chunk at a time.
            def chunk_of(start: int = offset) -> list[str]:
                return list(
                    self._client.zrangebyscore(
                        self._k("finished"), _ts(since), "+inf", start=start, num=chunk
                    )
                )

            ids = self._do(chunk_of)
            if not ids:
                break
            offset += len(ids)

            def read(batch: list[str] = ids) -> list[list[str | None]]:
                pipe = self._client.pipeline(transaction=False)
                for job_id in batch:
                    pipe.hmget(
                        self._k("job", job_id), "queue", "state", "finished_at", "processed_mark"
                    )
                return list(pipe.execute())

            for job_id, (q, state, finished, mark) in zip(ids, self._do(read), strict=True):
                if state in wanted and (queue is None or q == queue) and mark != finished:
                    found.append(int(job_id))
        return found[:limit]

    def job_mark_processed(self, job_id: int) -> bool:
        return bool(self._run("job_mark_processed", str(job_id)))
