"""Exports of the store to the engines a fleet already runs.

`otlp` sends one OpenTelemetry span per call (built in `spans`, attribute names pinned in
`attributes`) to a collector; `live` does the same from a running `llmtap serve` through a
bounded background queue; `prometheus` holds serve's metrics; `parquet` writes the `calls` and
`rollouts` tables (rows in `tables`, files and state in `parquet_files`) incrementally; `query`
runs DuckDB over them, and `examples` holds the questions the README shows. `sources` opens a
capture directory or capsule for all of them. Nothing is imported here: each module loads its
heavy library (the OpenTelemetry SDK, pyarrow, duckdb) only when it is used.
"""
