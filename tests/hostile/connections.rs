//! A hostile client cannot exhaust the real binary's connections: slow heads and idle
//! keep-alive connections are closed after `[server] header_timeout_s` / `idle_timeout_s`, a
//! flood of sockets never holds more than `max_connections` descriptors, a declared body over
//! the limit is refused before it is read, a body that stalls is cut off, and a long event
//! stream is never mistaken for an idle connection.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio::time::Instant;

const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_CONNECTIONS: usize = 20;
const MAX_BODY: u64 = 65_536;
const MAX_FILE: u64 = 1_048_576;

/// The real binary on a free port, with small limits.
struct Server {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tools.toml"),
            format!(
                "[server]\ndata_dir = \"data\"\nsandboxes = \"sandboxes\"\n\
                 header_timeout_s = {}\nidle_timeout_s = {}\nmax_connections = {MAX_CONNECTIONS}\n\
                 max_body_bytes = {MAX_BODY}\n[files]\nmax_bytes = {MAX_FILE}\n",
                HEADER_TIMEOUT.as_secs(),
                IDLE_TIMEOUT.as_secs()
            ),
        )
        .unwrap();
        let (child, addr) = crate::common::binary::serve(&dir.path().join("tools.toml")).await;
        Server {
            child,
            addr,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// Open descriptors of the server process.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    async fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// One request on its own connection (`Connection: close`): status and JSON body.
    async fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let mut s = self.connect().await;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let r = read_response(&mut s, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("{method} {path}: no response"));
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        )
    }
}

struct Resp {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Read one response with a `Content-Length`; `None` when the connection closes first.
/// Panics past `within`.
async fn read_response(s: &mut TcpStream, within: Duration) -> Option<Resp> {
    let deadline = Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                let body = buf[end + 4..end + 4 + len].to_vec();
                return Some(Resp { status, head, body });
            }
        }
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("no response and no close before the deadline")
            .unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Read until the server closes the connection (end of file or reset); what it sent and when.
/// `None` when it is still open at `deadline`.
async fn closed_by(s: &mut TcpStream, deadline: Instant) -> Option<(Vec<u8>, Instant)> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some((got, Instant::now())),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

