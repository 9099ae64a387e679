//! The embedded store on a full disk: a real `turnstile serve` with its `data_dir` on a small
//! tmpfs of its own (mounted here: the test needs root or CAP_SYS_ADMIN, and fails without).
//! Once the disk is full, writes are refused 503 `store_unavailable` with `Retry-After` and
//! `/readyz` is 503; nothing committed before is lost (`PRAGMA integrity_check`, the history,
//! the log checker); once space returns, `/readyz` is ready again and turns succeed, without a
//! restart.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::logcheck::check_events;
use crate::common::Http;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// A tmpfs of `size` mounted on a new temporary folder, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("turnstile-tmpfs-")
            .tempdir()
            .unwrap();
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let opts = CString::new(format!("size={size},mode=0755")).unwrap();
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EPERM) {
                panic!(
                    "this test mounts a small tmpfs to fill it: it needs root (or CAP_SYS_ADMIN); \
                     mount failed: {err}"
                );
            }
            panic!("mount -t tmpfs -o size={size} on {:?}: {err}", dir.path());
        }
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; a lazy unmount, whoever still holds files there.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Writes a file at `path` until the filesystem has no room left; its size.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5au8; 4096];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    let _ = f.sync_all();
    written
}

/// Status, `Retry-After` and JSON body of a request.
async fn call(
    http: &Http,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Option<String>, Value) {
    let resp = http
        .request_raw(method, path, body.map(|b| serde_json::to_vec(b).unwrap()))
        .await;
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {bytes:?}"));
    (status, retry, v)
}

async fn turn(http: &Http, sid: &str, text: &str) -> (u16, Option<String>, Value) {
    let body = json!({"messages": [{"role": "user", "content": text}]});
    call(http, "POST", &format!("/sessions/{sid}/turns"), Some(&body)).await
}

/// Polls `/readyz` until its status is `want`, for at most 20 s; its body.
async fn readyz_becomes(http: &Http, want: u16, log: &Path) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, v) = call(http, "GET", "/readyz", None).await;
        if status == want {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status}, not {want}: {v}\nserver log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts the answer is the store's refusal: 503, `Retry-After`, `store_unavailable`.
fn assert_refused(what: &str, (status, retry, v): &(u16, Option<String>, Value)) {
    assert_eq!(*status, 503, "{what}: {v}");
    assert!(retry.is_some(), "{what}: a 503 carries Retry-After");
    assert_eq!(v["error"]["type"], "store_unavailable", "{what}: {v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("store"), "{what}: says why: {v}");
}

fn config(fake: &FakeOpenAi, data: &Path) -> String {
    format!(
        "[server]\ndata_dir = {:?}\nsandboxes = \"sandboxes\"\n\n[upstream]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"fake-model\"\nretries = 0\n",
        data.display().to_string(),
        fake.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_503_keeps_the_log_and_recovers_when_space_returns() {
    let disk = Tmpfs::mount("3m");
    let data: PathBuf = disk.path().join("data");
    let fake = FakeOpenAi::start().await;
    fake.set_fallback(Reply::text("noted"));
    // The config and the sandboxes stay off the small disk: only the data is on it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config(&fake, &data)).unwrap();
    let (mut child, http) = crate::common::binary::serve_in(dir.path()).await;
    let log = dir.path().join("log.txt");

    let (status, created) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let mut answered = Vec::new();
    for i in 0..3 {
        let text = format!("before the disk filled #{i}");
        let (status, _, v) = turn(&http, &sid, &text).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["stopReason"], "end_turn", "{v}");
        answered.push(text);
    }

    // The disk fills (a file beside the data), then turns with large messages go on until one
    // cannot be stored (the WAL may have room left for a few).
    let filler = disk.path().join("filler");
    let filled = fill(&filler);
    assert!(filled > 0, "the filler took the free space");
    let big = "x".repeat(64 * 1024);
    let mut refused = None;
    for i in 0..100 {
        let text = format!("while the disk is full #{i} {big}");
        let answer = turn(&http, &sid, &text).await;
        if answer.0 == 200 && answer.2["stopReason"] == "end_turn" {
            answered.push(text);
            continue;
        }
        refused = Some(answer);
        break;
    }
    let refused = refused.expect("a turn was refused once the disk was full");
    assert_refused("the turn that could not be stored", &refused);
    // While the store cannot be written: unready, and writes are refused the same way.
    let ready = readyz_becomes(&http, 503, &log).await;
    assert_eq!(ready["error"]["store"]["writable"], false, "{ready}");
    assert_refused(
        "a new session",
        &call(&http, "POST", "/sessions", Some(&json!({}))).await,
    );
    assert_refused("another turn", &turn(&http, &sid, "still full").await);
    // Reads still work, and show every turn that was answered.
    let (status, hist) = http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(status, 200, "{hist}");
    let said: Vec<&str> = hist["history"]["full"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        said, answered,
        "the history holds every answered turn, in order"
    );

    // Space returns: ready again and turns succeed, with no restart.
    std::fs::remove_file(&filler).unwrap();
    let ready = readyz_becomes(&http, 200, &log).await;
    assert_eq!(ready["store"]["writable"], true, "{ready}");
    let (status, _, v) = turn(&http, &sid, "after space returned").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stopReason"], "end_turn", "{v}");
    answered.push("after space returned".into());
    let (status, _) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);

    // Nothing committed was lost or corrupted.
    child.kill().await.unwrap();
    let _ = child.wait().await;
    let db = rusqlite::Connection::open(data.join("turnstile.db")).unwrap();
    let integrity: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    drop(db);
    let store = turnstile::log::Store::open(&data, false).unwrap();
    let events = store.events(&sid, 0, 1 << 20).await.unwrap();
    check_events(&events);
    let stored: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.body {
            turnstile::log::EventBody::UserMessage { content, .. } => {
                content.as_str().map(str::to_string)
            }
            _ => None,
        })
        .collect();
    for text in &answered {
        assert!(
            stored.contains(text),
            "an answered turn is missing from the log: {:.40}",
            text
        );
    }
}
