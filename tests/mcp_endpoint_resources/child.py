"""A federated MCP server (stdio, official Python SDK low-level server) with the resources,
resource template, prompts and completions of the MCP conformance framework's reference
fixtures, for tests/mcp/endpoint_resources.rs and tests/mcp/endpoint_conformance.rs.

Resources: test://static-text, test://static-binary (a PNG), test://watched-resource,
test://secret; template test://template/{id}/data. Prompts: test_simple_prompt,
test_prompt_with_arguments (arg1, arg2), test_prompt_with_embedded_resource (resourceUri),
test_prompt_with_image. Completion of test_prompt_with_arguments' arguments. Subscriptions.
Logging (logging/setLevel accepted; test_tool_with_logging sends three messages).
Tools: add_resource (adds test://added/NAME and prompt added_NAME, then sends both list_changed
notifications), touch (sends notifications/resources/updated for a URI), and the framework's
reference tools (test_simple_text, test_image_content, test_audio_content,
test_embedded_resource, test_multiple_content_types, test_tool_with_logging,
test_tool_with_progress, test_error_handling, test_sampling, test_elicitation,
test_elicitation_sep1034_defaults, test_elicitation_sep1330_enums, test_reconnection,
json_schema_2020_12_tool), as its everything-server defines them; `log_at` (one log message at a
level); `burst` (progress reports and log messages back to back); and `structured` (an output
schema, annotations, a title, structured content and a `_meta`, to see that they pass through).
"""

import json

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


async def set_level(ctx, params):
    return types.EmptyResult()


async def complete(ctx, params):
    words = ["paris", "park", "party", "testValue"]
    value = params.argument.value
    values = [w for w in words if w.startswith(value)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


# A minimal WAV file.
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
NO_ARGS = {"type": "object", "properties": {}}
ELICIT_DEFAULTS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {"type": "string", "description": "User status",
                   "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}
ELICIT_ENUMS = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "description": "Select one option",
                           "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "description": "Select one option with titles",
                         "oneOf": [{"const": "value1", "title": "First Option"},
                                   {"const": "value2", "title": "Second Option"},
                                   {"const": "value3", "title": "Third Option"}]},
        "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                       "enum": ["opt1", "opt2", "opt3"],
                       "enumNames": ["Option One", "Option Two", "Option Three"]},
        "untitledMulti": {"type": "array", "description": "Select multiple options",
                          "minItems": 1, "maxItems": 3,
                          "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {"type": "array", "description": "Select multiple options with titles",
                        "minItems": 1, "maxItems": 3,
                        "items": {"anyOf": [{"const": "value1", "title": "First Choice"},
                                            {"const": "value2", "title": "Second Choice"},
                                            {"const": "value3", "title": "Third Choice"}]}},
    },
    "required": [],
}
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object",
                          "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}
