//! Property tests over hostile input (issue 16, "Fuzzing"): random and structure-aware bodies for
//! every JSON endpoint a client writes to, `tool_permission` sequences, `Last-Event-ID` and
//! `?after=` cursors, multipart uploads (random boundaries, headers, truncated streams) and
//! `tools.toml` text.
//!
//! The property, for every request: the server answers (no panic, no hang), every non-2xx answer
//! is a 4xx with a JSON `{"error": {"type", "message"}}` (never a 5xx for bad input), and a valid
//! request afterwards still works. Each test runs one in-process server against the fake
//! upstream and sends raw HTTP/1.1 over TCP, so that any bytes can be sent. Pure parsers (config
//! loading, the SSE parser, message content) get more cases directly.
//!
//! Cases are drawn afresh each run (no seed file is written); a failure prints the input.
//! `PROPTEST_CASES` scales every test's case count (default 1: the counts below).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

use crate::common::{config_text, logcheck::check_log, TestServer};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// Panics on the server's threads (the workers of a [`Harness`]'s runtime, named
/// [`SERVER_THREADS`]; the other tests of the binary run on threads of their own): a handler that
/// panics may still leave an answer (a 500 from a task whose reply was dropped) or none at all,
/// so they are counted here.
static SERVER_PANICS: AtomicUsize = AtomicUsize::new(0);

/// The name of the fuzzed server's threads.
const SERVER_THREADS: &str = "fuzz-inputs-server";

fn count_server_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current()
                .name()
                .is_some_and(|n| n == SERVER_THREADS)
            {
                SERVER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info)
        }));
    });
}

/// How many cases: `n` times `PROPTEST_CASES` (default 1).
fn cases(n: u32) -> u32 {
    let scale: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    n.saturating_mul(scale.max(1))
}

fn runner(n: u32) -> TestRunner {
    TestRunner::new(Config {
        cases: cases(n),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    })
}

/// Run a property: a failure shows the (shrunk) input and why.
fn check<S: Strategy>(
    mut runner: TestRunner,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// One server against the fake upstream, on a runtime of its own (the property closures are
/// synchronous).
struct Harness {
    server: Option<TestServer>,
    /// How many answers of each status the fuzzed requests got (printed at the end, to see
    /// that the strategies reach past the parser: `--nocapture`).
    statuses: std::sync::Mutex<std::collections::BTreeMap<u16, u32>>,
    fake: FakeOpenAi,
    rt: tokio::runtime::Runtime,
}

impl Harness {
    fn new(extra: &str) -> Harness {
        count_server_panics();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(SERVER_THREADS)
            .enable_all()
            .build()
            .expect("runtime");
        let (fake, server) = rt.block_on(async {
            let fake = FakeOpenAi::start().await;
            fake.record_requests(false);
            fake.set_fallback(Reply::text("ok"));
            let server = TestServer::start(&config_text(&fake, extra)).await;
            (fake, server)
        });
        Harness {
            server: Some(server),
            statuses: Default::default(),
            fake,
            rt,
        }
    }

    fn server(&self) -> &TestServer {
        self.server.as_ref().expect("server")
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// One raw exchange (see [`exchange`]).
    fn send(&self, req: Req) -> Option<Answer> {
        self.block_on(exchange(self.server().addr, req))
    }

    /// A JSON request that must succeed: its status and body.
    fn ok(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let req = if body.is_null() {
            Req::new(method, path, vec![])
        } else {
            Req::json(method, path, body)
        };
        let a = self
            .send(req)
            .unwrap_or_else(|| panic!("{method} {path}: no answer"));
        let v = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        assert!(
            (200..300).contains(&a.status),
            "{method} {path} {body}: {} {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        );
        (a.status, v)
    }

    fn session(&self, body: &Value) -> String {
        let (_, v) = self.ok("POST", "/sessions", body);
        v["sessionId"].as_str().expect("sessionId").to_string()
    }

    /// A plain user turn answers 200 `end_turn`: the server and the session still work.
    fn assert_turn_works(&self, sid: &str) -> Result<(), TestCaseError> {
        let (_, v) = self.ok(
            "POST",
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "still there?"}]}),
        );
        prop_assert_eq!(&v["stopReason"], "end_turn", "{}", v);
        Ok(())
    }

    /// Count a fuzzed request's answer (with `FUZZ_MESSAGES` set, print its error message).
    fn record(&self, a: &Answer) {
        *self.statuses.lock().unwrap().entry(a.status).or_default() += 1;
        if std::env::var("FUZZ_MESSAGES").is_ok() && a.status >= 400 {
            let v: Value = serde_json::from_slice(&a.body).unwrap_or_default();
            let m = v["error"]["message"].as_str().unwrap_or("");
            eprintln!("{} {}", a.status, m.chars().take(70).collect::<String>());
        }
    }

    /// No server thread panicked so far.
    fn assert_no_panic(&self) -> Result<(), TestCaseError> {
        let n = SERVER_PANICS.load(Ordering::SeqCst);
        prop_assert_eq!(n, 0, "a server thread panicked (see the test's stderr)");
        Ok(())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        eprintln!(
            "statuses of the fuzzed requests: {:?}",
            self.statuses.lock().unwrap()
        );
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.stop());
        }
    }
}

/// A raw HTTP/1.1 request.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// `Content-Length` to declare (default: the body's length). Larger than the body: the
    /// client sends what it has and closes its side (a truncated upload).
    declared: Option<usize>,
    /// Read only the status and headers (a stream that follows live never ends).
    head_only: bool,
}

impl Req {
    fn new(method: &str, path: &str, body: Vec<u8>) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            headers: vec![],
            body,
            declared: None,
            head_only: false,
        }
    }

    fn json(method: &str, path: &str, body: &Value) -> Req {
        Req::new(method, path, body.to_string().into_bytes())
            .header("content-type", b"application/json")
    }

    fn header(mut self, name: &str, value: &[u8]) -> Req {
        self.headers.push((name.into(), value.to_vec()));
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "{} {} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-length: {}\r\n",
            self.method,
            self.path,
            self.declared.unwrap_or(self.body.len())
        )
        .into_bytes();
        for (k, v) in &self.headers {
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Send `req` on a new connection and read the answer (to the end: the request says
/// `connection: close`). `None` when the server closed the connection without answering.
/// A server that does not answer within 20 s fails the test.
async fn exchange(addr: std::net::SocketAddr, req: Req) -> Option<Answer> {
    let fut = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        // The server may answer (and close) before taking the whole body: not an error.
        let _ = conn.write_all(&req.bytes()).await;
        if req.declared.is_some_and(|d| d > req.body.len()) {
            let _ = conn.shutdown().await;
        }
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if req.head_only && find(&buf, b"\r\n\r\n").is_some() {
                break;
            }
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf
    };
    let raw = tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("no answer within 20 s to {} {}", req.method, req.path));
    parse_answer(&raw)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_answer(raw: &[u8]) -> Option<Answer> {
    let end = find(raw, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).expect("response head is ASCII");
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status: u16 = status_line.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Some(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = find(b, b"\r\n") {
        let size_text = std::str::from_utf8(&b[..eol]).unwrap_or("0");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        let stop = (start + size).min(b.len());
        out.extend_from_slice(&b[start..stop]);
        b = b.get(stop + 2..).unwrap_or(&[]);
    }
    out
}

/// The property every answer keeps: never a 5xx, and a non-2xx is a 4xx whose body is
/// `{"error": {"type": "<snake_case>", "message": "<non-empty>"}}`.
fn check_answer(what: &str, a: &Answer) -> Result<(), TestCaseError> {
    let body = String::from_utf8_lossy(&a.body);
    prop_assert!(a.status < 500, "{what}: {} {body}", a.status);
    prop_assert!(a.status >= 200, "{what}: {} {body}", a.status);
    if a.status < 300 {
        return Ok(());
    }
    prop_assert!(a.status < 500, "{what}: {} {body}", a.status);
    let v: Value = serde_json::from_slice(&a.body)
        .map_err(|e| TestCaseError::fail(format!("{what}: {} not JSON ({e}): {body}", a.status)))?;
    let kind = v["error"]["type"].as_str().unwrap_or("");
    let message = v["error"]["message"].as_str().unwrap_or("");
    prop_assert!(
        !kind.is_empty()
            && kind
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit()),
        "{what}: error.type {kind:?}: {body}"
    );
    prop_assert!(!message.is_empty(), "{what}: empty error.message: {body}");
    Ok(())
}

/// Send and check: there must be an answer, and it keeps the property.
fn send_checked(h: &Harness, what: &str, req: Req) -> Result<Answer, TestCaseError> {
    let a = h.send(req).ok_or_else(|| {
        TestCaseError::fail(format!("{what}: the server closed without answering"))
    })?;
    h.record(&a);
    check_answer(what, &a)?;
    h.assert_no_panic()?;
    Ok(a)
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------
//
// Structure-aware generators make mostly well-formed values, with one thing wrong now and then
// (a field of the wrong type, an unknown field, a word the server gives meaning to), so that
// most requests get past the parser and reach the engine; `any_json` and raw bytes cover the rest.

/// Short text: plain, unicode, empty, or one of the words the server gives meaning to.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-zA-Z0-9 _.-]{1,12}",
        2 => any::<String>().prop_map(|s| s.chars().take(16).collect()),
        1 => Just(String::new()),
        2 => select(vec![
            "assistant", "call_0", "call_1", "lookup", "deliver_file", "*", "on", "off", "model",
            "thinking", "user", "tool", "\u{202e}gnp.exe", "\0", "evt_", "file_", "sess_",
            "../../etc/passwd", "mcp__x__y", "a\nb",
        ])
        .prop_map(str::to_string),
    ]
    .boxed()
}

