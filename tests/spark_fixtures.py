"""A local SparkSession shared by the whole test session, and a Spark Connect client of it.

Starting Spark costs seconds (and its first Python data source query several
more), so every Spark test shares one JVM. ``local[2,2]`` gives two cores and
lets a failed task be retried once, as on a cluster: the retry tests need that.
The same JVM runs a Spark Connect server (Spark's Connect plugin, on a free
loopback port, with a token), so the Connect tests cost no second JVM: the
``connect`` fixture is a Connect session of that server, as
``SparkSession.builder.remote(...)`` gives a user. The ``conveyor`` data source
is registered on both.

PySpark picks Connect or classic column functions by the environment variable
``SPARK_CONNECT_MODE_ENABLED``; the ``connect`` fixture sets it for the test's
duration only, so classic and Connect tests can follow each other.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def spark_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SparkSession, str]]:
    """The classic session and the URL of the Connect server running in its JVM."""
    # Spark's Python workers run `python3` from PATH unless told otherwise; they
    # must be this interpreter, the one that has conveyor and pyarrow installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Without it Spark warns that the hostname resolves to a loopback address.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from conveyor.spark import session

    port = _free_port()
    token = secrets.token_hex(16)
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
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.authenticate.token": token,
            # Spark SQL tables of the tests live here, not in the working directory.
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark, f"sc://localhost:{port}/;token={token}"
    finally:
        spark.stop()


@pytest.fixture(scope="session")
def spark(spark_server: tuple[SparkSession, str]) -> SparkSession:
    return spark_server[0]


@pytest.fixture(scope="session")
def _connect_session(spark_server: tuple[SparkSession, str]) -> Iterator[Any]:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from conveyor.spark import register

    # As SparkSession.builder.remote(url).getOrCreate() makes it: the default and
    # active Connect session (some of PySpark's Connect code looks it up).
    remote = ConnectSession.builder.remote(spark_server[1]).create()
    os.environ[_CONNECT_MODE] = "1"
    try:
        register(remote)
    finally:
        del os.environ[_CONNECT_MODE]
    yield remote
    os.environ[_CONNECT_MODE] = "1"
    try:
        remote.stop()
    finally:
        del os.environ[_CONNECT_MODE]


@pytest.fixture
def connect(_connect_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Spark Connect session (for this test, PySpark's functions build Connect columns)."""
    monkeypatch.setenv(_CONNECT_MODE, "1")
    return _connect_session


@pytest.fixture(params=["classic", "connect"])
def any_spark(request: pytest.FixtureRequest) -> Any:
    """The classic session, then a Spark Connect session: one test, both APIs."""
    if request.param == "classic":
        return request.getfixturevalue("spark")
    return request.getfixturevalue("connect")
