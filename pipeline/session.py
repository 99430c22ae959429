"""The shared Spark session, and small file helpers that work on any Hadoop-compatible URI.

`python -m pipeline` starts Spark embedded (`local[*]` unless --master says otherwise); under
`spark-submit` the master and resources come from spark-submit and are left alone. Paths may be local
paths or URIs (hdfs://, s3a://, file:/...): Parquet goes through Spark, and the few small side files
(JSON sidecars, the HTML report and its PNGs) through Hadoop's FileSystem API on the driver.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
# Set by spark-submit when it launches this driver (PySpark's own embedded launch sets it later).
_UNDER_SPARK_SUBMIT = "PYSPARK_GATEWAY_PORT" in os.environ


def local_cores(master: str) -> int | None:
    """2 for local[2], this machine's cores for local[*] or local; None for a cluster master."""
    if master == "local":
        return 1
    if master.startswith("local["):
        n = master[len("local["):].split(",")[0].rstrip("]")
        return (os.cpu_count() or 1) if n == "*" else int(n)
    return None


def _loopback(master: str) -> bool:
    host = master.split("://", 1)[-1].split(",")[0].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost", "[::1]")


def spark_session(master: str | None = None, app: str = "rip18-pipeline",
                  conf: dict[str, str] | None = None, executor_python: str | None = None) -> SparkSession:
    """The session for a job. With a cluster master (spark://, yarn, k8s://...) and no spark-submit, the
    executors run `executor_python` (default: PYSPARK_PYTHON, else python3) and the session ships the
    pipeline to them (pipeline/ship.py)."""
    builder = SparkSession.builder.appName(app)
    chosen = master or (None if _UNDER_SPARK_SUBMIT else DEFAULT_MASTER)
    if executor_python:
        # A path is made absolute: executors start in their own working directories.
        python = os.path.abspath(executor_python) if os.sep in executor_python else executor_python
        os.environ["PYSPARK_PYTHON"] = python  # read once, when the SparkContext starts
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.adaptive.enabled": "true",
    }
    if chosen is not None:
        builder = builder.master(chosen)
        cores = local_cores(chosen)
        if cores is not None:
            # Embedded: workers run this interpreter (it has the project installed); few shuffle partitions.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            settings["spark.sql.shuffle.partitions"] = str(max(4, 4 * cores))
        elif _loopback(chosen):  # a cluster on this machine: the executors call the driver back here
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            settings["spark.driver.host"] = settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.ui.showConsoleProgress"] = "false"  # a batch tool: the result is what it prints
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("PIPELINE_SPARK_LOG_LEVEL", "ERROR"))
    if chosen is not None and local_cores(chosen) is None:
        from pipeline.ship import ship

        ship(spark)
    return spark


# ---- small files on any Hadoop-compatible URI (driver side) -------------------------------------


def _fs_path(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    jvm: Any = spark.sparkContext._jvm  # py4j's gateway: untyped
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def list_names(spark: SparkSession, uri: str) -> list[str]:
    """File and directory names directly under `uri` ([] when it does not exist)."""
    fs, path = _fs_path(spark, uri)
    if not fs.exists(path):
        return []
    return sorted(str(s.getPath().getName()) for s in fs.listStatus(path))


def exists(spark: SparkSession, uri: str) -> bool:
    fs, path = _fs_path(spark, uri)
    return bool(fs.exists(path))


def read_bytes(spark: SparkSession, uri: str) -> bytes:
    fs, path = _fs_path(spark, uri)
    stream = fs.open(path)
    try:
        jvm: Any = spark.sparkContext._jvm
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def write_bytes(spark: SparkSession, uri: str, data: bytes) -> None:
    fs, path = _fs_path(spark, uri)
    fs.setWriteChecksum(False)  # no .crc side files next to a local report
    out = fs.create(path, True)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def read_text(spark: SparkSession, uri: str) -> str:
    return read_bytes(spark, uri).decode()


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    write_bytes(spark, uri, text.encode())