/// Any JSON value, with the keys the API reads over-represented.
fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        text().prop_map(Value::String),
    ];
    let key = prop_oneof![
        3 => select(vec![
            "role", "content", "messages", "agent", "stream", "tools", "type", "text", "toolCallId",
            "granted", "reason", "name", "trust", "options", "parameters", "inputSchema", "goal",
            "max_steps", "system_prompt", "files", "skills", "turn_id", "isError", "url", "input",
            "thinking", "description", "title", "plan", "edits",
        ])
        .prop_map(str::to_string),
        1 => text(),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
    .boxed()
}

/// `good`, or now and then any JSON value in its place.
fn or_junk(good: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    prop_oneof![24 => good, 1 => any_json()].boxed()
}

/// An object from optional fields, maybe with one unknown field more.
fn object(fields: Vec<(&'static str, Option<Value>)>, extra: Option<(String, Value)>) -> Value {
    let mut m = Map::new();
    for (k, v) in fields {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    }
    if let Some((k, v)) = extra {
        m.insert(k, v);
    }
    Value::Object(m)
}

/// Now and then an unknown field.
fn extra_field() -> BoxedStrategy<Option<(String, Value)>> {
    prop::option::weighted(0.03, (text(), any_json())).boxed()
}

fn image_url() -> BoxedStrategy<String> {
    prop_oneof![
        4 => Just("https://example.com/a.png".to_string()),
        4 => Just("data:image/png;base64,iVBORw0KGgo=".to_string()),
        1 => Just("data:".to_string()),
        1 => Just("http://[::1".to_string()),
        1 => Just("file:///etc/passwd".to_string()),
        1 => text(),
    ]
    .boxed()
}

fn block() -> BoxedStrategy<Value> {
    prop_oneof![
        12 => (text(), extra_field()).prop_map(|(t, x)| object(vec![("type", Some(json!("text"))), ("text", Some(json!(t)))], x)),
        4 => image_url().prop_map(|u| json!({"type": "image", "url": u})),
        1 => text().prop_map(|t| json!({"type": "thinking", "thinking": t})),
        1 => (text(), text(), any_json()).prop_map(|(id, n, i)| json!({"type": "tool_use", "toolCallId": id, "name": n, "input": i})),
        1 => (text(), any_json()).prop_map(|(t, v)| json!({"type": t, "text": v})),
    ]
    .boxed()
}

fn content() -> BoxedStrategy<Value> {
    or_junk(
        prop_oneof![
            3 => text().prop_map(Value::String),
            2 => vec(block(), 0..4).prop_map(Value::Array),
        ]
        .boxed(),
    )
}

fn call_id() -> BoxedStrategy<String> {
    prop_oneof![
        6 => select(vec!["call_0", "call_1", "call_2", "call_3"]).prop_map(str::to_string),
        1 => text(),
    ]
    .boxed()
}

fn user_message() -> BoxedStrategy<Value> {
    (content(), extra_field())
        .prop_map(|(c, x)| object(vec![("role", Some(json!("user"))), ("content", Some(c))], x))
        .boxed()
}

/// A client's tool result.
fn tool_message(id: BoxedStrategy<String>) -> BoxedStrategy<Value> {
    (
        id,
        content(),
        prop::option::weighted(0.3, or_junk(any::<bool>().prop_map(Value::Bool).boxed())),
        extra_field(),
    )
        .prop_map(|(id, c, e, x)| {
            object(
                vec![
                    ("role", Some(json!("tool"))),
                    ("toolCallId", Some(json!(id))),
                    ("content", Some(c)),
                    ("isError", e),
                ],
                x,
            )
        })
        .boxed()
}

/// A client's permission for a paused call.
fn permission_message(id: BoxedStrategy<String>) -> BoxedStrategy<Value> {
    (
        id,
        or_junk(any::<bool>().prop_map(Value::Bool).boxed()),
        prop::option::of(text()),
        extra_field(),
    )
        .prop_map(|(id, g, r, x)| {
            object(
                vec![
                    ("role", Some(json!("tool_permission"))),
                    ("toolCallId", Some(json!(id))),
                    ("granted", Some(g)),
                    ("reason", r.map(Value::String)),
                ],
                x,
            )
        })
        .boxed()
}

/// A message of a turn request: user, tool, tool_permission, the roles a turn may not carry, or
/// nonsense.
fn turn_message() -> BoxedStrategy<Value> {
    let role_other = prop_oneof![
        select(vec!["system", "assistant", "developer", "User", ""]).prop_map(str::to_string),
        text()
    ];
    prop_oneof![
        6 => user_message(),
        3 => tool_message(call_id()),
        3 => permission_message(call_id()),
        1 => (role_other, content()).prop_map(|(r, c)| json!({"role": r, "content": c})),
        1 => any_json(),
    ]
    .boxed()
}

fn tool_spec() -> BoxedStrategy<Value> {
    let schema = or_junk(
        prop_oneof![
            Just(json!({"type": "object", "properties": {"q": {"type": "string"}}})),
            Just(json!({})),
            Just(json!({"type": "object"})),
        ]
        .boxed(),
    );
    (
        prop_oneof![
            6 => "[a-z][a-z_]{0,11}",
            1 => select(vec!["lookup", "deliver_file", "get_weather", ""]).prop_map(str::to_string),
            1 => text()
        ],
        prop::option::of(text()),
        prop::option::of(schema),
        any::<bool>(),
        prop::option::weighted(0.2, text()),
        extra_field(),
    )
        .prop_map(|(name, description, schema, alias, title, x)| {
            let schema_key = if alias { "inputSchema" } else { "parameters" };
            object(
                vec![
                    ("name", Some(json!(name))),
                    ("description", description.map(Value::String)),
                    (schema_key, schema),
                    ("title", title.map(Value::String)),
                ],
                x,
            )
        })
        .boxed()
}

fn tools() -> BoxedStrategy<Value> {
    or_junk(vec(tool_spec(), 0..3).prop_map(Value::Array).boxed())
}

fn agent_object() -> BoxedStrategy<Value> {
    let grant = (
        prop_oneof![
            4 => select(vec!["deliver_file", "lookup"]).prop_map(str::to_string),
            1 => text()
        ],
        or_junk(any::<bool>().prop_map(Value::Bool).boxed()),
    )
        .prop_map(|(n, t)| json!({"name": n, "trust": t}));
    let option = prop_oneof![
        4 => select(vec!["on", "off"]).prop_map(|v| ("thinking".to_string(), json!(v))),
        4 => select(vec!["fake-model", "other-model"]).prop_map(|v| ("model".to_string(), json!(v))),
        1 => (select(vec!["thinking", "model"]).prop_map(str::to_string), or_junk(text().prop_map(Value::String).boxed())),
        1 => (text(), any_json()),
    ];
    let options = vec(option, 0..3).prop_map(|kv| Value::Object(kv.into_iter().collect()));
    (
        prop::option::weighted(
            0.7,
            or_junk(
                prop_oneof![8 => Just(json!("assistant")), 1 => text().prop_map(Value::String)]
                    .boxed(),
            ),
        ),
        prop::option::of(or_junk(vec(grant, 0..3).prop_map(Value::Array).boxed())),
        prop::option::of(or_junk(options.boxed())),
        extra_field(),
    )
        .prop_map(|(name, tools, options, x)| {
            object(
                vec![("name", name), ("tools", tools), ("options", options)],
                x,
            )
        })
        .boxed()
}

fn stream_mode() -> BoxedStrategy<Value> {
    or_junk(
        prop_oneof![
            12 => select(vec!["delta", "message", "none"]).prop_map(|s| json!(s)),
            1 => text().prop_map(Value::String),
        ]
        .boxed(),
    )
}

/// A structure-aware AAP turn request (for a session that waits for nothing: mostly one user
/// message).
fn turn_body() -> BoxedStrategy<Value> {
    let messages = prop_oneof![
        8 => user_message().prop_map(|m| json!([m])),
        3 => vec(turn_message(), 0..4).prop_map(Value::Array),
        1 => any_json(),
    ];
    (
        prop::option::weighted(0.3, agent_object()),
        prop::option::weighted(0.7, stream_mode()),
        prop::option::weighted(0.97, messages),
        prop::option::weighted(0.3, tools()),
        extra_field(),
    )
        .prop_map(|(agent, stream, messages, tools, x)| {
            object(
                vec![
                    ("agent", agent),
                    ("stream", stream),
                    ("messages", messages),
                    ("tools", tools),
                ],
                x,
            )
        })
        .boxed()
}

/// A seed (history) message for `POST /sessions`.
fn history_message() -> BoxedStrategy<Value> {
    prop_oneof![
        2 => text().prop_map(|t| json!({"role": "system", "content": t})),
        1 => content().prop_map(|c| json!({"role": "system", "content": c})),
        4 => content().prop_map(|c| json!({"role": "user", "content": c})),
        4 => content().prop_map(|c| json!({"role": "assistant", "content": c})),
        3 => (call_id(), content()).prop_map(|(id, c)| json!({"role": "tool", "toolCallId": id, "content": c})),
        1 => turn_message(),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Properties over the HTTP API
// ---------------------------------------------------------------------------------------------

const AGENT: &str = "[agents.assistant]\nmodels = [\"fake-model\", \"other-model\"]\n\n[policy]\ndefault = \"ask\"\n";

/// What a body is made of: a JSON value, or raw bytes (not JSON at all, or cut short).
#[derive(Debug, Clone)]
enum Body {
    Json(Value),
    Raw(Vec<u8>),
}

impl Body {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Body::Json(v) => v.to_string().into_bytes(),
            Body::Raw(b) => b.clone(),
        }
    }
}

/// `structured` most of the time, else any JSON value, raw bytes, or a JSON text cut short.
fn body_of(structured: BoxedStrategy<Value>) -> BoxedStrategy<Body> {
    prop_oneof![
        12 => structured.clone().prop_map(Body::Json),
        2 => any_json().prop_map(Body::Json),
        1 => vec(any::<u8>(), 0..64).prop_map(Body::Raw),
        1 => (structured, any::<prop::sample::Index>()).prop_map(|(v, i)| {
            let s = v.to_string().into_bytes();
            let cut = i.index(s.len() + 1);
            Body::Raw(s[..cut].to_vec())
        }),
    ]
    .boxed()
}

#[test]
fn turn_bodies_never_break_the_server() {
    let h = Harness::new(AGENT);
    let shared = h.session(&json!({"tools": [{"name": "lookup", "description": "a client tool"}]}));
    check(runner(160), body_of(turn_body()), |body| {
        // A fresh session for a structured body (it may change the session's tools and options),
        // the shared one for the rest.
        let sid = match &body {
            Body::Json(v) if v.get("messages").is_some() => h.session(&json!({})),
            _ => shared.clone(),
        };
        let path = format!("/sessions/{sid}/turns");
        let req = Req::new("POST", &path, body.bytes()).header("content-type", b"application/json");
        let a = send_checked(&h, &format!("POST {path} {body:?}"), req)?;
        if a.status == 200 && a.header("content-type") == Some("text/event-stream") {
            let text = String::from_utf8_lossy(&a.body);
            prop_assert!(
                text.contains("event: turn_stop"),
                "a streamed turn ends with turn_stop: {text}"
            );
        }
        h.assert_turn_works(&sid)
    });
    h.block_on(async {
        check_log(h.server().engine().store(), &shared).await;
    });
}

/// `tool_permission` (and tool result) sequences against a turn stopped on client and `ask`
/// calls: every answer keeps the property; afterwards, answering what is still open and a new
/// user turn work, and the log keeps its guarantees (every tool use has one result).
#[test]
fn tool_permission_sequences_never_break_a_session() {
    let h = Harness::new(AGENT);
    #[derive(Debug, Clone)]
    enum Kind {
        Client,
        Ask,
    }
    let calls = vec(prop_oneof![Just(Kind::Client), Just(Kind::Ask)], 1..4);
    // One answer: for call_<n> (call_3 is never a call), of the kind the call needs or not,
    // made as a tool result or as a permission (the id is set when the calls are known).
    let answer = (
        0usize..4,
        prop::bool::weighted(0.85),
        tool_message(Just("?".to_string()).boxed()),
        permission_message(Just("?".to_string()).boxed()),
    );
    #[derive(Debug, Clone)]
    enum Step {
        /// Answers for some ids (maybe twice, maybe unknown ones).
        Answers(Vec<(usize, bool, Value, Value)>),
        /// One answer for every call, maybe in reverse order.
        Complete(Vec<(usize, bool, Value, Value)>, bool),
        Body(Value),
    }
    let step = prop_oneof![
        4 => vec(answer.clone(), 1..5).prop_map(Step::Answers),
        6 => (vec(answer, 4), any::<bool>()).prop_map(|(a, rev)| Step::Complete(a, rev)),
        1 => vec(turn_message(), 1..4).prop_map(|m| Step::Body(json!({"messages": m}))),
        1 => turn_body().prop_map(Step::Body),
    ];
    check(runner(40), (calls, vec(step, 1..4)), |(calls, steps)| {
        let sid =
            h.session(&json!({"tools": [{"name": "lookup", "description": "a client tool"}]}));
        let script: Vec<(String, &str, Value)> = calls
            .iter()
            .enumerate()
            .map(|(i, k)| match k {
                Kind::Client => (format!("call_{i}"), "lookup", json!({"q": "x"})),
                Kind::Ask => (
                    format!("call_{i}"),
                    "deliver_file",
                    json!({"path": "missing.txt"}),
                ),
            })
            .collect();
        let script: Vec<(&str, &str, Value)> = script
            .iter()
            .map(|(id, n, i)| (id.as_str(), *n, i.clone()))
            .collect();
        h.fake.push(Reply::tool_calls(&script));
        let turns = format!("/sessions/{sid}/turns");
        let (_, v) = h.ok(
            "POST",
            &turns,
            &json!({"messages": [{"role": "user", "content": "go"}]}),
        );
        prop_assert_eq!(&v["stopReason"], "tool_use", "{}", v);
        let bodies: Vec<Value> = steps
            .iter()
            .map(|step| match step {
                Step::Body(b) => b.clone(),
                Step::Answers(_) | Step::Complete(..) => {
                    let answers: Vec<(usize, bool, Value, Value)> = match step {
                        Step::Complete(a, reverse) => {
                            let mut a: Vec<_> = a
                                .iter()
                                .take(calls.len())
                                .enumerate()
                                .map(|(n, (_, k, t, p))| (n, *k, t.clone(), p.clone()))
                                .collect();
                            if *reverse {
                                a.reverse();
                            }
                            a
                        }
                        Step::Answers(a) => a.clone(),
                        Step::Body(_) => unreachable!(),
                    };
                    let messages: Vec<Value> = answers
                        .iter()
                        .map(|(n, right_kind, tool, permission)| {
                            let is_client = matches!(calls.get(*n), Some(Kind::Client) | None);
                            let mut m = if is_client == *right_kind {
                                tool.clone()
                            } else {
                                permission.clone()
                            };
                            if let Some(o) = m.as_object_mut() {
                                o.insert("toolCallId".into(), json!(format!("call_{n}")));
                            }
                            m
                        })
                        .collect();
                    json!({"messages": messages, "stream": "message"})
                }
            })
            .collect();
        for body in &bodies {
            let req = Req::json("POST", &turns, body);
            let a = send_checked(&h, &format!("POST {turns} {body}"), req)?;
            if a.header("content-type") == Some("text/event-stream") {
                let text = String::from_utf8_lossy(&a.body);
                prop_assert!(text.contains("event: turn_stop"), "{text}");
            }
        }
        // Answer whatever is still open, then a plain turn works.
        let (_, info) = h.ok("GET", &format!("/sessions/{sid}"), &Value::Null);
        let answers: Vec<Value> = info["pending"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|p| {
                let id = &p["toolCallId"];
                if p["kind"] == "client" {
                    json!({"role": "tool", "toolCallId": id, "content": "done"})
                } else {
                    json!({"role": "tool_permission", "toolCallId": id, "granted": false})
                }
            })
            .collect();
        if !answers.is_empty() {
            let (_, v) = h.ok("POST", &turns, &json!({"messages": answers}));
            prop_assert_eq!(&v["stopReason"], "end_turn", "{}", v);
        }
        let (_, info) = h.ok("GET", &format!("/sessions/{sid}"), &Value::Null);
        prop_assert_eq!(&info["status"], "idle", "{}", info);
        h.assert_turn_works(&sid)?;
        h.block_on(async {
            check_log(h.server().engine().store(), &sid).await;
        });
        h.assert_no_panic()
    });
}

#[test]
fn session_bodies_never_break_the_server() {
    let h = Harness::new(AGENT);
    let create = (
        prop::option::weighted(0.4, agent_object()),
        prop::option::weighted(
            0.6,
            or_junk(vec(history_message(), 0..4).prop_map(Value::Array).boxed()),
        ),
        prop::option::weighted(0.4, tools()),
        prop::option::weighted(0.2, stream_mode()),
        extra_field(),
    )
        .prop_map(|(agent, messages, tools, stream, x)| {
            object(
                vec![
                    ("agent", agent),
                    ("messages", messages),
                    ("tools", tools),
                    ("stream", stream),
                ],
                x,
            )
        })
        .boxed();
    check(runner(150), body_of(create), |body| {
        let req =
            Req::new("POST", "/sessions", body.bytes()).header("content-type", b"application/json");
        let a = send_checked(&h, &format!("POST /sessions {body:?}"), req)?;
        let sid = if a.status == 201 {
            // What was accepted must be usable: a turn on it answers.
            let v: Value = serde_json::from_slice(&a.body).expect("JSON");
            v["sessionId"].as_str().expect("sessionId").to_string()
        } else {
            h.session(&json!({}))
        };
        let path = format!("/sessions/{sid}/turns");
        let req = Req::json(
            "POST",
            &path,
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        );
        let a = send_checked(&h, &format!("first turn after {body:?}"), req)?;
        prop_assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
        Ok(())
    });
}

#[test]
fn run_bodies_never_break_the_server() {
    let h = Harness::new(AGENT);
    let run = (
        prop::option::weighted(0.97, or_junk(text().prop_map(Value::String).boxed())),
        prop::option::weighted(0.3, or_junk(text().prop_map(Value::String).boxed())),
        prop::option::weighted(
            0.4,
            prop_oneof![
                8 => (0u64..6).prop_map(|n| json!(n)),
                1 => any::<i64>().prop_map(|n| json!(n)),
                1 => any::<u64>().prop_map(|n| json!(n)),
                1 => any_json()
            ],
        ),
        extra_field(),
    )
        .prop_map(|(goal, system_prompt, max_steps, x)| {
            object(
                vec![
                    ("goal", goal),
                    ("system_prompt", system_prompt),
                    ("max_steps", max_steps),
                ],
                x,
            )
        })
        .boxed();
    check(runner(100), body_of(run), |body| {
        let req =
            Req::new("POST", "/run", body.bytes()).header("content-type", b"application/json");
        send_checked(&h, &format!("POST /run {body:?}"), req)?;
        let (_, v) = h.ok("POST", "/run", &json!({"goal": "still there?"}));
        prop_assert_eq!(&v["status"], "finished", "{}", v);
        Ok(())
    });
}

#[test]
fn message_bodies_never_break_the_server() {
    let h = Harness::new(AGENT);
    let file_id = {
        let a = h
            .send(Req::new(
                "POST",
                "/files?filename=note.txt",
                b"a note".to_vec(),
            ))
            .expect("upload");
        assert_eq!(a.status, 201);
        let v: Value = serde_json::from_slice(&a.body).unwrap();
        v["id"].as_str().unwrap().to_string()
    };
    let file = prop_oneof![
        12 => Just(json!(file_id.clone())),
        1 => Just(json!("file_00000000000000000000000000")),
        1 => text().prop_map(Value::String),
        1 => any_json(),
    ];
    let message = (
        prop::option::weighted(0.95, content()),
        prop::option::weighted(0.4, or_junk(vec(file, 0..4).prop_map(Value::Array).boxed())),
        prop::option::weighted(
            0.3,
            or_junk(
                vec(
                    prop_oneof![8 => Just(json!({"id": "s1", "name": "skill"})), 1 => any_json()],
                    0..3,
                )
                .prop_map(Value::Array)
                .boxed(),
            ),
        ),
        extra_field(),
    )
        .prop_map(|(content, files, skills, x)| {
            object(
                vec![("content", content), ("files", files), ("skills", skills)],
                x,
            )
        })
        .boxed();
    check(runner(120), body_of(message), |body| {
        let sid = h.session(&json!({}));
        let path = format!("/sessions/{sid}/messages");
        let req = Req::new("POST", &path, body.bytes()).header("content-type", b"application/json");
        send_checked(&h, &format!("POST {path} {body:?}"), req)?;
        let (status, v) = h.ok("POST", &path, &json!({"content": "still there?"}));
        prop_assert_eq!(status, 202, "{}", v);
        h.block_on(h.server().wait_idle(&sid));
        Ok(())
    });
}

/// A cursor as a client might send it: a real event id, one mangled, or anything at all.
#[derive(Debug, Clone)]
enum Cursor {
    Real(prop::sample::Index),
    Mangled(prop::sample::Index, prop::sample::Index, String),
    Bytes(Vec<u8>),
    Text(String),
}

#[derive(Debug, Clone)]
enum Place {
    /// `Last-Event-ID` on `events/stream`.
    Header,
    /// `?after=` on `events/stream`.
    StreamQuery,
    /// `?after=` (and maybe `limit`) on `events/history`.
    HistoryQuery(Option<String>),
}

fn percent_encode(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if c.is_ascii_alphanumeric() || b"-_.~".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

#[test]
fn event_cursors_never_break_the_server() {
    let h = Harness::new(AGENT);
    let sid = h.session(&json!({}));
    for _ in 0..2 {
        h.ok(
            "POST",
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        );
    }
    let (_, v) = h.ok(
        "GET",
        &format!("/sessions/{sid}/events/history"),
        &Value::Null,
    );
    let ids: Vec<String> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.len() >= 6, "{v}");
    // Header bytes a client can send: tab, visible ASCII and obs-text (no CR, LF or NUL).
    let header_byte = prop_oneof![
        8 => 0x20u8..0x7f,
        1 => Just(b'\t'),
        2 => 0x80u8..=0xff,
    ];
    let cursor = prop_oneof![
        3 => any::<prop::sample::Index>().prop_map(Cursor::Real),
        3 => (any::<prop::sample::Index>(), any::<prop::sample::Index>(), "[a-zA-Z0-9_ %]{0,3}")
            .prop_map(|(i, j, s)| Cursor::Mangled(i, j, s)),
        2 => vec(header_byte, 0..40).prop_map(Cursor::Bytes),
        2 => prop_oneof![text(), "evt_[0-9a-zA-Z]{0,30}"].prop_map(Cursor::Text),
    ];
    let place = prop_oneof![
        Just(Place::Header),
        Just(Place::StreamQuery),
        prop::option::of(prop_oneof!["[0-9]{1,4}".prop_map(String::from), text()])
            .prop_map(Place::HistoryQuery),
    ];
    check(runner(200), (cursor, place), |(cursor, place)| {
        let value: Vec<u8> = match &cursor {
            Cursor::Real(i) => ids[i.index(ids.len())].clone().into_bytes(),
            Cursor::Mangled(i, j, s) => {
                let id = &ids[i.index(ids.len())];
                let cut = j.index(id.len() + 1);
                format!("{}{s}", &id[..cut]).into_bytes()
            }
            Cursor::Bytes(b) => b.clone(),
            Cursor::Text(t) => t.clone().into_bytes(),
        };
        let value = match place {
            // A header value has no CR, LF or NUL (hyper answers such a head itself: a 400
            // with no body), and no whitespace around it on the wire.
            Place::Header => {
                let v: Vec<u8> = value
                    .into_iter()
                    .filter(|b| !b"\r\n\0".contains(b))
                    .collect();
                let blank = |b: &u8| *b == b' ' || *b == b'\t';
                let start = v.iter().position(|b| !blank(b)).unwrap_or(v.len());
                let end = v.iter().rposition(|b| !blank(b)).map_or(start, |e| e + 1);
                v[start..end].to_vec()
            }
            _ => value,
        };
        let stream = format!("/sessions/{sid}/events/stream");
        let req = match &place {
            Place::Header => Req::new("GET", &stream, vec![]).header("last-event-id", &value),
            Place::StreamQuery => Req::new(
                "GET",
                &format!("{stream}?after={}", percent_encode(&value)),
                vec![],
            ),
            Place::HistoryQuery(limit) => {
                let mut path = format!(
                    "/sessions/{sid}/events/history?after={}",
                    percent_encode(&value)
                );
                if let Some(l) = limit {
                    path.push_str(&format!("&limit={}", percent_encode(l.as_bytes())));
                }
                Req::new("GET", &path, vec![])
            }
        };
        let is_stream = !matches!(place, Place::HistoryQuery(_));
        let req = Req {
            head_only: is_stream,
            ..req
        };
        let a = send_checked(
            &h,
            &format!(
                "{place:?} {cursor:?} = {:?}",
                String::from_utf8_lossy(&value)
            ),
            req,
        )?;
        // A real id is always accepted; a value that is not one never silently replays the log
        // from the beginning.
        let bad_limit = match &place {
            Place::HistoryQuery(Some(l)) => {
                !l.parse::<u32>().is_ok_and(|n| (1..=1000).contains(&n))
            }
            _ => false,
        };
        if bad_limit {
            prop_assert_eq!(a.status, 400);
        } else if let Cursor::Real(_) = cursor {
            prop_assert!(a.status == 200, "a real id is accepted: {}", a.status);
        } else if a.status == 200 && !ids.iter().any(|id| id.as_bytes() == value.as_slice()) {
            prop_assert!(
                value.is_empty(),
                "{:?} is no event id, yet it was accepted",
                String::from_utf8_lossy(&value)
            );
        }
        Ok(())
    });
    // The stream still serves a real cursor.
    let req = Req {
        head_only: true,
        ..Req::new("GET", &format!("/sessions/{sid}/events/stream"), vec![])
            .header("last-event-id", ids[2].as_bytes())
    };
    assert_eq!(h.send(req).expect("answer").status, 200);
}

/// A multipart body, its parts and how it is cut.
#[derive(Debug, Clone)]
struct Multipart {
    /// In the Content-Type header (maybe quoted, maybe junk).
    header_boundary: String,
    quoted: bool,
    /// In the body (usually the same).
    body_boundary: String,
    parts: Vec<Part>,
    close: bool,
    /// Cut the body at this fraction (0..=1000 per mille) and maybe declare the full length.
    cut: Option<(u16, bool)>,
}

#[derive(Debug, Clone)]
struct Part {
    disposition: Option<String>,
    content_type: Option<String>,
    extra_header: Option<(String, String)>,
    data: Vec<u8>,
}

fn multipart() -> BoxedStrategy<Multipart> {
    let boundary = prop_oneof![
        6 => "[A-Za-z0-9_-]{1,40}",
        2 => "[A-Za-z0-9'()+_,./:=?-]{1,70}",
        1 => "[ -~]{0,80}",
        1 => Just(String::new()),
    ];
    let filename = prop_oneof![
        "[a-zA-Z0-9._-]{1,12}",
        text(),
        Just("../../etc/passwd".to_string()),
        Just("\u{202e}cod.exe".to_string())
    ];
    let disposition = prop_oneof![
        4 => filename.clone().prop_map(|f| format!("form-data; name=\"file\"; filename=\"{f}\"")),
        1 => filename.clone().prop_map(|f| format!("form-data; name=\"file\"; filename*=UTF-8''{f}")),
        1 => Just("form-data; name=\"field\"".to_string()),
        1 => filename.prop_map(|f| format!("form-data; filename={f}")),
        1 => "[ -~]{0,40}",
    ];
    let part = (
        prop::option::weighted(0.9, disposition),
        prop::option::of(prop_oneof![
            select(vec!["text/plain", "image/png", "application/octet-stream"])
                .prop_map(str::to_string),
            "[ -~]{0,20}"
        ]),
        prop::option::weighted(0.2, ("[A-Za-z-]{1,10}", "[ -~]{0,20}")),
        prop_oneof![
            vec(any::<u8>(), 0..200),
            "[ -~\r\n-]{0,200}".prop_map(String::into_bytes)
        ],
    )
        .prop_map(|(disposition, content_type, extra_header, data)| Part {
            disposition,
            content_type,
            extra_header,
            data,
        });
    (
        boundary,
        any::<bool>(),
        prop::option::weighted(0.1, "[A-Za-z0-9-]{1,20}"),
        vec(part, 0..4),
        prop::bool::weighted(0.85),
        prop::option::weighted(0.3, (0u16..=1000, any::<bool>())),
    )
        .prop_map(
            |(header_boundary, quoted, other, parts, close, cut)| Multipart {
                body_boundary: other.unwrap_or_else(|| header_boundary.clone()),
                header_boundary,
                quoted,
                parts,
                close,
                cut,
            },
        )
        .boxed()
}

impl Multipart {
    fn request(&self) -> Req {
        let mut body = Vec::new();
        for p in &self.parts {
            body.extend_from_slice(format!("--{}\r\n", self.body_boundary).as_bytes());
            if let Some(d) = &p.disposition {
                body.extend_from_slice(format!("Content-Disposition: {d}\r\n").as_bytes());
            }
            if let Some(t) = &p.content_type {
                body.extend_from_slice(format!("Content-Type: {t}\r\n").as_bytes());
            }
            if let Some((k, v)) = &p.extra_header {
                body.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
            }
            body.extend_from_slice(b"\r\n");
            body.extend_from_slice(&p.data);
            body.extend_from_slice(b"\r\n");
        }
        if self.close {
            body.extend_from_slice(format!("--{}--\r\n", self.body_boundary).as_bytes());
        }
        let full = body.len();
        let mut declared = None;
        if let Some((per_mille, declare_full)) = self.cut {
            body.truncate(full * per_mille as usize / 1000);
            if declare_full {
                declared = Some(full.max(body.len() + 1));
            }
        }
        let b = if self.quoted {
            format!("\"{}\"", self.header_boundary)
        } else {
            self.header_boundary.clone()
        };
        Req {
            declared,
            ..Req::new("POST", "/files", body).header(
                "content-type",
                format!("multipart/form-data; boundary={b}").as_bytes(),
            )
        }
    }
}

/// What an upload may be: multipart, or a raw body with `?filename=` (maybe cut short).
#[derive(Debug, Clone)]
enum Upload {
    Multipart(Multipart),
    Raw {
        filename: Option<String>,
        content_type: String,
        data: Vec<u8>,
        cut_short: bool,
    },
}

#[test]
fn uploads_never_break_the_server() {
    let h = Harness::new(AGENT);
    let upload = prop_oneof![
        5 => multipart().prop_map(Upload::Multipart),
        1 => (
            prop::option::of(text()),
            prop_oneof![Just("application/octet-stream".to_string()), Just("multipart/form-data".to_string()), "[ -~]{0,30}"],
            vec(any::<u8>(), 0..100),
            any::<bool>(),
        )
            .prop_map(|(filename, content_type, data, cut_short)| Upload::Raw { filename, content_type, data, cut_short }),
    ];
    check(runner(150), upload, |upload| {
        let req = match &upload {
            Upload::Multipart(m) => m.request(),
            Upload::Raw {
                filename,
                content_type,
                data,
                cut_short,
            } => {
                let path = match filename {
                    Some(f) => format!("/files?filename={}", percent_encode(f.as_bytes())),
                    None => "/files".to_string(),
                };
                Req {
                    declared: cut_short.then_some(data.len() + 10),
                    ..Req::new("POST", &path, data.clone())
                        .header("content-type", content_type.as_bytes())
                }
            }
        };
        let truncated = req.declared.is_some();
        let what = format!("POST /files {upload:?}");
        match h.send(req) {
            Some(a) => {
                h.record(&a);
                check_answer(&what, &a)?;
                if a.status == 201 {
                    let v: Value = serde_json::from_slice(&a.body).expect("JSON");
                    let id = v["id"].as_str().expect("id");
                    let got = h
                        .send(Req::new("GET", &format!("/files/{id}/content"), vec![]))
                        .expect("download");
                    prop_assert_eq!(got.status, 200);
                    prop_assert_eq!(got.body.len() as u64, v["size_bytes"].as_u64().unwrap());
                }
            }
            // A client that cut its body short and left may get no answer.
            None => prop_assert!(truncated, "{}: no answer", what),
        }
        h.assert_no_panic()?;
        // A valid upload still works.
        let a = h
            .send(Req::new("POST", "/files?filename=ok.txt", b"fine".to_vec()))
            .expect("an answer");
        prop_assert_eq!(a.status, 201);
        Ok(())
    });
}

/// One path segment: a word of the route table, a real id, or anything (percent-encoded).
#[derive(Debug, Clone)]
enum Seg {
    Word(&'static str),
    Session,
    File,
    Event,
    Any(String),
}

/// The route table, `S` and `F` where a session or a file id goes.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/meta"),
    ("GET", "/tools"),
    ("GET", "/sessions"),
    ("POST", "/sessions"),
    ("GET", "/sessions/S"),
    ("GET", "/sessions/S/history"),
    ("POST", "/sessions/S/turns"),
    ("POST", "/sessions/S/messages"),
    ("GET", "/sessions/S/events/history"),
    ("GET", "/sessions/S/events/stream"),
    ("GET", "/sessions/S/events"),
    ("POST", "/sessions/S/cancel"),
    ("POST", "/sessions/S/run"),
    ("POST", "/sessions/S/plan/confirm"),
    ("POST", "/sessions/S/plan/reject"),
    ("POST", "/sessions/S/interrupt"),
    ("POST", "/run"),
    ("POST", "/files"),
    ("GET", "/files/F"),
    ("GET", "/files/F/content"),
];

/// A path: a route of the table (its ids real most of the time), or segments at random.
fn path_segments() -> BoxedStrategy<Vec<Seg>> {
    let id = |real: Seg| {
        prop_oneof![
            8 => Just(real),
            1 => prop_oneof![Just(Seg::Session), Just(Seg::File), Just(Seg::Event)],
            1 => text().prop_map(Seg::Any),
        ]
    };
    let routed =
        (select(ROUTES.to_vec()), id(Seg::Session), id(Seg::File)).prop_map(|((_, path), s, f)| {
            path.split('/')
                .skip(1)
                .map(|w| match w {
                    "S" => s.clone(),
                    "F" => f.clone(),
                    w => Seg::Word(w),
                })
                .collect::<Vec<Seg>>()
        });
    let word = prop_oneof![
        8 => select(vec![
            "sessions", "turns", "messages", "events", "history", "stream", "cancel", "run",
            "plan", "confirm", "reject", "interrupt", "files", "content", "meta", "tools",
            "healthz", "metrics", "..", ".", "",
        ])
        .prop_map(Seg::Word),
        4 => Just(Seg::Session),
        1 => Just(Seg::File),
        1 => Just(Seg::Event),
        1 => text().prop_map(Seg::Any),
    ];
    prop_oneof![8 => routed, 1 => vec(word, 1..5)].boxed()
}

/// Every route with any method, path and query, and a body made for the route or not: the
/// routes the other properties do not cover (cancel, session runs, plans, interrupt, listings,
/// history, metadata, downloads with `Range`) and the route table itself.
#[test]
fn any_route_with_any_input_never_breaks_the_server() {
    let h = Harness::new(AGENT);
    let sid = h.session(&json!({}));
    h.ok(
        "POST",
        &format!("/sessions/{sid}/turns"),
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    let (_, v) = h.ok(
        "GET",
        &format!("/sessions/{sid}/events/history"),
        &Value::Null,
    );
    let event_id = v["events"][0]["id"].as_str().unwrap().to_string();
    let a = h
        .send(Req::new(
            "POST",
            "/files?filename=a.txt",
            b"0123456789".to_vec(),
        ))
        .unwrap();
    let file_id = serde_json::from_slice::<Value>(&a.body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let query = prop::option::weighted(
        0.5,
        vec(
            (
                select(vec!["after", "type", "limit", "filename", "x"]),
                prop_oneof![
                    select(vec![
                        "full",
                        "compacted",
                        "1",
                        "0",
                        "1001",
                        "-1",
                        "",
                        "%",
                        "%zz",
                        "%e4"
                    ])
                    .prop_map(str::to_string),
                    Just("EVENT".to_string()),
                    Just("SESSION".to_string()),
                    text(),
                ],
            ),
            1..3,
        ),
    );
    let body = prop_oneof![
        3 => Just(None),
        2 => prop_oneof![
            (prop::option::of(text()), any::<bool>()).prop_map(|(g, p)| json!({"goal": g, "plan": p})),
            prop::option::of(text()).prop_map(|t| json!({"turn_id": t})),
            prop::option::of(text()).prop_map(|t| json!({"edits": t})),
            prop::option::of(text()).prop_map(|t| json!({"reason": t})),
            any_json(),
        ]
        .prop_map(Some),
    ];
    // The route's own method most of the time (None), else any.
    let method = prop::option::weighted(
        0.15,
        select(vec!["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"]),
    );
    let range = prop::option::weighted(
        0.2,
        prop_oneof![
            "bytes=[0-9]{0,3}-[0-9]{0,3}",
            "bytes=-[0-9]{1,20}",
            "[ -~]{0,20}"
        ],
    );
    check(
        runner(150),
        (method, path_segments(), query, body, range),
        |(method, segs, query, body, range)| {
            let mut path = String::new();
            for s in &segs {
                path.push('/');
                match s {
                    Seg::Word(w) => path.push_str(w),
                    Seg::Session => path.push_str(&sid),
                    Seg::File => path.push_str(&file_id),
                    Seg::Event => path.push_str(&event_id),
                    Seg::Any(t) => path.push_str(&percent_encode(t.as_bytes())),
                }
            }
            let method = method.unwrap_or_else(|| {
                // The method of the route these segments spell, if they spell one.
                let template: String = segs
                    .iter()
                    .map(|s| match s {
                        Seg::Word(w) => format!("/{w}"),
                        Seg::Session => "/S".to_string(),
                        Seg::File => "/F".to_string(),
                        _ => "/?".to_string(),
                    })
                    .collect();
                ROUTES
                    .iter()
                    .find(|(_, p)| *p == template)
                    .map_or("GET", |(m, _)| *m)
            });
            // A stream that follows live never ends: read its head only.
            let head_only =
                method == "GET" && (path.ends_with("/stream") || path.ends_with("/events"));
            if let Some(q) = &query {
                let pairs: Vec<String> = q
                    .iter()
                    .map(|(k, v)| {
                        let v = match v.as_str() {
                            "EVENT" => event_id.clone(),
                            "SESSION" => sid.clone(),
                            other => percent_encode(other.as_bytes()),
                        };
                        format!("{k}={v}")
                    })
                    .collect();
                path.push('?');
                path.push_str(&pairs.join("&"));
            }
            // Deleting the shared session would only make every later case a 404.
            let deletes_session = method == "DELETE"
                && segs.len() == 2
                && matches!(segs[0], Seg::Word("sessions"))
                && matches!(segs[1], Seg::Session);
            if deletes_session {
                return Ok(());
            }
            let mut req = match &body {
                Some(b) => Req::json(method, &path, b),
                None => Req::new(method, &path, vec![]),
            };
            if let Some(r) = &range {
                req = req.header("range", r.as_bytes());
            }
            req.head_only = head_only;
            let what = format!("{method} {path} {body:?} range {range:?}");
            let a = send_checked(&h, &what, req)?;
            drop(a);
            // Whatever the request did, the session still takes a turn, once what it started
            // has ended (a run waiting for its plan's approval, or for a client, is cancelled).
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let (_, info) = h.ok("GET", &format!("/sessions/{sid}"), &Value::Null);
                match info["status"].as_str() {
                    Some("idle") => break,
                    Some("plan_pending_approval" | "awaiting_client") => {
                        h.ok("POST", &format!("/sessions/{sid}/cancel"), &Value::Null);
                    }
                    _ => {}
                }
                prop_assert!(
                    std::time::Instant::now() < deadline,
                    "the session is not idle 20 s after {}: {}",
                    what,
                    info
                );
                h.block_on(async {
                    let _ = tokio::time::timeout(
                        Duration::from_millis(200),
                        h.server().wait_idle(&sid),
                    )
                    .await;
                });
            }
            h.assert_turn_works(&sid)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Pure parsers
// ---------------------------------------------------------------------------------------------

const TOOLS_TOML: &str = include_str!("../../tools.toml");

/// A TOML-ish token: table headers, keys the loader knows, values of every type, and junk.
fn toml_token() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(vec![
            "[server]", "[upstream]", "[agents.a]", "[agents.\"b c\"]", "[mcp_servers.m]",
            "[policy]", "[files]", "[limits]", "[[agents]]", "[agents]", "[mcp_servers]", "[",
            "]", "[[", "]]", "=", "\n", "\n", "\n", " ", ",", "{", "}", "\"", "'", "\"\"\"", "#",
            ".", "\\",
        ]).prop_map(str::to_string),
        3 => select(vec![
            "listen", "data_dir", "sandboxes", "api_keys_env", "max_body_bytes", "provider",
            "base_url", "model", "retries", "timeout_s", "max_tokens", "api_key_env", "title",
            "system_prompt", "tools", "max_steps", "turn_timeout_s", "thinking", "models",
            "command", "args", "env", "scope", "url", "headers", "sandbox", "trust", "ask",
            "deny", "default", "max_bytes", "queued_turns", "running_turns", "header_timeout_s",
            "idle_timeout_s", "max_connections", "approval_ttl_s", "network",
            "client_system_prompt", "tool_result_bytes", "version", "description",
        ]).prop_map(|k| format!("{k} = ")),
        3 => toml_value(),
        1 => any::<String>().prop_map(|s| s.chars().take(8).collect()),
    ]
    .boxed()
}

fn toml_value() -> BoxedStrategy<String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        select(vec![
            "0",
            "-1",
            "1e400",
            "nan",
            "inf",
            "-inf",
            "1.5",
            "9223372036854775808",
            "0x10",
            "true",
            "false",
            "1979-05-27T07:32:00Z",
            "[]",
            "{}",
            "\"\"",
            "\"*\"",
            "\"[\"",
            "\"{a,\"",
            "\"openai\"",
            "\"anthropic\"",
            "\"echo\"",
            "\"gpt\"",
            "\"session\"",
            "\"shared\"",
            "\"landlock\"",
            "\"ask\"",
            "\"trust\"",
            "\"deny\"",
            "\"localhost:0\"",
            "\"127.0.0.1:99999\"",
            "\"http://127.0.0.1:1/v1\"",
            "[\"*\", 1]",
            "{ TZ = \"UTC\" }",
            "\"{workspace}\"",
            "\"${X}\"",
            "\"\\u0000\"",
            "'''\nx\n'''",
        ])
        .prop_map(str::to_string),
        "\"[ -~]{0,12}\"",
    ]
    .boxed()
}

/// One edit of a config text.
#[derive(Debug, Clone)]
enum Edit {
    DeleteLine(prop::sample::Index),
    DuplicateLine(prop::sample::Index),
    Uncomment(prop::sample::Index),
    ReplaceValue(prop::sample::Index, String),
    InsertLine(prop::sample::Index, String),
    Truncate(prop::sample::Index),
    InsertChar(prop::sample::Index, char),
}

fn edit() -> BoxedStrategy<Edit> {
    let idx = any::<prop::sample::Index>;
    prop_oneof![
        2 => idx().prop_map(Edit::DeleteLine),
        1 => idx().prop_map(Edit::DuplicateLine),
        4 => idx().prop_map(Edit::Uncomment),
        4 => (idx(), toml_value()).prop_map(|(i, v)| Edit::ReplaceValue(i, v)),
        2 => (idx(), vec(toml_token(), 1..6).prop_map(|t| t.concat())).prop_map(|(i, l)| Edit::InsertLine(i, l)),
        1 => idx().prop_map(Edit::Truncate),
        1 => (idx(), any::<char>()).prop_map(|(i, c)| Edit::InsertChar(i, c)),
    ]
    .boxed()
}

fn apply(text: &str, edit: &Edit) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    let n = lines.len();
    match edit {
        Edit::DeleteLine(i) => {
            lines.remove(i.index(n));
        }
        Edit::DuplicateLine(i) => {
            let l = lines[i.index(n)].clone();
            lines.insert(i.index(n), l);
        }
        Edit::Uncomment(i) => {
            // The nearest commented line from i: uncommenting reaches the file's examples.
            let start = i.index(n);
            if let Some(j) = (0..n)
                .map(|k| (start + k) % n)
                .find(|&j| lines[j].trim_start().starts_with('#'))
            {
                let l = lines[j].trim_start().trim_start_matches('#').trim_start();
                lines[j] = l.to_string();
            }
        }
        Edit::ReplaceValue(i, v) => {
            let start = i.index(n);
            if let Some(j) = (0..n)
                .map(|k| (start + k) % n)
                .find(|&j| lines[j].contains('='))
            {
                let key = lines[j].split('=').next().unwrap_or("").to_string();
                lines[j] = format!("{key}= {v}");
            }
        }
        Edit::InsertLine(i, l) => lines.insert(i.index(n + 1), l.clone()),
        Edit::Truncate(i) => {
            let joined = lines.join("\n");
            let mut cut = i.index(joined.len() + 1);
            while !joined.is_char_boundary(cut) {
                cut -= 1;
            }
            return joined[..cut].to_string();
        }
        Edit::InsertChar(i, c) => {
            let mut joined = lines.join("\n");
            let mut at = i.index(joined.len() + 1);
            while !joined.is_char_boundary(at) {
                at -= 1;
            }
            joined.insert(at, *c);
            return joined;
        }
    }
    lines.join("\n") + "\n"
}

