"""A small MCP server for the proxy's tests, built on the real `mcp` SDK (run as a subprocess).

    python tool_server.py stdio
    python tool_server.py http PORT

Tools: `echo` succeeds, `fail` answers `isError`, `slow` sleeps, `big` returns a large result,
`crash` kills the server mid-call (exit code 3), `wait_for_file` logs a message and then waits
until a path exists (so a test can prove an SSE event arrived before the call finished),
`ask_secret` elicits a value (a server-initiated request, or an input-required retry on the
stateless protocol), `whoami` reports sha256 digests of the request's Authorization and Mcp-Session-Id headers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("llmtap-test-tools")


class Secret(BaseModel):
    code: str


def ask_for_code() -> Elicit[Secret]:
    return Elicit("What is the code?", Secret)


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail(reason: str) -> str:
    """Always fail, as a tool error the model sees (isError)."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def big(size: int) -> str:
    """Return `size` characters."""
    return "x" * size


@server.tool()
def crash() -> str:
    """Exit the server process in the middle of the call."""
    sys.stdout.flush()
    os._exit(3)


@server.tool()
async def wait_for_file(path: str, ctx: Context) -> str:
    """Log a message, then wait until `path` exists."""
    await ctx.info("waiting")
    for _ in range(2000):
        if Path(path).exists():
            return "done"
        await asyncio.sleep(0.01)
    return "gave up"


@server.tool()
def ask_secret(secret: Annotated[Secret, Resolve(ask_for_code)]) -> str:
    """Ask the client for a code and answer how long it was."""
    return f"got {len(secret.code)} characters"


@server.tool()
def whoami(ctx: Context) -> str:
    """Report digests of the Authorization and Mcp-Session-Id headers the request reached the server with."""
    headers = ctx.headers or {}

    def seen(name: str) -> str | None:
        value = headers.get(name)
        return None if value is None else hashlib.sha256(value.encode()).hexdigest()

    return f"authorization={seen('authorization')} session={seen('mcp-session-id')}"


@server.resource("note://hello")
def hello_note() -> str:
    """A fixed note."""
    return "hello from a resource"


@server.prompt()
def greet(name: str) -> str:
    """A greeting prompt."""
    return f"Say hello to {name}."


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))


if __name__ == "__main__":
    main()
