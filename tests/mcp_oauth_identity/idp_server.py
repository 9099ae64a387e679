"""An enterprise IdP, the authorization server of an MCP server, and that MCP server, on one
loopback port (standard library only), for tests/mcp/oauth_identity.rs. Prints `PORT <n>`.

- `/idp/token`: RFC 8693 token exchange; wants `Basic idp-client:idp-secret`, a subject token of
  type id_token that starts with `idtoken-`, `requested_token_type` id-jag, an `audience` and a
  `resource`; answers the ID-JAG `idjag-<n>` (issued_token_type id-jag, token_type N_A).
  `POST /control/refuse_idp`: it answers `invalid_grant` from now on.
- `/.well-known/oauth-protected-resource[/mcp]` names this origin as the authorization server;
  `/.well-known/oauth-authorization-server` its metadata (jwt-bearer, client_secret_basic).
- `/token`: the RFC 7523 JWT-bearer grant; wants `Basic as-client:as-secret` and an ID-JAG it
  issued; answers `access-tok-<n>` for an hour, with no refresh token (the client exchanges again).
- `POST /mcp` wants a valid bearer token, else 401 with a challenge; its tool `whoami` answers
  `token=<the bearer token>`. `POST /control/expire`: every access token stops working.
- `GET /control/log`: every token request, `{endpoint, authorization, form}`.
"""

import base64
import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
state = {"n": 0, "jags": set(), "access": set(), "log": [], "refuse_idp": False}
BASE = ""
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"


def basic(user, secret):
    return "Basic " + base64.b64encode(("%s:%s" % (user, secret)).encode()).decode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, obj=None, headers=None):
        body = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(code)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        if path.startswith("/.well-known/oauth-protected-resource"):
            self.reply(200, {"resource": BASE + "/mcp", "authorization_servers": [BASE]})
        elif path == "/.well-known/oauth-authorization-server":
            self.reply(200, {
                "issuer": BASE,
                "authorization_endpoint": BASE + "/authorize",
                "token_endpoint": BASE + "/token",
                "grant_types_supported": ["urn:ietf:params:oauth:grant-type:jwt-bearer"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            })
        elif path == "/control/log":
            with lock:
                self.reply(200, state["log"])
        else:
            self.reply(405 if path == "/mcp" else 404)

    def do_DELETE(self):
        self.reply(200)

    def do_POST(self):
        path = urllib.parse.urlparse(self.path).path
        raw = self.body()
        form = dict(urllib.parse.parse_qsl(raw.decode()))
        auth = self.headers.get("Authorization")
        if path in ("/idp/token", "/token"):
            with lock:
                state["log"].append({"endpoint": path, "authorization": auth, "form": form})
        if path == "/idp/token":
            self.exchange(form, auth)
        elif path == "/token":
            self.jwt_bearer(form, auth)
        elif path == "/control/expire":
            with lock:
                state["access"].clear()
            self.reply(200, {})
        elif path == "/control/refuse_idp":
            with lock:
                state["refuse_idp"] = True
            self.reply(200, {})
        elif path == "/mcp":
            self.mcp(raw)
        else:
            self.reply(404)

    def exchange(self, form, auth):
        with lock:
            if auth != basic("idp-client", "idp-secret"):
                return self.reply(401, {"error": "invalid_client"})
            if state["refuse_idp"]:
                return self.reply(400, {"error": "invalid_grant", "error_description": "access to this server was revoked"})
            ok = (form.get("grant_type") == "urn:ietf:params:oauth:grant-type:token-exchange"
                  and form.get("requested_token_type") == ID_JAG
                  and form.get("subject_token_type") == "urn:ietf:params:oauth:token-type:id_token"
                  and form.get("subject_token", "").startswith("idtoken-")
                  and form.get("audience") == BASE and form.get("resource") == BASE + "/mcp")
            if not ok:
                return self.reply(400, {"error": "invalid_request"})
            state["n"] += 1
            jag = "idjag-%d" % state["n"]
            state["jags"].add(jag)
        self.reply(200, {"access_token": jag, "issued_token_type": ID_JAG, "token_type": "N_A", "expires_in": 300})

    def jwt_bearer(self, form, auth):
        with lock:
            if auth != basic("as-client", "as-secret"):
                return self.reply(401, {"error": "invalid_client"})
            if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
                return self.reply(400, {"error": "unsupported_grant_type"})
            jag = form.get("assertion")
            if jag not in state["jags"]:
                return self.reply(400, {"error": "invalid_grant"})
            state["jags"].discard(jag)
            at = "access-tok-%d" % state["n"]
            state["access"].add(at)
        self.reply(200, {"access_token": at, "token_type": "Bearer", "expires_in": 3600})

    def mcp(self, raw):
        auth = self.headers.get("Authorization") or ""
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        with lock:
            ok = token in state["access"]
        if not ok:
            challenge = 'Bearer error="invalid_token", resource_metadata="%s/.well-known/oauth-protected-resource/mcp"' % BASE
            return self.reply(401, {"error": "invalid_token"}, {"WWW-Authenticate": challenge})
        msg = json.loads(raw or b"{}")
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            return self.reply(202)
        if method == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "protected", "version": "1"}}
            return self.reply(200, {"jsonrpc": "2.0", "id": mid, "result": result}, {"Mcp-Session-Id": "s1"})
        if method == "tools/list":
            result = {"tools": [{"name": "whoami", "description": "the bearer token it was called with",
                                 "inputSchema": {"type": "object", "properties": {}}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "token=%s" % token}]}
        else:
            result = {}
        self.reply(200, {"jsonrpc": "2.0", "id": mid, "result": result})


def main():
    global BASE
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    BASE = "http://127.0.0.1:%d" % server.server_address[1]
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
