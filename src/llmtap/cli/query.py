"""`llmtap query`: run SQL (DuckDB) over captured calls, with `calls` and `rollouts` as tables."""

from __future__ import annotations

import csv
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import click
import orjson

from ..errors import LlmtapError
from .export import require_export_extra
from .options import json_option

__all__ = ["query"]


@click.command()
@click.argument("sql")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="PATH")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV instead of a table.")
@json_option("Print one JSON object per row instead of a table.")
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where a capture directory's Parquet export is kept (default: llmtap's cache directory).",
)
def query(sql: str, path: Path, as_csv: bool, as_json: bool, cache_dir: Path | None) -> None:
    """Run SQL over PATH (a capture directory, a capsule or a Parquet export) with tables calls and rollouts."""
    if as_csv and as_json:
        raise click.UsageError("Choose one of --csv and --json.")
    require_export_extra("query")
    from ..export.query import run_query

    try:
        result = run_query(sql, path, cache_dir=cache_dir)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        for row in result.rows:
            click.echo(orjson.dumps(dict(zip(result.columns, row)), default=_jsonable).decode())
    elif as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([[_text(value, empty="") for value in row] for row in result.rows])
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(*result.columns)
        for row in result.rows:
            table.add_row(*[_text(value, empty="-") for value in row])
        Console().print(table)
        click.echo(f"{len(result.rows):,} rows")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return str(value)  # decimals, intervals, UUIDs: their text


def _text(value: Any, *, empty: str) -> str:
    if value is None:
        return empty
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, (list, dict)):
        return orjson.dumps(value, default=_jsonable).decode()
    return str(value)