/// The loader's promise: `Ok`, or an error whose `Display` is one line naming the file.
fn check_config(text: &str) -> Result<(), TestCaseError> {
    let path = std::path::Path::new("/etc/turnstile/tools.toml");
    if let Err(e) = turnstile::config::load_str(path, text, &crate::common::env(&[])) {
        let line = e.to_string();
        prop_assert!(
            !line.contains('\n') && !line.contains('\r'),
            "more than one line: {line:?}"
        );
        prop_assert!(
            line.starts_with("/etc/turnstile/tools.toml"),
            "does not name the file: {line:?}"
        );
        prop_assert!(
            line.len() > path.as_os_str().len() + 2,
            "no message: {line:?}"
        );
    }
    Ok(())
}

#[test]
fn tools_toml_mutations_load_or_fail_in_one_line() {
    assert!(
        turnstile::config::load_str(
            std::path::Path::new("/x/tools.toml"),
            TOOLS_TOML,
            &crate::common::env(&[]),
        )
        .is_ok(),
        "the repository's tools.toml loads"
    );
    check(runner(3000), vec(edit(), 1..8), |edits| {
        let mut text = TOOLS_TOML.to_string();
        for e in &edits {
            text = apply(&text, e);
        }
        check_config(&text)
    });
}

#[test]
fn random_toml_text_loads_or_fails_in_one_line() {
    check(
        runner(3000),
        prop_oneof![
            4 => vec(toml_token(), 0..40).prop_map(|t| t.concat()),
            1 => any::<String>(),
        ],
        |text| check_config(&text),
    );
}

