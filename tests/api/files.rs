//! The file store over HTTP: `POST /files` (a raw body with `?filename=`, and a hand-built
//! multipart body), metadata, MIME detection, downloads with `Content-Type`, `Content-Length`,
//! RFC 6266 `Content-Disposition` and `Range`, the size limit, ownership by API key, and files
//! attached to `POST /sessions/{id}/messages`: copied into the workspace, logged on the
//! `user.message`, and shown to the model (text inline, images as image blocks, anything else as
//! a line naming the file).

use crate::common::{config_text, logcheck::check_log, setup, TestServer};
use base64::Engine as _;
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// A 1×1 PNG.
const PNG: &[u8] = b"\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\x0d\x49\x44\x41\x54\x78\x9c\x63\xf8\xcf\xc0\xf0\x1f\x00\x05\x00\x01\xff\x89\x99\x3d\x1d\x00\x00\x00\x00\x49\x45\x4e\x44\xae\x42\x60\x82";

/// One request with these headers (and the bearer key, if any): status, headers, body.
async fn send(
    server: &TestServer,
    key: Option<&str>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, HeaderMap, Vec<u8>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{}", server.http.base, path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = client
        .request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, body)
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

/// `POST /files?filename=<encoded name>` with a raw body.
async fn upload_raw(
    server: &TestServer,
    key: Option<&str>,
    encoded_name: &str,
    bytes: &[u8],
) -> (u16, Value) {
    let (status, _, body) = send(
        server,
        key,
        "POST",
        &format!("/files?filename={encoded_name}"),
        &[("content-type", "application/octet-stream")],
        bytes.to_vec(),
    )
    .await;
    (status, json_of(&body))
}

/// Upload and expect 201: the file object.
async fn upload(server: &TestServer, encoded_name: &str, bytes: &[u8]) -> Value {
    let (status, v) = upload_raw(server, None, encoded_name, bytes).await;
    assert_eq!(status, 201, "upload {encoded_name}: {v}");
    v
}

const BOUNDARY: &str = "----turnstile-test-7d1f0a";

/// A multipart/form-data body: a plain field, then one file part.
fn multipart(filename: &str, content_type: &str, bytes: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nassistants\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: {content_type}\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    body
}

async fn upload_multipart(server: &TestServer, body: Vec<u8>) -> (u16, Value) {
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let (status, _, resp) = send(
        server,
        None,
        "POST",
        "/files",
        &[("content-type", &ct)],
        body,
    )
    .await;
    (status, json_of(&resp))
}

/// `GET /files/{id}/content` with an optional Range.
async fn download(server: &TestServer, id: &str, range: Option<&str>) -> (u16, HeaderMap, Vec<u8>) {
    let headers: Vec<(&str, &str)> = range.map(|r| ("range", r)).into_iter().collect();
    send(
        server,
        None,
        "GET",
        &format!("/files/{id}/content"),
        &headers,
        Vec::new(),
    )
    .await
}

/// The files' bytes the store keeps (blobs on disk, or in the database) and the uploads left
/// staged in its temporary folder.
fn stored(server: &TestServer) -> (usize, usize) {
    let tmp = std::fs::read_dir(server.data_dir().join("files/tmp"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
                .count()
        })
        .unwrap_or(0);
    let config = server.data_dir().with_file_name("tools.toml");
    (crate::common::stores::blob_count(&config), tmp)
}

