"""Static registration of ``format("logbuf")`` in every Spark session (spark-sql, Thrift server, notebooks).

Spark looks up installed top-level modules named ``pyspark_*`` whose ``DefaultSource`` is a Python
``DataSource`` and registers each under its ``name()`` (``pyspark.sql.worker.lookup_data_sources``).
This module is only that hook: the source is ``logbuf.archive.spark.LogbufDataSource``.
"""

from logbuf.archive.spark import LogbufDataSource as DefaultSource

__all__ = ["DefaultSource"]