/// Event-stream bytes: the format's tokens, line ends and BOMs among random bytes.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        select(vec![
            "data: ",
            "data:",
            "event: ",
            "id: 1",
            ": c",
            "\n",
            "\r\n",
            "\r",
            "\n\n",
            "retry: 5",
            "\u{feff}",
            "x",
            "{\"a\":1}",
            "[DONE]",
            "data",
            "é",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        vec(any::<u8>(), 0..8),
    ];
    vec(piece, 0..40).prop_map(|p| p.concat())
}

/// `bytes`, whole and cut at random places, with a limit: the input of the SSE properties.
fn sse_case() -> impl Strategy<Value = (Vec<u8>, Vec<prop::sample::Index>, usize)> {
    (
        sse_bytes(),
        vec(any::<prop::sample::Index>(), 0..6),
        1usize..64,
    )
}

/// `bytes` cut at `cuts`.
fn cut<'a>(bytes: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut chunks = Vec::new();
    let mut prev = 0;
    for a in at {
        chunks.push(&bytes[prev..a]);
        prev = a;
    }
    chunks.push(&bytes[prev..]);
    chunks
}

/// The providers' SSE parser: no panic on any bytes, and the events do not depend on how the
/// stream is split into chunks.
#[test]
fn sse_parser_is_split_invariant_and_never_panics() {
    use turnstile::outbound::event_stream::SseParser;
    check(runner(2000), sse_case(), |(bytes, cuts, limit)| {
        let run = |chunks: Vec<&[u8]>| {
            let mut p = SseParser::with_limit(limit);
            let mut out = Vec::new();
            for c in chunks {
                p.feed(c);
                loop {
                    match p.next_event() {
                        Ok(Some(ev)) => out.push(Ok(ev)),
                        Ok(None) => break,
                        Err(e) => {
                            out.push(Err(e));
                            return out;
                        }
                    }
                }
            }
            match p.finish() {
                Ok(Some(ev)) => out.push(Ok(ev)),
                Ok(None) => {}
                Err(e) => out.push(Err(e)),
            }
            out
        };
        let whole = run(vec![&bytes]);
        let split = run(cut(&bytes, &cuts));
        // An error ends the stream; which event it cut may depend on the split when the
        // limit is hit, so compare the events before the first error.
        let ok = |v: &[Result<_, _>]| -> Vec<turnstile::outbound::event_stream::SseEvent> {
            v.iter().map_while(|r| r.clone().ok()).collect()
        };
        let (w, s) = (ok(&whole), ok(&split));
        if whole.iter().all(Result::is_ok) && split.iter().all(Result::is_ok) {
            prop_assert_eq!(w, s);
        }
        Ok(())
    });
}