#[tokio::test]
async fn raw_and_multipart_uploads_store_the_bytes_with_their_metadata() {
    let (_fake, server) = setup("").await;
    let csv = b"name,amount\nalpha,1\nbeta,2\n";
    let f = upload(&server, "report.csv", csv).await;
    let id = f["id"].as_str().unwrap();
    assert!(id.starts_with("file_"), "{f}");
    assert_eq!(
        f,
        json!({"id": id, "filename": "report.csv", "mime_type": "text/csv", "size_bytes": csv.len()})
    );
    let (status, meta) = server.http.get(&format!("/files/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(meta["filename"], "report.csv");
    assert_eq!(meta["mime_type"], "text/csv");
    assert_eq!(meta["size_bytes"], csv.len());
    let created = meta["created_at"].as_str().unwrap();
    assert!(
        created.ends_with('Z') && created.len() == 24,
        "RFC 3339 with ms: {created}"
    );
    assert_eq!(download(&server, id, None).await.2, csv);

    // The content decides over the extension: a PNG named .txt is a PNG.
    let png = upload(&server, "picture.txt", PNG).await;
    assert_eq!(png["mime_type"], "image/png");
    assert_eq!(png["size_bytes"], PNG.len());
    let (_, headers, body) = download(&server, png["id"].as_str().unwrap(), None).await;
    assert_eq!(headers["content-type"], "image/png");
    assert_eq!(body, PNG);

    // A path in the name is not kept: only its last component.
    let evil = upload(&server, "..%2F..%2Fetc%2Fpasswd.txt", b"x").await;
    assert_eq!(evil["filename"], "passwd.txt");

    // Multipart, built by hand; the bytes hold CRLFs and a boundary look-alike.
    let content = b"line one\r\n--not-the-boundary\r\n\r\nline three\x00\xff".to_vec();
    let (status, m) = upload_multipart(
        &server,
        multipart("notes.bin", "application/octet-stream", &content),
    )
    .await;
    assert_eq!(status, 201, "{m}");
    assert_eq!(m["filename"], "notes.bin");
    assert_eq!(m["size_bytes"], content.len());
    assert_eq!(m["mime_type"], "application/octet-stream");
    assert_eq!(
        download(&server, m["id"].as_str().unwrap(), None).await.2,
        content
    );

    // Two uploads of the same bytes are two files (one blob).
    let again = upload(&server, "copy.csv", csv).await;
    assert_ne!(again["id"], f["id"]);
    assert_eq!(
        stored(&server),
        (4, 0),
        "four distinct contents, no leftovers"
    );
}

#[tokio::test]
async fn a_download_carries_type_length_disposition_and_honours_ranges() {
    let (_fake, server) = setup("").await;
    let f = upload(&server, "r%C3%A9sum%C3%A9%202024.txt", b"0123456789").await;
    assert_eq!(f["filename"], "résumé 2024.txt");
    assert_eq!(f["mime_type"], "text/plain");
    let id = f["id"].as_str().unwrap();

    let (status, h, body) = download(&server, id, None).await;
    assert_eq!(status, 200);
    assert_eq!(body, b"0123456789");
    assert_eq!(h["content-type"], "text/plain");
    assert_eq!(h["content-length"], "10");
    assert_eq!(h["accept-ranges"], "bytes");
    assert_eq!(
        h["content-disposition"],
        "attachment; filename=\"r_sum_ 2024.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%202024.txt",
        "RFC 6266: an ASCII fallback and filename* in UTF-8"
    );
    let ascii = upload(&server, "plain.txt", b"abc").await;
    let (_, h, _) = download(&server, ascii["id"].as_str().unwrap(), None).await;
    assert_eq!(
        h["content-disposition"],
        "attachment; filename=\"plain.txt\""
    );

    let (status, h, body) = download(&server, id, Some("bytes=2-5")).await;
    assert_eq!(status, 206);
    assert_eq!(body, b"2345");
    assert_eq!(h["content-range"], "bytes 2-5/10");
    assert_eq!(h["content-length"], "4");
    assert_eq!(h["content-type"], "text/plain");

    let (status, h, body) = download(&server, id, Some("bytes=-3")).await;
    assert_eq!(status, 206);
    assert_eq!(body, b"789");
    assert_eq!(h["content-range"], "bytes 7-9/10");

    let (status, h, body) = download(&server, id, Some("bytes=7-")).await;
    assert_eq!((status, body.as_slice()), (206, &b"789"[..]));
    assert_eq!(h["content-range"], "bytes 7-9/10");

    for unsatisfiable in ["bytes=10-", "bytes=20-30", "bytes=5-2"] {
        let (status, h, body) = download(&server, id, Some(unsatisfiable)).await;
        assert_eq!(status, 416, "{unsatisfiable}");
        assert_eq!(h["content-range"], "bytes */10", "{unsatisfiable}");
        assert_eq!(json_of(&body)["error"]["type"], "range_not_satisfiable");
    }

    let (status, v) = server.http.get("/files/file_doesnotexist").await;
    assert_eq!(status, 404, "{v}");
    let (status, _, _) = download(&server, "file_doesnotexist", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_upload_over_the_limit_is_413_and_a_nameless_one_400_and_nothing_is_stored() {
    let (_fake, server) = setup("[files]\nmax_bytes = 1024\n").await;
    let (status, err) = upload_raw(&server, None, "big.bin", &[1u8; 1025]).await;
    assert_eq!(status, 413, "{err}");
    assert_eq!(err["error"]["type"], "file_too_large");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_bytes"),
        "{err}"
    );
    let (status, err) = upload_multipart(
        &server,
        multipart("big.bin", "application/octet-stream", &[2u8; 4000]),
    )
    .await;
    assert_eq!(status, 413, "{err}");
    assert_eq!(
        stored(&server),
        (0, 0),
        "nothing stored, no temporary leftovers"
    );

    let (status, _, body) = send(&server, None, "POST", "/files", &[], b"no name".to_vec()).await;
    assert_eq!(status, 400);
    let err = json_of(&body);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("filename"),
        "{err}"
    );
    // A multipart body without a file part names no file either.
    let only_field = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nx\r\n--{BOUNDARY}--\r\n"
    );
    let (status, err) = upload_multipart(&server, only_field.into_bytes()).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(stored(&server), (0, 0));

    // At the limit exactly, it is accepted.
    let f = upload(&server, "fits.bin", &[3u8; 1024]).await;
    assert_eq!(f["size_bytes"], 1024);
    assert_eq!(stored(&server), (1, 0));
}

#[tokio::test]
async fn a_file_belongs_to_the_key_that_uploaded_it() {
    let fake = FakeOpenAi::start().await;
    let var = "TURNSTILE_TEST_KEYS_FILES_API";
    let cfg =
        config_text(&fake, "").replace("[server]", &format!("[server]\napi_keys_env = \"{var}\""));
    let server = TestServer::start_with_env(&cfg, &[(var, "key-one,key-two")]).await;
    let (status, _) = upload_raw(&server, None, "a.txt", b"mine").await;
    assert_eq!(status, 401, "uploads need a key");
    let (status, f) = upload_raw(&server, Some("key-one"), "a.txt", b"mine").await;
    assert_eq!(status, 201, "{f}");
    let id = f["id"].as_str().unwrap();
    for (key, want) in [(Some("key-one"), 200), (Some("key-two"), 404), (None, 401)] {
        let (status, _, _) = send(&server, key, "GET", &format!("/files/{id}"), &[], vec![]).await;
        assert_eq!(status, want, "metadata with {key:?}");
        let (status, _, body) = send(
            &server,
            key,
            "GET",
            &format!("/files/{id}/content"),
            &[],
            vec![],
        )
        .await;
        assert_eq!(status, want, "content with {key:?}");
        if want == 200 {
            assert_eq!(body, b"mine");
        }
    }
    // Nor can another key attach it to a message.
    let two = server.http.with_key("key-two");
    let (status, s) = two.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = s["sessionId"].as_str().unwrap();
    let (status, err) = two
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "read it", "files": [id]}),
        )
        .await;
    assert_eq!(status, 404, "{err}");
    assert!(
        !server
            .dir
            .path()
            .join("sandboxes")
            .join(sid)
            .join("a.txt")
            .exists(),
        "another key's file is not copied"
    );
    assert!(fake.requests().is_empty());
}

