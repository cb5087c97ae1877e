"""A local SparkSession shared by the whole test session.

Starting Spark costs seconds (and its first Python data source query several
more), so every Spark test shares one session. ``local[2,2]`` gives two cores
and lets a failed task be retried once, as on a cluster: the retry tests need
that. The ``conveyor`` data source is registered on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Spark's Python workers run `python3` from PATH unless told otherwise; they
    # must be this interpreter, the one that has conveyor and pyarrow installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Without it Spark warns that the hostname resolves to a loopback address.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from conveyor.spark import session

    jvm_options = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    spark = session(
        "local[2,2]",
        "conveyor-tests",
        conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.extraJavaOptions": jvm_options,
            "spark.executor.extraJavaOptions": jvm_options,
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
