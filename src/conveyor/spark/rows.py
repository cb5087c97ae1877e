"""From a DataFrame's rows (Arrow record batches) to the columns of new jobs.

The plan is made once, on the driver, before anything is written: which column
fills which job field, which columns become the handler's keyword arguments,
the defaults each task declared. Everything that can be refused there is
refused there. Rows are then turned into jobs a batch at a time in the tasks:
names are checked a column at a time with Arrow compute (a million keys would
cost a second through ``validate_name`` one by one); payloads are encoded to
JSON row by row, the one step that has to touch every value in Python.

How values become JSON: strings, numbers, booleans and nulls as they are;
timestamps and dates as ISO 8601 text; decimals as a string of their exact
digits (``"12.50"``: a JSON number would reach the handler as a float and lose
them; ``Decimal(value)`` gives them back); arrays as arrays; structs and maps
as objects (an empty map is ``{}``; map keys become strings). Binary, NaN and
infinity cannot be JSON and fail the write naming the column and the row.
"""

from __future__ import annotations

import datetime as dt
import hashlib
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
    MAX_PRIORITY,
    MIN_PRIORITY,
    Unique,
    validate_name,
)
from conveyor.spark.declarations import TaskDeclaration, is_keyword_name
from conveyor.spark.options import Options

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BATCH_SIZE = 10_000
DEFAULT_ABANDONED_AFTER_HOURS = 24
#: At most this many connections move an atomic write's rows at once (PostgreSQL).
DEFAULT_COMMIT_PIECES = 8
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
#: Fields whose columns are data a handler may want too: they are also passed as
#: keyword arguments, when the handler takes a parameter of the column's name
#: (or always, when the handler is not known), unless excludeColumns names them.
_DATA_FIELDS = ("key", "group", "batch", "priority", "run_at")
#: Options that change how a write runs, not what it enqueues (left out of ``described``).
_NOT_DESCRIBED = frozenset(
    {
        "dsn", "writeId", "batchSize", "abandonedAfterHours", "atomic", "commitPieces",
        "createTables",
    }
)  # fmt: skip
#: The kwarg_columns entry of tasks the write has no declaration for.
ANY_TASK = ""


