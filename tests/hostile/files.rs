//! The file store against a hostile client (issue 16): multipart bodies that never reach a
//! boundary, parts and bodies over `[files] max_bytes` (413, memory bounded: measured on the real
//! binary through `/proc/<pid>/status`), raw bodies over it, `[limits] files_per_message` and
//! repeated ids, unknown ids (404), `[limits] disk_bytes_per_key` for uploads and `deliver_file`,
//! `DELETE /files/{id}`, a deleted session's files, `files/tmp` emptied at start, and downloads
//! (`nosniff`, active types as sandboxed attachments, names without bidi controls).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{config_text, setup, Http, TestServer};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Child;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

const MIB: u64 = 1024 * 1024;
const BOUNDARY: &str = "hostile-7c2e";

// ---------------------------------------------------------------------------------------------
// The real binary and its memory.

/// The real binary serving a temporary folder.
struct Proc {
    child: Child,
    addr: std::net::SocketAddr,
    dir: tempfile::TempDir,
    _fake: FakeOpenAi,
}

impl Proc {
    async fn start(extra: &str) -> Proc {
        let fake = FakeOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tools.toml"), config_text(&fake, extra)).unwrap();
        let (child, addr) = crate::common::binary::serve(&dir.path().join("tools.toml")).await;
        Proc {
            child,
            addr,
            dir,
            _fake: fake,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Resident memory now, in bytes.
    fn rss(&self) -> u64 {
        status_field(self.pid(), "VmRSS")
    }

    /// Peak resident memory since the last [`Proc::reset_peak`], in bytes.
    fn peak(&self) -> u64 {
        status_field(self.pid(), "VmHWM")
    }

    /// Start measuring the peak afresh (`/proc/<pid>/clear_refs`; when the kernel refuses, the
    /// peak stays the one since start, which only makes the measure stricter).
    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5");
    }
}

fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// What a body is made of: literal bytes, or `n` copies of a byte (generated as it is sent).
enum Seg {
    Lit(Vec<u8>),
    Fill(u8, u64),
}

/// POST `segs` to `path` with `Transfer-Encoding: chunked` (no Content-Length for the server to
/// refuse up front: the body itself must be bounded), writing while the answer is read; the
/// status and the JSON answer. Writing stops at the first error (the server may close once it has
/// answered).
async fn post_chunked(
    addr: std::net::SocketAddr,
    path: &str,
    content_type: &str,
    segs: Vec<Seg>,
) -> (u16, Value) {
    let conn = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = conn.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        let block = vec![0u8; 64 * 1024];
        for seg in segs {
            match seg {
                Seg::Lit(b) => {
                    wr.write_all(format!("{:x}\r\n", b.len()).as_bytes())
                        .await?;
                    wr.write_all(&b).await?;
                    wr.write_all(b"\r\n").await?;
                }
                Seg::Fill(byte, mut n) => {
                    let block: Vec<u8> = block.iter().map(|_| byte).collect();
                    while n > 0 {
                        let len = n.min(block.len() as u64) as usize;
                        wr.write_all(format!("{len:x}\r\n").as_bytes()).await?;
                        wr.write_all(&block[..len]).await?;
                        wr.write_all(b"\r\n").await?;
                        n -= len as u64;
                    }
                }
            }
        }
        wr.write_all(b"0\r\n\r\n").await?;
        Ok::<_, std::io::Error>(wr)
    });
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                    let body = &buf[end + 4..end + 4 + len];
                    let v = serde_json::from_slice(body).unwrap_or(Value::Null);
                    return (status, v);
                }
            }
            let n = rd.read(&mut chunk).await.expect("read the answer");
            assert!(
                n > 0,
                "closed before answering: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .expect("no answer within 120 s");
    writer.abort();
    answer
}

fn boundaryless(total: u64) -> Vec<Seg> {
    vec![Seg::Fill(b'x', total)]
}

