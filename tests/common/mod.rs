//! Shared integration-test support: a turnstile server started in-process on port 0 against the
//! fake upstream, a small HTTP client, SSE parsing and the log checker.

pub mod binary;
pub mod console;
pub mod fixture_server;
pub mod logcheck;
pub mod mcp;
pub mod mcp_http;
pub mod mcp_python_sdk;
pub mod pair;
pub mod postgres;
pub mod provision;
pub mod requestcheck;
pub mod sse_stream;
pub mod stores;
pub mod tracing_capture;

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use turnstile::config::{Env, StoreBackendKind};
use turnstile::startup::{self, Running, StartOptions};
use turnstile::testkit::fake_openai::FakeOpenAi;

/// A server, its data folder and the fake upstream it talks to. With
/// `TURNSTILE_TEST_STORE=postgres-pair` and a PostgreSQL store, two instances behind a
/// round-robin proxy (`pair.rs`): `addr` and `http` are the proxy's, `running` the first
/// instance (data folder `data`), `second` the other (`data2`).
pub struct TestServer {
    pub running: Option<Running>,
    pub second: Option<Running>,
    proxy: Option<pair::RoundRobin>,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub http: Http,
}

/// The config of a test server: the fake upstream plus `extra` TOML (agents, policy, ...).
/// With `TURNSTILE_TEST_STORE=postgres` (or `postgres-pair`), on a fresh PostgreSQL database
/// (`postgres.rs`).
pub fn config_text(upstream: &FakeOpenAi, extra: &str) -> String {
    let store = if postgres::selected() {
        postgres::store_table()
    } else {
        String::new()
    };
    format!(
        r#"
[server]
data_dir = "data"
sandboxes = "sandboxes"

[upstream]
provider = "openai"
base_url = "{}"
model = "fake-model"
retries = 0

{extra}
{store}"#,
        upstream.base_url()
    )
}

impl TestServer {
    /// Start with this config text, in a new temporary folder.
    pub async fn start(config: &str) -> TestServer {
        Self::start_with_env(config, &[]).await
    }