@dataclass(frozen=True, slots=True)
class WritePlan:
    """How the rows of a DataFrame become jobs: checked on the driver, pickled to the tasks."""

    task: str | None
    columns: dict[str, str]  # job field -> DataFrame column
    #: Columns that become keyword arguments, by task name (ANY_TASK: a task not declared).
    kwarg_columns: dict[str, tuple[str, ...]]
    #: The Spark type of each column that goes into a payload (to convert maps and the like).
    types: dict[str, DataType] = field(default_factory=dict)
    payload_is_text: frozenset[str] = field(default_factory=frozenset)
    #: The queue, priority and attempts options (None: the task's declaration, else the default).
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    batch: str | None = None
    unique: Unique = "live"
    #: Rows whose key column is null: "refuse" them (the write fails, nothing of it is
    #: enqueued when atomic) or enqueue them "keyless" (option nullKeys).
    null_keys: str = "refuse"
    #: Make conveyor's tables on a database that has none (option createTables);
    #: by default such a write is refused: no worker would read its jobs.
    create_tables: bool = False
    atomic: bool = True
    batch_size: int = DEFAULT_BATCH_SIZE
    #: How many connections at most commit an atomic write in parallel pieces (1: one
    #: transaction). PostgreSQL with max_prepared_transactions only; see storage/pieces.py.
    commit_pieces: int = DEFAULT_COMMIT_PIECES
    #: An atomic write open this long is taken for abandoned (its driver died) and
    #: cleared away by the next write to the store.
    abandoned_after: dt.timedelta = dt.timedelta(hours=DEFAULT_ABANDONED_AFTER_HOURS)
    #: The caller's id for the write (option writeId), else None.
    write_id: str | None = None
    #: The tasks of the app named by option app (empty without it).
    tasks: dict[str, TaskDeclaration] = field(default_factory=dict)
    #: Check each row's call against its task's signature (shapes vary by row).
    check_calls: bool = False
    #: A SQL table's column names as its option schema gave them, by position: the
    #: batches arrive with Spark's (disguised) names and are renamed to these.
    renamed: tuple[str, ...] | None = None
    #: The options that decide what the write enqueues, as JSON: kept with its result,
    #: so that a rerun under the same writeId with other options is refused.
    described: str = "{}"

    @classmethod
    def from_options(
        cls,
        schema: StructType,
        options: Options,
        tasks: Mapping[str, TaskDeclaration] | None = None,
        *,
        stream: bool = False,
    ) -> WritePlan:
        tasks = dict(tasks or {})
        if not schema.fields:
            raise ConfigurationError(
                "the DataFrame has no columns, so its rows carry nothing to enqueue (and Spark "
                "hands a writer no rows without columns): give it at least one column, e.g. "
                ".withColumn('n', F.lit(1)) with excludeColumns 'n' for jobs without arguments"
            )
        fields = {f.name: f.dataType for f in schema.fields}
        lowered = {name.lower(): name for name in fields}

        def column_named(option_name: str, name: str) -> str:
            # Spark resolves column names case-insensitively by default; so do we.
            found = name if name in fields else lowered.get(name.lower())
            if found is None:
                raise ConfigurationError(
                    f"option {option_name} names column {name!r}, which the DataFrame does not "
                    f"have (it has {', '.join(fields) or 'no columns'})"
                )
            return found

        columns = {
            job_field: column_named(opt, name)
            for job_field, opt in _COLUMN_OPTIONS.items()
            if (name := options.text(opt)) is not None
        }
        excluded = [column_named("excludeColumns", n) for n in options.names("excludeColumns")]
        task = options.text("task")
        if task is None and "task" not in columns:
            raise ConfigurationError(
                'writing jobs needs .option("task", "name") or .option("taskColumn", "column")'
            )
        if task is not None and "task" in columns:
            raise ConfigurationError("give option task or option taskColumn, not both")
        if task is not None:
            validate_name("task", task)
            if tasks and task not in tasks:
                raise ConfigurationError(
                    f"task {task!r} is not registered in app {options.text('app')}; its tasks: "
                    f"{', '.join(sorted(tasks)) or 'none'}"
                )
        queue = options.text("queue")
        if queue is not None:
            validate_name("queue", queue)
        batch = options.text("batch")
        if batch is not None:
            validate_name("batch", batch)
        write_id = options.text("writeId")
        if write_id is not None:
            validate_name("writeId", write_id)
        # maxAttempts >= 1 and a 32-bit priority, as app.enqueue checks them.
        priority = options.integer("priority", None, minimum=MIN_PRIORITY, maximum=MAX_PRIORITY)
        max_attempts = options.integer("maxAttempts", None)
        _check_types(columns, fields)

        kwarg_columns, check_calls = _keyword_columns(
            fields, columns, excluded, task, tasks, options.text("app")
        )
        payload = {c for names in kwarg_columns.values() for c in names}
        payload |= {columns[f] for f in ("args", "kwargs") if f in columns}
        return cls(
            task=task,
            columns=columns,
            kwarg_columns=kwarg_columns,
            types={name: fields[name] for name in payload},
            payload_is_text=frozenset(
                columns[f]
                for f in ("args", "kwargs")
                if f in columns and isinstance(fields[columns[f]], StringType)
            ),
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            batch=batch,
            unique=options.choice("unique", ("live", "forever"), "live"),  # type: ignore[arg-type]
            null_keys=options.choice("nullKeys", ("refuse", "keyless"), "refuse"),
            create_tables=options.boolean("createTables", False),
            atomic=True if stream else options.boolean("atomic", True),
            batch_size=options.integer("batchSize", DEFAULT_BATCH_SIZE) or DEFAULT_BATCH_SIZE,
            commit_pieces=options.integer("commitPieces", DEFAULT_COMMIT_PIECES, maximum=64)
            or DEFAULT_COMMIT_PIECES,
            abandoned_after=dt.timedelta(
                hours=options.integer("abandonedAfterHours", DEFAULT_ABANDONED_AFTER_HOURS)
                or DEFAULT_ABANDONED_AFTER_HOURS
            ),
            write_id=write_id,
            tasks=tasks,
            check_calls=check_calls,
            described=json.dumps(
                {k: v for k, v in options.values.items() if k not in _NOT_DESCRIBED},
                sort_keys=True,
            ),
        )


