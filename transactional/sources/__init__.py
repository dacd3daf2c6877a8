"""Ready-made sources: spouts over the stores users already have.

- ``kafka``: a topic's partitions, partitioned or opaque, read by Spark's Kafka connector;
- ``files``: a directory of JSON Lines, CSV or Parquet files, in all three spout kinds;
- ``redis_streams``: N Redis streams, partitioned or opaque;
- ``delta``: a Delta table's versions (appends or the change data feed).

Each decides its ranges on the driver and reads them in Spark tasks; data a stored
batch needs and the source lost stops the run (``SourceDataLostError``), a change of
the records' schema too (``SourceSchemaError``), and an opaque batch names what it
lost in a row for the dead letters.
"""
