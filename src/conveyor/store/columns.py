"""The columns of ``jobs`` and ``events`` as both SQL stores read them by position:
``SELECT *`` yields them in table order, the same order on SQLite and PostgreSQL
(migrations add columns at the end). SQLite's migrate() checks the tables start
with them; Spark's scans take their names from here."""

from __future__ import annotations

JOB_COLUMNS = (
    "id", "queue", "task", "state", "args", "kwargs", "priority", "run_at", "attempts",
    "max_attempts", "key", "group_key", "batch", "worker", "lease_token", "lease_expires_at",
    "cancel_requested", "result", "error", "progress", "progress_message", "created_at",
    "started_at", "finished_at", "limit_key", "headers",
)  # fmt: skip
EVENT_COLUMNS = (
    "seq", "job_id", "queue", "task", "kind", "attempt", "worker", "at", "error", "started_at",
    "jobs",
)  # fmt: skip