def _keyword_columns(
    fields: dict[str, DataType],
    columns: dict[str, str],
    excluded: list[str],
    task: str | None,
    tasks: dict[str, TaskDeclaration],
    app: str | None,
) -> tuple[dict[str, tuple[str, ...]], bool]:
    """Which columns become keyword arguments, per task; and whether rows need checking."""
    named = set(columns.values())
    unnamed = [n for n in fields if n not in named and n not in excluded]
    if "kwargs" in columns:
        if unnamed:
            raise ConfigurationError(
                f"column(s) {', '.join(unnamed)} would be dropped: with kwargsColumn the keyword "
                "arguments are that column's alone. Select only the columns the write needs, or "
                "name the others in option excludeColumns"
            )
        return {ANY_TASK: ()}, bool(tasks)
    data = list(
        dict.fromkeys(
            columns[f] for f in _DATA_FIELDS if f in columns and columns[f] not in excluded
        )
    )
    shapes_vary = "args" in columns or task is None

    def refuse_names(names: list[str], why: str) -> None:
        bad = [n for n in names if not is_keyword_name(n)]
        if bad:
            raise ConfigurationError(
                f"column(s) {', '.join(repr(n) for n in bad)} cannot be keyword arguments "
                f"({why}): give them names that are Python identifiers (.alias('n')), or name "
                "them in option excludeColumns"
            )

    if not tasks:
        # The handler is not known: every column goes to it, data columns included.
        names = unnamed + [c for c in data if c not in unnamed]
        refuse_names(names, "they are not Python identifiers")
        return {ANY_TASK: tuple(names)}, False
    by_task: dict[str, tuple[str, ...]] = {}
    for name, declaration in tasks.items():
        if task is not None and name != task:
            continue
        if task is not None:
            refused = [c for c in unnamed if not declaration.takes(c)]
            if refused:
                raise ConfigurationError(
                    f"column(s) {', '.join(refused)} are not parameters of task "
                    f"{declaration.describe()} (app {app}): leave them out of the DataFrame, or "
                    "name them in option excludeColumns"
                )
        passed = unnamed + [c for c in data if c not in unnamed and declaration.takes(c)]
        refuse_names(passed, f"task {name} would be called with them")
        by_task[name] = tuple(passed)
        if task is not None and not shapes_vary:
            refusal = declaration.refusal(0, passed)
            if refusal is not None:
                raise ConfigurationError(
                    f"the DataFrame's columns do not fit task {declaration.describe()} "
                    f"(app {app}): {refusal}"
                )
    return by_task, shapes_vary


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
        if job_field == "kwargs":
            if not isinstance(kind, StructType | MapType | StringType):
                raise ConfigurationError(
                    f"column {name} (kwargs) must be a struct or map, or a string holding a "
                    "JSON object"
                )
            if isinstance(kind, StructType):
                bad = [f.name for f in kind.fields if not is_keyword_name(f.name)]
                if bad:
                    raise ConfigurationError(
                        f"fields {', '.join(repr(b) for b in bad)} of column {name} (kwargs) "
                        "cannot be keyword arguments: they are not Python identifiers"
                    )


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

    def null_keys(self, plan: WritePlan) -> int:
        """Rows whose key column is null (none when the write has no key column)."""
        return self.key.count(None) if "key" in plan.columns else 0

    def fingerprints(self) -> list[int]:
        """A 64-bit hash of each row, the same in every process (Python's hash() is not)."""
        out = []
        for row in self.rows():
            digest = hashlib.blake2b(repr(row).encode(), digest_size=8).digest()
            out.append(int.from_bytes(digest, "big", signed=True))
        return out


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

    task = names("task", plan.task)
    if None in task:
        index = task.index(None)
        raise RowError(f"column {cols['task']!r}, {where.row(index)}: the task name is null")
    declarations = _declarations(task, plan, where)  # type: ignore[arg-type]  # no None left
    queue = [
        q or plan.queue or (d.queue if d else DEFAULT_QUEUE)
        for q, d in zip(names("queue", None), declarations, strict=True)
    ]
    max_attempts = [
        plan.max_attempts or (d.max_attempts if d else DEFAULT_MAX_ATTEMPTS) for d in declarations
    ]
    args, kwargs = _payloads(batch, plan, where, task, declarations)  # type: ignore[arg-type]
    return JobColumns(
        queue=queue,
        task=task,  # type: ignore[arg-type]  # no None left: checked above
        args=args,
        kwargs=kwargs,
        priority=_priorities(batch, plan, where, declarations),
        run_at=_run_ats(batch, plan),
        max_attempts=max_attempts,
        key=names("key", None),
        group=names("group", None),
        batch=names("batch", plan.batch),
    )


