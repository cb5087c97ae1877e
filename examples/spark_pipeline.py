"""A Spark pipeline: one job per row of a DataFrame, run by a worker, read back as a DataFrame.

    pip install '.[spark]'                   # PySpark, pyarrow; needs Java 17
    python examples/spark_pipeline.py

1. A DataFrame of 200 images becomes 200 ``resize`` jobs in one atomic write
   (all or nothing), keyed by image id, in one batch.
2. The same write again, with the same ``writeId``, enqueues nothing.
3. A worker runs the jobs (``burst``: until none is left).
4. The jobs and their results come back as DataFrames, read in the database.

The store must be SQLite or PostgreSQL: CONVEYOR_DSN, else ./conveyor.db. The
session is a quick local one (two cores, no web UI); on a cluster, build the
session it needs and call ``conveyor.spark.register(spark)``.
"""

from __future__ import annotations

import os
from pathlib import Path

from conveyor import App
from conveyor.spark import batch_results, enqueue, read_table, session

# An absolute path, so that Spark's Python workers open the same file.
DSN = os.environ.get("CONVEYOR_DSN") or f"sqlite:///{Path('conveyor.db').resolve()}"
app = App(DSN)


@app.task(queue="images")
def resize(image_id: int, size: int) -> str:
    return f"images/{image_id}-{size}px.png"


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no loopback warning
    jvm = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"  # a faster start for a small job
    spark = session(
        "local[2]",
        "conveyor-example",
        conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.extraJavaOptions": jvm,
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        images = spark.range(1, 201).selectExpr("id AS image_id", "256 AS size")
        options = {"task": "resize", "queue": "images", "keyColumn": "image_id"}
        written = enqueue(images, DSN, batch="thumbnails", writeId="thumbnails-1", **options)
        print(
            f"write: {written.rows} rows, {written.enqueued} jobs enqueued, "
            f"{written.skipped} skipped"
        )
        rerun = enqueue(images, DSN, batch="thumbnails", writeId="thumbnails-1", **options)
        print(
            f"the same write again: new={rerun.new}, nothing more enqueued "
            f"({app.count_jobs(batch='thumbnails')})"
        )

        app.run_worker(queues=["images"], concurrency=8, burst=True)

        jobs = read_table(spark, DSN, "jobs", batch="thumbnails", columns=["id", "state"])
        for row in jobs.groupBy("state").count().collect():
            print(f"jobs {row['state']}: {row['count']}")
        results = batch_results(spark, DSN, batch="thumbnails").orderBy("id")
        for row in results.select("id", "result_value").limit(3).collect():
            print(f"job {row['id']}: {row['result_value']}")
        print("batch counts:", app.batch_status("thumbnails").counts)
    finally:
        spark.stop()
        app.close()


if __name__ == "__main__":
    main()
