"""`llmtap query`: SQL over the store with DuckDB, through the Parquet tables.

`calls` and `rollouts` are views over a Parquet export directory (`llmtap export parquet`). Given
a capture directory or capsule instead, the query first brings a cached export of it up to date
(incremental, so a second query costs only the new calls) in `$LLMTAP_CACHE_DIR/query/<hash>`
(else `$LLMTAP_HOME/cache/...`, else `~/.cache/llmtap/...`). The `rollouts` view shows the newest
version of each rollout's row. DuckDB runs in memory; nothing is written to the export.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from .parquet import export_parquet
from .parquet_files import STATE_NAME
from .sources import ExportError
from .tables import CALLS_SCHEMA, ROLLOUTS_SCHEMA

__all__ = ["QueryResult", "connect", "export_dir_for", "run_query"]


@dataclass(frozen=True)
class QueryResult:
    """A query's column names and rows (Python values: datetimes, lists, numbers, strings)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def export_dir_for(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the Parquet export directory to query for `path`, exporting into the cache first if needed."""
    root = Path(path)
    if (root / STATE_NAME).is_file():
        return root
    target = Path(cache_dir) if cache_dir is not None else _cache_root() / _cache_name(root)
    export_parquet(root, target)
    return target


def connect(export_dir: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the `calls` and `rollouts` views over `export_dir`."""
    connection = duckdb.connect(":memory:")
    connection.execute("SET TimeZone = 'UTC'")  # hours and dates group in UTC, whatever the machine's zone
    calls = _source(connection, export_dir / "calls", CALLS_SCHEMA, "empty_calls")
    rollouts = _source(connection, export_dir / "rollouts", ROLLOUTS_SCHEMA, "empty_rollouts")
    connection.execute(f"CREATE VIEW calls AS SELECT * FROM {calls}")
    connection.execute(
        "CREATE VIEW rollouts AS SELECT * EXCLUDE (_version) FROM ("
        f"SELECT *, row_number() OVER (PARTITION BY rollout_id ORDER BY export_run DESC) AS _version FROM {rollouts}"
        ") WHERE _version = 1"
    )
    return connection


def run_query(
    sql: str, path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None
) -> QueryResult:
    """Run one SQL statement over `path` (a Parquet export, a capture directory or a capsule).

    Raises ExportError with DuckDB's message when the SQL fails.

    Usage::

        result = run_query("SELECT model, count(*) FROM calls GROUP BY model", "/abs/model-calls")
    """
    connection = connect(export_dir_for(path, cache_dir=cache_dir))
    try:
        cursor = connection.execute(sql)
        columns = [column[0] for column in cursor.description or []]
        rows = cursor.fetchall() if cursor.description else []
    except duckdb.Error as exc:
        raise ExportError(f"The query failed: {exc}") from exc
    finally:
        connection.close()
    return QueryResult(columns, rows)


def _source(connection: duckdb.DuckDBPyConnection, table_dir: Path, schema: pa.Schema, empty_name: str) -> str:
    """The FROM clause of one table: its part files, or an empty table of its schema when it has none."""
    if any(table_dir.glob("date=*/part-*.parquet")):
        pattern = _sql_string(str(table_dir / "**" / "part-*.parquet"))
        return (
            f"read_parquet({pattern}, hive_partitioning = true, union_by_name = true, "
            "hive_types = {'date': VARCHAR})"
        )
    empty = schema.empty_table().append_column("date", pa.array([], pa.string()))
    connection.register(empty_name, empty)
    return empty_name


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _cache_root() -> Path:
    configured = os.environ.get("LLMTAP_CACHE_DIR")
    if configured:
        return Path(configured).expanduser() / "query"
    home = os.environ.get("LLMTAP_HOME")
    base = Path(home).expanduser() / "cache" if home else Path("~/.cache/llmtap").expanduser()
    if str(base).startswith("~"):
        raise ExportError("No cache directory for the query's export: set LLMTAP_CACHE_DIR, or pass --cache DIR.")
    return base / "query"


def _cache_name(root: Path) -> str:
    return hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:16]