def _declarations(task: list[str], plan: WritePlan, where: Where) -> list[TaskDeclaration | None]:
    if not plan.tasks:
        return [None] * len(task)
    out: list[TaskDeclaration | None] = []
    for index, name in enumerate(task):
        declaration = plan.tasks.get(name)
        if declaration is None:
            raise RowError(
                f"column {plan.columns['task']!r}, {where.row(index)}: task {name!r} is not "
                f"registered in the app; its tasks: {', '.join(sorted(plan.tasks))}"
            )
        out.append(declaration)
    return out


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


def _priorities(
    batch: pa.RecordBatch,
    plan: WritePlan,
    where: Where,
    declarations: list[TaskDeclaration | None],
) -> list[int]:
    defaults = [
        plan.priority if plan.priority is not None else (d.priority if d else 0)
        for d in declarations
    ]
    if "priority" not in plan.columns:
        return defaults
    name = plan.columns["priority"]
    values = batch.column(name).to_pylist()
    out = [default if v is None else v for v, default in zip(values, defaults, strict=True)]
    for index, value in enumerate(out):
        if not MIN_PRIORITY <= value <= MAX_PRIORITY:
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


# --- JSON -----------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        # The exact digits as text, never in exponent form ("0E-10" is "0.0000000000").
        return format(value, "f")
    if isinstance(value, bytes | bytearray):
        raise TypeError("binary values cannot be JSON")
    raise TypeError(f"{type(value).__name__} values cannot be JSON")


_encode: Callable[[Any], str] = json.JSONEncoder(
    separators=(",", ":"), allow_nan=False, default=_json_default
).encode


def _map_key(key: Any) -> str:
    if isinstance(key, dt.datetime | dt.date):
        return key.isoformat()
    if isinstance(key, Decimal):
        return format(key, "f")
    return str(key)


def converter(kind: DataType) -> Callable[[Any], Any] | None:
    """What turns Arrow's Python value of ``kind`` into its JSON shape; None when it already is.

    Arrow gives maps as lists of (key, value) pairs: only the type tells an
    empty map from an empty list, so the conversion follows the Spark type.
    """
    if isinstance(kind, MapType):
        inner = converter(kind.valueType)
        if inner is None:
            return lambda v: None if v is None else {_map_key(k): x for k, x in v}
        return lambda v: None if v is None else {_map_key(k): inner(x) for k, x in v}
    if isinstance(kind, ArrayType):
        element = converter(kind.elementType)
        if element is None:
            return None
        return lambda v: None if v is None else [element(x) for x in v]
    if isinstance(kind, StructType):
        inside = {f.name: c for f in kind.fields if (c := converter(f.dataType)) is not None}
        if not inside:
            return None
        return lambda v: (
            None if v is None else {k: (inside[k](x) if k in inside else x) for k, x in v.items()}
        )
    return None


def _column_values(batch: pa.RecordBatch, name: str, plan: WritePlan) -> list[Any]:
    values: list[Any] = batch.column(name).to_pylist()
    convert = converter(plan.types[name]) if name in plan.types else None
    return values if convert is None else [convert(v) for v in values]


