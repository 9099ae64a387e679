"""An MCP client (the official Python SDK) reading the resources and prompts turnstile's /mcp
passes through from the fixture server (child.py), for tests/mcp/endpoint_resources.rs.

usage: client.py URL SCENARIO

Prints one JSON object per line on stdout: what the scenario saw. Scenarios:
- read: capabilities; list resources and templates; read by the listed URI, by a template, by
  the server's own URI; read the denied one (listed URI and own URI); read the asked one
  without elicitation.
- prompts: list prompts; get one with arguments; get the asked one without elicitation; get a
  bare name; complete an argument.
- accept: read the asked resource and get the asked prompt with an elicitation handler that
  accepts.
- changed: call add_resource, wait for both list_changed notifications, list again; subscribe
  to a resource, call touch, wait for notifications/resources/updated.
- verbatim: the tool `structured` as listed and its result; the content blocks of the audio,
  embedded-resource and mixed-content reference tools; the error one's result.
- names: list tools, prompts, resources and templates; call `structured` by its own and its
  federated name; get a prompt and read a resource by their own and federated names.
- logs: whether logging is declared; set the level to info, call test_tool_with_logging, the
  messages received; then at error, again.
- burst: call burst (50 progress reports and 50 log messages back to back): the reports seen by
  the time the result came, and the log messages.
"""

import json
import sys

import anyio
import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

P = "turnstile://fx/"


def out(**kw):
    print(json.dumps(kw), flush=True)


def contents(r):
    return [{"uri": str(c.uri), "text": getattr(c, "text", None), "blob": getattr(c, "blob", None),
             "mime": c.mime_type} for c in r.contents]


async def attempt(f):
    try:
        return {"ok": await f()}
    except MCPError as e:
        return {"code": e.code, "message": e.message}


async def main(url, scenario):
    events = {"resources": anyio.Event(), "prompts": anyio.Event(), "updated": anyio.Event()}
    updated = []

    async def on_message(message):
        method = getattr(getattr(message, "root", message), "method", "")
        if method == "notifications/resources/list_changed":
            events["resources"].set()
        elif method == "notifications/prompts/list_changed":
            events["prompts"].set()
        elif method == "notifications/resources/updated":
            updated.append(str(getattr(message, "root", message).params.uri))
            events["updated"].set()

    async def accept(context, params):
        out(elicited=params.message)
        return types.ElicitResult(action="accept", content={})

    logged = []
    seen = {}  # a message's data -> an event set when it arrives

    async def on_log(params):
        logged.append({"level": params.level, "data": params.data})
        seen.setdefault(params.data, anyio.Event()).set()

    elicitation = accept if scenario == "accept" else None
    async with httpx2.AsyncClient(timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, elicitation_callback=elicitation,
                                     message_handler=on_message, logging_callback=on_log) as session:
                init = await session.initialize()
                if scenario == "logs":
                    await logs(session, init, logged, seen)
                elif scenario == "burst":
                    await burst(session, logged, seen)
                else:
                    await SCENARIOS[scenario](session, init, events, updated)


async def read(session, init, events, updated):
    out(capabilities=init.capabilities.model_dump(by_alias=True, exclude_none=True))
    listed = await session.list_resources()
    out(resources=sorted(r.uri for r in listed.resources), names=sorted(r.name for r in listed.resources))
    templates = await session.list_resource_templates()
    out(templates=[t.uri_template for t in templates.resource_templates])
    out(text=contents(await session.read_resource(P + "test://static-text")))
    out(binary=contents(await session.read_resource(P + "test://static-binary")))
    out(template=contents(await session.read_resource(P + "test://template/42/data")))
    out(own=contents(await session.read_resource("test://static-text")))
    out(denied=await attempt(lambda: session.read_resource(P + "test://secret")))
    out(denied_own=await attempt(lambda: session.read_resource("test://secret")))
    out(asked=await attempt(lambda: session.read_resource(P + "test://watched-resource")))
    out(unknown=await attempt(lambda: session.read_resource("turnstile://nosuch/x://y")))


async def prompts(session, init, events, updated):
    listed = await session.list_prompts()
    out(prompts=sorted(p.name for p in listed.prompts),
        args=[a.name for p in listed.prompts if p.name == "fx/test_prompt_with_arguments" for a in p.arguments])
    got = await session.get_prompt("fx/test_prompt_with_arguments", {"arg1": "red", "arg2": "blue"})
    out(with_args=[m.content.text for m in got.messages])
    out(asked=await attempt(lambda: session.get_prompt("fx/test_simple_prompt")))
    out(bare=await attempt(lambda: session.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})))
    done = await session.complete(types.PromptReference(name="fx/test_prompt_with_arguments"),
                                  {"name": "arg1", "value": "pa"})
    out(completed=done.completion.values)


