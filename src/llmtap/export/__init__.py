"""Exports of the store to the engines a fleet already runs.

`otlp` sends one OpenTelemetry span per call to a collector, `live` does the same from a running
`llmtap serve` through a bounded background queue, `prometheus` holds serve's metrics, `parquet`
writes the calls and rollouts tables incrementally, and `query` runs DuckDB over them. Each module
loads its heavy library (the OpenTelemetry SDK, pyarrow, duckdb) only when it is used.
"""
