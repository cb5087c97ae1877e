"""SqlStore on PostgreSQL: what the Spark data source builds on, and its archive's delete."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from conveyor.store.postgres.core import CoreMixin


class ArchiveMixin(CoreMixin):
    """The SQL dialect Spark's tables are written in, and the archive's delete (``SqlStore``)."""

    #: SqlStore: the Spark data source builds its tables beside the jobs'.
    sql_dialect = "postgresql"

    def job_delete_terminal(self, job_ids: Sequence[int], finished_before: datetime) -> list[int]:
        if not job_ids:
            return []
        params = {"ids": list(job_ids), "before": finished_before}
        return self._delete("job_delete_terminal", params)
