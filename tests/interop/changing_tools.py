"""A stdio MCP server, on the official Python SDK, whose tool list changes
while it runs: `rename_lookup` replaces the tool `lookup` with
`lookup_v2` and sends notifications/tools/list_changed. Used by
tests/mcp.rs to check that discovery follows a server's tool list."""

from mcp.server import MCPServer
from mcp.server.mcpserver import Context

server = MCPServer("changing-tools")


def lookup(key: str) -> dict:
    """Looks a key up."""
    return {"key": key, "found": True}


def lookup_v2(key: str) -> dict:
    """Looks a key up, second edition."""
    return {"key": key, "found": True, "edition": 2}


@server.tool()
async def rename_lookup(ctx: Context) -> str:
    """Replaces the tool lookup with lookup_v2."""
    server.remove_tool("lookup")
    server.add_tool(lookup_v2)
    await ctx.session.send_tool_list_changed()
    return "lookup is now lookup_v2"


server.add_tool(lookup)

if __name__ == "__main__":
    server.run()
