"""WorkflowStore on Redis: the edges between jobs read back, declared workflows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from conveyor.job import Job, NewJob
from conveyor.store.flows import DROPPED, GONE
from conveyor.store.records import Relative, WorkflowInfo
from conveyor.store.redis.base import _dt, _WorkflowTaken
from conveyor.store.redis.core import CoreMixin


class WorkflowsMixin(CoreMixin):
    """Jobs that wait for other jobs, and declared workflows (``WorkflowStore``)."""

    def job_parents(self, job_id: int) -> list[Relative]:
        edges: dict[str, str] = self._do(lambda: self._client.hgetall(self._k("wp", str(job_id))))
        ids = sorted(int(i) for i in edges)
        # A parent that cannot be read is gone (deleted, or dropped, or about to
        # be): named, with no job, so that its child does not leave it out.
        return [
            Relative(i, job, edges[str(i)] or None)
            if job is not None
            else Relative(i, None, edges[str(i)] if edges[str(i)] in GONE else DROPPED)
            for i, job in zip(ids, self._load(ids), strict=True)
        ]

    def job_workflow(self, job_id: int) -> str | None:
        found: str | None = self._do(
            lambda: self._client.hget(self._k("job", str(job_id)), "workflow")
        )
        return found

    def workflow_insert(
        self, workflow_id: str, name: str, jobs: Sequence[NewJob], now: datetime
    ) -> tuple[list[Job], bool]:
        try:
            return self._insert(jobs, now, workflow_id, name), False
        except _WorkflowTaken as taken:
            return [j for j in self._load(taken.ids) if j is not None], True

    def workflow_get(self, workflow_id: str) -> WorkflowInfo | None:
        fields: dict[str, str] = self._do(lambda: self._client.hgetall(self._k("wf", workflow_id)))
        if not fields:
            return None
        return WorkflowInfo(
            workflow_id, fields["name"], int(fields["jobs"]), _dt(fields["created_at"])
        )

    def workflow_list(self, limit: int = 100) -> list[WorkflowInfo]:
        def read() -> list[tuple[str, dict[str, str]]]:
            ids = self._client.zrevrange(self._k("workflows"), 0, limit - 1)
            pipe = self._client.pipeline(transaction=False)
            for workflow_id in ids:
                pipe.hgetall(self._k("wf", workflow_id))
            return list(zip(ids, pipe.execute(), strict=True))

        return [
            WorkflowInfo(i, f["name"], int(f["jobs"]), _dt(f["created_at"]))
            for i, f in self._do(read)
            if f
        ]

    def _workflow_ids(self, workflow_id: str) -> list[int]:
        ids = self._do(lambda: self._client.zrange(self._k("wfj", workflow_id), 0, -1))
        return [int(i) for i in ids]

    def workflow_jobs(self, workflow_id: str) -> list[Job]:
        return [j for j in self._load(self._workflow_ids(workflow_id)) if j is not None]

    def workflow_counts(self, workflow_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for state in self._job_field(self._workflow_ids(workflow_id), "state"):
            if state is not None:
                counts[state] = counts.get(state, 0) + 1
        return dict(sorted(counts.items()))

    def workflow_edges(self, workflow_id: str) -> list[tuple[int, int, str | None]]:
        ids = self._workflow_ids(workflow_id)

        def read() -> list[dict[str, str]]:
            pipe = self._client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self._k("wp", str(job_id)))
            return list(pipe.execute())

        return [
            (child, int(parent), resolved or None)
            for child, edges in zip(ids, self._do(read), strict=True)
            for parent, resolved in sorted(edges.items(), key=lambda e: int(e[0]))
        ]

    def job_children(self, job_id: int) -> list[Relative]:
        def read() -> list[tuple[int, str | None]]:
            ids = [int(i) for i in self._client.zrange(self._k("wc", str(job_id)), 0, -1)]
            pipe = self._client.pipeline(transaction=False)
            for child in ids:
                pipe.hget(self._k("wp", str(child)), str(job_id))
            return list(zip(ids, pipe.execute(), strict=True))

        edges = dict(self._do(read))
        return [
            Relative(job.id, job, edges.get(job.id) or None)
            for job in self._load(sorted(edges))
            if job is not None
        ]