/// A multipart body: a form field of `field` bytes, then a file part of `file` bytes.
fn multipart(field: u64, file: u64) -> Vec<Seg> {
    vec![
        Seg::Lit(
            format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n")
                .into_bytes(),
        ),
        Seg::Fill(b'p', field),
        Seg::Lit(
            format!(
                "\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .into_bytes(),
        ),
        Seg::Fill(b'f', file),
        Seg::Lit(format!("\r\n--{BOUNDARY}--\r\n").into_bytes()),
    ]
}

fn multipart_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// The stored blobs and the files left in `files/tmp`.
/// The files' bytes the store keeps (on disk or in the database) and the uploads left staged.
fn stored(data: &Path) -> (usize, usize) {
    let tmp = std::fs::read_dir(data.join("files/tmp"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .count()
        })
        .unwrap_or(0);
    (
        crate::common::stores::blob_count(&data.with_file_name("tools.toml")),
        tmp,
    )
}

fn message_of(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_150_mib_multipart_without_a_boundary_is_413_and_rss_grows_under_48_mib() {
    // The default [files] max_bytes (100 MiB).
    let p = Proc::start("").await;
    // Warm up: one ordinary multipart upload.
    let (status, v) = post_chunked(p.addr, "/files", &multipart_type(), multipart(10, 1000)).await;
    assert_eq!(status, 201, "{v}");
    p.reset_peak();
    let before = p.rss();
    let started = Instant::now();
    let (status, err) =
        post_chunked(p.addr, "/files", &multipart_type(), boundaryless(150 * MIB)).await;
    let peak = p.peak().max(p.rss());
    assert_eq!(status, 413, "{err}");
    assert_eq!(err["error"]["type"], "multipart_too_large", "{err}");
    assert!(message_of(&err).contains("outside its parts"), "{err}");
    let growth = peak.saturating_sub(before);
    eprintln!(
        "boundary-less 150 MiB: 413 in {:?}, RSS {} -> peak {} MiB (+{:.1} MiB)",
        started.elapsed(),
        before / MIB,
        peak / MIB,
        growth as f64 / MIB as f64
    );
    assert!(growth < 48 * MIB, "RSS grew by {growth} bytes");
    assert_eq!(
        stored(&p.data()),
        (1, 0),
        "nothing stored, nothing left in tmp"
    );
    // Part headers that never end are held no more than a preamble is.
    let mut segs = vec![Seg::Lit(
        format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\nX-Pad: ")
            .into_bytes(),
    )];
    segs.push(Seg::Fill(b'h', 150 * MIB));
    let (status, err) = post_chunked(p.addr, "/files", &multipart_type(), segs).await;
    assert_eq!(status, 413, "{err}");
    let growth = p.peak().max(p.rss()).saturating_sub(before);
    assert!(growth < 48 * MIB, "RSS grew by {growth} bytes");
}

#[tokio::test]
async fn parts_and_bodies_over_max_bytes_are_413_naming_it_with_memory_bounded() {
    let max = 4 * MIB;
    let p = Proc::start(&format!("[files]\nmax_bytes = {max}\n")).await;
    let (status, v) = post_chunked(p.addr, "/files", &multipart_type(), multipart(10, 1000)).await;
    assert_eq!(status, 201, "{v}");
    p.reset_peak();
    let before = p.rss();

    // A file part of 150 MiB, well formed: cut off at max_bytes, on disk, never in memory.
    let (status, err) = post_chunked(
        p.addr,
        "/files",
        &multipart_type(),
        multipart(10, 150 * MIB),
    )
    .await;
    assert_eq!(status, 413, "{err}");
    assert_eq!(err["error"]["type"], "file_too_large", "{err}");
    assert!(message_of(&err).contains("[files] max_bytes"), "{err}");
    assert!(message_of(&err).contains(&max.to_string()), "{err}");

    // The whole stream too: a form field larger than max_bytes before the file part.
    let (status, err) =
        post_chunked(p.addr, "/files", &multipart_type(), multipart(6 * MIB, 10)).await;
    assert_eq!(status, 413, "{err}");
    assert!(message_of(&err).contains("[files] max_bytes"), "{err}");

    // A raw body over max_bytes.
    let (status, err) = post_chunked(
        p.addr,
        "/files?filename=big.bin",
        "application/octet-stream",
        vec![Seg::Fill(b'r', 150 * MIB)],
    )
    .await;
    assert_eq!(status, 413, "{err}");
    assert!(message_of(&err).contains("[files] max_bytes"), "{err}");

    let growth = p.peak().max(p.rss()).saturating_sub(before);
    eprintln!(
        "over max_bytes ({max} bytes), three 413s: RSS +{:.1} MiB",
        growth as f64 / MIB as f64
    );
    assert!(growth < 48 * MIB, "RSS grew by {growth} bytes");
    assert_eq!(
        stored(&p.data()),
        (1, 0),
        "nothing stored, nothing left in tmp"
    );

    // At the limit exactly, both ways, it is stored.
    let (status, v) = post_chunked(p.addr, "/files", &multipart_type(), multipart(10, max)).await;
    assert_eq!((status, v["size_bytes"].as_u64()), (201, Some(max)), "{v}");
    let (status, v) = post_chunked(
        p.addr,
        "/files?filename=exact.bin",
        "application/octet-stream",
        vec![Seg::Fill(b'e', max)],
    )
    .await;
    assert_eq!((status, v["size_bytes"].as_u64()), (201, Some(max)), "{v}");
}

#[tokio::test]
async fn files_tmp_is_emptied_when_the_server_starts() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("data/files/tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("tmp_cut_short_by_a_crash"), vec![0u8; 4096]).unwrap();
    let server = TestServer::start_in(dir, &config_text(&fake, "")).await;
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
    // And uploads still work.
    upload(&server.http, "a.txt", b"hello").await;
}

// ---------------------------------------------------------------------------------------------
// The API, in process.

/// A config whose keys are in the environment variable `var`.
fn with_keys(config: String, var: &str) -> String {
    config.replace("[server]", &format!("[server]\napi_keys_env = \"{var}\""))
}

/// `POST /files?filename=` with a raw body: the status and the answer.
async fn upload_raw(http: &Http, name: &str, bytes: &[u8]) -> (u16, Value) {
    let resp = http
        .request_raw(
            "POST",
            &format!("/files?filename={name}"),
            Some(bytes.to_vec()),
        )
        .await;
    let status = resp.status().as_u16();
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn upload(http: &Http, name: &str, bytes: &[u8]) -> String {
    let (status, v) = upload_raw(http, name, bytes).await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn workspace_files(server: &TestServer, sid: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(server.dir.path().join("sandboxes").join(sid))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn a_message_names_at_most_files_per_message_distinct_files_and_a_repeated_id_is_one() {
    let (fake, server) = setup("[limits]\nfiles_per_message = 3\n").await;
    let sid = server.session(json!({})).await;
    let a = upload(&server.http, "a.txt", b"one").await;
    let ids: Vec<String> = [
        upload(&server.http, "n.txt", b"1").await,
        upload(&server.http, "n.txt", b"2").await,
        upload(&server.http, "n.txt", b"3").await,
        upload(&server.http, "n.txt", b"4").await,
    ]
    .into();

    // Four distinct files: 400 naming the limit and its key; nothing copied.
    let (status, err) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "read them", "files": ids}),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    let msg = message_of(&err);
    assert!(
        msg.contains("[limits] files_per_message") && msg.contains('3'),
        "{err}"
    );
    assert!(workspace_files(&server, &sid).is_empty());

    // One id 400 times (the 13 KB request): one attachment, one copy, at once.
    fake.push(Reply::text("read"));
    let started = Instant::now();
    let many: Vec<&str> = std::iter::repeat_n(a.as_str(), 400).collect();
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "read it", "files": many}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let took = started.elapsed();
    server.wait_idle(&sid).await;
    assert_eq!(workspace_files(&server, &sid), ["a.txt"]);
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let user = hist["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "user.message")
        .unwrap()
        .clone();
    assert_eq!(user["files"].as_array().unwrap().len(), 1, "{user}");
    let sent = fake.requests()[0].to_string();
    assert_eq!(
        sent.matches("<file name=").count(),
        1,
        "inlined once: {sent}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");

    // Three files sharing a name, beside the ones there: each its own free name.
    fake.push(Reply::text("ok"));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "these", "files": [ids[0], ids[1], ids[0], ids[2]]}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    server.wait_idle(&sid).await;
    assert_eq!(
        workspace_files(&server, &sid),
        ["a.txt", "n (2).txt", "n (3).txt", "n.txt"]
    );
}

#[tokio::test]
async fn an_unknown_file_id_in_a_message_is_404_naming_it() {
    let (fake, server) = setup("").await;
    let sid = server.session(json!({})).await;
    let a = upload(&server.http, "a.txt", b"one").await;
    for bad in ["file_0000000000000000nosuch", "not-a-file-id"] {
        let (status, err) = server
            .http
            .post(
                &format!("/sessions/{sid}/messages"),
                &json!({"content": "read", "files": [a, bad]}),
            )
            .await;
        assert_eq!(status, 404, "{err}");
        assert_eq!(err["error"]["type"], "not_found", "{err}");
        assert!(message_of(&err).contains(bad), "{err}");
    }
    assert!(workspace_files(&server, &sid).is_empty());
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn delete_file_is_the_owners_only_and_takes_the_bytes() {
    let fake = FakeOpenAi::start().await;
    let var = "TURNSTILE_TEST_KEYS_HOSTILE_FILES_DELETE";
    let server = TestServer::start_with_env(
        &with_keys(config_text(&fake, ""), var),
        &[(var, "key-one,key-two")],
    )
    .await;
    let one = server.http.with_key("key-one");
    let two = server.http.with_key("key-two");
    let id = upload(&one, "a.txt", b"mine").await;
    let data = server.data_dir();
    assert_eq!(stored(&data), (1, 0));

    let (status, err) = two.call("DELETE", &format!("/files/{id}"), None).await;
    assert_eq!(status, 404, "another key: {err}");
    let (status, _) = server
        .http
        .call("DELETE", &format!("/files/{id}"), None)
        .await;
    assert_eq!(status, 401, "no key");
    let (status, _) = one.get(&format!("/files/{id}")).await;
    assert_eq!(status, 200, "still there");

    let (status, v) = one.call("DELETE", &format!("/files/{id}"), None).await;
    assert_eq!((status, v), (204, Value::Null));
    assert_eq!(stored(&data), (0, 0), "the bytes are gone from disk");
    let (status, _) = one.get(&format!("/files/{id}")).await;
    assert_eq!(status, 404);
    let (status, _) = one.get(&format!("/files/{id}/content")).await;
    assert_eq!(status, 404);
    let (status, _) = one.call("DELETE", &format!("/files/{id}"), None).await;
    assert_eq!(status, 404, "a second delete");

    // Same bytes in two files: deleting one leaves the other whole.
    let a = upload(&one, "a.txt", b"shared").await;
    let b = upload(&one, "b.txt", b"shared").await;
    assert_eq!(stored(&data), (1, 0));
    let (status, _) = one.call("DELETE", &format!("/files/{a}"), None).await;
    assert_eq!(status, 204);
    let resp = one
        .request_raw("GET", &format!("/files/{b}/content"), None)
        .await;
    assert_eq!(resp.status(), 200);
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"shared");
    let (status, _) = server.http.call("PUT", &format!("/files/{b}"), None).await;
    assert_eq!(status, 405);
}

#[tokio::test]
async fn a_deleted_sessions_files_go_with_it_unless_another_session_names_them() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config_text(
        &fake,
        "[policy]\ntrust = [\"deliver_file\"]\ndefault = \"ask\"\n",
    ))
    .await;
    let only_a = upload(&server.http, "only-a.txt", b"a's").await;
    let shared = upload(&server.http, "shared.txt", b"both").await;
    let unattached = upload(&server.http, "loose.txt", b"loose").await;
    let a = server.session(json!({})).await;
    let b = server.session(json!({})).await;

    // Session a: both files attached, and a file delivered by its agent.
    std::fs::create_dir_all(server.dir.path().join("sandboxes").join(&a)).unwrap();
    std::fs::write(
        server.dir.path().join("sandboxes").join(&a).join("out.csv"),
        "x,y\n",
    )
    .unwrap();
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "deliver_file",
        json!({"path": "out.csv"}),
    )]));
    fake.push(Reply::text("done"));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{a}/messages"),
            &json!({"content": "go", "files": [only_a, shared]}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    server.wait_idle(&a).await;
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{a}/events/history"))
        .await;
    let delivered = hist["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "agent.tool_result")
        .and_then(|e| e["files"][0]["id"].as_str())
        .unwrap_or_else(|| panic!("nothing delivered: {hist}"))
        .to_string();

    // Session b names the shared one.
    fake.push(Reply::text("ok"));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{b}/messages"),
            &json!({"content": "this too", "files": [shared]}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    server.wait_idle(&b).await;

    let (status, _) = server
        .http
        .call("DELETE", &format!("/sessions/{a}"), None)
        .await;
    assert_eq!(status, 204);
    for (id, want) in [
        (&only_a, 404),
        (&delivered, 404),
        (&shared, 200),
        (&unattached, 200),
    ] {
        let (status, v) = server.http.get(&format!("/files/{id}")).await;
        assert_eq!(status, want, "{id}: {v}");
    }
    // Blobs: shared.txt and loose.txt remain.
    assert_eq!(stored(&server.data_dir()), (2, 0));

    // Once b goes too, the shared file goes with it.
    let (status, _) = server
        .http
        .call("DELETE", &format!("/sessions/{b}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.http.get(&format!("/files/{shared}")).await;
    assert_eq!(status, 404);
    assert_eq!(stored(&server.data_dir()), (1, 0));
}

#[tokio::test]
async fn disk_bytes_per_key_bounds_uploads_and_deliveries_per_key() {
    let fake = FakeOpenAi::start().await;
    let var = "TURNSTILE_TEST_KEYS_HOSTILE_FILES_QUOTA";
    let cfg = config_text(
        &fake,
        "[limits]\ndisk_bytes_per_key = 10000\n[policy]\ntrust = [\"deliver_file\"]\ndefault = \"ask\"\n",
    );
    let server =
        TestServer::start_with_env(&with_keys(cfg, var), &[(var, "key-one,key-two")]).await;
    let one = server.http.with_key("key-one");
    let two = server.http.with_key("key-two");
    let first = upload(&one, "a.bin", &[1u8; 5904]).await;
    let (status, err) = upload_raw(&one, "b.bin", &[2u8; 4097]).await;
    assert_eq!(status, 413, "{err}");
    assert_eq!(err["error"]["type"], "disk_quota_exceeded", "{err}");
    let msg = message_of(&err);
    assert!(
        msg.contains("[limits] disk_bytes_per_key") && msg.contains("10000"),
        "{err}"
    );
    assert_eq!(stored(&server.data_dir()), (1, 0), "nothing kept of it");
    // Another key has its own.
    upload(&two, "b.bin", &[2u8; 9000]).await;
    // Up to the quota exactly.
    upload(&one, "c.bin", &[3u8; 4096]).await;
    // Full: an empty file is refused too (each file counts at least 4,096 bytes).
    let (status, err) = upload_raw(&one, "empty.bin", &[]).await;
    assert_eq!(status, 413, "{err}");
    assert_eq!(err["error"]["type"], "disk_quota_exceeded", "{err}");

    // deliver_file past it: an error result saying so.
    let (status, s) = one.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = s["sessionId"].as_str().unwrap().to_string();
    let ws = server.dir.path().join("sandboxes").join(&sid);
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("out.bin"), [4u8; 10]).unwrap();
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "deliver_file",
        json!({"path": "out.bin"}),
    )]));
    fake.push(Reply::text("could not"));
    let (status, v) = one
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "deliver"}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let result = poll_tool_result(&one, &sid).await;
    assert_eq!(result["is_error"], true, "{result}");
    let content = result["content"].to_string();
    assert!(content.contains("[limits] disk_bytes_per_key"), "{result}");

    // Deleting frees it.
    let (status, _) = one.call("DELETE", &format!("/files/{first}"), None).await;
    assert_eq!(status, 204);
    upload(&one, "d.bin", &[5u8; 5904]).await;
}