/// The MCP client's SSE parser: no panic on any bytes, and the same events, events over the
/// limit and UTF-8 error however the stream is split.
#[test]
fn strict_sse_parser_is_split_invariant_and_never_panics() {
    use turnstile::outbound::event_stream::StrictParser;
    check(runner(2000), sse_case(), |(bytes, cuts, limit)| {
        let run = |chunks: Vec<&[u8]>| {
            let mut p = StrictParser::new(limit, 4);
            let mut out = Vec::new();
            for c in chunks {
                p.feed(c);
                loop {
                    match p.next_item() {
                        Ok(Some(item)) => out.push(Ok(item)),
                        Ok(None) => break,
                        Err(e) => {
                            out.push(Err(e));
                            return out;
                        }
                    }
                }
            }
            out
        };
        prop_assert_eq!(run(vec![&bytes]), run(cut(&bytes, &cuts)));
        Ok(())
    });
}

/// The tokenizer both parsers share: the same lines however the stream is split, a line over
/// the limit in pieces (none empty but a last one), and no more than the limit buffered.
#[test]
fn sse_tokenizer_is_split_invariant_and_bounded() {
    use turnstile::outbound::event_stream::{Line, Tokenizer};
    check(runner(2000), sse_case(), |(bytes, cuts, limit)| {
        let run = |chunks: Vec<&[u8]>| -> Result<Vec<(Vec<u8>, bool)>, TestCaseError> {
            let mut t = Tokenizer::new();
            let mut lines = Vec::new();
            let mut open: Option<Vec<u8>> = None;
            for c in chunks {
                t.feed(c);
                while let Some(line) = t.next_line(limit) {
                    match line {
                        Line::Whole(b) => {
                            prop_assert!(open.is_none() && b.len() <= limit);
                            lines.push((b.to_vec(), false));
                        }
                        Line::Piece { bytes, last } => {
                            prop_assert!(last || !bytes.is_empty());
                            let line = open.get_or_insert_with(Vec::new);
                            line.extend_from_slice(bytes);
                            if last {
                                prop_assert!(line.len() > limit);
                                lines.push((std::mem::take(line), true));
                                open = None;
                            }
                        }
                    }
                }
                prop_assert!(t.buffered() <= limit.max(3));
            }
            Ok(lines)
        };
        prop_assert_eq!(run(vec![&bytes])?, run(cut(&bytes, &cuts))?);
        Ok(())
    });
}

