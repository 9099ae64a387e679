"""A stdio MCP server (the official Python SDK) whose tool `ask` asks its client for a
completion (`sampling/createMessage`) `times` times and answers with what came back, one line
per request: `sampled=<text> model=<model> stop=<stopReason> role=<role>` or
`refused: <the client's error message>`, after a first line `caps_sampling=<True|False>` (whether
the client declared the sampling capability)."""

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

server = MCPServer("sampling")


@server.tool()
async def ask(prompt: str, ctx: Context, max_tokens: int = 50, times: int = 1, image: bool = False) -> str:
    """Asks the client's model `prompt`, `times` times."""
    caps = ctx.client_capabilities
    lines = ["caps_sampling=%s" % (caps is not None and caps.sampling is not None)]
    content = [types.TextContent(type="text", text=prompt)]
    if image:
        content.append(types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"))
    for _ in range(times):
        try:
            result = await ctx.session.create_message(
                [types.SamplingMessage(role="user", content=content if image else content[0])],
                max_tokens=max_tokens,
                system_prompt="Answer briefly.",
                temperature=0.3,
                stop_sequences=["END"],
                model_preferences=types.ModelPreferences(hints=[types.ModelHint(name="claude")]),
            )
            c = result.content
            text = c.text if isinstance(c, types.TextContent) else repr(c)
            lines.append("sampled=%s model=%s stop=%s role=%s" % (text, result.model, result.stop_reason, result.role))
        except MCPError as e:
            lines.append("refused: %s" % e.message)
    return "\n".join(lines)


if __name__ == "__main__":
    server.run()
