//! A bare MCP client over streamable HTTP (raw hyper requests with the MCP headers), for tests
//! that open many `/mcp` sessions or look at one session's requests one by one.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

/// The protocol version it speaks (one with `Mcp-Session-Id` sessions).
pub const VERSION: &str = "2025-06-18";

/// A client of `http://ADDR/mcp`, its connections kept alive and shared by clones.
#[derive(Clone)]
pub struct McpHttp {
    url: String,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Sent as `Authorization: Bearer <key>`.
    key: Option<String>,
}

/// A response: its status, its `Mcp-Session-Id`, and the JSON-RPC message it carried (from a
/// JSON body or the last message of an SSE stream), if any.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub session: Option<String>,
    pub message: Option<Value>,
}

impl McpHttp {
    pub fn new(addr: std::net::SocketAddr) -> McpHttp {
        McpHttp {
            url: format!("http://{addr}/mcp"),
            client: Client::builder(TokioExecutor::new()).build_http(),
            key: None,
        }
    }

    /// This client sending `key` as its bearer key.
    pub fn with_key(&self, key: &str) -> McpHttp {
        McpHttp {
            key: Some(key.to_string()),
            ..self.clone()
        }
    }

    /// This client on `/mcp/<agent>`, sending `key` as its bearer key.
    pub fn agent_with_key(&self, agent: &str, key: &str) -> McpHttp {
        McpHttp {
            url: format!("{}/{agent}", self.url.trim_end_matches('/')),
            client: self.client.clone(),
            key: Some(key.to_string()),
        }
    }

    /// One request to `/mcp` in `session` (none: a request that opens one).
    pub async fn send(&self, method: &str, session: Option<&str>, body: Option<Value>) -> Answer {
        let mut req = http::Request::builder()
            .method(method)
            .uri(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(k) = &self.key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        if let Some(s) = session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", VERSION);
        }
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let resp = self
            .client
            .request(req.body(Full::new(Bytes::from(body))).expect("request"))
            .await
            .expect("an answer from /mcp");
        let status = resp.status().as_u16();
        let session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        let message = serde_json::from_str(&text).ok().or_else(|| {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .next_back()
        });
        Answer {
            status,
            session,
            message,
        }
    }

    /// `initialize` and `notifications/initialized`: a new session's id.
    pub async fn open(&self) -> String {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": VERSION, "capabilities": {},
            "clientInfo": {"name": "turnstile-tests", "version": "0"}}});
        let a = self.send("POST", None, Some(init)).await;
        assert_eq!(a.status, 200, "initialize: {a:?}");
        let id = a.session.expect("an Mcp-Session-Id");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let a = self.send("POST", Some(&id), Some(note)).await;
        assert_eq!(a.status, 202, "notifications/initialized: {a:?}");
        id
    }

    /// A request `method` with `params` in `session`: the JSON-RPC response.
    pub async fn call(&self, session: &str, method: &str, params: Value) -> Answer {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        self.send("POST", Some(session), Some(body)).await
    }

    /// `DELETE /mcp`: the status.
    pub async fn delete(&self, session: &str) -> u16 {
        self.send("DELETE", Some(session), None).await.status
    }

    /// Open `n` sessions, `concurrency` at a time.
    pub async fn open_many(&self, n: usize, concurrency: usize) -> Vec<String> {
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..concurrency {
            let me = self.clone();
            let mine = n / concurrency + usize::from(w < n % concurrency);
            tasks.spawn(async move {
                let mut ids = Vec::with_capacity(mine);
                for _ in 0..mine {
                    ids.push(me.open().await);
                }
                ids
            });
        }
        let mut all = Vec::with_capacity(n);
        while let Some(ids) = tasks.join_next().await {
            all.extend(ids.expect("an opening task"));
        }
        all
    }

    /// Delete `ids`, `concurrency` at a time; each must succeed.
    pub async fn delete_many(&self, ids: &[String], concurrency: usize) {
        let mut tasks = tokio::task::JoinSet::new();
        for chunk in ids.chunks(ids.len().div_ceil(concurrency).max(1)) {
            let (me, chunk) = (self.clone(), chunk.to_vec());
            tasks.spawn(async move {
                for id in chunk {
                    let status = me.delete(&id).await;
                    assert!((200..300).contains(&status), "DELETE {id}: {status}");
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("a deleting task");
        }
    }
}