/// Message content: any JSON parses or fails cleanly, and what parses round-trips.
#[test]
fn message_content_parses_or_fails_cleanly_and_round_trips() {
    use turnstile::message::{Content, Message};
    check(
        runner(3000),
        prop_oneof![history_message(), content(), any_json(),],
        |v| {
            if let Ok(m) = serde_json::from_value::<Message>(v.clone()) {
                let again: Message =
                    serde_json::from_value(serde_json::to_value(&m).unwrap()).unwrap();
                prop_assert_eq!(again, m);
            }
            if let Ok(c) = serde_json::from_value::<Content>(v.clone()) {
                let again: Content =
                    serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
                prop_assert_eq!(again, c);
            }
            // From text too (another deserializer path), including cut-short text.
            let s = v.to_string();
            let _ = serde_json::from_str::<Message>(&s);
            let mut half = s.len() / 2;
            while !s.is_char_boundary(half) {
                half -= 1;
            }
            let _ = serde_json::from_str::<Content>(&s[..half]);
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Regressions: what the properties above found, as plain tests
// ---------------------------------------------------------------------------------------------

/// An upload whose body ends before its declared `Content-Length` (the client went away) was a
/// 500 `internal_error` ("the file store failed") logged at ERROR: the body's read error was
/// taken for a disk error. It is the client's: a 400.
#[test]
fn an_upload_cut_short_is_a_400_not_a_500() {
    let h = Harness::new("");
    let raw = Req {
        declared: Some(100),
        ..Req::new("POST", "/files?filename=a.txt", b"only part".to_vec())
    };
    let multipart = Req {
        declared: Some(200),
        ..Req::new(
            "POST",
            "/files",
            b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nonly pa"
                .to_vec(),
        )
        .header("content-type", b"multipart/form-data; boundary=b")
    };
    for req in [raw, multipart] {
        let what = format!("{req:?}");
        let a = h.send(req).expect("an answer");
        assert_eq!(
            a.status,
            400,
            "{what}: {}",
            String::from_utf8_lossy(&a.body)
        );
        let v: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request", "{v}");
    }
    // Nothing of them was stored, and the next upload works.
    let a = h
        .send(Req::new("POST", "/files?filename=b.txt", b"whole".to_vec()))
        .unwrap();
    assert_eq!(a.status, 201);
    let tmp = h.server().data_dir().join("files/tmp");
    assert_eq!(
        std::fs::read_dir(tmp).unwrap().count(),
        0,
        "no partial file left"
    );
}

/// A `Last-Event-ID` with a byte outside visible ASCII (here 0x80, which HTTP allows as
/// obs-text) was read as no cursor at all: the stream answered 200 and replayed the session's
/// whole log from its first event, where an unknown id is a 400.
#[test]
fn a_last_event_id_that_is_not_text_is_a_400_not_a_replay_of_everything() {
    let h = Harness::new("");
    let sid = h.session(&json!({}));
    h.ok(
        "POST",
        &format!("/sessions/{sid}/turns"),
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    let stream = format!("/sessions/{sid}/events/stream");
    for value in [&b"\x80"[..], b"evt_\xff\xfe", b"caf\xc3\xa9"] {
        let req = Req {
            head_only: true,
            ..Req::new("GET", &stream, vec![]).header("last-event-id", value)
        };
        let a = h.send(req).expect("an answer");
        assert_eq!(
            a.status,
            400,
            "{value:?}: {}",
            String::from_utf8_lossy(&a.body)
        );
        let v: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Last-Event-ID"),
            "{v}"
        );
    }
    // An unknown id that is text answers the same; no header streams from the start.
    let req = Req {
        head_only: true,
        ..Req::new("GET", &stream, vec![]).header("last-event-id", b"evt_nope")
    };
    assert_eq!(h.send(req).unwrap().status, 400);
    let req = Req {
        head_only: true,
        ..Req::new("GET", &stream, vec![])
    };
    assert_eq!(h.send(req).unwrap().status, 200);
}
