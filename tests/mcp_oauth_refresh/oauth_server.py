"""An OAuth 2.1 authorization server and the MCP server it protects, on one loopback port
(standard library only), for tests/mcp/oauth_refresh.rs. Prints `PORT <n>` when listening.

- `/.well-known/oauth-protected-resource[/mcp]` (RFC 9728) names this origin as the
  authorization server; `/.well-known/oauth-authorization-server` (RFC 8414) its endpoints.
- `/register` (RFC 7591) registers a public client; `/authorize` approves at once and
  redirects with a code (PKCE S256 required); `/token` exchanges a code, or a refresh token
  (rotated: each is good once), for `at-<n>` / `rt-<n>` valid for an hour. Every token request is
  logged (`GET /control/log`).
- `POST /mcp` (streamable HTTP, JSON answers) wants a valid bearer token, else 401 with a
  `WWW-Authenticate` challenge; its tool `whoami` answers `token=<the bearer token>`.
- `POST /control/expire`: every access token issued so far stops working (as if expired);
  `POST /control/refuse_refresh`: refresh requests get `invalid_grant` from now on;
  `POST /control/short_once`: the next token issued is valid for 30 s only;
  `GET /control/rejected`: the bearer tokens `/mcp` refused so far.
"""

import base64
import hashlib
import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
state = {"n": 0, "access": set(), "refresh": set(), "codes": {}, "log": [], "refuse_refresh": False,
         "short": 0, "rejected": []}
BASE = ""


def issue():
    state["n"] += 1
    at, rt = "at-%d" % state["n"], "rt-%d" % state["n"]
    state["access"].add(at)
    state["refresh"].add(rt)
    lifetime = 30 if state["short"] else 3600
    state["short"] = 0
    return {"access_token": at, "refresh_token": rt, "token_type": "Bearer", "expires_in": lifetime, "scope": "tools"}


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
        url = urllib.parse.urlparse(self.path)
        if url.path.startswith("/.well-known/oauth-protected-resource"):
            self.reply(200, {"resource": BASE + "/mcp", "authorization_servers": [BASE], "scopes_supported": ["tools"]})
        elif url.path == "/.well-known/oauth-authorization-server":
            self.reply(200, {
                "issuer": BASE,
                "authorization_endpoint": BASE + "/authorize",
                "token_endpoint": BASE + "/token",
                "registration_endpoint": BASE + "/register",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
                "scopes_supported": ["tools"],
            })
        elif url.path == "/authorize":
            q = dict(urllib.parse.parse_qsl(url.query))
            if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
                return self.reply(400, {"error": "invalid_request", "error_description": "PKCE S256 required"})
            with lock:
                code = "code-%d" % (len(state["codes"]) + 1)
                state["codes"][code] = q
            sep = "&" if "?" in q["redirect_uri"] else "?"
            target = q["redirect_uri"] + sep + urllib.parse.urlencode({"code": code, "state": q.get("state", "")})
            self.reply(302, None, {"Location": target})
        elif url.path == "/control/log":
            with lock:
                self.reply(200, state["log"])
        elif url.path == "/control/rejected":
            with lock:
                self.reply(200, state["rejected"])
        else:
            self.reply(405 if url.path == "/mcp" else 404)

    def do_DELETE(self):
        self.reply(200)

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        raw = self.body()
        if url.path == "/register":
            meta = json.loads(raw or b"{}")
            self.reply(201, {"client_id": "client-1", "token_endpoint_auth_method": "none",
                             "redirect_uris": meta.get("redirect_uris", [])})
        elif url.path == "/token":
            self.token(dict(urllib.parse.parse_qsl(raw.decode())))
        elif url.path == "/control/expire":
            with lock:
                state["access"].clear()
            self.reply(200, {})
        elif url.path == "/control/short_once":
            with lock:
                state["short"] = 1
            self.reply(200, {})
        elif url.path == "/control/refuse_refresh":
            with lock:
                state["refuse_refresh"] = True
            self.reply(200, {})
        elif url.path == "/mcp":
            self.mcp(raw)
        else:
            self.reply(404)

    def token(self, form):
        grant = form.get("grant_type")
        with lock:
            state["log"].append({k: form.get(k) for k in ("grant_type", "refresh_token", "resource", "client_id")})
            if grant == "authorization_code":
                asked = state["codes"].pop(form.get("code"), None)
                verifier = form.get("code_verifier", "")
                digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
                if asked is None or digest != asked.get("code_challenge"):
                    return self.reply(400, {"error": "invalid_grant"})
                return self.reply(200, issue())
            if grant == "refresh_token":
                rt = form.get("refresh_token")
                if state["refuse_refresh"] or rt not in state["refresh"]:
                    return self.reply(400, {"error": "invalid_grant", "error_description": "the refresh token is not valid"})
                state["refresh"].discard(rt)
                return self.reply(200, issue())
        self.reply(400, {"error": "unsupported_grant_type"})

    def mcp(self, raw):
        auth = self.headers.get("Authorization") or ""
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        with lock:
            ok = token in state["access"]
            if not ok and token is not None:
                state["rejected"].append(token)
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