async def accept(session, init, events, updated):
    out(read=contents(await session.read_resource(P + "test://watched-resource")))
    got = await session.get_prompt("fx/test_simple_prompt")
    out(prompt=[m.content.text for m in got.messages])


async def changed(session, init, events, updated):
    before = await session.list_resources()
    out(before=sorted(r.uri for r in before.resources))
    r = await session.call_tool("mcp__fx__add_resource", {"name": "fresh"})
    out(added="".join(c.text for c in r.content))
    with anyio.fail_after(10):
        await events["resources"].wait()
        await events["prompts"].wait()
    out(resources=sorted(r.uri for r in (await session.list_resources()).resources),
        prompts=sorted(p.name for p in (await session.list_prompts()).prompts))
    await session.subscribe_resource(P + "test://static-text")
    # Not subscribed: never relayed (it would arrive first, the child's notifications keep order).
    await session.call_tool("mcp__fx__touch", {"uri": "test://static-binary"})
    await session.call_tool("mcp__fx__touch", {"uri": "test://static-text"})
    with anyio.fail_after(10):
        await events["updated"].wait()
    out(denied_subscribe=await attempt(lambda: session.subscribe_resource(P + "test://secret")))
    await session.unsubscribe_resource(P + "test://static-text")
    out(updated=updated)


def block(c):
    return c.model_dump(by_alias=True, exclude_none=True, mode="json")


async def verbatim(session, init, events, updated):
    listed = {t.name: t for t in (await session.list_tools()).tools}
    t = listed["mcp__fx__structured"]
    out(structured_tool=t.model_dump(by_alias=True, exclude_none=True, mode="json"))
    r = await session.call_tool("mcp__fx__structured", {})
    out(structured=r.model_dump(by_alias=True, exclude_none=True, mode="json"))
    for name in ["test_audio_content", "test_embedded_resource", "test_multiple_content_types"]:
        r = await session.call_tool("mcp__fx__" + name, {})
        out(**{name: [block(c) for c in r.content]})
    r = await session.call_tool("mcp__fx__test_error_handling", {})
    out(error={"is_error": r.is_error, "content": [block(c) for c in r.content]})


async def names(session, init, events, updated):
    out(tools=sorted(t.name for t in (await session.list_tools()).tools))
    out(prompts=sorted(p.name for p in (await session.list_prompts()).prompts))
    out(resources=sorted(r.uri for r in (await session.list_resources()).resources))
    out(templates=sorted(t.uri_template for t in (await session.list_resource_templates()).resource_templates))
    for name in ["structured", "mcp__fx__structured"]:
        r = await session.call_tool(name, {})
        out(**{"call_" + name: {"is_error": r.is_error, "content": [block(c) for c in r.content]}})
    got = await attempt(lambda: session.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"}))
    out(prompt_own=[m.content.text for m in got["ok"].messages] if "ok" in got else got)
    got = await session.get_prompt("fx/test_prompt_with_arguments", {"arg1": "c", "arg2": "d"})
    out(prompt_federated=[m.content.text for m in got.messages])
    got = await attempt(lambda: session.read_resource("test://static-text"))
    out(read_own=contents(got["ok"]) if "ok" in got else got)
    out(read_federated=contents(await session.read_resource(P + "test://static-text")))


async def logs(session, init, logged, seen):
    async def level(name):
        try:
            await session.set_logging_level(name)
            return "ok"
        except MCPError as e:
            return {"code": e.code, "message": e.message}

    async def until(text):
        """Wait (10 s at most) for a message whose data is `text`; the messages so far."""
        with anyio.fail_after(10):
            await seen.setdefault(text, anyio.Event()).wait()
        return list(logged)

    out(logging=init.capabilities.logging is not None)
    out(set_info=await level("info"))
    r = await session.call_tool("mcp__fx__test_tool_with_logging", {})
    out(called="".join(c.text for c in r.content))
    if init.capabilities.logging is None:
        return
    out(at_info=await until("Tool execution completed"))
    logged.clear()
    out(set_error=await level("error"))
    await session.call_tool("mcp__fx__test_tool_with_logging", {})
    # The instance's messages reach the client in order: its info ones before this one.
    await session.call_tool("mcp__fx__log_at", {"level": "error", "text": "sentinel"})
    out(at_error=await until("sentinel"))


async def burst(session, logged, seen):
    count = 50
    await session.set_logging_level("debug")
    progress = []

    async def on_progress(value, total, message):
        progress.append(value)

    r = await session.call_tool("mcp__fx__burst", {"count": count}, progress_callback=on_progress)
    # Every report came before the result: the call's progress is complete when it returns.
    out(result="".join(c.text for c in r.content), progress=progress)
    with anyio.fail_after(10):
        await seen.setdefault(f"burst {count - 1}", anyio.Event()).wait()
    out(logs=[m["data"] for m in logged])


SCENARIOS = {"read": read, "prompts": prompts, "accept": accept, "changed": changed,
             "verbatim": verbatim, "names": names}

if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
