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

    from pyspark.sql import SparkSession

    from conveyor.spark import register

    jvm_options = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("conveyor-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", jvm_options)
        .config("spark.executor.extraJavaOptions", jvm_options)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
