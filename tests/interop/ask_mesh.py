"""Asks the mesh through the official Python MCP client: over streamable
HTTP (`ask_mesh.py http URL QUERY`) or by launching `agentmesh mcp-stdio`
(`ask_mesh.py stdio QUERY PROGRAM ARG...`). Prints one JSON object: the
tools listed, the `ask` result (text, structured content, isError) and the
progress messages received. `ask_mesh.py tool URL NAME ARGUMENTS_JSON`
calls another tool of the mesh's instead of `ask`. Used by the MCP
tests."""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


def field(obj, snake: str, camel: str):
    """A model field: mcp 2.x names them in snake_case, 1.x in camelCase."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel, None)


async def ask(session: ClientSession, query: str, tool: str = "ask", arguments: dict | None = None) -> dict:
    await session.initialize()
    tools = (await session.list_tools()).tools
    progress = []

    async def on_progress(done, total, message):
        progress.append(message)

    result = await session.call_tool(tool, arguments or {"query": query}, progress_callback=on_progress)
    meta = field(result, "meta", "_meta")
    return {
        "tools": [{"name": t.name, "output_schema": field(t, "output_schema", "outputSchema") is not None} for t in tools],
        "meta": dict(meta) if meta else None,
        "text": "".join(c.text for c in result.content if getattr(c, "type", "") == "text"),
        "structured": field(result, "structured_content", "structuredContent"),
        "is_error": bool(field(result, "is_error", "isError")),
        "progress": progress,
    }


async def main() -> None:
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "tool":
        url, tool, arguments = rest[0], rest[1], json.loads(rest[2])
        async with streamable_http_client(url) as (read, write, *_):
            async with ClientSession(read, write) as session:
                out = await ask(session, "", tool, arguments)
    elif mode == "http":
        url, query = rest[0], rest[1]
        async with streamable_http_client(url) as (read, write, *_):
            async with ClientSession(read, write) as session:
                out = await ask(session, query)
    else:
        query, program, args = rest[0], rest[1], rest[2:]
        params = StdioServerParameters(command=program, args=args)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                out = await ask(session, query)
    print(json.dumps(out))


asyncio.run(main())
