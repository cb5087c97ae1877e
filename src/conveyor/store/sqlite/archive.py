"""SqlStore on SQLite: what the Spark data source builds on, and its archive's delete."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from conveyor.store.sqlite import flows as sqlite_flows
from conveyor.store.sqlite.base import _Q, _ts
from conveyor.store.sqlite.core import CoreMixin


class ArchiveMixin(CoreMixin):
    """The SQL dialect Spark's tables are written in, and the archive's delete (``SqlStore``)."""

    #: SqlStore: the Spark data source builds its tables beside the jobs'.
    sql_dialect = "sqlite"

    def job_delete_terminal(self, job_ids: Sequence[int], finished_before: datetime) -> list[int]:
        if not job_ids:
            return []
        params = {"ids": json.dumps(list(job_ids)), "before": _ts(finished_before)}
        with self._write() as conn:
            # Selected under the write lock: no retry can slip in before the delete.
            ids = [r[0] for r in conn.execute(_Q["job_delete_terminal_select"], params)]
            ids = sqlite_flows.keep(conn, ids)  # parents of jobs yet to run stay
            self._delete_jobs(conn, ids)
        return ids