#[tokio::test]
async fn a_slow_head_is_closed_unanswered_after_the_header_timeout() {
    let server = Server::start().await;
    let mut s = server.connect().await;
    let (mut rd, mut wr) = s.split();
    let started = Instant::now();
    // One byte every 200 ms: the head would take seconds to complete.
    let drip = async {
        for b in
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"
        {
            if wr.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let read = async {
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        let deadline = started + Duration::from_secs(8);
        loop {
            match tokio::time::timeout_at(deadline, rd.read(&mut chunk)).await {
                Err(_) => panic!("still open 8 s after the first byte of a slow head"),
                Ok(Ok(0)) | Ok(Err(_)) => return (got, started.elapsed()),
                Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let ((got, took), ()) = tokio::join!(read, drip);
    assert!(
        got.is_empty(),
        "answered: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        took >= HEADER_TIMEOUT - Duration::from_millis(100) && took < HEADER_TIMEOUT * 2,
        "closed after {took:?}, the header timeout is {HEADER_TIMEOUT:?}"
    );

    // A connection that sends nothing at all owes its head within the header timeout too.
    let mut silent = server.connect().await;
    let opened = Instant::now();
    let (got, at) = closed_by(&mut silent, opened + Duration::from_secs(8))
        .await
        .expect("a silent connection still open after 8 s");
    assert!(got.is_empty());
    assert!(at - opened < HEADER_TIMEOUT * 2, "{:?}", at - opened);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout_not_before() {
    let server = Server::start().await;
    let mut s = server.connect().await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut s, Duration::from_secs(5)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.head);
    let idle_from = Instant::now();
    let (got, at) = closed_by(&mut s, idle_from + Duration::from_secs(8))
        .await
        .expect("an idle keep-alive connection still open after 8 s");
    assert!(got.is_empty());
    let idle = at - idle_from;
    // Not the (shorter) header timeout: an idle connection is not a slow head.
    assert!(
        idle >= IDLE_TIMEOUT - Duration::from_millis(200) && idle < IDLE_TIMEOUT * 2,
        "closed after {idle:?} idle, the idle timeout is {IDLE_TIMEOUT:?}"
    );

    // A second request within the idle timeout is served on the same connection, and a slow
    // head after it still gets only the header timeout.
    let mut s = server.connect().await;
    for _ in 0..2 {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut s, Duration::from_secs(5)).await.unwrap();
        assert_eq!(r.status, 200);
    }
    s.write_all(b"GET /heal").await.unwrap();
    let head_from = Instant::now();
    let (_, at) = closed_by(&mut s, head_from + Duration::from_secs(8))
        .await
        .expect("a half-sent head still open after 8 s");
    assert!(
        at - head_from < IDLE_TIMEOUT,
        "a half-sent head on a keep-alive connection lasted {:?}",
        at - head_from
    );
}

#[tokio::test]
async fn an_event_stream_open_past_the_idle_timeout_is_not_cut() {
    let server = Server::start().await;
    let (status, created) = server.call("POST", "/sessions", "{}").await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let mut s = server.connect().await;
    s.write_all(
        format!("GET /sessions/{sid}/events/stream HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("no response head")
            .unwrap();
        assert!(n > 0, "closed before its head");
        seen.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&seen).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    // Quiet for twice the idle timeout (the keep-alive comments come every 15 s): still open.
    let opened = Instant::now();
    assert!(
        closed_by(
            &mut s,
            opened + IDLE_TIMEOUT * 2 + Duration::from_millis(500)
        )
        .await
        .is_none(),
        "the event stream was closed while it was quiet"
    );
    // And it still delivers.
    let (status, sent) = server
        .call(
            "POST",
            &format!("/sessions/{sid}/messages"),
            r#"{"content": "still there?"}"#,
        )
        .await;
    assert_eq!(status, 202, "{sent}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&seen).contains("still there?") {
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("the message never came on the stream")
            .unwrap();
        assert!(n > 0, "the event stream was closed");
        seen.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("event: user.message"), "{text}");
}

/// `turnstile_<name>` in `GET /metrics`.
async fn metric(server: &Server, name: &str) -> u64 {
    let mut s = server.connect().await;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut s, Duration::from_secs(5)).await.unwrap();
    let text = String::from_utf8(r.body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("turnstile_{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn ten_times_max_connections_never_hold_more_descriptors_than_the_limit() {
    let server = Server::start().await;
    // Before any client: the listener, the store, the log are open.
    let baseline = server.fds();

    // 200 sockets, each with half a request head, held open.
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..MAX_CONNECTIONS * 10 {
        let mut s = server.connect().await;
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n").await;
        readers.spawn(
            async move { closed_by(&mut s, Instant::now() + Duration::from_secs(15)).await },
        );
    }
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut closed = 0;
    while closed < MAX_CONNECTIONS * 10 {
        most = most.max(server.fds());
        match tokio::time::timeout(Duration::from_millis(5), readers.join_next()).await {
            Ok(Some(r)) => {
                let (got, _) = r.unwrap().expect("a flood socket still open after 15 s");
                assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
                closed += 1;
            }
            Ok(None) => break,
            Err(_) => assert!(Instant::now() < deadline, "the flood is still open"),
        }
    }
    eprintln!("descriptors: {baseline} before the flood, {most} at most during it");
    // The listener, the store and a log file are in the baseline; a couple more for slack
    // (a descriptor accepted and about to be closed).
    assert!(
        most <= baseline + MAX_CONNECTIONS + 2,
        "the server held {most} descriptors, {baseline} before the flood, max_connections = {MAX_CONNECTIONS}"
    );
    let refused = metric(&server, "connections_refused_total").await;
    assert!(
        refused >= (MAX_CONNECTIONS * 5) as u64,
        "only {refused} connections counted as refused"
    );
    // The flood is gone: a fresh request is served.
    let (status, body) = server.call("GET", "/healthz", "").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_declared_body_over_the_limit_is_413_at_once_naming_the_limit_and_key() {
    let server = Server::start().await;
    for (path, limit, key, kind) in [
        (
            "/sessions",
            MAX_BODY,
            "[server] max_body_bytes",
            "body_too_large",
        ),
        (
            "/files?filename=big.bin",
            MAX_FILE,
            "[files] max_bytes",
            "file_too_large",
        ),
    ] {
        let mut s = server.connect().await;
        let sent = Instant::now();
        s.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Content-Length: 10737418240\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let r = read_response(&mut s, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("POST {path}: closed without an answer"));
        // Well before any timeout could have played a part.
        assert!(sent.elapsed() < HEADER_TIMEOUT / 2, "{:?}", sent.elapsed());
        assert_eq!(r.status, 413, "{}", r.head);
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["error"]["type"], kind, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&limit.to_string()), "{message}");
        assert!(message.contains(key), "{message}");
    }
}

#[tokio::test]
async fn a_body_that_stalls_is_cut_off() {
    let server = Server::start().await;
    let mut s = server.connect().await;
    s.write_all(
        b"POST /sessions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"agent\"",
    )
    .await
    .unwrap();
    let sent = Instant::now();
    let r = read_response(&mut s, Duration::from_secs(8))
        .await
        .expect("a stalled body: closed without an answer");
    let took = sent.elapsed();
    assert_eq!(r.status, 408, "{}", r.head);
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("[server] idle_timeout_s"), "{message}");
    assert!(
        took >= IDLE_TIMEOUT - Duration::from_millis(200) && took < IDLE_TIMEOUT * 2,
        "cut after {took:?}, the idle timeout is {IDLE_TIMEOUT:?}"
    );
    assert!(
        closed_by(&mut s, Instant::now() + Duration::from_secs(5))
            .await
            .is_some(),
        "the connection of a stalled body stayed open"
    );

    // An upload that stalls is cut off too.
    let mut s = server.connect().await;
    s.write_all(
        b"POST /files?filename=a.txt HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\nsome bytes",
    )
    .await
    .unwrap();
    let sent = Instant::now();
    let (got, at) = closed_by(&mut s, sent + Duration::from_secs(8))
        .await
        .expect("a stalled upload still open after 8 s");
    let text = String::from_utf8_lossy(&got);
    assert!(!text.starts_with("HTTP/1.1 2"), "{text}");
    assert!(at - sent < IDLE_TIMEOUT * 2, "{:?}", at - sent);
}
