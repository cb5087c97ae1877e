"""Jobs as plain data, and taken out of the store with their history (``conveyor export``).

The records ``conveyor jobs show --json`` prints and an export writes: a job's
fields, its arguments and result decoded (``"encrypted (no key here)"`` where
no key of this process opens them, never the ciphertext), and its events. An
export walks the jobs a selection names, newest first, a page at a time, and
deletes nothing.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from conveyor.encryption import SEALED_LABEL
from conveyor.errors import ConfigurationError
from conveyor.job import Event, Job, is_sealed
from conveyor.store.records import Step

if TYPE_CHECKING:
    from conveyor.app import App

#: The formats an export writes.
FORMATS = ("jsonl", "csv", "parquet")
#: Jobs read per page while exporting.
EXPORT_PAGE = 500


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def decoded(text: str | None) -> Any:
    """A stored JSON payload, decoded; as the raw text when it is not JSON (a poison job);
    SEALED_LABEL when it is encrypted and no key here opens it (never the ciphertext)."""
    if text is None:
        return None
    if is_sealed(text):
        return SEALED_LABEL
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def job_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "queue": job.queue,
        "task": job.task,
        "state": str(job.state),
        "detailed_state": job.detailed_state(),
        "held": job.held,
        "args": decoded(job.args_json),
        "kwargs": decoded(job.kwargs_json),
        "headers": decoded(job.headers_json) or {},
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "group": job.group,
        "batch": job.batch,
        "limit_key": job.limit_key,
        "run_at": iso(job.run_at),
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "worker": job.worker,
        "lease_expires_at": iso(job.lease_expires_at),
        "cancel_requested": job.cancel_requested,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "result": decoded(job.result_json),
        "error": job.error,
        **_encrypted(job),
    }


def _encrypted(job: Job) -> dict[str, Any]:
    """``{"encrypted": [fields]}`` naming the fields no key here opens; {} for none."""
    stored = (("args", job.args_json), ("kwargs", job.kwargs_json), ("result", job.result_json))
    sealed = [name for name, text in stored if is_sealed(text)]
    return {"encrypted": sealed} if sealed else {}


def event_dict(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "attempt": event.attempt,
        "worker": event.worker,
        "at": iso(event.at),
        "error": event.error,
    }


def step_dict(step: Step) -> dict[str, Any]:
    return {
        "name": step.name,
        "attempt": step.attempt,
        "started_at": iso(step.started_at),
        "finished_at": iso(step.finished_at),
        "result": decoded(step.result_json),
    }


def exported_jobs(
    app: App, filters: Mapping[str, str | None], limit: int | None = None, events: bool = True
) -> Iterator[dict[str, Any]]:
    """The jobs ``filters`` name (as ``app.jobs`` takes them), newest first, each as
    ``job_dict`` with its ``events`` (unless ``events`` is False); at most ``limit``."""
    before: int | None = None
    left = limit
    while left is None or left > 0:
        size = EXPORT_PAGE if left is None else min(EXPORT_PAGE, left)
        page = app.jobs(limit=size, before_id=before, **filters)
        for job in page:
            record = job_dict(job)
            if events:
                record["events"] = [event_dict(event) for event in app.events(job.id)]
            yield record
        if len(page) < size:
            return
        before = page[-1].id
        if left is not None:
            left -= len(page)


def jsonl_lines(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    """One JSON object a line."""
    for record in records:
        yield json.dumps(record, default=str) + "\n"


def csv_lines(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    """A header line of the job's fields, then a line a job (nested values as JSON)."""
    buffer = io.StringIO()
    writer: csv.DictWriter[str] | None = None
    for record in records:
        row = flat(record)
        if writer is None:
            writer = csv.DictWriter(buffer, fieldnames=_columns(row), extrasaction="ignore")
            writer.writeheader()
        writer.writerow(row)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def write_lines(lines: Iterable[str], out: IO[str]) -> int:
    """Write an export's lines (``jsonl_lines``, ``csv_lines``); how many jobs they held."""
    count = 0
    for line in lines:
        out.write(line)
        count += 1
    return count


def flat(record: dict[str, Any]) -> dict[str, Any]:
    """A record with its nested values (arguments, result, events...) as JSON text."""
    return {
        name: json.dumps(value, default=str) if isinstance(value, dict | list) else value
        for name, value in record.items()
    }


def write_parquet(records: Iterable[dict[str, Any]], path: str) -> int:
    """A Parquet file of the records (nested values as JSON text); needs pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigurationError(
            "exporting to Parquet needs pyarrow (pip install 'conveyor[spark]' or pyarrow)"
        ) from None
    rows = [flat(record) for record in records]
    columns = _columns(rows[0]) if rows else ["id"]
    table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
    pq.write_table(table, path)
    return len(rows)


def _columns(row: dict[str, Any]) -> list[str]:
    # "encrypted" appears only on sealed jobs: every row has the column.
    return [*row, *(["encrypted"] if "encrypted" not in row else [])]
