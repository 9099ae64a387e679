//! `/mcp` against a hostile client and a careless server: a resource's policy cannot be
//! sidestepped by spelling its URI another way (the server reads what the policy judged), a
//! template that would make a matcher backtrack costs nothing, and a server's own names that
//! would deceive a reader are not shown as they are. The real binary federates the example
//! server in `--naive-files` mode (it reads any `file:` URI the careless way); the client is
//! rmcp's, over turnstile's own streamable-HTTP transport.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rmcp::model::ReadResourceRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceExt};

/// `/mcp` over the example server `evil` in `--naive-files` mode, with `extra` args: its tools
/// and files trusted, but the secret file denied (by its plain spelling, as an operator
/// writes it) and the `u://` templates' resources trusted.
fn config(dir: &Path, secret: &Path, extra_args: &str, endpoint: &str) -> std::path::PathBuf {
    let text = format!(
        "[server]\ndata_dir = {:?}\nsandboxes = {:?}\n\n[agents.assistant]\ntools = [\"*\"]\n\n{}\n[policy]\ntrust = [\"mcp__evil__*\"]\ndeny = [\"mcp__evil__file://{}\"]\ndefault = \"deny\"\n\n[mcp_endpoint]\nenabled = true\n{endpoint}\n",
        dir.join("data").display().to_string(),
        dir.join("sandboxes").display().to_string(),
        crate::common::mcp::example_server(
            "evil",
            &format!("args = [\"--naive-files\"{extra_args}]")
        ),
        secret.display(),
    );
    let path = dir.join("tools.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn connect(addr: std::net::SocketAddr) -> RunningService<RoleClient, ()> {
    let transport = turnstile::tools::mcp::http_client::transport(
        &format!("http://{addr}/mcp"),
        HashMap::new(),
        None,
    );
    ().serve(transport).await.expect("initialize /mcp")
}

async fn read(client: &RunningService<RoleClient, ()>, uri: &str) -> Result<String, String> {
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        client.read_resource(ReadResourceRequestParams::new(uri)),
    )
    .await
    .unwrap_or_else(|_| panic!("resources/read of {uri} answered within 30 s"));
    match read {
        Ok(r) => Ok(serde_json::to_value(&r.contents).unwrap().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// A folder with a secret file and a public one beside it.
fn files(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let files = dir.join("files");
    std::fs::create_dir_all(files.join("srv")).unwrap();
    let secret = files.join("secret.txt");
    std::fs::write(&secret, "the secret").unwrap();
    let public = files.join("public.txt");
    std::fs::write(&public, "public words").unwrap();
    (secret, public)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_denied_file_uri_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, public) = files(dir.path());
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), &secret, "", "")).await;
    let client = connect(addr).await;
    let s = secret.display().to_string();
    let files = secret.parent().unwrap().display().to_string();
    let (head, tail) = s[1..].split_once('/').unwrap();
    // The plain spelling is denied, and a public file beside it is read.
    let public_uri = format!("turnstile://evil/file://{}", public.display());
    assert!(read(&client, &public_uri)
        .await
        .unwrap()
        .contains("public words"));
    let mut tried = vec![format!("turnstile://evil/file://{s}")];
    // The four spellings that read /etc/shadow through a deny on its plain spelling, and more.
    tried.extend(
        [
            format!("file://{files}/srv/../secret.txt"),
            format!("file:///%{:02x}{}", head.as_bytes()[0], &s[2..]),
            format!("file://localhost{s}"),
            format!("file:///{s}"),
            format!("FILE://LOCALHOST/{head}/./{tail}"),
            format!("file:{s}"),
            format!(
                "file://{files}/%2e%2e/{}/secret.txt",
                Path::new(&files).file_name().unwrap().to_string_lossy()
            ),
            format!("file://{files}/secret%2etxt"),
        ]
        .iter()
        .map(|u| format!("turnstile://evil/{u}")),
    );
    for uri in &tried {
        match read(&client, uri).await {
            Ok(text) => panic!("{uri} read the denied file: {text}"),
            Err(e) => assert!(e.contains("denied by policy"), "{uri}: {e}"),
        }
    }
    // Spellings with no one meaning are refused, saying why, before any server sees them.
    for (uri, why) in [
        (format!("file://{files}%2Fsecret.txt"), "escaped '/'"),
        (format!("file://{s}?x"), "query or a fragment"),
        (format!("file://{s}%3Fx"), "escaped '?'"),
        (format!("file://elsewhere{s}"), "another host"),
    ] {
        let e = read(&client, &format!("turnstile://evil/{uri}"))
            .await
            .expect_err(&uri);
        assert!(e.contains(why), "{uri}: {e}");
    }
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_would_backtrack_is_matched_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, _) = files(dir.path());
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), &secret, "", "")).await;
    let client = connect(addr).await;
    // Without the server's prefix, the URI goes to the server whose template matches it:
    // `u://{+a}/{+b}/{+c}.json` against 800 slashes took a backtracking matcher 126 s.
    let hostile = format!("u://{}x", "a/".repeat(800));
    let clients = futures_util::future::join_all((0..3).map(|_| async {
        let c = connect(addr).await;
        let r = read(&c, &hostile).await;
        c.cancel().await.unwrap();
        r
    }));
    let health = async {
        let (status, _) = crate::common::Http::new(addr).get("/healthz").await;
        status
    };
    let (reads, health) = tokio::join!(clients, health);
    assert_eq!(health, 200);
    for r in reads {
        // It matches no template (no `.json`), so the only server with resources takes it.
        let text = r.expect("the hostile URI is read");
        assert!(text.contains("nested"), "{text}");
    }
    let long = format!("u://a/{}/c.json", "b/".repeat(300));
    assert!(read(&client, &long).await.unwrap().contains("nested"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_names_that_would_deceive_are_shown_federated() {
    let dir = tempfile::tempdir().unwrap();
    let (secret, _) = files(dir.path());
    let extra = ", \"--extra-tool\", \"../../etc/passwd\", \"--extra-tool\", \"\u{fc}n\u{ef}\u{202e}code\", \"--extra-tool\", \"plain.name-1\"";
    let (_child, addr) =
        crate::common::binary::serve(&config(dir.path(), &secret, extra, "names = \"own\"")).await;
    let client = connect(addr).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(names.contains(&"plain.name-1"), "{names:?}");
    assert!(names.contains(&"echo"), "{names:?}");
    for n in &names {
        assert!(
            n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)),
            "{n:?} is shown to clients: {names:?}"
        );
    }
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("mcp__evil__") && n.ends_with("etc_passwd")),
        "the federated name stands for it: {names:?}"
    );
    client.cancel().await.unwrap();
}
