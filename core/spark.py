"""Spark sessions for the three preprocessing jobs (Criteo, Outbrain, Amazon Books): one
place that turns a configuration into a session, and the settings every local job shares."""
from __future__ import annotations

import os

# HotSpot leaves methods over 8000 bytes of bytecode uncompiled; Spark's generated code for
# wide rows has such methods (the Criteo job passes this to its JVMs)
HUGE_METHODS = "-XX:-DontCompileHugeMethods"


def local_conf(master, app_name: str, shuffle_partitions: int, **extra) -> dict:
    """A job's configuration: the master URL (default local[*]), no UI or console progress,
    UTC timestamps, and the job's shuffle partitions; extra: more spark.* keys."""
    return {"spark.master": master or "local[*]", "spark.app.name": app_name,
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": str(shuffle_partitions), **extra}


def start_spark(conf: dict):
    """A session with every key of conf, logging at SPARK_LOG_LEVEL (default WARN)."""
    from pyspark.sql import SparkSession  # pyspark starts a JVM: only the Spark jobs load it
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    return spark


def stop_spark(spark) -> None:
    """Stops the session and ends its JVM: pyspark keeps the JVM of a stopped session
    alive, busy on a core, for as long as the Python process lives (a test session or a
    notebook that ran a job in process); the next start_spark starts a new one."""
    from pyspark import SparkContext
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)  # the JVM pyspark launched, if it did
    if process is not None:
        process.kill()
        process.wait()
    SparkContext._gateway = SparkContext._jvm = None
