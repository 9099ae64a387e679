"""The client side of one MCP conformance scenario, played by turnstile.

The conformance framework (`conformance client --command "python3 driver.py" --scenario S`)
starts the scenario's MCP server and runs this script with the server's URL as its last
argument, `MCP_CONFORMANCE_SCENARIO` and, for some scenarios, `MCP_CONFORMANCE_CONTEXT` (client
credentials; for cross-app access also the enterprise IdP's issuer, this client's id there and
the user's ID token) in the environment.

The script writes a tools.toml whose `[mcp_servers.conf]` points at that URL, runs
`turnstile login conf` first when the scenario needs an authorization (it opens the printed
authorization URL as a browser would, so the redirect reaches turnstile's loopback listener),
then `turnstile serve` with the built-in echo upstream, and drives one AAP session that calls
every tool the server lists (the echo provider's `/call NAME {json}`). An elicitation reaches the
session as a call of its client tool `elicitation`, answered `accept` with no content, so that
the server's defaults (SEP-1034) are what turnstile sends back.

The turnstile binary is `$TURNSTILE_BIN`. Standard library only. Exit 0 when every step
answered; the framework judges the rest from what its server saw.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

DEADLINE_S = 20


def log(*a):
    print("driver:", *a, file=sys.stderr, flush=True)


def toml_str(s):
    return json.dumps(s)


def config(url, scenario, context, data):
    lines = [
        "[server]",
        f"data_dir = {toml_str(os.path.join(data, 'data'))}",
        f"sandboxes = {toml_str(os.path.join(data, 'sandboxes'))}",
        'secret_key_env = "TURNSTILE_SECRET_KEY"',
        "",
        "[agents.assistant]",
        'elicitation_tool = "elicitation"',
        "",
        "[mcp_servers.conf]",
        f"url = {toml_str(url)}",
        "startup_timeout_s = 15",
        "timeout_s = 20",
        'elicitation = "ask"',
    ]
    oauth = []
    if context.get("client_id"):
        oauth.append(f"client_id = {toml_str(context['client_id'])}")
    if context.get("client_secret"):
        oauth.append('client_secret_env = "CONF_CLIENT_SECRET"')
    if context.get("private_key_pem"):
        path = os.path.join(data, "client_key.pem")
        with open(path, "w") as f:
            f.write(context["private_key_pem"])
        oauth.append(f"private_key_file = {toml_str(path)}")
        oauth.append(
            f"signing_algorithm = {toml_str(context.get('signing_algorithm', 'ES256'))}"
        )
    if scenario.startswith("auth/client-credentials"):
        oauth.append('grant = "client_credentials"')
    if context.get("idp_id_token"):
        # Enterprise-managed authorization: the IdP found from its issuer, the user's ID
        # token in a variable, as an operator would set it up.
        oauth.append('grant = "identity_assertion"')
        oauth.append(f"idp_issuer = {toml_str(context['idp_issuer'])}")
        oauth.append(f"idp_client_id = {toml_str(context['idp_client_id'])}")
        oauth.append('identity_assertion_env = "CONF_ID_TOKEN"')
    if scenario == "auth/basic-cimd":
        oauth.append(
            'client_metadata_url = "https://conformance-test.local/client-metadata.json"'
        )
    if oauth:
        lines += ["", "[mcp_servers.conf.oauth]"] + oauth
    lines += ["", "[policy]", 'default = "trust"', ""]
    return "\n".join(lines)


def http(addr, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE_S + 10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def login(binary, cfg, env):
    """`turnstile login conf`: open the printed authorization URL as a browser would."""
    p = subprocess.Popen(
        [binary, "login", "conf", "--config", cfg],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        env=env,
        text=True,
    )
    opened = False
    for line in p.stdout:
        log("login:", line.rstrip())
        word = line.strip()
        if not opened and word.startswith("http"):
            opened = True
            threading.Thread(target=browse, args=(word,), daemon=True).start()
    return p.wait(timeout=DEADLINE_S) == 0


def browse(url):
    try:
        with urllib.request.urlopen(url, timeout=DEADLINE_S) as r:
            r.read()
    except Exception as e:  # the redirect's target answers; failures show in login's output
        log("browse:", e)


def serve(binary, cfg, env):
    p = subprocess.Popen(
        [binary, "serve", "--config", cfg, "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    for line in p.stderr:
        sys.stderr.write(line)
        if "listening on http://" in line:
            addr = line.split("listening on http://")[1].split()[0]
            threading.Thread(target=pump, args=(p.stderr,), daemon=True).start()
            return p, addr
    raise SystemExit("turnstile serve exited before listening")


def pump(stream):
    for line in stream:
        sys.stderr.write(line)


def arguments(schema):
    """Numbers for the required numeric properties (add_numbers), nothing else."""
    props = (schema or {}).get("properties") or {}
    return {
        k: 1 for k, v in props.items() if v.get("type") in ("number", "integer")
    }


def wait_up(addr):
    end = time.time() + DEADLINE_S
    while time.time() < end:
        _, status = http(addr, "GET", "/status")
        for s in (status or {}).get("mcp_servers", []) or []:
            if s.get("name") == "conf" and s.get("state") == "up":
                return True
        time.sleep(0.1)
    log("server conf did not come up:", json.dumps(status))
    return False


def call_tools(addr, relogin):
    _, meta = http(addr, "GET", "/meta")
    tools = [
        t
        for t in meta["agents"][0]["tools"]
        if t["name"].startswith("mcp__conf__")
    ]
    elicit = {
        "name": "elicitation",
        "description": "answers an MCP server's question",
        "parameters": {"type": "object"},
    }
    ok = True
    for t in tools:
        _, s = http(addr, "POST", "/sessions", {"tools": [elicit]})
        sid = s["sessionId"]
        said = f"/call {t['name']} {json.dumps(arguments(t.get('parameters')))}"
        turn = {"messages": [{"role": "user", "content": said}]}
        code, r = http(addr, "POST", f"/sessions/{sid}/turns", turn)
        # A server that asks for more scope (step-up): the operator logs in again, as the
        # tool's error says, and the call is made again (at most twice).
        for _ in range(2):
            if not (code == 200 and "turnstile login" in json.dumps(r)):
                break
            if not relogin():
                break
            _, s = http(addr, "POST", "/sessions", {"tools": [elicit]})
            sid = s["sessionId"]
            code, r = http(addr, "POST", f"/sessions/{sid}/turns", turn)
        for _ in range(4):
            calls = pending_elicitations(r) if code == 200 else []
            if not calls:
                break
            results = [
                {
                    "role": "tool",
                    "toolCallId": c,
                    "content": json.dumps({"action": "accept", "content": {}}),
                }
                for c in calls
            ]
            code, r = http(
                addr, "POST", f"/sessions/{sid}/turns", {"messages": results}
            )
        log(t["name"], code, json.dumps(r)[:400])
        ok = ok and code == 200
    return ok


def pending_elicitations(r):
    out = []
    for m in r.get("messages", []):
        for b in m.get("content", []) if isinstance(m.get("content"), list) else []:
            if b.get("type") == "tool_use" and b.get("name") == "elicitation":
                out.append(b["toolCallId"])
    return out


def main():
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    binary = os.environ["TURNSTILE_BIN"]
    data = tempfile.mkdtemp(prefix="conformance-")
    # The scenario's data folder (config, store, sandboxes) goes when the driver exits.
    atexit.register(shutil.rmtree, data, True)
    cfg = os.path.join(data, "tools.toml")
    with open(cfg, "w") as f:
        f.write(config(url, scenario, context, data))
    env = dict(os.environ)
    env["TURNSTILE_SECRET_KEY"] = "conformance-driver-secret-key-0123456789"
    env["CONF_CLIENT_SECRET"] = context.get("client_secret", "")
    env["CONF_ID_TOKEN"] = context.get("idp_id_token", "")
    env.setdefault("RUST_LOG", "info")
    machine = scenario.startswith("auth/client-credentials") or context.get(
        "idp_id_token"
    )
    if scenario.startswith("auth/") and not machine:
        if not login(binary, cfg, env):
            log("login failed")
            return 1
    p, addr = serve(binary, cfg, env)
    try:
        if not wait_up(addr):
            return 1
        return 0 if call_tools(addr, lambda: login(binary, cfg, env)) else 1
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


if __name__ == "__main__":
    sys.exit(main())