    /// [`TestServer::start`] with these variables in the server's environment (see [`env`]).
    pub async fn start_with_env(config: &str, vars: &[(&str, &str)]) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in_with_env(dir, config, vars).await
    }

    /// Start with this config text in `dir` (to restart on the same data).
    pub async fn start_in(dir: tempfile::TempDir, config: &str) -> TestServer {
        Self::start_in_with_env(dir, config, &[]).await
    }

    /// [`TestServer::start_in`] with these variables in the server's environment.
    pub async fn start_in_with_env(
        dir: tempfile::TempDir,
        config: &str,
        vars: &[(&str, &str)],
    ) -> TestServer {
        let path = dir.path().join("tools.toml");
        std::fs::write(&path, config).expect("write config");
        let cfg =
            turnstile::config::load(&path, &env(vars)).unwrap_or_else(|e| panic!("config: {e}"));
        let paired = pair::selected() && cfg.store.backend == StoreBackendKind::Postgres;
        let running = start_one(cfg).await;
        let (second, proxy) = if paired {
            let mut cfg = turnstile::config::load(&path, &env(vars)).expect("config");
            cfg.server.data_dir = dir.path().join("data2");
            let second = start_one(cfg).await;
            let proxy = pair::RoundRobin::start([running.addr, second.addr]).await;
            (Some(second), Some(proxy))
        } else {
            (None, None)
        };
        let addr = proxy.as_ref().map_or(running.addr, |p| p.addr);
        TestServer {
            running: Some(running),
            second,
            proxy,
            addr,
            dir,
            http: Http::new(addr),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn engine(&self) -> &turnstile::engine::Engine {
        &self.running.as_ref().expect("running").engine
    }

    /// Stop gracefully (both instances of a pair) and keep the folder.
    pub async fn stop(mut self) -> tempfile::TempDir {
        self.proxy.take();
        let stop = |r: Option<Running>| async move {
            if let Some(r) = r {
                r.stop().await;
            }
        };
        tokio::join!(stop(self.running.take()), stop(self.second.take()));
        self.dir
    }

    /// Create a session with this body; its id.
    pub async fn session(&self, body: Value) -> String {
        let (status, v) = self.http.post("/sessions", &body).await;
        assert_eq!(status, 201, "create session: {v}");
        v["sessionId"].as_str().expect("sessionId").to_string()
    }

    /// POST `body` to `path` on a connection of its own, without reading the answer: the
    /// connection, for a test to drop (a client that goes away mid-request).
    pub async fn post_and_hold(&self, path: &str, body: &Value) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let body = body.to_string();
        let mut conn = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        conn.write_all(format!("{head}{body}").as_bytes())
            .await
            .expect("send the request");
        conn
    }

    /// Wait until the session's current turn has ended (through the engine's live feed). On a
    /// pair, until neither instance holds the session's lease (it is taken before a turn
    /// starts and kept while one runs, is queued, or a request waits for it in the inbox) and
    /// each has heard the log to its end (at most 60 s).
    pub async fn wait_idle(&self, session_id: &str) {
        let Some(second) = &self.second else {
            return wait_idle_on(self.engine(), session_id).await;
        };
        let engines = [self.engine(), &second.engine];
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let held = engines
                .iter()
                .any(|e| e.store().lease_mark(session_id).is_some());
            if !held
                && !behind(engines[0], session_id).await
                && !behind(engines[1], session_id).await
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{session_id}: not idle after 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// Whether the instance has the session in memory without the log's last events.
async fn behind(engine: &turnstile::engine::Engine, session_id: &str) -> bool {
    if !engine.in_memory(session_id).1 {
        return false; // read from the log when next asked for
    }
    let Ok(session) = engine
        .session(turnstile::engine::Reach::Every, session_id)
        .await
    else {
        return false;
    };
    let seen = session.tail().last().map_or(0, |e| e.seq);
    let newer = engine.store().events(session_id, seen, 1).await;
    !newer.expect("the log").is_empty()
}

/// [`TestServer::wait_idle`] on one instance.
async fn wait_idle_on(engine: &turnstile::engine::Engine, session_id: &str) {
    let session = engine
        .session(turnstile::engine::Reach::Every, session_id)
        .await
        .expect("session");
    let (_, mut rx) = session.subscribe();
    loop {
        if session.running_turn().is_none() {
            return;
        }
        match rx.recv().await {
            Ok(turnstile::engine::Feed::Event(ev)) if ev.body.is_terminal() => {}
            Ok(_) => continue,
            Err(_) => {}
        }
    }
}

/// Start an instance on port 0.
async fn start_one(cfg: turnstile::config::Config) -> Running {
    startup::start(cfg, "127.0.0.1:0".parse().unwrap(), StartOptions::default())
        .await
        .unwrap_or_else(|e| panic!("start: {e}"))
}

/// The environment a test server is given: this process's, the variables naming the test
/// databases ([`postgres::vars`]) and `vars` (API keys, secrets). The tests share one process,
/// so none of them sets a variable in it.
pub fn env(vars: &[(&str, &str)]) -> Env {
    Env::process()
        .with(postgres::vars())
        .with(vars.iter().copied())
}

/// A minimal HTTP client for tests.
#[derive(Clone)]
pub struct Http {
    pub base: String,
    client: Client<HttpConnector, Full<Bytes>>,
    pub bearer: Option<String>,
}

/// A parsed SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub event: String,
    pub data: Value,
    pub id: Option<String>,
}

impl Http {
    pub fn new(addr: SocketAddr) -> Http {
        Http {
            base: format!("http://{addr}"),
            client: Client::builder(TokioExecutor::new()).build_http(),
            bearer: None,
        }
    }

    pub fn with_key(&self, key: &str) -> Http {
        Http {
            bearer: Some(key.to_string()),
            ..self.clone()
        }
    }

    pub async fn request_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> hyper::Response<hyper::body::Incoming> {
        self.try_request_raw(method, path, body)
            .await
            .expect("request")
    }

    /// [`Http::request_raw`] that hands the client's error back (a server killed or not
    /// listening yet) instead of failing the test.
    pub async fn try_request_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path))
            .header("content-type", "application/json");
        if let Some(k) = &self.bearer {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .unwrap();
        self.client.request(req).await
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let resp = self
            .request_raw(method, path, body.map(|b| serde_json::to_vec(b).unwrap()))
            .await;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{method} {path}: not JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        (status, v)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call("POST", path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.call("DELETE", path, None).await
    }

    /// POST and read the whole SSE stream (it ends after `turn_stop`).
    pub async fn post_sse(&self, path: &str, body: &Value) -> Vec<Sse> {
        let resp = self
            .request_raw("POST", path, Some(serde_json::to_vec(body).unwrap()))
            .await;
        assert_eq!(resp.status(), 200, "SSE POST {path}");
        assert_eq!(
            resp.headers()["content-type"],
            "text/event-stream",
            "SSE content type"
        );
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        parse_sse(std::str::from_utf8(&bytes).expect("utf-8"))
    }
}

/// Parse an SSE text into events (comments skipped).
pub fn parse_sse(text: &str) -> Vec<Sse> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut event = None;
        let mut data = String::new();
        let mut id = None;
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event: ") {
                event = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            }
        }
        if let Some(event) = event {
            let data = serde_json::from_str(&data)
                .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data}"));
            out.push(Sse { event, data, id });
        }
    }
    out
}

/// The event names of a stream, in order.
pub fn names(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

/// The fake upstream and a test server on it with `extra` TOML (see [`config_text`]).
pub async fn setup(extra: &str) -> (FakeOpenAi, TestServer) {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config_text(&fake, extra)).await;
    (fake, server)
}
