"""A federated MCP server (stdio, official Python SDK low-level server) with the resources,
resource template, prompts and completions of the MCP conformance framework's reference
fixtures, for tests/mcp_endpoint_resources.rs and tests/mcp_endpoint_conformance.rs.

Resources: test://static-text, test://static-binary (a PNG), test://watched-resource,
test://secret; template test://template/{id}/data. Prompts: test_simple_prompt,
test_prompt_with_arguments (arg1, arg2), test_prompt_with_embedded_resource (resourceUri),
test_prompt_with_image. Completion of test_prompt_with_arguments' arguments. Subscriptions.
Tools: add_resource (adds test://added/NAME and prompt added_NAME, then sends both list_changed
notifications), touch (sends notifications/resources/updated for a URI).
"""

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

# A 1x1 red PNG.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
)

TEXTS = {
    "test://static-text": "This is the content of the static text resource.",
    "test://watched-resource": "Watched resource content.",
    "test://secret": "the secret",
}
added = []


def resources():
    out = [types.Resource(uri=u, name=u.split("//")[1], mime_type="text/plain") for u in TEXTS]
    out.append(types.Resource(uri="test://static-binary", name="static-binary", mime_type="image/png"))
    out.extend(types.Resource(uri=f"test://added/{n}", name=f"added-{n}", mime_type="text/plain") for n in added)
    return out


async def list_resources(ctx, params):
    return types.ListResourcesResult(resources=resources())


async def list_templates(ctx, params):
    return types.ListResourceTemplatesResult(
        resource_templates=[
            types.ResourceTemplate(
                uri_template="test://template/{id}/data",
                name="template-data",
                description="Data of one id",
                mime_type="application/json",
            )
        ]
    )


async def read_resource(ctx, params):
    uri = str(params.uri)
    if uri in TEXTS:
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=TEXTS[uri])]
        )
    if uri == "test://static-binary":
        return types.ReadResourceResult(
            contents=[types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)]
        )
    if uri.startswith("test://added/") and uri[len("test://added/"):] in added:
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=f"added {uri}")]
        )
    if uri.startswith("test://template/") and uri.endswith("/data"):
        rid = uri[len("test://template/"):-len("/data")]
        text = '{"id": "%s", "templateTest": true, "data": "Data for ID: %s"}' % (rid, rid)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
        )
    raise ValueError(f"no resource {uri}")


async def subscribe(ctx, params):
    return types.EmptyResult()


async def unsubscribe(ctx, params):
    return types.EmptyResult()


def prompts():
    out = [
        types.Prompt(name="test_simple_prompt", description="A simple prompt without arguments"),
        types.Prompt(
            name="test_prompt_with_arguments",
            description="A prompt with required arguments",
            arguments=[
                types.PromptArgument(name="arg1", description="First argument", required=True),
                types.PromptArgument(name="arg2", description="Second argument", required=True),
            ],
        ),
        types.Prompt(
            name="test_prompt_with_embedded_resource",
            description="A prompt that includes an embedded resource",
            arguments=[types.PromptArgument(name="resourceUri", description="URI", required=True)],
        ),
        types.Prompt(name="test_prompt_with_image", description="A prompt that includes an image"),
    ]
    out.extend(types.Prompt(name=f"added_{n}", description=f"added {n}") for n in added)
    return out


async def list_prompts(ctx, params):
    return types.ListPromptsResult(prompts=prompts())


def user(content):
    return types.PromptMessage(role="user", content=content)


async def get_prompt(ctx, params):
    args = params.arguments or {}
    name = params.name
    if name == "test_simple_prompt":
        msgs = [user(types.TextContent(text="This is a simple prompt for testing."))]
    elif name == "test_prompt_with_arguments":
        text = f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"
        msgs = [user(types.TextContent(text=text))]
    elif name == "test_prompt_with_embedded_resource":
        uri = args.get("resourceUri", "test://example-resource")
        res = types.TextResourceContents(uri=uri, mime_type="text/plain", text="Embedded resource content for testing.")
        msgs = [
            user(types.EmbeddedResource(type="resource", resource=res)),
            user(types.TextContent(text="Please process the embedded resource above.")),
        ]
    elif name == "test_prompt_with_image":
        msgs = [
            user(types.ImageContent(data=PNG, mime_type="image/png")),
            user(types.TextContent(text="Please analyze the image above.")),
        ]
    elif name.startswith("added_") and name[len("added_"):] in added:
        msgs = [user(types.TextContent(text=name))]
    else:
        raise ValueError(f"no prompt {name}")
    return types.GetPromptResult(messages=msgs)


async def complete(ctx, params):
    words = ["paris", "park", "party", "testValue"]
    value = params.argument.value
    values = [w for w in words if w.startswith(value)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


TOOLS = [
    types.Tool(
        name="add_resource",
        description="Add test://added/NAME and the prompt added_NAME",
        input_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    ),
    types.Tool(
        name="touch",
        description="Send notifications/resources/updated for a URI",
        input_schema={"type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"]},
    ),
]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    args = params.arguments or {}
    if params.name == "add_resource":
        added.append(args["name"])
        await ctx.session.send_resource_list_changed()
        await ctx.session.send_prompt_list_changed()
        text = f"added {args['name']}"
    elif params.name == "touch":
        await ctx.session.send_resource_updated(args["uri"])
        text = f"touched {args['uri']}"
    else:
        return types.CallToolResult(content=[types.TextContent(text=f"no tool {params.name}")], is_error=True)
    return types.CallToolResult(content=[types.TextContent(text=text)])


server = Server(
    "fixtures",
    version="1.0.0",
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
    on_completion=complete,
    on_list_tools=list_tools,
    on_call_tool=call_tool,
)


async def main():
    options = server.create_initialization_options(
        NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=False)
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, options)


if __name__ == "__main__":
    anyio.run(main)
