"""A stdio MCP server (standard library only) whose tool `ask` asks its client a question
(`elicitation/create`, a form with defaults) and answers with what came back:
`action=<action> content=<json> caps=<the client's declared capabilities>`."""

import json
import sys

caps = {}


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def read():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "Ada"},
        "count": {"type": "integer", "minimum": 1, "default": 2},
    },
}

while True:
    msg = read()
    method = msg.get("method")
    if method == "initialize":
        caps = msg["params"].get("capabilities", {})
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "elicit", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": [{
            "name": "ask", "description": "asks the user",
            "inputSchema": {"type": "object", "properties": {}}}]}})
    elif method == "tools/call":
        call_id = msg["id"]
        send({"jsonrpc": "2.0", "id": "q1", "method": "elicitation/create", "params": {
            "mode": "form", "message": "Who are you?", "requestedSchema": SCHEMA}})
        while True:
            reply = read()
            if reply.get("id") == "q1" and "method" not in reply:
                break
        result = reply.get("result") or {}
        text = "action=%s content=%s caps=%s" % (
            result.get("action"),
            json.dumps(result.get("content"), sort_keys=True),
            json.dumps(caps, sort_keys=True),
        )
        send({"jsonrpc": "2.0", "id": call_id, "result": {
            "content": [{"type": "text", "text": text}]}})
    elif "id" in msg and method:
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
