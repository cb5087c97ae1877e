"""From a DataFrame's rows (Arrow record batches) to the columns of new jobs.

Names are checked a column at a time with Arrow compute (a million keys would
cost a second through ``validate_name`` one by one); payloads are encoded to
JSON row by row, the one step that has to touch every value in Python.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import (
    MAX_NAME_LENGTH,
    MAX_PAYLOAD_BYTES,
    Unique,
    validate_max_attempts,
    validate_name,
    validate_priority,
)
from conveyor.spark.source import bool_option, int_option, option

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BATCH_SIZE = 10_000
DEFAULT_ABANDONED_AFTER_HOURS = 24
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
# Options that name a column, by the job field they fill.
_COLUMN_OPTIONS = {
    "queue": "queueColumn",
    "task": "taskColumn",
    "key": "keyColumn",
    "group": "groupColumn",
    "batch": "batchColumn",
    "priority": "priorityColumn",
    "run_at": "runAtColumn",
    "args": "argsColumn",
    "kwargs": "kwargsColumn",
}


@dataclass(frozen=True, slots=True)
class WritePlan:
    """How the rows of a DataFrame become jobs: checked on the driver, pickled to the tasks."""

    queue: str
    task: str | None
    columns: dict[str, str]  # job field -> DataFrame column
    kwarg_columns: tuple[str, ...]
    map_columns: frozenset[str] = field(default_factory=frozenset)
    payload_is_text: frozenset[str] = field(default_factory=frozenset)
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch: str | None = None
    unique: Unique = "live"
    atomic: bool = True
    batch_size: int = DEFAULT_BATCH_SIZE
    #: An atomic write open this long is taken for abandoned (its driver died) and
    #: cleared away by the next atomic write to the store.
    abandoned_after: dt.timedelta = dt.timedelta(hours=DEFAULT_ABANDONED_AFTER_HOURS)

    @classmethod
    def from_options(cls, schema: StructType, options: Mapping[str, str]) -> WritePlan:
        fields = {f.name: f.dataType for f in schema.fields}
        lowered = {name.lower(): name for name in fields}

        def column(job_field: str) -> str | None:
            opt = _COLUMN_OPTIONS[job_field]
            name = option(options, opt)
            if name is None:
                return None
            # Spark resolves column names case-insensitively by default; so do we.
            found = name if name in fields else lowered.get(name.lower())
            if found is None:
                raise ConfigurationError(
                    f"option {opt} names column {name!r}, which the DataFrame does not have "
                    f"(it has {', '.join(fields) or 'no columns'})"
                )
            return found

        columns = {f: c for f in _COLUMN_OPTIONS if (c := column(f)) is not None}
        task = option(options, "task")
        if task is None and "task" not in columns:
            raise ConfigurationError(
                'writing jobs needs .option("task", "name") or .option("taskColumn", "column")'
            )
        if task is not None:
            validate_name("task", task)
        queue = option(options, "queue", DEFAULT_QUEUE) or DEFAULT_QUEUE
        validate_name("queue", queue)
        batch = option(options, "batch")
        if batch is not None:
            validate_name("batch", batch)
        try:
            priority = validate_priority(int(option(options, "priority", "0") or 0))
            max_attempts = validate_max_attempts(
                int(option(options, "maxAttempts", str(DEFAULT_MAX_ATTEMPTS)) or 0)
            )
        except ValueError as exc:
            raise ConfigurationError(f"option priority or maxAttempts: {exc}") from None
        unique = (option(options, "unique", "live") or "live").lower()
        if unique not in ("live", "forever"):
            raise ConfigurationError(f'option unique must be "live" or "forever", got {unique!r}')

        _check_types(columns, fields)
        used = set(columns.values())
        payload_given = "args" in columns or "kwargs" in columns
        kwarg_columns = () if payload_given else tuple(n for n in fields if n not in used)
        payload = [*kwarg_columns, *(columns[f] for f in ("args", "kwargs") if f in columns)]
        return cls(
            queue=queue,
            task=task,
            columns=columns,
            kwarg_columns=kwarg_columns,
            map_columns=frozenset(n for n in payload if _has_map(fields[n])),
            payload_is_text=frozenset(
                columns[f]
                for f in ("args", "kwargs")
                if f in columns and isinstance(fields[columns[f]], StringType)
            ),
            priority=priority,
            max_attempts=max_attempts,
            batch=batch,
            unique=unique,  # type: ignore[arg-type]  # checked just above
            atomic=bool_option(options, "atomic", True),
            batch_size=int_option(options, "batchSize", DEFAULT_BATCH_SIZE) or DEFAULT_BATCH_SIZE,
            abandoned_after=dt.timedelta(
                hours=int_option(options, "abandonedAfterHours", DEFAULT_ABANDONED_AFTER_HOURS)
                or DEFAULT_ABANDONED_AFTER_HOURS
            ),
        )


def _check_types(columns: dict[str, str], fields: dict[str, DataType]) -> None:
    for job_field, name in columns.items():
        kind = fields[name]
        if job_field in ("queue", "task", "group", "batch") and not isinstance(kind, StringType):
            raise ConfigurationError(f"column {name} ({job_field}) must be a string column")
        if job_field == "key" and not isinstance(kind, (StringType, *_INTEGRAL)):
            raise ConfigurationError(f"column {name} (key) must be a string or integer column")
        if job_field == "priority" and not isinstance(kind, _INTEGRAL):
            raise ConfigurationError(f"column {name} (priority) must be an integer column")
        if job_field == "run_at" and not isinstance(kind, TimestampType | TimestampNTZType):
            raise ConfigurationError(f"column {name} (run_at) must be a timestamp column")
        if job_field == "args" and not isinstance(kind, ArrayType | StringType):
            raise ConfigurationError(
                f"column {name} (args) must be an array, or a string holding a JSON array"
            )
        if job_field == "kwargs" and not isinstance(kind, StructType | MapType | StringType):
            raise ConfigurationError(
                f"column {name} (kwargs) must be a struct or map, or a string holding a JSON object"
            )


def _has_map(kind: DataType) -> bool:
    if isinstance(kind, MapType):
        return True
    if isinstance(kind, ArrayType):
        return _has_map(kind.elementType)
    if isinstance(kind, StructType):
        return any(_has_map(f.dataType) for f in kind.fields)
    return False


@dataclass(slots=True)
class JobColumns:
    """One batch of new jobs, a list per field (the shape both inserts want)."""

    queue: list[str]
    task: list[str]
    args: list[str]
    kwargs: list[str]
    priority: list[int]
    run_at: list[float | None]  # epoch seconds; None: when the write commits
    max_attempts: list[int]
    key: list[str | None]
    group: list[str | None]
    batch: list[str | None]

    def __len__(self) -> int:
        return len(self.task)

    def rows(self) -> list[tuple[Any, ...]]:
        return list(
            zip(
                self.queue, self.task, self.args, self.kwargs, self.priority, self.run_at,
                self.max_attempts, self.key, self.group, self.batch, strict=True,
            )
        )  # fmt: skip


class RowError(InvalidJobError):
    """A row cannot become a job; the message names the column and the row."""


@dataclass(slots=True)
class Where:
    """Where the rows of a batch come from, for error messages."""

    partition: int
    first_row: int

    def row(self, index: int) -> str:
        return f"row {self.first_row + index} of partition {self.partition} (counting from 0)"


def prepare(batch: pa.RecordBatch, plan: WritePlan, where: Where) -> JobColumns:
    n = batch.num_rows
    cols = plan.columns

    def names(job_field: str, default: str | None) -> list[str | None]:
        if job_field not in cols:
            return [default] * n
        return _checked_names(batch.column(cols[job_field]), job_field, cols[job_field], where)

    queue = [q or plan.queue for q in names("queue", plan.queue)]
    task = names("task", plan.task)
    if None in task:
        index = task.index(None)
        raise RowError(f"column {cols['task']!r}, {where.row(index)}: the task name is null")
    args, kwargs = _payloads(batch, plan, where)
    return JobColumns(
        queue=queue,
        task=task,  # type: ignore[arg-type]  # no None left: checked above
        args=args,
        kwargs=kwargs,
        priority=_priorities(batch, plan, where),
        run_at=_run_ats(batch, plan),
        max_attempts=[plan.max_attempts] * n,
        key=names("key", None),
        group=names("group", None),
        batch=names("batch", plan.batch),
    )


def _checked_names(values: pa.Array, job_field: str, column: str, where: Where) -> list[str | None]:
    if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
        values = pc.cast(values, pa.string())
    length = pc.utf8_length(values)
    bad = pc.or_(
        pc.or_(pc.greater(length, MAX_NAME_LENGTH), pc.equal(length, 0)),
        pc.or_(
            pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(values)), 0),
            pc.match_substring(values, "\x00"),
        ),
    )
    if pc.any(bad).as_py():
        index = pc.index(bad, True).as_py()
        try:
            validate_name(job_field, values[index].as_py())
        except InvalidJobError as exc:
            raise RowError(f"column {column!r}, {where.row(index)}: {exc}") from None
    result: list[str | None] = values.to_pylist()
    return result


def _priorities(batch: pa.RecordBatch, plan: WritePlan, where: Where) -> list[int]:
    if "priority" not in plan.columns:
        return [plan.priority] * batch.num_rows
    name = plan.columns["priority"]
    values = batch.column(name).to_pylist()
    out = [plan.priority if v is None else v for v in values]
    for index, value in enumerate(out):
        if not -(2**31) < value < 2**31:
            raise RowError(f"column {name!r}, {where.row(index)}: priority {value} is not 32-bit")
    return out


def _run_ats(batch: pa.RecordBatch, plan: WritePlan) -> list[float | None]:
    if "run_at" not in plan.columns:
        return [None] * batch.num_rows
    values = batch.column(plan.columns["run_at"])
    # Epoch seconds from the Arrow timestamps, without a datetime per row.
    micros = pc.cast(values.cast(pa.timestamp("us")), pa.int64())
    seconds = pc.divide(pc.cast(micros, pa.float64()), 1e6)
    result: list[float | None] = seconds.to_pylist()
    return result


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes | bytearray):
        raise TypeError("binary values cannot be JSON")
    raise TypeError(f"{type(value).__name__} values cannot be JSON")


_encode: Callable[[Any], str] = json.JSONEncoder(
    separators=(",", ":"), allow_nan=False, default=_json_default
).encode


def _plain(value: Any) -> Any:
    """Arrow gives maps as lists of (key, value) pairs; JSON wants objects."""
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {str(k): _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _column_values(batch: pa.RecordBatch, name: str, plan: WritePlan) -> list[Any]:
    values: list[Any] = batch.column(name).to_pylist()
    if name in plan.map_columns:
        values = [_plain(v) for v in values]
    return values


def _payloads(batch: pa.RecordBatch, plan: WritePlan, where: Where) -> tuple[list[str], list[str]]:
    n = batch.num_rows
    if plan.kwarg_columns:
        names = plan.kwarg_columns
        lists = [_column_values(batch, name, plan) for name in names]
        kwargs = _encode_rows(
            lambda row: dict(zip(names, row, strict=True)), lists, names, where, "kwargs"
        )
    elif "kwargs" in plan.columns:
        kwargs = _single_payload(batch, plan, "kwargs", dict, where)
    else:
        kwargs = ["{}"] * n
    args = _single_payload(batch, plan, "args", list, where) if "args" in plan.columns else None
    if args is None:
        args = ["[]"] * n
    # Characters are at most 4 bytes: only a payload that might pass the limit is encoded.
    for index, (a, k) in enumerate(zip(args, kwargs, strict=True)):
        if (len(a) + len(k)) * 4 > MAX_PAYLOAD_BYTES:
            size = len(a.encode()) + len(k.encode())
            if size > MAX_PAYLOAD_BYTES:
                raise RowError(
                    f"{where.row(index)}: the payload is {size} bytes; the limit is "
                    f"{MAX_PAYLOAD_BYTES}. Store large data elsewhere and enqueue a reference."
                )
    return args, kwargs


def _single_payload(
    batch: pa.RecordBatch, plan: WritePlan, job_field: str, kind: type, where: Where
) -> list[str]:
    name = plan.columns[job_field]
    values = _column_values(batch, name, plan)
    empty = "[]" if kind is list else "{}"
    if name in plan.payload_is_text:
        out = []
        for index, text in enumerate(values):
            if text is None:
                out.append(empty)
                continue
            try:
                ok = isinstance(json.loads(text), kind)
            except ValueError:
                ok = False
            if not ok:
                raise RowError(
                    f"column {name!r}, {where.row(index)}: not a JSON "
                    f"{'array' if kind is list else 'object'}: {text[:80]!r}"
                )
            out.append(text)
        return out
    return _encode_rows(
        lambda row: empty if row[0] is None else row[0], [values], (name,), where, job_field
    )


def _encode_rows(
    build: Callable[[tuple[Any, ...]], Any],
    lists: list[list[Any]],
    names: tuple[str, ...],
    where: Where,
    what: str,
) -> list[str]:
    rows = zip(*lists, strict=True)
    try:
        return [_encode(build(row)) for row in rows]
    except (TypeError, ValueError):
        pass
    # Find the first bad value again, slowly, to say which column and row it is.
    for index, row in enumerate(zip(*lists, strict=True)):
        for name, value in zip(names, row, strict=True):
            try:
                _encode(value)
            except (TypeError, ValueError) as exc:
                raise RowError(
                    f"column {name!r}, {where.row(index)}: {what} must be JSON: {exc} "
                    f"(value {value!r:.80})"
                ) from None
    raise RowError(f"{what} of partition {where.partition} cannot be encoded as JSON")
