"""An MCP client (the official Python SDK) against turnstile's /mcp, for tests/mcp/endpoint.rs.

usage: client.py URL KEY SCENARIO [ARG]   (KEY "-" for none)

Prints one JSON object per line on stdout: what the scenario saw. Scenarios:
- tools: list the tools; call a trusted, a denied and an ask tool (without elicitation).
- accept / decline: call the ask tool with an elicitation handler that accepts / declines.
- changed: call add_tool, wait for notifications/tools/list_changed, list again.
- reload: list the tools (printed as before), wait for notifications/tools/list_changed (the
  test reloads the server's config meanwhile), list again (printed as after).
- cancel: call slow (ARG: the notify address) with a 1 s timeout (the SDK then cancels it).
- progress: call slow (300 ms) with a progress callback: print the reports.
- deliver: write out.txt with the session-scoped server ws, deliver it, download the link.
- hold: list the tools, print ready, then keep the session (and its GET stream) open for 60 s.
- owners: open a session with raw HTTP, then send tools/list in it with KEY and with ARG (another
  key): print both statuses; then a second initialize with KEY and one with ARG.
"""

import json
import sys

import anyio
import httpx2
import mcp.types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


def out(**kw):
    print(json.dumps(kw), flush=True)


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def result(r):
    return {"is_error": bool(r.is_error), "text": text_of(r)}


async def main(url, key, scenario, arg):
    headers = {} if key == "-" else {"Authorization": f"Bearer {key}"}
    changed = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification) or getattr(
            getattr(message, "root", None), "method", ""
        ) == "notifications/tools/list_changed":
            changed.set()

    async def accept(context, params):
        out(elicited=params.message)
        return types.ElicitResult(action="accept", content={})

    async def decline(context, params):
        out(elicited=params.message)
        return types.ElicitResult(action="decline", content={"reason": "not today"})

    if scenario == "owners":
        await owners(url, key, arg)
        return
    elicitation = {"accept": accept, "decline": decline}.get(scenario)
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(
                read, write, elicitation_callback=elicitation, message_handler=on_message
            ) as session:
                await session.initialize()
                if scenario == "tools":
                    listed = await session.list_tools()
                    out(tools=sorted(t.name for t in listed.tools),
                        echo_schema=next((t.input_schema for t in listed.tools if t.name == "mcp__ex__echo"), None))
                    out(trusted=result(await session.call_tool("mcp__ex__echo", {"text": "hi"})))
                    out(denied=result(await session.call_tool("mcp__ex__fail", {"message": "x"})))
                    out(ask=result(await session.call_tool("mcp__ex__add", {"a": 1, "b": 2})))
                elif scenario in ("accept", "decline"):
                    out(ask=result(await session.call_tool("mcp__ex__add", {"a": 1, "b": 2})))
                elif scenario == "changed":
                    out(added=result(await session.call_tool("mcp__ex__add_tool", {"name": "fresh"})))
                    with anyio.fail_after(10):
                        await changed.wait()
                    listed = await session.list_tools()
                    out(tools=sorted(t.name for t in listed.tools))
                elif scenario == "reload":
                    listed = await session.list_tools()
                    out(before=sorted(t.name for t in listed.tools))
                    with anyio.fail_after(60):
                        await changed.wait()
                    listed = await session.list_tools()
                    out(after=sorted(t.name for t in listed.tools))
                elif scenario == "progress":
                    seen = []

                    async def on_progress(progress, total, message):
                        seen.append({"progress": progress, "total": total, "message": message})

                    r = await session.call_tool("mcp__ex__slow", {"ms": 300}, progress_callback=on_progress)
                    out(slow=result(r), progress=seen)
                elif scenario == "deliver":
                    out(wrote=result(await session.call_tool("mcp__ws__write_file",
                                                             {"path": "out.txt", "text": "hello"})))
                    r = await session.call_tool("deliver_file", {"path": "out.txt"})
                    links = [c for c in r.content if getattr(c, "type", "") == "resource_link"]
                    out(delivered=result(r), links=[{"uri": str(l.uri), "name": l.name,
                                                     "mime": l.mime_type} for l in links])
                    if links:
                        got = await http.get(str(links[0].uri))
                        out(download=got.status_code, body=got.text)
                elif scenario == "hold":
                    await session.list_tools()
                    out(ready=True)
                    await anyio.sleep(60)
                elif scenario == "cancel":
                    try:
                        r = await session.call_tool("mcp__ex__slow", {"ms": 30000, "notify": arg},
                                                    read_timeout_seconds=1.0)
                        out(cancel=result(r))
                    except Exception as e:  # the SDK's timeout error
                        out(cancel={"raised": type(e).__name__})


async def owners(url, key, other):
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
              "MCP-Protocol-Version": "2025-11-25"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "owners", "version": "1"}}}
    async with httpx2.AsyncClient(timeout=30) as http:
        def h(k, sid=None):
            d = dict(accept, Authorization=f"Bearer {k}")
            if sid:
                d["Mcp-Session-Id"] = sid
            return d
        r = await http.post(url, headers=h(key), json=init)
        sid = r.headers.get("mcp-session-id")
        out(init=r.status_code, session=bool(sid))
        await http.post(url, headers=h(key, sid),
                        json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        theirs = await http.post(url, headers=h(other, sid), json=listing)
        mine = await http.post(url, headers=h(key, sid), json=listing)
        out(other=theirs.status_code, other_body=theirs.text[:300], mine=mine.status_code)
        second = await http.post(url, headers=h(key), json=init)
        out(second=second.status_code, second_body=second.text[:300],
            retry_after=second.headers.get("retry-after"))
        out(other_init=(await http.post(url, headers=h(other), json=init)).status_code)


if __name__ == "__main__":
    url, key, scenario = sys.argv[1:4]
    anyio.run(main, url, key, scenario, sys.argv[4] if len(sys.argv) > 4 else None)
