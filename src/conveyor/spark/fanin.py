"""Fan-in: a batch's jobs with their results parsed, as one DataFrame.

``batch_results(spark, dsn, "b1")`` gives one row per job of the batch, in id
order: ``id, queue, task, batch, state, attempts, key, args, kwargs, result,
result_value, error, created_at, started_at, finished_at``.

``result`` stays the JSON text the handler's return value was stored as, so
nothing is lost whatever shape it has; ``result_value`` is that JSON parsed
into Spark types. Give ``schema`` (a DDL string such as ``"struct<width: int,
url: string>"``, or a DataType) when you know what the task returns; without
it the schema is inferred from the batch's own results, like
``spark.read.json`` does: objects become structs, numbers longs or doubles,
and results of different shapes widen to a common type (a string at worst). A
result that does not fit the schema parses to null while ``result`` keeps it.
Jobs without a result (not finished, failed, cancelled, or returning None)
have null in both.

For how many are done, failed and outstanding without Spark, use
``app.batch_status(batch)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.job import validate_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

COLUMNS = (
    "id",
    "queue",
    "task",
    "batch",
    "state",
    "attempts",
    "key",
    "args",
    "kwargs",
    "result",
    "error",
    "created_at",
    "started_at",
    "finished_at",
)
#: Results are wrapped as {"value": ...} to infer and parse them: a top-level
#: number or string is not a JSON record to Spark, an object's field is.
_WRAP_FIELD = "value"


def batch_results(
    spark: SparkSession,
    dsn: str,
    batch: str,
    *,
    schema: str | DataType | None = None,
) -> DataFrame:
    """The batch's jobs with ``result`` (JSON text) and ``result_value`` (parsed)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    from conveyor.spark import read_table

    validate_name("batch", batch)
    jobs = read_table(spark, dsn, "jobs", columns=list(COLUMNS), batch=batch)
    wrapped = F.concat(F.lit(f'{{"{_WRAP_FIELD}":'), F.col("result"), F.lit("}"))
    if isinstance(schema, str):
        # A DDL type, wrapped the way the results are.
        parsed = F.from_json(wrapped, f"`{_WRAP_FIELD}` {schema}")[_WRAP_FIELD]
    else:
        value_type = schema
        if value_type is None:
            value_type = _infer(
                spark, jobs.where(F.col("result").isNotNull()).select(wrapped.alias("json"))
            )
        if value_type is None:
            # No job has a result yet: there is nothing to infer a type from.
            parsed = F.lit(None).cast("string")
        else:
            record = StructType([StructField(_WRAP_FIELD, value_type)])
            parsed = F.from_json(wrapped, record)[_WRAP_FIELD]
    return jobs.select(*COLUMNS[:10], parsed.alias("result_value"), *COLUMNS[10:]).orderBy("id")


def _infer(spark: SparkSession, wrapped: DataFrame) -> DataType | None:
    """The type of ``value`` across the wrapped results, as spark.read.json infers it.

    ``spark.read.json`` of a DataFrame of JSON strings: no RDD, so it works
    under Spark Connect too.
    """
    from pyspark.sql.types import StructType

    if wrapped.isEmpty():
        return None
    inferred = spark.read.json(wrapped).schema
    if not isinstance(inferred, StructType) or _WRAP_FIELD not in inferred.fieldNames():
        return None
    return inferred[_WRAP_FIELD].dataType