def _payloads(
    batch: pa.RecordBatch,
    plan: WritePlan,
    where: Where,
    task: list[str],
    declarations: list[TaskDeclaration | None],
) -> tuple[list[str], list[str]]:
    n = batch.num_rows
    if "args" in plan.columns:
        args, arg_counts = _single_payload(batch, plan, "args", list, where)
    else:
        args, arg_counts = ["[]"] * n, [0] * n
    kwarg_names: list[tuple[str, ...]]
    if "kwargs" in plan.columns:
        kwargs, key_lists = _single_payload(batch, plan, "kwargs", dict, where)
        kwarg_names = key_lists
        _check_keyword_keys(kwarg_names, declarations, plan.columns["kwargs"], where)
    elif plan.task is not None or not plan.tasks:
        names = plan.kwarg_columns[plan.task if plan.tasks else ANY_TASK]  # type: ignore[index]
        lists = [_column_values(batch, name, plan) for name in names]
        kwargs = _encode_rows(
            lambda row: dict(zip(names, row, strict=True)), lists, names, where, "kwargs"
        )
        kwarg_names = [names] * n
    else:
        # Tasks named row by row, each with the columns its own handler takes.
        every = tuple(dict.fromkeys(c for cs in plan.kwarg_columns.values() for c in cs))
        lists = [_column_values(batch, name, plan) for name in every]
        kwarg_names = [plan.kwarg_columns[t] for t in task]
        position = {name: i for i, name in enumerate(every)}
        rows = [tuple(values[i] for values in lists) for i in range(n)]
        kwargs = _encode_rows(
            lambda row: {name: row[0][position[name]] for name in row[1]},
            [rows, kwarg_names],
            every,
            where,
            "kwargs",
        )
    if plan.check_calls:
        _check_calls(declarations, arg_counts, kwarg_names, where)
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


def _check_keyword_keys(
    names: list[tuple[str, ...]],
    declarations: list[TaskDeclaration | None],
    column: str,
    where: Where,
) -> None:
    for index, (keys, declaration) in enumerate(zip(names, declarations, strict=True)):
        if declaration is not None and declaration.takes_any_keyword():
            continue  # the handler takes **kwargs: any text is a fine name
        bad = [k for k in keys if not is_keyword_name(k)]
        if bad:
            raise RowError(
                f"column {column!r}, {where.row(index)}: key {bad[0]!r} cannot be a keyword "
                "argument (it is not a Python identifier)"
            )


def _check_calls(
    declarations: list[TaskDeclaration | None],
    arg_counts: list[int],
    kwarg_names: list[tuple[str, ...]],
    where: Where,
) -> None:
    for index, declaration in enumerate(declarations):
        if declaration is None:
            continue
        refusal = declaration.refusal(arg_counts[index], kwarg_names[index])
        if refusal is not None:
            raise RowError(
                f"{where.row(index)}: the arguments do not fit task "
                f"{declaration.describe()}: {refusal}"
            )


def _single_payload(
    batch: pa.RecordBatch, plan: WritePlan, job_field: str, kind: type, where: Where
) -> tuple[list[str], list[Any]]:
    """One column's payloads as JSON text, and each row's argument count or keyword names."""
    name = plan.columns[job_field]
    values = _column_values(batch, name, plan)
    empty = "[]" if kind is list else "{}"

    def shape(value: Any) -> Any:
        if kind is list:
            return 0 if value is None else len(value)
        return () if value is None else tuple(value)

    if name in plan.payload_is_text:
        out = []
        shapes = []
        for index, text in enumerate(values):
            if text is None:
                out.append(empty)
                shapes.append(shape(None))
                continue
            try:
                parsed = json.loads(text)
                ok = isinstance(parsed, kind)
            except ValueError:
                ok = False
            if not ok:
                raise RowError(
                    f"column {name!r}, {where.row(index)}: not a JSON "
                    f"{'array' if kind is list else 'object'}: {text[:80]!r}"
                )
            out.append(text)
            shapes.append(shape(parsed))
        return out, shapes
    encoded = _encode_rows(
        lambda row: empty if row[0] is None else row[0], [values], (name,), where, job_field
    )
    return encoded, [shape(v) for v in values]


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
        built = build(row)
        values = built.items() if isinstance(built, dict) else [(names[0], built)]
        for name, value in values:
            try:
                _encode(value)
            except (TypeError, ValueError) as exc:
                raise RowError(
                    f"column {name!r}, {where.row(index)}: {what} must be JSON: {exc} "
                    f"(value {value!r:.80})"
                ) from None
    raise RowError(f"{what} of partition {where.partition} cannot be encoded as JSON")