/// The user messages the model was sent, by request.
fn last_user_content(req: &Value) -> Value {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| m["content"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn files_named_by_a_message_are_copied_into_the_workspace_and_shown_to_the_model() {
    let (fake, server) = setup("").await;
    let text = "Quarterly notes\nrevenue: 42\n";
    let t = upload(&server, "notes.txt", text.as_bytes()).await;
    let i = upload(&server, "pixel.png", PNG).await;
    let binary = [0u8, 159, 146, 150, 0, 1, 2];
    let b = upload(&server, "data.bin", &binary).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::text("I see a note, a pixel and some data."));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "What is in these?", "files": [t["id"], i["id"], b["id"]]}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    server.wait_idle(&sid).await;

    // Copied into the workspace, byte for byte.
    let ws = server.dir.path().join("sandboxes").join(&sid);
    assert_eq!(
        std::fs::read(ws.join("notes.txt")).unwrap(),
        text.as_bytes()
    );
    assert_eq!(std::fs::read(ws.join("pixel.png")).unwrap(), PNG);
    assert_eq!(std::fs::read(ws.join("data.bin")).unwrap(), binary);

    // The user.message event holds the file objects.
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let events = hist["events"].as_array().unwrap();
    assert_eq!(events[0]["type"], "user.message");
    assert_eq!(events[0]["files"], json!([t, i, b]));
    assert_eq!(events.last().unwrap()["type"], "turn.completed");

    // The model got the text inline, the image as an image block, the binary as a line.
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    let content = last_user_content(&reqs[0]);
    let parts = content
        .as_array()
        .unwrap_or_else(|| panic!("content parts: {content}"));
    let texts: Vec<&str> = parts
        .iter()
        .filter(|p| p["type"] == "text")
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert!(
        texts.iter().any(|t| t.contains("What is in these?")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("<file name=\"notes.txt\">") && t.contains(text)),
        "the text file inline: {texts:?}"
    );
    let png_url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(PNG)
    );
    let images: Vec<&Value> = parts.iter().filter(|p| p["type"] == "image_url").collect();
    assert_eq!(images.len(), 1, "{content}");
    assert_eq!(images[0]["image_url"]["url"], png_url);
    let line = format!(
        "[Attached file: data.bin (application/octet-stream, {} bytes), in the workspace at /workspace/data.bin]",
        binary.len()
    );
    assert!(
        texts.contains(&line.as_str()),
        "the binary file is named: {texts:?}"
    );

    // The same file again does not overwrite the first copy.
    fake.push(Reply::text("Same note."));
    let (status, _) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "again", "files": [t["id"]]}),
        )
        .await;
    assert_eq!(status, 202);
    server.wait_idle(&sid).await;
    assert_eq!(
        std::fs::read(ws.join("notes (2).txt")).unwrap(),
        text.as_bytes()
    );
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let second = hist["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "user.message")
        .nth(1)
        .cloned()
        .unwrap();
    assert_eq!(second["files"][0]["filename"], "notes (2).txt");
    assert_eq!(second["files"][0]["id"], t["id"]);
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn an_unknown_file_id_is_404_and_nothing_is_queued() {
    let (fake, server) = setup("").await;
    let sid = server.session(json!({})).await;
    let (status, err) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "read it", "files": ["file_nosuchfile"]}),
        )
        .await;
    assert_eq!(status, 404, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("file_nosuchfile"),
        "{err}"
    );
    // Had anything been queued, it would run before this message: the log holds one turn only.
    fake.push(Reply::text("ok"));
    let (status, _) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "hello"}),
        )
        .await;
    assert_eq!(status, 202);
    server.wait_idle(&sid).await;
    let events = check_log(server.engine().store(), &sid).await;
    let users = events
        .iter()
        .filter(|e| e.body.type_name() == "user.message")
        .count();
    assert_eq!(users, 1, "the refused message was never queued");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn a_refused_message_leaves_the_workspace_untouched() {
    let (fake, server) = setup("").await;
    let t = upload(&server, "notes.txt", b"hello").await;
    let sid = server.session(json!({})).await;
    let (status, err) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "read them", "files": [t["id"], "file_nosuchfile"]}),
        )
        .await;
    assert_eq!(status, 404, "{err}");
    let ws = server.dir.path().join("sandboxes").join(&sid);
    let left: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "a refused message must not copy its valid files into the workspace: {left:?}"
    );
    assert!(fake.requests().is_empty());
}