REFERENCE = [
    types.Tool(name="test_simple_text", description="Tests simple text content response", input_schema=NO_ARGS),
    types.Tool(name="test_image_content", description="Tests image content response", input_schema=NO_ARGS),
    types.Tool(name="test_audio_content", description="Tests audio content response", input_schema=NO_ARGS),
    types.Tool(name="test_embedded_resource", description="Tests embedded resource content response",
               input_schema=NO_ARGS),
    types.Tool(name="test_multiple_content_types", description="Tests response with multiple content types",
               input_schema=NO_ARGS),
    types.Tool(name="test_tool_with_logging", description="Tests tool that emits log messages during execution",
               input_schema=NO_ARGS),
    types.Tool(name="test_tool_with_progress", description="Tests tool that reports progress notifications",
               input_schema=NO_ARGS),
    types.Tool(name="test_error_handling", description="Tests error response handling", input_schema=NO_ARGS),
    types.Tool(name="test_reconnection", description="Tests SSE stream disconnection and client reconnection",
               input_schema=NO_ARGS),
    types.Tool(name="test_sampling", description="Tests server-initiated sampling",
               input_schema={"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}),
    types.Tool(name="test_elicitation", description="Tests server-initiated elicitation",
               input_schema={"type": "object", "properties": {"message": {"type": "string"}},
                             "required": ["message"]}),
    types.Tool(name="test_elicitation_sep1034_defaults", description="Tests elicitation with default values",
               input_schema=NO_ARGS),
    types.Tool(name="test_elicitation_sep1330_enums", description="Tests elicitation with enum schemas",
               input_schema=NO_ARGS),
    types.Tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features",
               input_schema=SCHEMA_2020_12),
    types.Tool(name="burst", description="Send COUNT progress reports and COUNT log messages back to back",
               input_schema={"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}),
    types.Tool(name="log_at", description="Send one log message at a level",
               input_schema={"type": "object", "properties": {"level": {"type": "string"}, "text": {"type": "string"}},
                             "required": ["level", "text"]}),
    types.Tool(
        name="structured",
        title="Structured weather",
        description="Structured content with an output schema",
        input_schema=NO_ARGS,
        output_schema={"type": "object", "properties": {"temperature": {"type": "number"}},
                       "required": ["temperature"]},
        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    ),
]

TOOLS = REFERENCE + [
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


def text(t):
    return types.TextContent(text=t)


async def reference(ctx, name, args):
    """The framework's reference tools, as its everything-server answers them."""
    session = ctx.session
    if name == "test_simple_text":
        return [text("This is a simple text response for testing.")]
    if name == "test_image_content":
        return [types.ImageContent(data=PNG, mime_type="image/png")]
    if name == "test_audio_content":
        return [types.AudioContent(data=WAV, mime_type="audio/wav")]
    if name == "test_embedded_resource":
        res = types.TextResourceContents(uri="test://embedded-resource", mime_type="text/plain",
                                         text="This is an embedded resource content.")
        return [types.EmbeddedResource(type="resource", resource=res)]
    if name == "test_multiple_content_types":
        res = types.TextResourceContents(uri="test://mixed-content-resource", mime_type="application/json",
                                         text=json.dumps({"test": "data", "value": 123}))
        return [text("Multiple content types test:"), types.ImageContent(data=PNG, mime_type="image/png"),
                types.EmbeddedResource(type="resource", resource=res)]
    if name == "test_tool_with_logging":
        for i, line in enumerate(["Tool execution started", "Tool processing data", "Tool execution completed"]):
            if i:
                await anyio.sleep(0.05)
            await session.send_log_message("info", line, related_request_id=ctx.request_id)
        return [text("Tool with logging executed successfully")]
    if name == "test_tool_with_progress":
        token = (ctx.meta or {}).get("progress_token", 0)
        for i, step in enumerate([0, 50, 100]):
            if i:
                await anyio.sleep(0.05)
            await session.send_progress_notification(token, step, 100, f"Completed step {step} of 100",
                                                     related_request_id=ctx.request_id)
        return [text(str(token))]
    if name == "test_reconnection":
        await anyio.sleep(0.1)
        return [text("Reconnection test completed successfully. If you received this, the client "
                     "properly reconnected after stream closure.")]
    if name == "test_sampling":
        try:
            r = await session.create_message(
                [types.SamplingMessage(role="user", content=text(args.get("prompt", "")))], max_tokens=100)
            return [text(f"LLM response: {getattr(r.content, 'text', 'No response')}")]
        except Exception as e:  # noqa: BLE001 - the reference tool reports any failure
            return [text(f"Sampling not supported or error: {e}")]
    elicit = {
        "test_elicitation": (args.get("message", ""), {
            "type": "object", "properties": {"response": {"type": "string", "description": "User's response"}},
            "required": ["response"]}, "User response"),
        "test_elicitation_sep1034_defaults": (
            "Please review and update the form fields with defaults", ELICIT_DEFAULTS, "Elicitation completed"),
        "test_elicitation_sep1330_enums": (
            "Please select options from the enum fields", ELICIT_ENUMS, "Elicitation completed"),
    }
    if name in elicit:
        message, schema, said = elicit[name]
        try:
            r = await session.elicit(message, schema, related_request_id=ctx.request_id)
            return [text(f"{said}: action={r.action}, content={json.dumps(r.content or {})}")]
        except Exception as e:  # noqa: BLE001
            return [text(f"Elicitation not supported or error: {e}")]
    if name == "burst":
        token = (ctx.meta or {}).get("progress_token")
        for i in range(args["count"]):
            if token is not None:
                await session.send_progress_notification(token, i, args["count"], related_request_id=ctx.request_id)
            await session.send_log_message("info", f"burst {i}", related_request_id=ctx.request_id)
        return [text("burst done")]
    if name == "log_at":
        await session.send_log_message(args["level"], args["text"], related_request_id=ctx.request_id)
        return [text("logged")]
    if name == "json_schema_2020_12_tool":
        return [text(f"JSON Schema 2020-12 tool called with: {json.dumps(args)}")]
    return None


async def call_tool(ctx, params):
    args = params.arguments or {}
    if params.name == "test_error_handling":
        return types.CallToolResult(content=[text("This tool intentionally returns an error for testing")],
                                    is_error=True)
    if params.name == "structured":
        return types.CallToolResult(content=[text('{"temperature": 21.5}')],
                                    structured_content={"temperature": 21.5},
                                    _meta={"fixture/source": "child.py"})
    content = await reference(ctx, params.name, args)
    if content is not None:
        return types.CallToolResult(content=content)
    if params.name == "add_resource":
        added.append(args["name"])
        await ctx.session.send_resource_list_changed()
        await ctx.session.send_prompt_list_changed()
        said = f"added {args['name']}"
    elif params.name == "touch":
        await ctx.session.send_resource_updated(args["uri"])
        said = f"touched {args['uri']}"
    else:
        return types.CallToolResult(content=[types.TextContent(text=f"no tool {params.name}")], is_error=True)
    return types.CallToolResult(content=[text(said)])


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
    on_set_logging_level=set_level,
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
