"""The archive: recordings of streams in segment files, replay, and the Spark data source."""
