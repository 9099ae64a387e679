"""A stdio MCP server on the official Python SDK (`mcp`, pinned by tests/common/provision.rs)
whose tool `ask` asks its client a question (`elicitation/create`, a form with a required
field, defaults, an enum, a bound number and a boolean) and answers with what came back, as
JSON: `{"action": ..., "content": ...}`."""

import json
import sys
from typing import Literal

from pydantic import BaseModel, Field

try:  # the SDK's high-level server (named FastMCP before 2.x)
    from mcp.server.fastmcp import Context, FastMCP
except ImportError:  # pragma: no cover
    from mcp.server.mcpserver import Context, MCPServer as FastMCP


class Form(BaseModel):
    email: str = Field(description="Your e-mail address")
    age: int = Field(default=30, ge=0, le=150, description="Your age")
    color: Literal["red", "green", "blue"] = Field(default="red", description="A colour")
    subscribe: bool = Field(default=True, description="Send news")


server = FastMCP("asker")


@server.tool()
async def ask(ctx: Context) -> str:
    """Asks the user who they are and says what they answered."""
    r = await ctx.elicit(message="Who are you?", schema=Form)
    content = r.data.model_dump() if r.action == "accept" else None
    return json.dumps({"action": r.action, "content": content}, sort_keys=True)


if __name__ == "__main__":
    print("asker: starting", file=sys.stderr, flush=True)
    server.run()