#[tokio::test]
async fn files_per_key_bounds_how_many_files_a_key_stores() {
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, "[limits]\nfiles_per_key = 2\n");
    let server = TestServer::start(&cfg).await;
    let http = &server.http;
    let first = upload(http, "a.txt", b"").await;
    upload(http, "b.txt", b"").await;
    let (status, err) = upload_raw(http, "c.txt", b"").await;
    assert_eq!(status, 413, "{err}");
    assert_eq!(err["error"]["type"], "too_many_files", "{err}");
    assert!(message_of(&err).contains("[limits] files_per_key"), "{err}");
    let (status, _) = http.call("DELETE", &format!("/files/{first}"), None).await;
    assert_eq!(status, 204);
    upload(http, "c.txt", b"").await;
}

/// The first `agent.tool_result` of a session's log, polled for up to 30 s.
async fn poll_tool_result(http: &Http, sid: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, hist) = http.get(&format!("/sessions/{sid}/events/history")).await;
        if let Some(r) = hist["events"]
            .as_array()
            .and_then(|evs| evs.iter().find(|e| e["type"] == "agent.tool_result"))
        {
            return r.clone();
        }
        assert!(Instant::now() < deadline, "no tool result: {hist}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn downloads_are_nosniff_active_types_sandboxed_attachments_and_names_lose_bidi() {
    let (_fake, server) = setup("").await;
    let html = upload(
        &server.http,
        "page.html",
        b"<html><script>alert(1)</script></html>",
    )
    .await;
    let svg = upload(
        &server.http,
        "pic.svg",
        b"<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>",
    )
    .await;
    let txt = upload(&server.http, "notes.txt", b"hello").await;
    // "invoice" U+202E "fdp.exe": shown as "invoiceexe.pdf" were the control kept.
    let (status, v) = upload_raw(&server.http, "invoice%E2%80%AEfdp.exe", b"MZ").await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["filename"], "invoicefdp.exe");
    let bidi = v["id"].as_str().unwrap().to_string();

    for (id, active) in [(&html, true), (&svg, true), (&txt, false), (&bidi, false)] {
        let resp = server
            .http
            .request_raw("GET", &format!("/files/{id}/content"), None)
            .await;
        assert_eq!(resp.status(), 200);
        let h = resp.headers();
        assert_eq!(h["x-content-type-options"], "nosniff", "{id}");
        let disposition = h["content-disposition"].to_str().unwrap();
        assert!(
            disposition.starts_with("attachment;"),
            "{id}: {disposition}"
        );
        assert!(!disposition.contains("%E2%80%AE"), "{disposition}");
        assert_eq!(
            h.get("content-security-policy").is_some(),
            active,
            "{id}: {:?} {h:?}",
            h["content-type"]
        );
    }
    let (_, meta) = server.http.get(&format!("/files/{bidi}")).await;
    assert_eq!(meta["filename"], "invoicefdp.exe");
}

/// Every entry under `root` whose mode lets its group or others in.
fn open_to_others(root: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            out.push(format!("{} {mode:o}", p.display()));
        }
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
        }
    }
    out
}

#[tokio::test]
async fn what_turnstile_writes_is_its_users_alone() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A data folder made before, open to everyone.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();
    let (_child, http) = crate::common::binary::serve_in(dir.path()).await;
    let file = upload(&http, "notes.txt", b"private notes").await;
    let (status, s) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{s}");
    let sid = s["sessionId"].as_str().unwrap().to_string();
    fake.push(Reply::text("read them"));
    let (status, v) = http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "here", "files": [file]}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, hist) = http.get(&format!("/sessions/{sid}/events/history")).await;
        if hist.to_string().contains("turn.completed") {
            break;
        }
        assert!(Instant::now() < deadline, "the turn did not end: {hist}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let workspace = dir.path().join("sandboxes").join(&sid);
    assert!(
        workspace.join("notes.txt").is_file(),
        "the attachment is in the workspace"
    );
    let open: Vec<String> = [data, dir.path().join("sandboxes")]
        .iter()
        .flat_map(|root| open_to_others(root))
        .collect();
    assert!(open.is_empty(), "open to others: {open:#?}");
}
